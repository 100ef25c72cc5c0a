// Package api serves paymesh's JSON HTTP API in every region. Any region
// answers for any ID: a request for an account or transfer homed elsewhere
// is forwarded to its home region over NATS (request-reply on
// paymesh.api.<region>), which answers from its own database; no region reads
// another region's database.
//
// POST /v1/transfers requires an Idempotency-Key (IETF draft "The
// Idempotency-Key HTTP Header Field", Stripe's behaviour): the key is scoped
// to the authenticated client and kept in the home region of the source
// account. The first response is stored there, by the ledger in the same
// transaction as the debit (or by the API if it answers first), and every
// repeat, in any region, gets it back unchanged with Idempotent-Replayed:
// true. The same key with another body is 422, a repeat while the first is
// in flight is 409.
//
// The files follow the resources served: accounts.go, transfers.go (with
// the two paths of a transfer's key, unclaimed.go and claimed.go, and the
// wait for its answer, answer.go), holds.go (captures, voids and refunds)
// and ops.go (the operator endpoints); the plumbing they share is auth.go
// (API keys, roles, rate limits), forward.go (a call run in its home
// region) and forwardcheck.go (a forwarded call checked on receipt),
// recover.go (a panic answered), reply.go and problem.go (the answers).
package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/webhooks"
)

// Submitter hands a command to the region's router.
type Submitter interface {
	Submit(ctx context.Context, cmd ledger.Command) (bool, error)
}

// Config configures a region's API.
type Config struct {
	Region  string
	Regions *idgen.Regions
	IDs     *idgen.Generator // mints transfer IDs in Region
	// Ledger is the region's ledger (accounts and transfers), Store the
	// API's own clients and idempotency keys.
	Ledger Ledger
	Store  Store
	Router Submitter
	NATS   *nats.Conn
	// DeadLetters, if set, serves the operator endpoints (/v1/ops/...) on
	// the region's dead letters; without it they answer 503
	// operator_api_disabled.
	DeadLetters DeadLetters
	// Webhooks, if set, serves the webhook endpoints
	// (/v1/webhook_endpoints, POST /v1/events/{id}/redeliver) from the
	// region's webhook store; without it they answer 503
	// webhooks_disabled. WebhookGuard checks their URLs (default: no host
	// allowed but public ones).
	Webhooks     Webhooks
	WebhookGuard *webhooks.Guard
	// Wait is how long POST /v1/transfers waits for a final state before it
	// answers 202 (default 2 s).
	Wait time.Duration
	// KeyTTL is how long idempotency keys are kept (default 24 h).
	KeyTTL time.Duration
	// Answers, if set, is this process's subject for the ledger's answer
	// notifications (subjects.Answers): Router must send it with each
	// request (router.Config.AnswerTo), and Listen subscribes to it.
	// Without it a waiting request learns of its answer from the poll
	// alone.
	Answers string
	// AnswerPoll is how often the keys of waiting requests are read when
	// no notification came (default 50 ms): the fallback for a lost one.
	AnswerPoll time.Duration
	// ClientCacheTTL is how long a client found by its API key is kept in
	// memory (default 2 s; negative: not at all). A revoked key keeps
	// working for up to this long.
	ClientCacheTTL time.Duration
	// ClaimKeys makes every transfer request claim its idempotency key in
	// a commit of its own before it is submitted (the claimed path). By
	// default a request is submitted unclaimed, and the ledger's
	// transaction stores its key (unclaimed.go): a commit less.
	// Claiming keeps one semantic across several API processes of a
	// region: a repeat with another body while the first is in flight in
	// another process gets 422, where unclaimed it gets 409 (and 422 once
	// the first is answered).
	ClaimKeys bool
	// Apply, if set, applies the region's transfer requests in this
	// process, in group commits of the region's ledger transaction
	// (direct.go), and the ledger stream carries only those it could not
	// apply; ApplyStats counts their results as the ledger's consumer
	// counts its own (default: a Stats of the Handler's). Without Apply
	// every request is submitted to the ledger stream (Router). The
	// claimed path (ClaimKeys) always submits.
	Apply      ledgerstream.Applier
	ApplyStats *ledger.Stats
	// ApplyPID returns the Postgres backend process ID of Apply's one
	// connection (nil: unknown). A request whose own transaction may still
	// be running when its wait runs out recognises that transaction's key
	// lock by it, and stores its 202; another's means 409.
	ApplyPID func() uint32
	// Now is the clock the idempotency keys' creation, leases, expiry and
	// cleanup are measured by (default time.Now); the fault-injection
	// suite steps it.
	Now func() time.Time
	// WrapForwardReader, if set, decorates how the calls other regions
	// forward to this one are read and checked (ForwardReader): an audit
	// or metrics of what peers send and what is refused, say.
	WrapForwardReader func(ForwardReader) ForwardReader
	// Duplicate, if set, is told each duplicate the Idempotency-Key layer
	// caught (a replay: its topic, cause and age), with the request's
	// context and span.
	Duplicate func(ctx context.Context, c ledger.Caught)
	Log       *slog.Logger
}

