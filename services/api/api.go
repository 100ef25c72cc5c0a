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
package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
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
	Log *slog.Logger
}

// Stats counts the API's idempotency outcomes. The zero value is ready.
type Stats struct {
	Replays    atomic.Int64 // repeats answered with the stored response
	Mismatches atomic.Int64 // keys reused with another body (422)
	InFlight   atomic.Int64 // repeats while the first was in flight (409)
	Unclaimed  atomic.Int64 // requests submitted without claiming their key first
	Direct     atomic.Int64 // requests answered from a transaction of this process (direct.go)
	Handed     atomic.Int64 // requests tried here and then submitted to the ledger stream
}

// Handler is a region's API: the HTTP routes, and the calls other regions
// forward to this one over NATS (Listen). It is an http.Handler.
type Handler struct {
	Stats    Stats
	cfg      Config
	mux      *http.ServeMux
	routes   []string
	limiters sync.Map // client id -> *rate.Limiter
	sub      *nats.Subscription
	answers  *nats.Subscription
	keys     keyWaiter
	clients  clientCache
	accounts accountCache // the accounts seen: who may submit unclaimed (unclaimed.go)
	inflight inFlight     // the unclaimed requests submitted and not answered yet
	lately   answeredLately
	direct   *directGroup // nil unless Config.Apply
}

// New returns a region's API server. Call Listen to answer forwarded
// requests from other regions.
func New(cfg Config) *Handler {
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
	s := &Handler{cfg: cfg, mux: http.NewServeMux(), keys: keyWaiter{store: cfg.Store, poll: cfg.AnswerPoll},
		clients: clientCache{ttl: cfg.ClientCacheTTL, max: defaultClientCacheMax}, lately: answeredLately{span: answeredLatelySpan}}
	if cfg.Apply != nil {
		if cfg.ApplyStats == nil {
			cfg.ApplyStats = &ledger.Stats{}
			s.cfg.ApplyStats = cfg.ApplyStats
		}
		s.direct = newDirectGroup(cfg.Apply, cfg.ApplyStats)
	}
	s.route("POST /v1/accounts", s.authed(s.postAccount))
	s.route("GET /v1/accounts/{id}", s.authed(s.getAccount))
	s.route("GET /v1/accounts/{id}/entries", s.authed(s.getEntries))
	s.route("POST /v1/transfers", s.authed(s.postTransfer))
	s.route("GET /v1/transfers/{id}", s.authed(s.getTransfer))
	s.route("POST /v1/transfers/{id}/capture", s.authed(s.postAction(ledger.TypeCapture)))
	s.route("POST /v1/transfers/{id}/void", s.authed(s.postAction(ledger.TypeVoid)))
	s.route("POST /v1/transfers/{id}/refunds", s.authed(s.postRefund))
	s.route("GET /v1/ops/dead-letters", s.operator(s.listDeadLetters))
	s.route("GET /v1/ops/dead-letters/{seq}", s.operator(s.showDeadLetter))
	s.route("POST /v1/ops/dead-letters/{seq}/replay", s.operator(s.replayDeadLetter))
	s.route("POST /v1/ops/dead-letters/{seq}/discard", s.operator(s.discardDeadLetter))
	s.route("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.route("GET /readyz", s.readyz)
	s.route("GET /openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write(OpenAPI)
	})
	return s
}

func (s *Handler) route(pattern string, h http.HandlerFunc) {
	s.routes = append(s.routes, pattern)
	s.mux.HandleFunc(pattern, h)
}

// Routes lists the method and path patterns the server handles.
func (s *Handler) Routes() []string { return append([]string(nil), s.routes...) }

