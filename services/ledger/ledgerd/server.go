// Package ledgerd wires one region's ledger: the Postgres store with its
// consume-log, the JetStream streams, the retention job and the batching
// consumers, and its /metrics, whose instruments it defines (metrics.go;
// the API exports the transfers it applies itself with them too).
// cmd/paymesh and internal/testbed/cluster run it.
package ledgerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsconn"
	"github.com/paymesh/paymesh/platform/nodelease"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/regiondb"
)

// Config is everything a region's ledger needs.
type Config struct {
	Region  string
	Regions *idgen.Regions
	// Node is the node id in the region this process mints account IDs
	// with. Open leases it in the region's database (nodelease) and fails,
	// naming the holder, while another live process holds it.
	Node uint16
	// NodeTTL is how long the node lease outlives this process after a
	// crash (default nodelease.DefaultTTL).
	NodeTTL      time.Duration
	PostgresURL  string // the region's database
	NATSURL      string // the region's servers: one URL, or a comma-separated list (every server of a cluster)
	NATSUser     string // the ledger's user on that server (platform/natsauth); empty if it has none
	NATSPassword string
	// NATSCA is the PEM file of the authority that signs the servers'
	// certificates: set, every connection requires TLS (natsconn.Config.CAFile).
	NATSCA     string
	Workers    int           // consumers in this process; each applies its own shards in order
	OwnShards  []int         // shards this process applies (default: all); give replicas disjoint sets
	BatchSize  int           // most messages per transaction
	AckWait    time.Duration // JetStream redelivery timeout
	MaxDeliver int           // deliveries before a client request is dead-lettered
	// MaxStepDeliver and MaxParkedDeliver bound a saga step's deliveries
	// (ledgerstream.ConsumerConfig; 0 takes its default).
	MaxStepDeliver, MaxParkedDeliver int
	Lease                            time.Duration // the transaction lease: longest a transaction may sit idle before Postgres ends it (postgres.Connect)
	WindowDays                       int           // consume-log retention
	CacheSize                        int           // recent-commit cache entries; 0 disables the cache
	Shards                           int           // ledger subjects per region
	// DuplicateWindow is the ledger streams' Nats-Msg-Id window (default
	// ledgerstream.DefaultDuplicateWindow).
	DuplicateWindow time.Duration
	// StreamReplicas is how many servers of the region's JetStream
	// cluster keep LEDGER_<R> and DLQ_<R> (0 means 1; 3 for a cluster of
	// three). Open sets it on existing streams too; it fails for a count
	// outside 1 to ledgerstream.MaxReplicas or above the region's servers.
	StreamReplicas int
	// StreamLimits and DLQLimits bound the sizes of LEDGER_<R> and DLQ_<R>
	// (zero fields: ledgerstream.DefaultLimits, DefaultDLQLimits). A full
	// stream refuses publishes. Open sets them on existing streams too.
	StreamLimits, DLQLimits ledgerstream.Limits
	// RelaySteps leaves every saga step to the relay (services/router):
	// the ledger then publishes none itself after its COMMIT
	// (ledgerstream.StepSender), and its NATS user needs no right to
	// publish steps, as before that right was given (platform/natsauth).
	RelaySteps bool
	// OutboxRetention is how long a sent outbox row is kept before the
	// maintenance job deletes it (default postgres.DefaultOutboxRetention;
	// negative keeps every row).
	OutboxRetention time.Duration
	// NoEvents turns the events off (postgres.Config.NoEvents); the API
	// processes of the region must agree. EventRetention is how long an
	// event is kept (default postgres.DefaultEventRetention; negative
	// keeps every one).
	NoEvents       bool
	EventRetention time.Duration
	// SyncStandbys is how many synchronous standbys the region's database
	// is meant to have (0: a single server). It is exported as
	// paymesh_postgres_standbys_expected, which the alert on a region
	// running without its standby compares with what the primary reports.
	SyncStandbys int
	// Stats, if set, receives the counters (kept across restarts by the
	// caller); a new one is made otherwise.
	Stats *ledger.Stats
	// Answers, if set, records the first answer to every client request
	// in the transaction that applies it (see postgres.Answers): whoever
	// runs the ledger with the API hands in the API's (services/api/apidb).
	// The ledger runs the API's code only through this interface, which its
	// adapter declares, so that its packages never link the API
	// (services/ledger's TestLedgerDoesNotLinkAPI).
	Answers postgres.Answers
	// AnswersSchema is the migration set of the tables Answers writes
	// (services/api/apidb's Migrations), applied at Open after the
	// ledger's own as the API's part of the region's schema
	// (services/regiondb), so that the ledger can commit whether or not the
	// API has started yet. The API applies the same set; the two are
	// serialized by pgdb.Migrate's lock. It is handed in for the reason
	// Answers is.
	AnswersSchema *pgdb.Migration
	// Observe receives the applied batches and saga stages (default: the
	// histograms of /metrics when MetricsListen is set).
	Observe ledgerstream.Observer
	// WrapJetStream, if set, decorates the JetStream handle the ledger
	// builds, before its consumers, topology and dead-letter publishes use
	// it: traces or metrics of its deliveries and acks, say.
	WrapJetStream func(jetstream.JetStream) jetstream.JetStream
	// WrapConsumeLog, if set, decorates the consume-log the store uses
	// (see postgres.ConsumeLog): traces or metrics of its claims, say. The
	// retention job runs on the undecorated log.
	WrapConsumeLog func(postgres.ConsumeLog) postgres.ConsumeLog
	// WrapApplier, if set, decorates what the ledger's consumers apply
	// their batches with (the store): traces or timings of each batch,
	// say.
	WrapApplier func(ledgerstream.Applier) ledgerstream.Applier
	// MaxAttempts is the store's retry budget per transaction (see
	// postgres.Config; default 8).
	MaxAttempts uint
	// Now is the store's clock, by which holds expire (see
	// postgres.Config; default time.Now).
	Now func() time.Time
	// MetricsListen is where /metrics is served ("" for nowhere,
	// "127.0.0.1:0" for a free port).
	MetricsListen string
	// ConnectTimeout bounds how long Open waits for Postgres and NATS to
	// answer (0: one attempt each).
	ConnectTimeout time.Duration
	Log            *slog.Logger
}

