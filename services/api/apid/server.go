// Package apid wires one region's HTTP API: its database pool (it migrates
// the API's part of the region's schema, services/regiondb), its NATS connection
// (forwarded calls and the submitting router), optionally a second one as
// the region's operator user for the dead-letter endpoints
// (services/ledger/dlq), the HTTP listener, the idempotency-key cleanup and
// its /metrics. cmd/paymesh and
// internal/testbed/cluster run it.
package apid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsconn"
	"github.com/paymesh/paymesh/platform/nodelease"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/regiondb"
	"github.com/paymesh/paymesh/services/router"
	"github.com/paymesh/paymesh/services/webhooks"
	"github.com/paymesh/paymesh/services/webhooks/delivery"
	"github.com/paymesh/paymesh/services/webhooks/webhookdb"
)

// Config is everything a region's API needs.
type Config struct {
	Region  string
	Regions *idgen.Regions
	// Node is the node id in the region for the transfer IDs this process
	// mints. Open leases it in the region's database (nodelease) and
	// fails, naming the holder, while another live process holds it.
	Node uint16
	// NodeTTL is how long the node lease outlives this process after a
	// crash (default nodelease.DefaultTTL).
	NodeTTL      time.Duration
	PostgresURL  string // the region's database
	NATSURL      string // the region's servers: one URL, or a comma-separated list (every server of a cluster)
	NATSUser     string // the API's user on that server (platform/natsauth); empty if it has none
	NATSPassword string
	// NATSCA is the PEM file of the authority that signs the servers'
	// certificates: set, every connection requires TLS (natsconn.Config.CAFile).
	NATSCA string
	// OpsNATSUser is the region's operator user on the same server
	// (ops-<region>, platform/natsauth). With it the API serves
	// the operator endpoints on the region's dead letters (/v1/ops/...,
	// through services/ledger/dlq); without it they answer 503
	// operator_api_disabled.
	OpsNATSUser     string
	OpsNATSPassword string
	// OpsWait bounds how long a replay waits for the ledger's outcome
	// (default 10 s, within the HTTP write timeout).
	OpsWait time.Duration
	Shards  int           // ledger subjects per region, as the ledgers
	AckWait time.Duration // the submitting router's publish timeout (see router.Config)
	// DuplicateWindow is the route stream's Nats-Msg-Id window (default
	// ledgerstream.DefaultDuplicateWindow); the API makes sure the stream exists.
	DuplicateWindow time.Duration
	// StreamReplicas is how many servers of the region's JetStream
	// cluster keep ROUTE_<R>, which the API creates or updates as the
	// region's router does (0 means 1; give both the same count, or each
	// start scales the stream to its own). Open fails for a count outside
	// 1 to ledgerstream.MaxReplicas or above the region's servers.
	StreamReplicas int
	// StreamLimits bounds ROUTE_<R>'s size, as the region's router has
	// it (zero fields: ledgerstream.DefaultLimits).
	StreamLimits ledgerstream.Limits
	// RouterStats, if set, counts the API's submissions (with the region
	// router's, in one process).
	RouterStats *router.Stats
	// Wait, KeyTTL, AnswerPoll, ClientCacheTTL, ClaimKeys and Now
	// configure the API (see api.Config).
	Wait           time.Duration
	KeyTTL         time.Duration
	AnswerPoll     time.Duration
	ClientCacheTTL time.Duration
	ClaimKeys      bool
	Now            func() time.Time
	// NoEvents turns the events off in what the API applies itself and
	// in the accounts it opens (postgres.Config.NoEvents), as the
	// region's ledgers are set.
	NoEvents bool
	// NoWebhooks turns webhooks off: the endpoints answer 503
	// webhooks_disabled, and no delivery runs. By default the API keeps
	// the region's webhook endpoints and delivers its events
	// (services/webhooks).
	NoWebhooks bool
	// WebhookAllowHosts are the hosts an endpoint may name though they
	// are not public addresses (webhooks.Guard): loopback in the demo and
	// the simulation, an operator's own receivers.
	WebhookAllowHosts []string
	// WebhookSchedule and WebhookTimeout configure delivery (zero:
	// webhooks.DefaultSchedule, 10 s).
	WebhookSchedule webhooks.Schedule
	WebhookTimeout  time.Duration
	// WebhookStats, if set, counts the deliveries (default: the server's).
	WebhookStats *delivery.Stats
	// SubmitAll makes the API submit every transfer request to the ledger
	// stream. By default it applies its region's requests itself, in
	// group commits of the ledger's transaction (api.Config.Apply), and
	// submits only those it could not apply.
	SubmitAll bool
	// LedgerStats, if set, counts the results of the transfers applied
	// here (with the region ledger's, in one process). The API's /metrics
	// exports them as the ledger's, with consumer="api".
	LedgerStats *ledger.Stats
	// WrapConsumeLog, if set, decorates the consume-log of the transfers
	// applied here, as the ledger's (ledgerd.Config.WrapConsumeLog).
	WrapConsumeLog func(postgres.ConsumeLog) postgres.ConsumeLog
	// WrapJetStream, if set, decorates the JetStream handle the API
	// builds, before its router and forwarded calls use it.
	WrapJetStream func(jetstream.JetStream) jetstream.JetStream
	// WrapStore, if set, decorates the API's store before the API uses it:
	// cross-cutting concerns such as tracing, metrics or logging of every
	// key and client lookup wrap the api.Store interface here instead of
	// living in the adapter.
	WrapStore func(api.Store) api.Store
	// WrapForwardReader, if set, decorates how the API reads and checks
	// the calls other regions forward to it (api.Config.WrapForwardReader):
	// an audit of what peers send, say.
	WrapForwardReader func(api.ForwardReader) api.ForwardReader
	// Listen is the HTTP address (default 127.0.0.1:0, a free port).
	Listen string
	// MetricsListen is where /metrics is served ("" for nowhere,
	// "127.0.0.1:0" for a free port).
	MetricsListen string
	// ConnectTimeout bounds how long Open waits for Postgres and NATS to
	// answer (0: one attempt each).
	ConnectTimeout time.Duration
	Log            *slog.Logger
}

