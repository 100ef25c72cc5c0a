package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/paymesh/paymesh/pkg/webhook"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// endpointNotFound answers an endpoint that is not, or not the caller's.
func endpointNotFound(id string) error {
	return ledger.Errorf(ledger.CodeNotFound, "no webhook endpoint %.64q", id)
}

// byID runs op for GET/DELETE/POST /v1/webhook_endpoints/{id}[/…] in the
// endpoint's home region.
func (h *hooks) byID(op operation) func(context.Context, *http.Request, string) reply {
	return func(ctx context.Context, r *http.Request, client string) reply {
		id := r.PathValue("id")
		home, err := h.fwd.home(id)
		if err != nil {
			return errReply(endpointNotFound(id))
		}
		return h.fwd.do(ctx, home, op, Call{Client: client, ID: id})
	}
}

// own returns the caller's endpoint as this region holds it.
func (h *hooks) own(ctx context.Context, c Call) (webhooks.Endpoint, error) {
	e, ok, err := h.cfg.Webhooks.Endpoint(ctx, c.ID)
	if err == nil && (!ok || e.Client != c.Client || e.Status == webhooks.Deleted) {
		err = endpointNotFound(c.ID)
	}
	return e, err
}

func (h *hooks) readHere(ctx context.Context, c Call) reply {
	e, err := h.own(ctx, c)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusOK, endpointBody(e, false))
}

// getList serves GET /v1/webhook_endpoints: every region's endpoints of
// the client that are homed there, newest first.
func (h *hooks) getList(ctx context.Context, r *http.Request, client string) reply {
	if r.URL.RawQuery != "" {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "GET /v1/webhook_endpoints takes no query (a client has at most %d)", webhooks.MaxEndpoints))
	}
	regions := h.cfg.Regions.Names()
	out := WebhookEndpointList{Endpoints: []WebhookEndpointBody{}}
	for _, region := range regions {
		rep := h.fwd.do(ctx, region, h.list, Call{Client: client})
		if rep.Status != http.StatusOK {
			return rep
		}
		var page WebhookEndpointList
		if err := json.Unmarshal(rep.Body, &page); err != nil {
			return errReply(err)
		}
		for _, e := range page.Endpoints {
			if home, err := h.fwd.homeOf("id", e.ID); err != nil || home != region {
				return errReply(ledger.Errorf(CodeInternal, "region %s listed endpoint %.64q, which it does not hold", region, e.ID))
			}
		}
		out.Endpoints = append(out.Endpoints, page.Endpoints...)
	}
	slices.SortFunc(out.Endpoints, func(a, b WebhookEndpointBody) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return jsonReply(http.StatusOK, out)
}

func (h *hooks) listHere(ctx context.Context, c Call) reply {
	eps, err := h.cfg.Webhooks.Endpoints(ctx, c.Client)
	if err != nil {
		return errReply(err)
	}
	out := WebhookEndpointList{Endpoints: []WebhookEndpointBody{}}
	for _, e := range eps {
		if home, _ := h.fwd.homeOf("id", e.ID); home == h.cfg.Region {
			out.Endpoints = append(out.Endpoints, endpointBody(e, false))
		}
	}
	return jsonReply(http.StatusOK, out)
}

// change runs a change of the caller's endpoint at its home and pushes it.
func (h *hooks) change(ctx context.Context, c Call, secret bool, edit func(*webhooks.Endpoint) error) reply {
	e, ok, err := h.cfg.Webhooks.Change(ctx, c.ID, c.Client, edit)
	if err == nil && !ok {
		err = endpointNotFound(c.ID)
	}
	if err != nil {
		return errReply(err)
	}
	h.push(ctx, e)
	return jsonReply(http.StatusOK, endpointBody(e, secret))
}

func (h *hooks) removeHere(ctx context.Context, c Call) reply {
	return h.change(ctx, c, false, func(e *webhooks.Endpoint) error {
		e.Status, e.UpdatedAt = webhooks.Deleted, h.cfg.Now()
		return nil
	})
}

func (h *hooks) rotateHere(ctx context.Context, c Call) reply {
	secret, err := webhook.NewSecret()
	if err != nil {
		return errReply(err)
	}
	return h.change(ctx, c, true, func(e *webhooks.Endpoint) error {
		now := h.cfg.Now()
		e.PreviousSecret, e.PreviousUntil, e.Secret, e.UpdatedAt = e.Secret, now.Add(RotationOverlap), secret, now
		return nil
	})
}

// disableRequest is a region's word to an endpoint's home that its
// deliveries failed for good there.
type disableRequest struct {
	Reason string `json:"reason"`
}

