package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/paymesh/paymesh/services/ledger"
)

// auth is the gate of every endpoint: it finds the caller by its API key,
// requires the key's role, applies the caller's rate limit, logs every
// refused or failed write, and writes the endpoint's reply.
type auth struct {
	cfg      *Config
	clients  clientCache
	limiters sync.Map // client id -> *rate.Limiter
}

// authed serves a client endpoint: the key must be a client's (an
// operator's is refused with 403 client_only: operators move no money).
func (a *auth) authed(h func(context.Context, *http.Request, string) reply) http.HandlerFunc {
	return a.keyed(RoleClient, func(ctx context.Context, r *http.Request, c RegisteredClient) reply { return h(ctx, r, c.ID) })
}

// operator serves an operator endpoint: the key must be an operator's (a
// client's is refused with 403 operator_only).
func (a *auth) operator(h func(context.Context, *http.Request, RegisteredClient) reply) http.HandlerFunc {
	return a.keyed(RoleOperator, func(ctx context.Context, r *http.Request, op RegisteredClient) reply {
		if a.cfg.DeadLetters == nil { // the API runs without the region's operator NATS user
			return errReply(opsDisabled)
		}
		return h(ctx, r, op)
	})
}

// forbidden is the refusal of a key of the wrong role.
var forbidden = map[Role]*ledger.Error{
	RoleClient:   ledger.Errorf(CodeClientOnly, "this endpoint takes a client's API key; an operator key moves no money"),
	RoleOperator: ledger.Errorf(CodeOperatorOnly, "this endpoint takes an operator's API key (paymesh client --operator)"),
}

// keyed authenticates the caller (Authorization: Bearer <API key>),
// requires its key to have role, applies its rate limit, and logs every
// refused or failed write.
func (a *auth) keyed(role Role, h func(context.Context, *http.Request, RegisteredClient) reply) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		reqID := r.Header.Get("X-Request-Id")
		if reqID == "" {
			reqID = strconv.FormatInt(time.Now().UnixNano(), 36)
		}
		w.Header().Set("X-Request-Id", reqID)
		client, err := a.admit(w, r, role)
		if err != nil {
			a.logRefused(r, client.ID, reqID, err)
			write(w, errReply(err))
			return
		}
		rep := h(r.Context(), r, client)
		if r.Method != http.MethodGet && rep.Status >= 400 {
			a.logRefused(r, client.ID, reqID, errors.New(string(rep.Body)))
		}
		write(w, rep)
	}
}

// admit returns the caller of r if its key is valid, has role and is
// within its rate limit; otherwise the refusal, with its headers set on w.
func (a *auth) admit(w http.ResponseWriter, r *http.Request, role Role) (RegisteredClient, error) {
	key, ok := bearer(r)
	var client RegisteredClient
	if ok {
		var err error
		if client, ok, err = a.client(r.Context(), key); err != nil {
			return RegisteredClient{}, err
		}
	}
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="paymesh"`)
		return RegisteredClient{}, ledger.Errorf(CodeUnauthorized, "a valid API key is required (Authorization: Bearer <key>)")
	}
	if client.RoleOf() != role {
		return client, forbidden[role]
	}
	if wait := a.limit(client); wait > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		return client, ledger.Errorf(CodeRateLimited, "over %d requests per second", client.RatePerSec)
	}
	return client, nil
}

// client returns the client whose API key is key, from the cache while
// its entry lasts, or false.
func (a *auth) client(ctx context.Context, key string) (RegisteredClient, bool, error) {
	hash, now := sha256.Sum256([]byte(key)), time.Now()
	if c, ok := a.clients.get(hash, now); ok {
		return c, true, nil
	}
	c, ok, err := a.cfg.Store.ClientByKey(ctx, hash[:])
	if ok && err == nil {
		a.clients.put(hash, c, now)
	}
	return c, ok, err
}

func (a *auth) logRefused(r *http.Request, client, reqID string, err error) {
	a.cfg.Log.Warn("request refused", "method", r.Method, "path", r.URL.Path, "client", client, "request_id", reqID, "reason", err.Error())
}

func bearer(r *http.Request) (string, bool) {
	const p = "Bearer "
	h := r.Header.Get("Authorization")
	if len(h) <= len(p) || h[:len(p)] != p {
		return "", false
	}
	return h[len(p):], true
}

// limit takes a token from the client's bucket and returns how long to
// wait when there is none.
func (a *auth) limit(c RegisteredClient) time.Duration {
	v, _ := a.limiters.LoadOrStore(c.ID, rate.NewLimiter(rate.Limit(c.RatePerSec), c.RatePerSec))
	l := v.(*rate.Limiter)
	res := l.Reserve()
	if d := res.Delay(); d > 0 {
		res.Cancel()
		return d
	}
	return 0
}