// Stats counts the API's idempotency outcomes. The zero value is ready.
type Stats struct {
	Replays    atomic.Int64 // repeats answered with the stored response (of every topic)
	Mismatches atomic.Int64 // keys reused with another body (422)
	InFlight   atomic.Int64 // repeats while the first was in flight (409)
	Unclaimed  atomic.Int64 // requests submitted without claiming their key first
	Direct     atomic.Int64 // requests answered from a transaction of this process (direct.go)
	Handed     atomic.Int64 // requests tried here and then submitted to the ledger stream
	// panics counts the panics recovered while serving, by where
	// (recover.go); refused the forwarded calls refused before they ran,
	// by why (forwarder.check).
	panics  [numPanicSites]atomic.Int64
	refused [numRefusals]atomic.Int64
	// byTopic counts the requests that carried an Idempotency-Key into
	// the key's checks, and the replays among them, by topic: the
	// Idempotency-Key layer's duplicate rate is one over the other.
	mu      sync.Mutex
	byTopic map[ledger.Topic]*topicKeys
}

// topicKeys are one topic's keyed requests and replays.
type topicKeys struct{ keyed, replayed int64 }

func (s *Stats) topic(t ledger.Topic) *topicKeys {
	if s.byTopic == nil {
		s.byTopic = map[ledger.Topic]*topicKeys{}
	}
	k := s.byTopic[t]
	if k == nil {
		k = &topicKeys{}
		s.byTopic[t] = k
	}
	return k
}

func (s *Stats) keyed(t ledger.Topic) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.topic(t).keyed++
}

func (s *Stats) replayed(t ledger.Topic) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.topic(t).replayed++
}

// Keyed returns how many requests of topic t carried an Idempotency-Key
// into the key's checks, and how many of them were replays.
func (s *Stats) Keyed(t ledger.Topic) (keyed, replayed int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.byTopic[t]; k != nil {
		return k.keyed, k.replayed
	}
	return 0, 0
}

// Panics returns how many panics were recovered at site, each answered
// with the internal-error problem.
func (s *Stats) Panics(site PanicSite) int64 {
	if site >= numPanicSites {
		return 0
	}
	return s.panics[site].Load()
}

// Refused returns how many forwarded calls were refused for r.
func (s *Stats) Refused(r Refusal) int64 {
	if r >= numRefusals {
		return 0
	}
	return s.refused[r].Load()
}

// Handler is a region's API: the HTTP routes, and the calls other regions
// forward to this one over NATS (Listen). It is an http.Handler.
type Handler struct {
	Stats   Stats
	cfg     Config
	mux     *http.ServeMux
	routes  []string
	auth    *auth
	fwd     *forwarder
	answers *answerer
	direct  *directGroup // nil unless Config.Apply
	sub     *nats.Subscription
	told    *nats.Subscription // the ledger's answer notifications
	hooks   *hooks
}

// KeyTTL returns how long the API keeps an idempotency key: the
// Idempotency-Key layer's window.
func (s *Handler) KeyTTL() time.Duration { return s.cfg.KeyTTL }