func (h *hooks) disableHere(ctx context.Context, c Call) reply {
	var req disableRequest
	if err := decodeStrict(c.Body, &req, "reason"); err != nil {
		return errReply(err)
	}
	if req.Reason == "" || len(req.Reason) > 1024 {
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "disable_webhook_endpoint: a reason of 1 to 1024 bytes is required"))
	}
	return h.change(ctx, c, false, func(e *webhooks.Endpoint) error {
		if e.Status == webhooks.Enabled {
			e.Status, e.DisabledReason, e.UpdatedAt = webhooks.Disabled, req.Reason, h.cfg.Now()
		}
		return nil
	})
}

// EndpointDisabled tells an endpoint's home region that its deliveries
// failed for good here (services/webhooks/delivery.Config.Disabled).
func (s *Handler) EndpointDisabled(ctx context.Context, e webhooks.Endpoint, reason string) {
	home, err := s.fwd.home(e.ID)
	if err != nil {
		return
	}
	body, _ := json.Marshal(disableRequest{Reason: reason})
	if rep := s.fwd.do(ctx, home, s.hooks.disable, Call{Client: e.Client, ID: e.ID, Body: body}); rep.Status != http.StatusOK {
		s.cfg.Log.Warn("webhook endpoint's home not told of its disabling", "endpoint", e.ID, "status", rep.Status)
	}
}

// AttemptBody is one recorded attempt of a delivery.
type AttemptBody struct {
	Event      string    `json:"event"`
	Attempt    int       `json:"attempt"`
	At         time.Time `json:"at"`
	DurationMS float64   `json:"duration_ms"`
	StatusCode int       `json:"status_code,omitempty"`
	Error      string    `json:"error,omitempty"`
}

// AttemptList is a page of GET /v1/webhook_endpoints/{id}/attempts.
type AttemptList struct {
	Attempts   []AttemptBody `json:"attempts"`
	NextCursor string        `json:"next_cursor,omitempty"`
}

// attemptQuery is what a region's page of attempts selects.
type attemptQuery struct {
	Event string                   `json:"event,omitempty"`
	After *webhookdb.AttemptCursor `json:"after,omitempty"`
}

// getAttempts serves GET /v1/webhook_endpoints/{id}/attempts?event=&limit=&cursor=:
// the endpoint's attempts, newest first, from the event's region, or from
// every region merged.
func (h *hooks) getAttempts(ctx context.Context, r *http.Request, client string) reply {
	id := r.PathValue("id")
	if _, err := h.fwd.home(id); err != nil {
		return errReply(endpointNotFound(id))
	}
	q, limit, err := readAttemptQuery(r.URL.RawQuery)
	if err != nil {
		return errReply(err)
	}
	regions := h.cfg.Regions.Names()
	if q.Event != "" {
		ref, _ := ledger.ParseEventID(q.Event)
		home, err := h.fwd.homeOf("event", ref.Account)
		if err != nil {
			return errReply(err)
		}
		regions = []string{home}
	}
	body, _ := json.Marshal(q)
	var all []AttemptBody
	for _, region := range regions {
		rep := h.fwd.do(ctx, region, h.attempts, Call{Client: client, ID: id, Body: body, Limit: limit})
		if rep.Status != http.StatusOK {
			return rep
		}
		var page AttemptList
		if err := json.Unmarshal(rep.Body, &page); err != nil {
			return errReply(err)
		}
		all = append(all, page.Attempts...)
	}
	slices.SortStableFunc(all, func(a, b AttemptBody) int { return b.At.Compare(a.At) })
	out := AttemptList{Attempts: all[:min(limit, len(all))]}
	if len(all) > limit {
		last := out.Attempts[limit-1]
		ref, _ := ledger.ParseEventID(last.Event)
		c, _ := json.Marshal(webhookdb.AttemptCursor{At: last.At, Event: ref, Attempt: last.Attempt})
		out.NextCursor = base64.RawURLEncoding.EncodeToString(c)
	}
	return jsonReply(http.StatusOK, out)
}

// readAttemptQuery reads event (an event's ID), limit and cursor.
func readAttemptQuery(raw string) (attemptQuery, int, error) {
	var q attemptQuery
	v, err := url.ParseQuery(raw)
	if err != nil {
		return q, 0, ledger.Errorf(ledger.CodeInvalidRequest, "the query does not parse: %v", err)
	}
	limit := defaultListLimit
	for name, vals := range v {
		if len(vals) != 1 {
			return q, 0, ledger.Errorf(ledger.CodeInvalidRequest, "give %s once", name)
		}
		switch name {
		case "limit":
			limit, err = parseLimit(vals[0])
		case "event":
			q.Event = vals[0]
			_, err = ledger.ParseEventID(vals[0])
		case "cursor":
			var c webhookdb.AttemptCursor
			b, derr := base64.RawURLEncoding.DecodeString(vals[0])
			if derr != nil || json.Unmarshal(b, &c) != nil || c.At.IsZero() || c.Event.Sequence < 1 || c.Attempt < 1 {
				err = ledger.Errorf(ledger.CodeInvalidRequest, "cursor=%.40q is not a cursor this list gave", vals[0])
			}
			q.After = &c
		default:
			err = ledger.Errorf(ledger.CodeInvalidRequest, "unknown query parameter %.32q (attempts take event, limit, cursor)", name)
		}
		if err != nil {
			return q, 0, err
		}
	}
	return q, limit, nil
}