// Server is a running region ledger.
type Server struct {
	cfg   Config
	Store *postgres.Store
	Stats *ledger.Stats
	Topo  ledgerstream.Topology
	pool  *pgxpool.Pool
	lease *nodelease.Lease
	nc    *nats.Conn
	js    jetstream.JetStream
	dedup *dedup.Log
	// steps publishes the saga steps of each committed batch (made by
	// Run, after open set up the Observer); nil with Config.RelaySteps.
	steps *ledgerstream.StepSender
	// metrics serves /metrics; nil when it is not served.
	metrics *telemetry.Served
	// census counts the region's dead letters for /metrics; nil when it
	// is not served.
	census *dlq.Census
}

// censusEvery is how often the dead-letter census reads DLQ_<R>: one
// stream info when nothing changed.
const censusEvery = 5 * time.Second

// Open connects to Postgres and NATS, migrates the database and creates the
// streams. It returns an error naming what could not be reached.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.StreamReplicas != 0 {
		// Refused before anything is opened.
		if err := ledgerstream.CheckReplicas(cfg.StreamReplicas); err != nil {
			return nil, fmt.Errorf("ledger %s: %w", cfg.Region, err)
		}
	}
	if _, err := idgen.NewGenerator(cfg.Regions, cfg.Region, cfg.Node); err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	s := &Server{cfg: cfg, Stats: cfg.Stats,
		Topo: ledgerstream.Topology{Region: cfg.Region, Shards: cfg.Shards, DuplicateWindow: cfg.DuplicateWindow, Replicas: cfg.StreamReplicas,
			Limits: cfg.StreamLimits, DLQLimits: cfg.DLQLimits}}
	if err := s.open(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("ledger %s: %w", cfg.Region, err), s.Close())
	}
	return s, nil
}

// withDefaults returns cfg with its unset fields given their defaults.
func withDefaults(cfg Config) Config {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.EventRetention == 0 {
		cfg.EventRetention = postgres.DefaultEventRetention
	}
	if cfg.OutboxRetention == 0 {
		cfg.OutboxRetention = postgres.DefaultOutboxRetention
	}
	if cfg.Stats == nil {
		cfg.Stats = &ledger.Stats{}
	}
	return cfg
}

// open connects, leases the node, builds the store, migrates the region's
// database, creates the streams and starts /metrics, in that order. What
// it opened is released by Close.
func (s *Server) open(ctx context.Context) error {
	gen, err := s.connectPostgres(ctx)
	if err != nil {
		return err
	}
	if err := s.connectNATS(ctx); err != nil {
		return err
	}
	s.newStore(gen)
	// The ledger's own part, and the API's when this ledger writes the
	// API's answers: its transaction needs their tables.
	if err := regiondb.Migrate(ctx, s.pool, regiondb.Schema{Ledger: s.Store, API: s.cfg.AnswersSchema}); err != nil {
		return err
	}
	if err := ledgerstream.EnsureStreams(ctx, s.js, s.Topo); err != nil {
		return err
	}
	if s.cfg.MetricsListen != "" {
		if s.metrics, err = telemetry.ServeNew(s.cfg.MetricsListen, s.cfg.Log, s.observe); err != nil {
			return err
		}
	}
	return nil
}