// New returns a region's API server. Call Listen to answer forwarded
// requests from other regions.
func New(cfg Config) *Handler {
	s := &Handler{cfg: withDefaults(cfg), mux: http.NewServeMux()}
	c := &s.cfg
	s.auth = &auth{cfg: c, clients: clientCache{ttl: c.ClientCacheTTL, max: defaultClientCacheMax}}
	s.fwd = &forwarder{cfg: c, stats: &s.Stats}
	s.fwd.reader = s.fwd
	if c.WrapForwardReader != nil {
		s.fwd.reader = c.WrapForwardReader(s.fwd)
	}
	s.answers = &answerer{cfg: c, stats: &s.Stats, keys: keyWaiter{store: c.Store, poll: c.AnswerPoll},
		lately: answeredLately{span: answeredLatelySpan}}
	if c.Apply != nil {
		if c.ApplyStats == nil {
			c.ApplyStats = &ledger.Stats{}
		}
		s.direct = newDirectGroup(c.Apply, c.ApplyStats, c.Region)
	}
	seen := &accountCache{}
	unclaimed := &unclaimedPath{cfg: c, stats: &s.Stats, answers: s.answers, seen: seen, direct: s.direct}
	var path keyPath = unclaimed
	if c.ClaimKeys {
		path = &claimedPath{cfg: c, answers: s.answers, seen: seen}
	}
	s.hooks = newHooks(c, s.fwd)
	s.serve(newAccounts(c, s.fwd, seen), newTransfers(c, s.fwd, s.answers, path), newHolds(c, s.fwd, unclaimed), newAccountActions(c, s.fwd, unclaimed), newLists(c, s.fwd), &ops{cfg: c})
	return s
}

// withDefaults fills in what cfg leaves unset.
func withDefaults(cfg Config) Config {
	if cfg.Wait <= 0 {
		cfg.Wait = 2 * time.Second
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = 24 * time.Hour
	}
	if cfg.AnswerPoll <= 0 {
		cfg.AnswerPoll = defaultAnswerPoll
	}
	if cfg.ClientCacheTTL == 0 {
		cfg.ClientCacheTTL = defaultClientCacheTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// serve routes the resources' endpoints, and takes their operations from
// other regions (forwarder.register).
func (s *Handler) serve(a *accounts, t *transfers, h *holds, aa *accountActions, l *lists, o *ops) {
	s.fwd.register(a.create, a.claim, a.read, a.entries, a.statement, t.create, t.read, h.capture, h.void, h.target, h.refund,
		aa.close, aa.freeze, aa.unfreeze, l.transfers, l.accounts, l.events, s.hooks.create, s.hooks.read, s.hooks.list,
		s.hooks.remove, s.hooks.rotate, s.hooks.put, s.hooks.disable, s.hooks.attempts, s.hooks.redeliver)
	wh := s.hooks
	s.route("POST /v1/webhook_endpoints", s.auth.authed(wh.on(wh.post)))
	s.route("GET /v1/webhook_endpoints", s.auth.authed(wh.on(wh.getList)))
	s.route("GET /v1/webhook_endpoints/{id}", s.auth.authed(wh.on(wh.byID(wh.read))))
	s.route("DELETE /v1/webhook_endpoints/{id}", s.auth.authed(wh.on(wh.byID(wh.remove))))
	s.route("POST /v1/webhook_endpoints/{id}/rotate_secret", s.auth.authed(wh.on(wh.byID(wh.rotate))))
	s.route("GET /v1/webhook_endpoints/{id}/attempts", s.auth.authed(wh.on(wh.getAttempts)))
	s.route("POST /v1/events/{id}/redeliver", s.auth.authed(wh.on(wh.postRedeliver)))
	s.route("POST /v1/accounts", s.auth.authed(a.post))
	s.route("GET /v1/accounts", s.auth.authed(l.getAccounts))
	s.route("GET /v1/transfers", s.auth.authed(l.getTransfers))
	s.route("GET /v1/events", s.auth.authed(l.getEvents))
	s.route("GET /v1/accounts/{id}", s.auth.authed(a.get))
	s.route("GET /v1/accounts/{id}/entries", s.auth.authed(a.getEntries))
	s.route("GET /v1/accounts/{id}/statement", s.auth.authed(a.getStatement))
	s.route("POST /v1/accounts/{id}/close", s.auth.authed(aa.post(aa.close)))
	s.route("POST /v1/accounts/{id}/freeze", s.auth.authed(aa.post(aa.freeze)))
	s.route("POST /v1/accounts/{id}/unfreeze", s.auth.authed(aa.post(aa.unfreeze)))
	s.route("POST /v1/transfers", s.auth.authed(t.post))
	s.route("GET /v1/transfers/{id}", s.auth.authed(t.get))
	s.route("POST /v1/transfers/{id}/capture", s.auth.authed(h.postAction(h.capture)))
	s.route("POST /v1/transfers/{id}/void", s.auth.authed(h.postAction(h.void)))
	s.route("POST /v1/transfers/{id}/refunds", s.auth.authed(h.postRefund))
	s.route("GET /v1/ops/dead-letters", s.auth.operator(o.list))
	s.route("GET /v1/ops/dead-letters/{seq}", s.auth.operator(o.show))
	s.route("POST /v1/ops/dead-letters/{seq}/replay", s.auth.operator(o.replay))
	s.route("POST /v1/ops/dead-letters/{seq}/discard", s.auth.operator(o.discard))
	s.route("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.route("GET /readyz", s.readyz)
	s.route("GET /openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(OpenAPI)
	})
}

func (s *Handler) route(pattern string, h http.HandlerFunc) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, h)
}