// defaultWait is api.Config's default Wait, from which the HTTP write
// timeout is derived.
const defaultWait = 2 * time.Second

// Server is a running region API.
type Server struct {
	cfg  Config
	pool *pgxpool.Pool
	// ages records the duplicates the API's Idempotency-Key layer caught
	// (nil without metrics: nothing); set once the metrics are made, which
	// is after the API answers forwarded calls.
	ages atomic.Pointer[telemetry.DuplicateAges]
	// applyPool is the connection of the transactions the API runs
	// itself (api.Config.Apply), nil with SubmitAll.
	applyPool *pgxpool.Pool
	lease     *nodelease.Lease
	nc        *nats.Conn
	opsNC     *nats.Conn // the operator user's connection, when configured
	api       *api.Handler
	store     *apidb.Store
	// accounts counts what the ledger adapter does for the API: the
	// account ID collisions of the accounts it opens.
	accounts *ledger.Stats
	ln       net.Listener
	http     *http.Server
	metrics  *telemetry.Served
	// deliver is the region's webhook delivery worker (nil with
	// NoWebhooks).
	deliver    *delivery.Worker
	deliverCfg delivery.Config
}

// Open connects to the region's database and NATS server, waiting for each
// up to cfg.ConnectTimeout, answers forwarded calls, binds cfg.Listen and
// starts /metrics. It returns an error naming what could not be reached or
// bound.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.StreamReplicas != 0 {
		// Refused before anything is opened.
		if err := ledgerstream.CheckReplicas(cfg.StreamReplicas); err != nil {
			return nil, fmt.Errorf("api %s: %w", cfg.Region, err)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Wait <= 0 {
		cfg.Wait = defaultWait
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	s := &Server{cfg: cfg}
	if err := s.open(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("api %s: %w", cfg.Region, err), s.Close())
	}
	return s, nil
}

