package faultproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The control API's routes and the method each takes.
var routes = map[string]string{
	"/":        http.MethodGet,
	"/cut":     http.MethodPost,
	"/heal":    http.MethodPost,
	"/latency": http.MethodPost,
}

// maxBody bounds a control request's body.
const maxBody = 64 << 10

// ShapeRequest is the body of POST /latency: durations as Go duration
// strings ("40ms"); an omitted field stays as it is.
type ShapeRequest struct {
	Latency   *string  `json:"latency,omitempty"`
	Jitter    *string  `json:"jitter,omitempty"`
	ResetRate *float64 `json:"reset_rate,omitempty"`
}

// apply returns s changed by the fields r gives, or an error naming the
// field that does not parse or is out of range.
func (r ShapeRequest) apply(s Shape) (Shape, error) {
	for _, f := range []struct {
		name string
		in   *string
		out  *time.Duration
	}{{"latency", r.Latency, &s.Latency}, {"jitter", r.Jitter, &s.Jitter}} {
		if f.in == nil {
			continue
		}
		d, err := time.ParseDuration(*f.in)
		if err != nil {
			return Shape{}, fmt.Errorf("%s %q: want a duration such as \"40ms\"", f.name, *f.in)
		}
		*f.out = d
	}
	if r.ResetRate != nil {
		s.ResetRate = *r.ResetRate
	}
	return s, s.Validate()
}

// Handler serves p's control API:
//
//	GET  /         the link's Status as JSON
//	POST /cut      Cut the link
//	POST /heal     Heal it
//	POST /latency  change its shape: {"latency":"40ms","jitter":"5ms","reset_rate":0.5}
//
// Every answer is JSON: the status after the change, or {"error": "..."}
// with 404 for an unknown path, 405 for a wrong method and 400 for a body
// that does not parse or a value out of range; a request that fails changes
// nothing.
func Handler(p *Proxy) http.Handler {
	var mu sync.Mutex // orders read-modify-write shape changes
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method, ok := routes[r.URL.Path]
		switch {
		case !ok:
			writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %q: the control API has GET /, POST /cut, POST /heal, POST /latency", r.URL.Path))
			return
		case r.Method != method:
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: want %s", r.Method, r.URL.Path, method))
			return
		}
		switch r.URL.Path {
		case "/cut":
			p.Cut()
		case "/heal":
			p.Heal()
		case "/latency":
			var req ShapeRequest
			if err := decodeBody(r, &req); err != nil {
				writeError(w, http.StatusBadRequest, "POST /latency: "+err.Error())
				return
			}
			mu.Lock()
			s, err := req.apply(p.Shape())
			if err == nil {
				p.SetShape(s)
			}
			mu.Unlock()
			if err != nil {
				writeError(w, http.StatusBadRequest, "POST /latency: "+err.Error())
				return
			}
		}
		writeJSON(w, http.StatusOK, p.Status())
	})
}

// decodeBody decodes r's body, one JSON object with known fields only, into
// v.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New(`empty body: want a JSON object such as {"latency":"40ms"}`)
		}
		return fmt.Errorf("bad JSON: %w", err)
	}
	if dec.More() {
		return errors.New("bad JSON: more than one value")
	}
	return nil
}

type errorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Client talks to a link's control API.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client of the control API at baseURL
// ("http://127.0.0.1:7501").
func NewClient(baseURL string) *Client {
	return &Client{base: strings.TrimSuffix(baseURL, "/"), hc: &http.Client{Timeout: 10 * time.Second}}
}

// URL returns the control API's base URL.
func (c *Client) URL() string { return c.base }

// Status returns the link's status. It returns an error when the request
// fails or the API answers with an error.
func (c *Client) Status(ctx context.Context) (Status, error) {
	return c.do(ctx, http.MethodGet, "/", nil)
}

// Cut takes the link down. It returns an error when the request fails.
func (c *Client) Cut(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodPost, "/cut", nil)
	return err
}

// Heal brings the link back up. It returns an error when the request fails.
func (c *Client) Heal(ctx context.Context) error {
	_, err := c.do(ctx, http.MethodPost, "/heal", nil)
	return err
}

// SetShape sets the link's whole shape. It returns an error when the
// request fails or the API rejects the shape.
func (c *Client) SetShape(ctx context.Context, s Shape) error {
	lat, jit := s.Latency.String(), s.Jitter.String()
	_, err := c.do(ctx, http.MethodPost, "/latency", ShapeRequest{Latency: &lat, Jitter: &jit, ResetRate: &s.ResetRate})
	return err
}

func (c *Client) do(ctx context.Context, method, path string, body any) (Status, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return Status{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return Status{}, fmt.Errorf("faultproxy client: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("faultproxy client: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return Status{}, fmt.Errorf("faultproxy client: %s %s: %w", method, c.base+path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return Status{}, fmt.Errorf("faultproxy client: %s %s: %s: %s", method, c.base+path, resp.Status, e.Error)
	}
	var s Status
	if err := json.Unmarshal(b, &s); err != nil {
		return Status{}, fmt.Errorf("faultproxy client: %s %s: decode status: %w", method, c.base+path, err)
	}
	return s, nil
}