// ServeHTTP serves the API.
func (s *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// call is one operation, run in the home region of what it touches; it
// travels between regions as JSON.
type call struct {
	Op     string          `json:"op"`
	Client string          `json:"client"`
	ID     string          `json:"id,omitempty"`
	Key    string          `json:"key,omitempty"`
	After  int64           `json:"after,omitempty"`
	Limit  int             `json:"limit,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	// Target is, for a refund, the accounts of the transfer it refunds.
	Target *refundTarget `json:"target,omitempty"`
	// transfer is Body decoded, when the call runs in the process that
	// decoded it (a forwarded call decodes its body again).
	transfer *TransferRequest
}

// reply is an operation's HTTP answer.
type reply struct {
	Status int               `json:"status"`
	Header map[string]string `json:"header,omitempty"`
	Body   []byte            `json:"body"`
}

func errReply(err error) reply {
	st, b := problem(err)
	return reply{Status: st, Header: map[string]string{"Content-Type": "application/problem+json"}, Body: b}
}

func jsonReply(status int, v any) reply {
	b, _ := json.Marshal(v)
	return reply{Status: status, Body: b}
}

// do runs c in region home: here, or over NATS in the home region.
func (s *Handler) do(ctx context.Context, home string, c call) reply {
	if home == s.cfg.Region {
		return s.run(ctx, c)
	}
	req, _ := json.Marshal(c)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Wait+5*time.Second)
	defer cancel()
	out := nats.NewMsg(ForwardSubject(home))
	out.Data = req
	natstrace.Inject(ctx, out)
	msg, err := s.cfg.NATS.RequestMsgWithContext(ctx, out)
	if err != nil {
		return errReply(ledger.Errorf(CodeRegionUnavailable, "region %s did not answer: %v", home, err))
	}
	var rep reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return errReply(fmt.Errorf("reply from %s: %w", home, err))
	}
	return rep
}

// ForwardSubject is where region's API takes the calls forwarded from other
// regions; only API users may publish or subscribe to it (platform/natsauth).
func ForwardSubject(region string) string { return subjects.API(region) }

// maxForwarded bounds the calls from other regions served at once.
const maxForwarded = 256

// Listen answers operations forwarded by other regions until Close.
func (s *Handler) Listen() error {
	// A subscription's callback runs one message at a time, and a transfer
	// may wait for its final state: each call gets a goroutine of its own,
	// up to maxForwarded at once.
	slots := make(chan struct{}, maxForwarded)
	sub, err := s.cfg.NATS.QueueSubscribe(ForwardSubject(s.cfg.Region), "api", func(m *nats.Msg) {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			var c call
			rep := errReply(ledger.Errorf(ledger.CodeInvalidRequest, "malformed forwarded call"))
			if err := json.Unmarshal(m.Data, &c); err == nil {
				ctx, cancel := context.WithTimeout(natstrace.Extract(context.Background(), m.Header), s.cfg.Wait+4*time.Second)
				rep = s.run(ctx, c)
				cancel()
			}
			b, _ := json.Marshal(rep)
			_ = m.Respond(b)
		}()
	})
	if err != nil {
		return fmt.Errorf("api listen: %w", err)
	}
	s.sub = sub
	if s.cfg.Answers != "" {
		if s.answers, err = s.cfg.NATS.Subscribe(s.cfg.Answers, s.answered); err != nil {
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
	s.keys.answered(keys)
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
	if s.answers != nil {
		_ = s.answers.Unsubscribe()
	}
}

func (s *Handler) run(ctx context.Context, c call) reply {
	switch c.Op {
	case "create_account":
		return s.createAccount(ctx, c)
	case "get_account":
		return s.readAccount(ctx, c)
	case "list_entries":
		return s.listEntries(ctx, c)
	case "create_transfer":
		return s.createTransfer(ctx, c)
	case "get_transfer":
		return s.readTransfer(ctx, c)
	case ledger.TypeCapture, ledger.TypeVoid:
		return s.actOnHold(ctx, c)
	case "refund_target":
		return s.readRefundTarget(ctx, c)
	case "create_refund":
		return s.createRefund(ctx, c)
	}
	return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "unknown operation %q", c.Op))
}

func write(w http.ResponseWriter, rep reply) {
	for k, v := range rep.Header {
		w.Header().Set(k, v)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(rep.Status)
	_, _ = w.Write(rep.Body)
}

// authed serves a client endpoint: the key must be a client's (an
// operator's is refused with 403 client_only: operators move no money).
func (s *Handler) authed(h func(context.Context, *http.Request, string) reply) http.HandlerFunc {
	return s.keyed(RoleClient, func(ctx context.Context, r *http.Request, c RegisteredClient) reply { return h(ctx, r, c.ID) })
}

// operator serves an operator endpoint: the key must be an operator's (a
// client's is refused with 403 operator_only).
func (s *Handler) operator(h func(context.Context, *http.Request, RegisteredClient) reply) http.HandlerFunc {
	return s.keyed(RoleOperator, func(ctx context.Context, r *http.Request, op RegisteredClient) reply {
		if s.cfg.DeadLetters == nil { // the API runs without the region's operator NATS user
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
func (s *Handler) keyed(role Role, h func(context.Context, *http.Request, RegisteredClient) reply) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		reqID := r.Header.Get("X-Request-Id")
		if reqID == "" {
			reqID = strconv.FormatInt(time.Now().UnixNano(), 36)
		}
		w.Header().Set("X-Request-Id", reqID)
		key, ok := bearer(r)
		var client RegisteredClient
		if ok {
			var err error
			if client, ok, err = s.client(r.Context(), key); err != nil {
				s.logRefused(r, "", reqID, err)
				write(w, errReply(err))
				return
			}
		}
		if !ok {
			err := ledger.Errorf(CodeUnauthorized, "a valid API key is required (Authorization: Bearer <key>)")
			s.logRefused(r, "", reqID, err)
			w.Header().Set("WWW-Authenticate", `Bearer realm="paymesh"`)
			write(w, errReply(err))
			return
		}
		if client.RoleOf() != role {
			err := forbidden[role]
			s.logRefused(r, client.ID, reqID, err)
			write(w, errReply(err))
			return
		}
		if wait := s.limit(client); wait > 0 {
			err := ledger.Errorf(CodeRateLimited, "over %d requests per second", client.RatePerSec)
			s.logRefused(r, client.ID, reqID, err)
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			write(w, errReply(err))
			return
		}
		rep := h(r.Context(), r, client)
		if r.Method != http.MethodGet && rep.Status >= 400 {
			s.logRefused(r, client.ID, reqID, errors.New(string(rep.Body)))
		}
		write(w, rep)
	}
}

// client returns the client whose API key is key, from the cache while
// its entry lasts, or false.
func (s *Handler) client(ctx context.Context, key string) (RegisteredClient, bool, error) {
	hash, now := sha256.Sum256([]byte(key)), time.Now()
	if c, ok := s.clients.get(hash, now); ok {
		return c, true, nil
	}
	c, ok, err := s.cfg.Store.ClientByKey(ctx, hash[:])
	if ok && err == nil {
		s.clients.put(hash, c, now)
	}
	return c, ok, err
}

func (s *Handler) logRefused(r *http.Request, client, reqID string, err error) {
	s.cfg.Log.Warn("request refused", "method", r.Method, "path", r.URL.Path, "client", client, "request_id", reqID, "reason", err.Error())
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
func (s *Handler) limit(c RegisteredClient) time.Duration {
	v, _ := s.limiters.LoadOrStore(c.ID, rate.NewLimiter(rate.Limit(c.RatePerSec), c.RatePerSec))
	l := v.(*rate.Limiter)
	res := l.Reserve()
	if d := res.Delay(); d > 0 {
		res.Cancel()
		return d
	}
	return 0
}

// readBody reads a request's JSON body. A body sent with a Content-Type
// other than JSON is refused (a request without one is read as JSON).
func (s *Handler) readBody(r *http.Request) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, ledger.Errorf(CodeUnsupportedMediaType, "Content-Type %q: the body must be application/json", ct)
		}
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, ledger.Errorf(ledger.CodeInvalidRequest, "read body: %v", err)
	}
	if len(b) > MaxBodyBytes {
		return nil, ledger.Errorf(CodeBodyTooLarge, "body over the %d-byte limit", MaxBodyBytes)
	}
	return b, nil
}

func (s *Handler) home(id string) (string, error) {
	r, err := s.cfg.Regions.HomeRegion(id)
	if err != nil {
		return "", ledger.Errorf(ledger.CodeNotFound, "no such object %q", id)
	}
	return r, nil
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