func (s *Server) open(ctx context.Context) error {
	cfg := s.cfg
	if _, err := idgen.NewGenerator(cfg.Regions, cfg.Region, cfg.Node); err != nil {
		return err
	}
	if err := pgdb.Wait(ctx, cfg.PostgresURL, cfg.ConnectTimeout, cfg.Log); err != nil {
		return err
	}
	var err error
	if s.pool, err = postgres.Connect(ctx, cfg.PostgresURL, time.Minute, 0); err != nil {
		return err
	}
	host, _ := os.Hostname()
	gen, lease, err := nodelease.OpenGenerator(ctx, s.pool, cfg.Regions, nodelease.Config{Region: cfg.Region, Node: cfg.Node,
		Holder: fmt.Sprintf("api %s pid %d", host, os.Getpid()), TTL: cfg.NodeTTL, Log: cfg.Log})
	if err != nil {
		return err
	}
	s.lease = lease
	rt, answers, err := s.openRouter(ctx)
	if err != nil {
		return err
	}
	// The API's own tables, migrated here as the ledger migrates its own,
	// and the dead-letter audit's when it serves the operator endpoints.
	if err := regiondb.Migrate(ctx, s.pool, regiondb.Schema{API: new(apidb.Migrations()), DeadLetters: cfg.OpsNATSUser != ""}); err != nil {
		return err
	}
	s.store = apidb.New(s.pool)
	var store api.Store = s.store
	if cfg.WrapStore != nil {
		store = cfg.WrapStore(store)
	}
	// The API reads the ledger's accounts and transfers through api.Ledger,
	// an interface it declares, handed the ledger's Postgres adapter here:
	// services/api does not import the adapter (see openApply).
	s.accounts = &ledger.Stats{}
	led := postgres.New(s.pool, postgres.Config{Region: cfg.Region, Regions: cfg.Regions, IDs: gen, Stats: s.accounts, NoEvents: cfg.NoEvents})
	acfg := api.Config{Region: cfg.Region, Regions: cfg.Regions, IDs: gen, Ledger: led, Store: store, Router: rt, NATS: s.nc,
		Answers: answers, AnswerPoll: cfg.AnswerPoll, ClientCacheTTL: cfg.ClientCacheTTL, ClaimKeys: cfg.ClaimKeys, Wait: cfg.Wait, KeyTTL: cfg.KeyTTL, Now: cfg.Now,
		WrapForwardReader: cfg.WrapForwardReader, Log: cfg.Log, Duplicate: s.recordDuplicate}
	if !cfg.SubmitAll {
		if err := s.openApply(ctx, gen, &acfg); err != nil {
			return err
		}
	}
	if cfg.OpsNATSUser != "" {
		if acfg.DeadLetters, err = s.openOps(ctx); err != nil {
			return err
		}
	}
	if !cfg.NoWebhooks {
		if err := s.openWebhooks(ctx, led, &acfg); err != nil {
			return err
		}
	}
	s.api = api.New(acfg)
	if err := s.api.Listen(); err != nil {
		return err
	}
	if !cfg.NoWebhooks {
		s.deliverCfg.Disabled = s.api.EndpointDisabled
		if s.deliver, err = delivery.New(s.deliverCfg); err != nil {
			return err
		}
	}
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// A transfer may wait cfg.Wait for its final state before it is
	// answered, and a replay OpsWait for the ledger's outcome: the write
	// timeout leaves room for the longer and the write.
	s.http = &http.Server{Handler: otelhttp.NewHandler(s.api, "paymesh api",
		otelhttp.WithSpanOptions(trace.WithAttributes(attribute.String("paymesh.region", cfg.Region)))), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: max(cfg.Wait, cfg.OpsWait, defaultOpsWait) + 15*time.Second, IdleTimeout: time.Minute}
	if cfg.MetricsListen != "" {
		s.metrics, err = telemetry.ServeNew(cfg.MetricsListen, cfg.Log, func(m *telemetry.Metrics) error { return s.observe(m, acfg.ApplyStats) })
	}
	return err
}

// openWebhooks migrates the webhook tables and configures the endpoints'
// store and the delivery worker, which open makes once the API that it
// tells of disabled endpoints is, and Run runs.
func (s *Server) openWebhooks(ctx context.Context, led *postgres.Store, acfg *api.Config) error {
	if err := regiondb.Migrate(ctx, s.pool, regiondb.Schema{Webhooks: true}); err != nil {
		return err
	}
	store := webhookdb.New(s.pool).RecordingEvents(led)
	guard := webhooks.NewGuard(s.cfg.WebhookAllowHosts)
	acfg.Webhooks, acfg.WebhookGuard = store, guard
	if s.cfg.WebhookStats == nil {
		s.cfg.WebhookStats = &delivery.Stats{}
	}
	s.deliverCfg = delivery.Config{Store: store, Bodies: api.EventBodies{Ledger: led}, Guard: guard, Schedule: s.cfg.WebhookSchedule,
		Timeout: s.cfg.WebhookTimeout, Stats: s.cfg.WebhookStats, Log: s.cfg.Log}
	return nil
}

