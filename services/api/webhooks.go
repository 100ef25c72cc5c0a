package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// Webhook endpoints: /v1/webhook_endpoints. An endpoint lives in its home
// region (its ID's: the region that received the create, or under an
// Idempotency-Key the key's, AccountKeyHome, so that a retry sent anywhere
// finds it), which writes each change as the next version and pushes it
// to every other region (put_webhook_endpoint), since each region delivers
// its own events. A push that fails is retried by the sync loop
// (SyncWebhooks) until every region holds the version. Reads run at the
// home; a list asks every region for the endpoints homed there.

// Webhooks is what the API asks of its region's webhook store
// (services/webhooks/webhookdb's Store implements it).
type Webhooks interface {
	Create(ctx context.Context, e webhooks.Endpoint, key string, hash []byte) (webhooks.Endpoint, bool, error)
	Put(ctx context.Context, e webhooks.Endpoint) (bool, error)
	Endpoint(ctx context.Context, id string) (webhooks.Endpoint, bool, error)
	Endpoints(ctx context.Context, client string) ([]webhooks.Endpoint, error)
	Change(ctx context.Context, id, client string, change func(*webhooks.Endpoint) error) (webhooks.Endpoint, bool, error)
	Unpushed(ctx context.Context, limit int) ([]webhooks.Endpoint, error)
	Pushed(ctx context.Context, id string, version int64) error
	Disable(ctx context.Context, id, reason string) (bool, error)
	Attempts(ctx context.Context, endpoint string, event *ledger.EventRef, after *webhookdb.AttemptCursor, limit int) ([]webhookdb.Attempt, error)
	Redeliver(ctx context.Context, event ledger.EventRef, endpoints []string) ([]string, error)
}

// CodeWebhooksDisabled: the API runs without a webhook store.
const CodeWebhooksDisabled ledger.Code = "webhooks_disabled"

var webhooksOff = ledger.Errorf(CodeWebhooksDisabled, "this region's API runs without webhooks")

// RotationOverlap is how long a rotated secret keeps signing deliveries
// beside the new one, so that receivers can switch without a refusal.
const RotationOverlap = 24 * time.Hour

// WebhookEndpointRequest is the body of POST /v1/webhook_endpoints.
type WebhookEndpointRequest struct {
	URL   string   `json:"url"`
	Types []string `json:"types,omitempty"`
}

