package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Client calls the paymesh HTTP API. Its zero HTTP field means
// http.DefaultClient.
type Client struct {
	BaseURL string
	APIKey  string
	HTTP    *http.Client
	// Attempts bounds the tries of SendTransfer (default 8).
	Attempts uint
}

// Response is a raw API answer.
type Response struct {
	Status   int
	Replayed bool
	Body     json.RawMessage
	// Tries is how many times the request was sent before this answer
	// (1: at once).
	Tries int
}

// Error is an API answer with a problem body.
type Error struct {
	Status  int
	Problem Problem
}

func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Problem.Code, e.Problem.Detail)
}

// NewIdempotencyKey returns a random key for SendTransfer.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *Client) do(ctx context.Context, method, path, key string, body []byte) (Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.APIKey)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return Response{}, err
	}
	r := Response{Status: res.StatusCode, Replayed: res.Header.Get(HeaderReplayed) == "true", Body: b}
	if res.StatusCode >= 400 {
		e := &Error{Status: res.StatusCode}
		_ = json.Unmarshal(b, &e.Problem)
		inFlight := res.StatusCode == http.StatusConflict && e.Problem.Code == CodeIdempotencyKeyInFlight
		if inFlight || res.StatusCode == http.StatusTooManyRequests || res.StatusCode >= 500 {
			secs, _ := strconv.Atoi(res.Header.Get("Retry-After"))
			return r, retryable{e, time.Duration(secs) * time.Second}
		}
		return r, e
	}
	return r, nil
}

// retryable marks an answer worth trying again after a while.
type retryable struct {
	err   *Error
	after time.Duration
}

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

// SendTransfer posts a transfer with the idempotency key and retries with
// the same key on network errors, 409 (in flight), 429 and 5xx, with
// backoff: the transfer is made at most once whatever happens.
func (c *Client) SendTransfer(ctx context.Context, req TransferRequest, key string) (Response, error) {
	body, _ := json.Marshal(req)
	return c.post(ctx, "/v1/transfers", key, body)
}

// Capture captures the hold id (amount 0: all of it), retrying as
// SendTransfer does.
func (c *Client) Capture(ctx context.Context, id string, amount int64, key string) (Response, error) {
	body, _ := json.Marshal(ActionRequest{Amount: amount})
	return c.post(ctx, "/v1/transfers/"+id+"/capture", key, body)
}

// Void releases the hold id, retrying as SendTransfer does.
func (c *Client) Void(ctx context.Context, id, key string) (Response, error) {
	return c.post(ctx, "/v1/transfers/"+id+"/void", key, nil)
}

// Refund refunds the transfer id (amount 0: all that is left), retrying as
// SendTransfer does.
func (c *Client) Refund(ctx context.Context, id string, amount int64, key string) (Response, error) {
	body, _ := json.Marshal(ActionRequest{Amount: amount})
	return c.post(ctx, "/v1/transfers/"+id+"/refunds", key, body)
}

// AccountAction closes, freezes or unfreezes (op: "close", "freeze",
// "unfreeze") the account id, retrying as SendTransfer does.
func (c *Client) AccountAction(ctx context.Context, id, op, key string) (Response, error) {
	return c.post(ctx, "/v1/accounts/"+url.PathEscape(id)+"/"+op, key, nil)
}

// post sends a request that moves money with its idempotency key, and
// retries it with the same key on network errors, 409 while the key is in
// flight, 429 and 5xx, with backoff.
func (c *Client) post(ctx context.Context, path, key string, body []byte) (Response, error) {
	attempts := c.Attempts
	if attempts == 0 {
		attempts = 8
	}
	tries := 0
	r, err := backoff.Retry(ctx, func() (Response, error) {
		tries++
		r, err := c.do(ctx, http.MethodPost, path, key, body)
		var e *Error
		var rt retryable
		switch {
		case errors.As(err, &rt):
			if rt.after > 0 {
				return r, backoff.RetryAfter(int(rt.after.Seconds()))
			}
			return r, err
		case errors.As(err, &e):
			return r, backoff.Permanent(err)
		}
		return r, err // nil, or a network error: retried
	}, backoff.WithMaxTries(attempts), backoff.WithBackOff(&backoff.ExponentialBackOff{
		InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.3, Multiplier: 2, MaxInterval: 3 * time.Second}))
	r.Tries = tries
	return r, err
}

// CreateAccount opens an account; region may be empty. With an
// idempotency key it retries as SendTransfer does, and opens one account
// whatever happens; without one it sends the request once.
func (c *Client) CreateAccount(ctx context.Context, req AccountRequest, key string) (Response, error) {
	body, _ := json.Marshal(req)
	if key == "" {
		return c.do(ctx, http.MethodPost, "/v1/accounts", "", body)
	}
	return c.post(ctx, "/v1/accounts", key, body)
}

// Get reads a path of the API (an account, its entries, a transfer).
func (c *Client) Get(ctx context.Context, path string) (Response, error) {
	return c.do(ctx, http.MethodGet, path, "", nil)
}

// CreateWebhookEndpoint creates a webhook endpoint. With an idempotency
// key it retries as SendTransfer does, and creates one endpoint whatever
// happens; without one it sends the request once.
func (c *Client) CreateWebhookEndpoint(ctx context.Context, req WebhookEndpointRequest, key string) (Response, error) {
	body, _ := json.Marshal(req)
	if key == "" {
		return c.do(ctx, http.MethodPost, "/v1/webhook_endpoints", "", body)
	}
	return c.post(ctx, "/v1/webhook_endpoints", key, body)
}

// PostOnce sends a POST without an idempotency key, once: for the calls
// that are safe to repeat by themselves (a redelivery, a rotation).
func (c *Client) PostOnce(ctx context.Context, path string, body []byte) (Response, error) {
	return c.do(ctx, http.MethodPost, path, "", body)
}

// Delete deletes what path names.
func (c *Client) Delete(ctx context.Context, path string) (Response, error) {
	return c.do(ctx, http.MethodDelete, path, "", nil)
}