// openRouter connects to the region's servers as the API's user and
// returns the router the API submits through, on its route stream, and
// the subject on which the ledger answers this process.
func (s *Server) openRouter(ctx context.Context) (rt *router.Router, answers string, err error) {
	cfg := s.cfg
	s.nc, err = natsconn.Connect(ctx, natsconn.Config{URL: cfg.NATSURL, User: cfg.NATSUser, Password: cfg.NATSPassword, CAFile: cfg.NATSCA,
		Name: "paymesh-api-" + cfg.Region, Timeout: cfg.ConnectTimeout, Log: cfg.Log})
	if err != nil {
		return nil, "", err
	}
	js, err := router.NewJetStream(s.nc, cfg.AckWait)
	if err != nil {
		return nil, "", err
	}
	if cfg.WrapJetStream != nil {
		js = cfg.WrapJetStream(js)
	}
	if err := router.EnsureStream(ctx, js, cfg.Region, cfg.DuplicateWindow, cfg.StreamReplicas, cfg.StreamLimits); err != nil {
		return nil, "", err
	}
	// The ledger tells this process, on a subject of its own (named by
	// its node, which no other live process of the region holds), which
	// of the requests it submitted are answered.
	answers = subjects.Answers(cfg.Region, strconv.Itoa(int(cfg.Node)))
	rt = router.New(js, router.Config{Region: cfg.Region, Regions: cfg.Regions, Shards: cfg.Shards, AckWait: cfg.AckWait,
		Stats: cfg.RouterStats, AnswerTo: answers})
	return rt, answers, nil
}

// openApply sets acfg's Apply to the region's ledger transaction, run
// here: its consume-log claims under a holder of this process (the node it
// leased, whose IDs gen mints), and the requests' first answers stored
// with their keys. The API asks it through ledgerstream.Applier, and the
// ledger's transaction stores the API's answers through postgres.Answers,
// which this wiring hands the API's adapter. Each service declares what it
// runs of the other's code: the ledger's packages never link the API
// (services/ledger's TestLedgerDoesNotLinkAPI), services/api imports no
// ledger adapter, and a transfer is still applied in the one transaction
// the ledger defines, whichever process runs it.
func (s *Server) openApply(ctx context.Context, gen *idgen.Generator, acfg *api.Config) error {
	cfg := s.cfg
	// One connection, as the group runs one transaction at a time: its
	// backend tells this process's key locks from others'.
	var err error
	if s.applyPool, acfg.ApplyPID, err = postgres.ConnectOne(ctx, cfg.PostgresURL, time.Minute); err != nil {
		return err
	}
	acfg.ApplyStats = cfg.LedgerStats
	if acfg.ApplyStats == nil {
		acfg.ApplyStats = &ledger.Stats{}
	}
	host, _ := os.Hostname()
	consumeLog := postgres.NewConsumeLog(dedup.New(dedup.Config{Holder: fmt.Sprintf("%s/api-%s-%d/%d", cfg.Region, host, os.Getpid(), cfg.Node)}))
	if cfg.WrapConsumeLog != nil {
		consumeLog = cfg.WrapConsumeLog(consumeLog)
	}
	acfg.Apply = postgres.New(s.applyPool, postgres.Config{Region: cfg.Region, Regions: cfg.Regions, IDs: gen, Dedup: consumeLog, NoEvents: cfg.NoEvents,
		Answers: apidb.LockingAnswers{}, Stats: acfg.ApplyStats})
	return nil
}

// observe registers the API's counters with m and, unless the region's
// ledger exports them (Config.LedgerStats), applied's under the ledger's
// names: the counts of the transfers this process applies itself, nil when
// it applies none.
func (s *Server) observe(m *telemetry.Metrics, applied *ledger.Stats) error {
	if err := ObserveAPI(m, s.cfg.Region, &s.api.Stats); err != nil {
		return err
	}
	ages, err := telemetry.NewDuplicateAges(m, s.cfg.Region, "api")
	if err != nil {
		return err
	}
	s.ages.Store(ages)
	if err := m.ObserveWindows(s.cfg.Region, map[string]time.Duration{string(ledger.LayerIdempotencyKey): s.api.KeyTTL()}); err != nil {
		return err
	}
	if err := ObserveAccounts(m, s.cfg.Region, s.accounts); err != nil {
		return err
	}
	if s.deliver != nil {
		if err := ObserveWebhooks(m, s.cfg.Region, s.cfg.WebhookStats, s.deliverCfg.Store.Backlogs); err != nil {
			return err
		}
	}
	if applied == nil || s.cfg.LedgerStats != nil {
		return nil // the region's ledger exports the shared counters
	}
	return ledgerd.ObserveApplied(m, s.cfg.Region, applied)
}