// Routes lists the method and path patterns the server handles.
func (s *Handler) Routes() []string { return append([]string(nil), s.routes...) }

// Listen answers operations forwarded by other regions until Close, and
// takes the ledger's answer notifications (Config.Answers).
func (s *Handler) Listen() error {
	sub, err := s.fwd.listen()
	if err != nil {
		return err
	}
	s.sub = sub
	if s.cfg.Answers != "" {
		if s.told, err = s.cfg.NATS.Subscribe(s.cfg.Answers, s.answered); err != nil {
			return fmt.Errorf("api listen: %w", err)
		}
	}
	return nil
}

// answered takes the ledger's notification that it answered keys: the
// requests waiting for them get the answer it carries, or read their
// answers now. A malformed one is dropped (the poll still finds every
// answer).
func (s *Handler) answered(m *nats.Msg) {
	a, err := ledgerstream.DecodeAnsweredKeys(m.Data)
	if err != nil {
		s.cfg.Log.Warn("answer notification dropped", "err", err)
		return
	}
	keys := make([]IdempotencyKey, len(a.Keys))
	for i, k := range a.Keys {
		keys[i] = IdempotencyKey{ClientID: k.Client, Key: k.Key, TransferID: k.TransferID, Status: k.Status, Body: k.Body,
			Final: k.Status != http.StatusAccepted}
	}
	s.answers.keys.answered(keys)
}

// Applying returns how many requests wait for, or are in, a transaction
// of this process's own (direct.go): effects it may still commit. Zero
// when it applies nothing itself (Config.Apply unset).
func (s *Handler) Applying() int64 {
	if s.direct == nil {
		return 0
	}
	return s.direct.queued()
}

// Close stops answering forwarded operations and taking notifications,
// and applying here once the transactions already queued have run.
func (s *Handler) Close() {
	if s.direct != nil {
		s.direct.close()
	}
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
	}
	if s.told != nil {
		_ = s.told.Unsubscribe()
	}
}

func (s *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Store.Ping(r.Context()); err != nil || !s.cfg.NATS.IsConnected() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// CleanupKeys deletes the idempotency keys expired by the API's clock, and
// returns how many.
func (s *Handler) CleanupKeys(ctx context.Context) (int64, error) {
	return s.cfg.Store.DeleteExpiredKeys(ctx, s.cfg.Now())
}

// RunCleanup deletes expired idempotency keys now and then every interval
// until ctx ends.
func (s *Handler) RunCleanup(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := s.CleanupKeys(ctx); err != nil {
			if ctx.Err() == nil {
				s.cfg.Log.Warn("idempotency key cleanup", "err", err)
			}
		} else if n > 0 {
			s.cfg.Log.Info("idempotency keys expired", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