// WebhookEndpointBody is the JSON form of an endpoint. Secret is sent only
// by the create (and its replays) and the rotation.
type WebhookEndpointBody struct {
	ID             string    `json:"id"`
	URL            string    `json:"url"`
	Types          []string  `json:"types"`
	Status         string    `json:"status"`
	DisabledReason string    `json:"disabled_reason,omitempty"`
	Secret         string    `json:"secret,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// WebhookEndpointList is GET /v1/webhook_endpoints.
type WebhookEndpointList struct {
	Endpoints []WebhookEndpointBody `json:"endpoints"`
}

func endpointBody(e webhooks.Endpoint, secret bool) WebhookEndpointBody {
	b := WebhookEndpointBody{ID: e.ID, URL: e.URL, Types: []string{}, Status: string(e.Status), DisabledReason: e.DisabledReason,
		CreatedAt: e.CreatedAt.UTC(), UpdatedAt: e.UpdatedAt.UTC()}
	for _, t := range e.Types {
		b.Types = append(b.Types, string(t))
	}
	if secret {
		b.Secret = e.Secret
	}
	return b
}

// hooks serves the webhook endpoints.
type hooks struct {
	cfg   *Config
	fwd   *forwarder
	guard *webhooks.Guard // Config.WebhookGuard, or one that allows no host
	// The operations: run in the endpoint's home region (create, read,
	// remove, rotate), in every region (list, put: a home's push, disable:
	// a region's word to the home), in the event's (redeliver), in each
	// region holding attempts (attempts).
	create, read, list, remove, rotate, put, disable, attempts, redeliver operation
}

func newHooks(cfg *Config, fwd *forwarder) *hooks {
	h := &hooks{cfg: cfg, fwd: fwd, guard: cfg.WebhookGuard}
	if h.guard == nil {
		h.guard = webhooks.NewGuard(nil)
	}
	h.create = operation{name: "create_webhook_endpoint", run: h.createHere, takes: shape{key: optionalKey, body: requiredBody}}
	h.read = operation{name: "get_webhook_endpoint", run: h.readHere, takes: shape{id: idHere}}
	h.list = operation{name: "list_webhook_endpoints", run: h.listHere}
	h.remove = operation{name: "delete_webhook_endpoint", run: h.removeHere, takes: shape{id: idHere}}
	h.rotate = operation{name: "rotate_webhook_secret", run: h.rotateHere, takes: shape{id: idHere}}
	h.put = operation{name: "put_webhook_endpoint", run: h.putHere, takes: shape{id: idAny, body: requiredBody}}
	h.disable = operation{name: "disable_webhook_endpoint", run: h.disableHere, takes: shape{id: idHere, body: requiredBody}}
	h.attempts = operation{name: "list_webhook_attempts", run: h.attemptsHere, takes: shape{id: idAny, body: optionalBody, page: true}}
	h.redeliver = operation{name: "redeliver_event", run: h.redeliverHere, takes: shape{body: requiredBody}}
	return h
}

// on wraps a handler so that it answers 503 without a webhook store.
func (h *hooks) on(f func(context.Context, *http.Request, string) reply) func(context.Context, *http.Request, string) reply {
	return func(ctx context.Context, r *http.Request, client string) reply {
		if h.cfg.Webhooks == nil {
			return errReply(webhooksOff)
		}
		return f(ctx, r, client)
	}
}

// post serves POST /v1/webhook_endpoints.
func (h *hooks) post(ctx context.Context, r *http.Request, client string) reply {
	key, err := keyIfAny(r)
	if err != nil {
		return errReply(err)
	}
	body, err := readBody(r)
	if err != nil {
		return errReply(err)
	}
	if _, err := h.decode(ctx, body, true); err != nil {
		return errReply(err) // refused here, before it travels
	}
	home := h.cfg.Region
	if key != "" {
		home = AccountKeyHome(h.cfg.Regions.Names(), client, "webhook_endpoint/"+key)
	}
	return h.fwd.do(ctx, home, h.create, Call{Client: client, Key: key, Body: body})
}

// decode reads and checks a create's body: its URL's form and, when
// resolve, where its host points (the Guard).
func (h *hooks) decode(ctx context.Context, body []byte, resolve bool) (WebhookEndpointRequest, error) {
	var req WebhookEndpointRequest
	if err := decodeStrict(body, &req, "url", "types"); err != nil {
		return req, err
	}
	u, err := webhooks.CheckURL(req.URL, h.guard.Allowed)
	if err != nil {
		return req, err
	}
	if err := checkEventTypes(req.Types); err != nil {
		return req, err
	}
	if resolve {
		return req, h.guard.Check(ctx, u)
	}
	return req, nil
}

func (h *hooks) createHere(ctx context.Context, c Call) reply {
	req, err := h.decode(ctx, c.Body, true)
	if err != nil {
		return errReply(err)
	}
	id, err := h.cfg.IDs.NextString()
	if err != nil {
		return errReply(err)
	}
	secret, err := webhook.NewSecret()
	if err != nil {
		return errReply(err)
	}
	now := h.cfg.Now()
	e := webhooks.Endpoint{ID: id, Client: c.Client, URL: req.URL, Secret: secret, CreatedAt: now, UpdatedAt: now}
	for _, t := range req.Types {
		e.Types = append(e.Types, ledger.EventType(t))
	}
	var hash []byte
	if c.Key != "" {
		sum := sha256.Sum256(c.Body)
		hash = sum[:]
	}
	e, created, err := h.cfg.Webhooks.Create(ctx, e, c.Key, hash)
	if err != nil {
		return errReply(err)
	}
	h.push(ctx, e)
	rep := jsonReply(http.StatusCreated, endpointBody(e, true))
	rep.Header = map[string]string{"Location": "/v1/webhook_endpoints/" + e.ID}
	if !created {
		rep.Header[HeaderReplayed] = "true"
	}
	return rep
}

// push sends an endpoint's version to every other region and, when each
// has it, records it pushed; a region that does not answer gets it from
// the sync loop.
func (h *hooks) push(ctx context.Context, e webhooks.Endpoint) {
	body, _ := json.Marshal(peerEndpoint(e)) // cannot fail: strings, numbers, times
	all := true
	for _, region := range h.cfg.Regions.Names() {
		if region == h.cfg.Region {
			continue
		}
		if rep := h.fwd.do(ctx, region, h.put, Call{Client: e.Client, ID: e.ID, Body: body}); rep.Status != http.StatusOK {
			all = false
			h.cfg.Log.Warn("webhook endpoint not pushed", "endpoint", e.ID, "region", region, "status", rep.Status)
		}
	}
	if all {
		if err := h.cfg.Webhooks.Pushed(ctx, e.ID, e.Version); err != nil {
			h.cfg.Log.Warn("webhook endpoint push not recorded", "endpoint", e.ID, "err", err)
		}
	}
}

// SyncWebhooks pushes, every every, the endpoint versions this region
// wrote that some region does not hold yet, until ctx ends.
func (s *Handler) SyncWebhooks(ctx context.Context, every time.Duration) {
	if s.cfg.Webhooks == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		eps, err := s.cfg.Webhooks.Unpushed(ctx, 100)
		if err != nil && ctx.Err() == nil {
			s.cfg.Log.Warn("webhook sync failed", "err", err)
		}
		for _, e := range eps {
			s.hooks.push(ctx, e)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// peerEndpointBody is an endpoint as a home pushes it: everything a region
// needs to deliver to it, the secrets included.
type peerEndpointBody struct {
	Client         string    `json:"client"`
	URL            string    `json:"url"`
	Types          []string  `json:"types"`
	Secret         string    `json:"secret"`
	PreviousSecret string    `json:"previous_secret,omitempty"`
	PreviousUntil  time.Time `json:"previous_until,omitzero"`
	Status         string    `json:"status"`
	DisabledReason string    `json:"disabled_reason,omitempty"`
	Version        int64     `json:"version"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func peerEndpoint(e webhooks.Endpoint) peerEndpointBody {
	b := peerEndpointBody{Client: e.Client, URL: e.URL, Types: []string{}, Secret: e.Secret, PreviousSecret: e.PreviousSecret,
		PreviousUntil: e.PreviousUntil, Status: string(e.Status), DisabledReason: e.DisabledReason, Version: e.Version,
		CreatedAt: e.CreatedAt, UpdatedAt: e.UpdatedAt}
	for _, t := range e.Types {
		b.Types = append(b.Types, string(t))
	}
	return b
}

// putHere writes a copy pushed by the endpoint's home, checked as any
// input: the ID homed in another region, the call's client the body's, a
// URL and types a create would take, secrets that are secrets, a known
// status and a positive version.
func (h *hooks) putHere(ctx context.Context, c Call) reply {
	var b peerEndpointBody
	if err := decodeStrict(c.Body, &b, "client", "url", "types", "secret", "previous_secret", "previous_until", "status",
		"disabled_reason", "version", "created_at", "updated_at"); err != nil {
		return errReply(err)
	}
	e := webhooks.Endpoint{ID: c.ID, Client: b.Client, URL: b.URL, Secret: b.Secret, PreviousSecret: b.PreviousSecret,
		PreviousUntil: b.PreviousUntil, Status: webhooks.Status(b.Status), DisabledReason: b.DisabledReason, Version: b.Version,
		CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt}
	for _, t := range b.Types {
		e.Types = append(e.Types, ledger.EventType(t))
	}
	if err := h.checkCopy(c, e); err != nil {
		return errReply(err)
	}
	if _, err := h.cfg.Webhooks.Put(ctx, e); err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, struct{}{})
}

func (h *hooks) checkCopy(c Call, e webhooks.Endpoint) error {
	bad := func(why string) error {
		return ledger.Errorf(ledger.CodeInvalidRequest, "put_webhook_endpoint %s: %s", e.ID, why)
	}
	if home, _ := h.fwd.homeOf("id", e.ID); home == h.cfg.Region {
		return bad("an endpoint homed here is written here, not pushed")
	}
	if e.Client != c.Client {
		return bad("the body's client is not the call's")
	}
	if _, err := webhooks.CheckURL(e.URL, h.guard.Allowed); err != nil {
		return err
	}
	if err := ledger.CheckEventTypes(e.Types); err != nil {
		return err
	}
	for _, s := range []string{e.Secret, e.PreviousSecret} {
		if s != "" && webhook.CheckSecret(s) != nil {
			return bad("a secret is not a signing secret")
		}
	}
	if e.Secret == "" || e.Version < 1 || !slices.Contains([]webhooks.Status{webhooks.Enabled, webhooks.Disabled, webhooks.Deleted}, e.Status) {
		return bad("a secret, a positive version and a known status are required")
	}
	return nil
}