// recordDuplicate records the age of a duplicate the Idempotency-Key layer
// caught, once the metrics are made (nothing before, or without them).
func (s *Server) recordDuplicate(ctx context.Context, c ledger.Caught) {
	s.ages.Load().Record(ctx, c.Topic.String(), string(c.Layer), string(c.Cause), c.Age)
}

// defaultOpsWait is how long a replay through the API waits for the
// ledger's outcome by default.
const defaultOpsWait = 10 * time.Second

// openOps connects as the region's operator user and returns the
// region's dead-letter operations (open migrated their audit table).
func (s *Server) openOps(ctx context.Context) (*dlq.Ops, error) {
	cfg := s.cfg
	var err error
	s.opsNC, err = natsconn.Connect(ctx, natsconn.Config{URL: cfg.NATSURL, User: cfg.OpsNATSUser, Password: cfg.OpsNATSPassword, CAFile: cfg.NATSCA,
		Name: "paymesh-api-ops-" + cfg.Region, Timeout: cfg.ConnectTimeout, Log: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("operator user %s: %w", cfg.OpsNATSUser, err)
	}
	js, err := jetstream.New(s.opsNC)
	if err != nil {
		return nil, fmt.Errorf("operator user %s: %w", cfg.OpsNATSUser, err)
	}
	wait := cfg.OpsWait
	if wait <= 0 {
		wait = defaultOpsWait
	}
	return &dlq.Ops{Region: cfg.Region, JS: js, Pool: s.pool, Wait: wait}, nil
}

// The adapters the API is assembled from.
var (
	_ api.Store       = (*apidb.Store)(nil)
	_ api.Ledger      = (*postgres.Store)(nil)
	_ api.DeadLetters = (*dlq.Ops)(nil)
)

// Store returns the API's own store (clients and idempotency keys), as
// opened, without WrapStore's decorators: what an operator tool or a test
// registers clients with.
func (s *Server) Store() *apidb.Store { return s.store }

// API returns the region's API handler.
func (s *Server) API() *api.Handler { return s.api }

// URL returns the API's base URL, http://host:port.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// MetricsURL returns the address of /metrics, or "" when it is not served.
func (s *Server) MetricsURL() string {
	if s.metrics == nil {
		return ""
	}
	return s.metrics.URL
}

// Run serves HTTP and removes expired idempotency keys until ctx ends, then
// lets the requests in progress finish. It returns the HTTP server's error.
func (s *Server) Run(ctx context.Context) error {
	s.cfg.Log.Info("api listening", "region", s.cfg.Region, "url", s.URL(), "metrics", s.MetricsURL())
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.api.RunCleanup(ctx, time.Hour) })
	if s.deliver != nil {
		wg.Go(func() { _ = s.deliver.Run(ctx) })
		wg.Go(func() { s.api.SyncWebhooks(ctx, time.Second) })
	}
	wg.Go(func() {
		<-ctx.Done()
		shut, done := context.WithTimeout(context.Background(), s.cfg.Wait+5*time.Second)
		defer done()
		_ = s.http.Shutdown(shut)
	})
	err := s.http.Serve(s.ln)
	cancel()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops /metrics, the HTTP server and the answering of forwarded
// calls, then closes the NATS connection, releases the node lease and
// closes the database pool. It returns the errors of the servers and the
// release, joined.
func (s *Server) Close() error {
	var errs []error
	if s.metrics != nil {
		errs = append(errs, s.metrics.Close())
	}
	if s.http != nil {
		errs = append(errs, s.http.Close())
	}
	if s.ln != nil {
		if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if s.api != nil {
		s.api.Close() // the transactions queued here run first
	}
	if s.applyPool != nil {
		s.applyPool.Close()
	}
	if s.opsNC != nil {
		s.opsNC.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.lease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs = append(errs, s.lease.Release(ctx))
	}
	if s.pool != nil {
		s.pool.Close()
	}
	return errors.Join(errs...)
}