// connectPostgres waits for the region's database, opens the pool with
// the transaction lease and leases the node, whose ID generator it returns.
func (s *Server) connectPostgres(ctx context.Context) (*idgen.Generator, error) {
	cfg := s.cfg
	if err := pgdb.Wait(ctx, cfg.PostgresURL, cfg.ConnectTimeout, cfg.Log); err != nil {
		return nil, err
	}
	var err error
	if s.pool, err = postgres.Connect(ctx, cfg.PostgresURL, cfg.Lease, 0); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	gen, lease, err := nodelease.OpenGenerator(ctx, s.pool, cfg.Regions, nodelease.Config{Region: cfg.Region, Node: cfg.Node,
		Holder: fmt.Sprintf("ledger %s pid %d", host, os.Getpid()), TTL: cfg.NodeTTL, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	s.lease = lease
	return gen, nil
}

// connectNATS connects to the region's servers as the ledger's user.
func (s *Server) connectNATS(ctx context.Context) error {
	cfg := s.cfg
	var err error
	s.nc, err = natsconn.Connect(ctx, natsconn.Config{URL: cfg.NATSURL, User: cfg.NATSUser, Password: cfg.NATSPassword, CAFile: cfg.NATSCA,
		Name: "paymesh-ledger-" + cfg.Region, Timeout: cfg.ConnectTimeout, Log: cfg.Log})
	if err != nil {
		return err
	}
	// Asynchronous publishes (the saga steps) time out, so that PubAcks
	// never answered cannot pile up pending.
	if s.js, err = jetstream.New(s.nc, jetstream.WithPublishAsyncTimeout(ledgerstream.StepAckWait)); err != nil {
		return err
	}
	if cfg.WrapJetStream != nil {
		s.js = cfg.WrapJetStream(s.js)
	}
	return nil
}

// newStore builds the consume-log, decorated by WrapConsumeLog, and the
// store that applies with it and mints account IDs with gen.
func (s *Server) newStore(gen *idgen.Generator) {
	cfg := s.cfg
	var cache *dedup.Cache
	if cfg.CacheSize > 0 {
		cache = dedup.NewCache(cfg.CacheSize)
	}
	host, _ := os.Hostname()
	s.dedup = dedup.New(dedup.Config{
		Holder: fmt.Sprintf("%s/%s-%d/%d", cfg.Region, host, os.Getpid(), cfg.Node), WindowDays: cfg.WindowDays, Cache: cache,
	})
	consumeLog := postgres.NewConsumeLog(s.dedup)
	if cfg.WrapConsumeLog != nil {
		consumeLog = cfg.WrapConsumeLog(consumeLog)
	}
	handoff := ledgerstream.DefaultStepHandoff // the steps the ledger publishes itself
	if cfg.RelaySteps {
		handoff = 0
	}
	s.Store = postgres.New(s.pool, postgres.Config{Region: cfg.Region, IDs: gen, Regions: cfg.Regions, Dedup: consumeLog, Stats: s.Stats,
		Answers: cfg.Answers, MaxAttempts: cfg.MaxAttempts, Now: cfg.Now, NoEvents: cfg.NoEvents, StepHandoff: handoff,
		OnRetry: func(op string, attempt int, err error) {
			cfg.Log.Debug("transaction retried", "op", op, "attempt", attempt, "err", err)
		}})
}

// observe registers the ledger's counters, its store's gauges and, unless
// the caller gave an Observer, its batch and saga histograms with m.
func (s *Server) observe(m *telemetry.Metrics) error {
	if s.cfg.Observe.Batch == nil && s.cfg.Observe.Stage == nil && s.cfg.Observe.Duplicate == nil {
		o, err := NewObserver(m, s.cfg.Region, s.Topo.Stream())
		if err != nil {
			return err
		}
		s.cfg.Observe = o
	}
	if err := ObserveLedger(m, s.cfg.Region, s.Topo.Stream(), s.Stats); err != nil {
		return err
	}
	if err := m.ObserveBacklog(s.cfg.Region, s.Topo.Stream(), Pending(s.js, s.Topo)); err != nil {
		return err
	}
	for _, stream := range []string{s.Topo.Stream(), s.Topo.DLQStream()} {
		if err := m.ObserveFill(s.cfg.Region, stream, ledgerstream.FillOf(s.js, stream)); err != nil {
			return err
		}
	}
	// The windows the ledger's layers catch duplicates within: the
	// consume-log's retention, the ledger stream's Msg-Id window.
	if err := m.ObserveWindows(s.cfg.Region, map[string]time.Duration{
		string(ledger.LayerConsumeLog): s.dedup.Window(), string(ledger.LayerMsgID): s.Topo.Window(),
	}); err != nil {
		return err
	}
	s.census = dlq.NewCensus(s.js, s.cfg.Region)
	if err := ObserveDeadLetters(m, s.cfg.Region, s.census); err != nil {
		return err
	}
	if err := ObserveDatabase(m, s.cfg.Region, s.Store, s.cfg.SyncStandbys); err != nil {
		return err
	}
	return ObserveStore(m, s.cfg.Region, s.Store)
}

// MetricsURL returns the address of /metrics, or "" when it is not served.
func (s *Server) MetricsURL() string {
	if s.metrics == nil {
		return ""
	}
	return s.metrics.URL
}

// JetStream returns the server's JetStream handle.
func (s *Server) JetStream() jetstream.JetStream { return s.js }

// Run runs the retention jobs (consume-log partitions, outbox pruning), the
// dead-letter census (when /metrics is served) and the consumers until ctx
// ends. It returns the first consumer set-up error.
func (s *Server) Run(ctx context.Context) error {
	s.cfg.Log.Info("ledger running", "region", s.cfg.Region, "stream", s.Topo.Stream(), "shards", s.cfg.OwnShards, "workers", s.cfg.Workers, "metrics", s.MetricsURL())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.dedup.RunRetention(ctx, s.pool, time.Hour, s.cfg.Log) })
	if s.cfg.OutboxRetention > 0 {
		wg.Go(func() {
			s.runPrune(ctx, time.Hour, "outbox", s.cfg.OutboxRetention, s.Store.PruneOutbox, &s.Stats.OutboxPruned)
		})
	}
	if s.cfg.EventRetention > 0 {
		wg.Go(func() {
			s.runPrune(ctx, time.Hour, "events", s.cfg.EventRetention, s.Store.PruneEvents, &s.Stats.EventsPruned)
		})
	}
	if s.census != nil {
		wg.Go(func() { s.census.Run(ctx, censusEvery, s.cfg.Log) })
	}
	if !s.cfg.RelaySteps {
		s.steps = ledgerstream.NewStepSender(s.js, s.Topo, s.Store, s.Stats, s.cfg.Observe.Duplicate, s.cfg.Log)
		wg.Go(func() { s.steps.Run(ctx) })
	}
	errs := make(chan error, max(s.cfg.Workers, 1))
	own := s.cfg.OwnShards
	if len(own) == 0 {
		own = ledgerstream.AllShards(s.Topo)
	}
	var applier ledgerstream.Applier = s.Store
	if s.cfg.WrapApplier != nil {
		applier = s.cfg.WrapApplier(applier)
	}
	for _, shards := range ledgerstream.Split(own, min(s.cfg.Workers, len(own))) {
		c := ledgerstream.NewConsumer(s.js, applier, ledgerstream.ConsumerConfig{
			Topology: s.Topo, Shards: shards, BatchSize: s.cfg.BatchSize, AckWait: s.cfg.AckWait,
			MaxDeliver: s.cfg.MaxDeliver, MaxStepDeliver: s.cfg.MaxStepDeliver, MaxParkedDeliver: s.cfg.MaxParkedDeliver,
			Regions: s.cfg.Regions, Stats: s.Stats, Log: s.cfg.Log,
			Observe: s.cfg.Observe, Steps: s.steps,
		})
		wg.Go(func() {
			if err := c.Run(ctx); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	return errors.Join(<-errs)
}

// runPrune deletes what, the rows older than retention (sent outbox rows,
// events), with prune now and then every interval until ctx ends,
// counting them in pruned and logging each run that deleted any; a failed
// run is retried at the next tick.
func (s *Server) runPrune(ctx context.Context, every time.Duration, what string, retention time.Duration,
	prune func(context.Context, time.Duration, int) (int64, error), pruned *atomic.Int64) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := prune(ctx, retention, 0)
		pruned.Add(n)
		switch {
		case err != nil && ctx.Err() == nil:
			s.cfg.Log.Error(what+" prune failed", "err", err, "pruned", n)
		case n > 0:
			s.cfg.Log.Info(what+" pruned", "rows", n, "retention", retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops /metrics, closes the NATS connection, releases the node
// lease and closes the database pool, in that order, each if Open got
// that far. It returns the errors of the metrics server and the release,
// joined.
func (s *Server) Close() error {
	var errs []error
	if s.metrics != nil {
		errs = append(errs, s.metrics.Close())
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