func (h *hooks) attemptsHere(ctx context.Context, c Call) reply {
	e, err := h.own(ctx, c)
	if err != nil {
		return errReply(err)
	}
	var q attemptQuery
	if len(c.Body) > 0 {
		if err := decodeStrict(c.Body, &q, "event", "after"); err != nil {
			return errReply(err)
		}
	}
	var ref *ledger.EventRef
	if q.Event != "" {
		r, err := ledger.ParseEventID(q.Event)
		if err != nil {
			return errReply(err)
		}
		ref = &r
	}
	as, err := h.cfg.Webhooks.Attempts(ctx, e.ID, ref, q.After, min(max(c.Limit, 1), MaxPageLimit)+1)
	if err != nil {
		return errReply(err)
	}
	out := AttemptList{Attempts: []AttemptBody{}}
	for _, a := range as {
		out.Attempts = append(out.Attempts, AttemptBody{Event: a.Event.ID(), Attempt: a.Attempt, At: a.At.UTC(),
			DurationMS: float64(a.Duration.Microseconds()) / 1000, StatusCode: a.StatusCode, Error: a.Err})
	}
	return jsonReply(http.StatusOK, out)
}

// RedeliverRequest is the body of POST /v1/events/{id}/redeliver: the
// endpoint to send the event to again, or none for every endpoint that
// takes it.
type RedeliverRequest struct {
	Endpoint string `json:"endpoint,omitempty"`
}

// RedeliverBody says which endpoints the event was queued for.
type RedeliverBody struct {
	Event     string   `json:"event"`
	Endpoints []string `json:"endpoints"`
}

// postRedeliver serves POST /v1/events/{id}/redeliver, in the event's
// region.
func (h *hooks) postRedeliver(ctx context.Context, r *http.Request, client string) reply {
	ref, err := ledger.ParseEventID(r.PathValue("id"))
	if err != nil {
		return errReply(err)
	}
	home, err := h.fwd.home(ref.Account)
	if err != nil {
		return errReply(ledger.Errorf(ledger.CodeNotFound, "no event %.80q", r.PathValue("id")))
	}
	body, err := readBody(r)
	if err != nil {
		return errReply(err)
	}
	if strings.TrimSpace(string(body)) == "" {
		body = []byte("{}")
	}
	wrapped, _ := json.Marshal(struct {
		Event string          `json:"event"`
		Req   json.RawMessage `json:"request"`
	}{ref.ID(), body})
	return h.fwd.do(ctx, home, h.redeliver, Call{Client: client, Body: wrapped})
}

func (h *hooks) redeliverHere(ctx context.Context, c Call) reply {
	var w struct {
		Event string          `json:"event"`
		Req   json.RawMessage `json:"request"`
	}
	var req RedeliverRequest
	if err := decodeStrict(c.Body, &w, "event", "request"); err != nil {
		return errReply(err)
	}
	if err := decodeStrict(w.Req, &req, "endpoint"); err != nil {
		return errReply(err)
	}
	ref, err := ledger.ParseEventID(w.Event)
	if err == nil {
		err = h.fwd.here(c.Op, "event", ref.Account)
	}
	if err != nil {
		return errReply(err)
	}
	eps, err := h.cfg.Webhooks.Endpoints(ctx, c.Client)
	if err != nil {
		return errReply(err)
	}
	var ids []string
	for _, e := range eps {
		if req.Endpoint == "" || e.ID == req.Endpoint {
			ids = append(ids, e.ID)
		}
	}
	if req.Endpoint != "" && len(ids) == 0 {
		return errReply(endpointNotFound(req.Endpoint))
	}
	evs, err := h.cfg.Ledger.EventsAt(ctx, []ledger.EventRef{ref})
	if err == nil && (len(evs) == 0 || evs[0].Client != c.Client) {
		err = ledger.Errorf(ledger.CodeNotFound, "no event %s", ref.ID())
	}
	if err != nil {
		return errReply(err)
	}
	queued, err := h.cfg.Webhooks.Redeliver(ctx, ref, ids)
	if err != nil {
		return errReply(err)
	}
	return jsonReply(http.StatusAccepted, RedeliverBody{Event: ref.ID(), Endpoints: append([]string{}, queued...)})
}
