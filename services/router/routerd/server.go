// Package routerd wires one region's router: its NATS connection and route
// stream, the forwarder that moves accepted commands to their home regions,
// the relay of the ledger's outbox, and its /metrics. cmd/paymesh and
// internal/testbed/cluster run it.
package routerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsconn"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/router"
)

// Config is everything a region's router needs.
type Config struct {
	Region       string
	Regions      *idgen.Regions
	PostgresURL  string // the region's database, whose outbox the relay reads
	NATSURL      string // the region's servers: one URL, or a comma-separated list (every server of a cluster)
	NATSUser     string // the router's user on that server (platform/natsauth); empty if it has none
	NATSPassword string
	// NATSCA is the PEM file of the authority that signs the servers'
	// certificates: set, every connection requires TLS (natsconn.Config.CAFile).
	NATSCA  string
	Shards  int           // ledger subjects per region, as the ledgers
	AckWait time.Duration // how long a forward may take before it is retried (see router.Config)
	// DuplicateWindow is the route stream's Nats-Msg-Id window (default
	// ledgerstream.DefaultDuplicateWindow).
	DuplicateWindow time.Duration
	// StreamReplicas is how many servers of the region's JetStream
	// cluster keep ROUTE_<R> (0 means 1; 3 for a cluster of three), as the
	// region's API has it. Open sets it on an existing stream too; it fails
	// for a count outside 1 to ledgerstream.MaxReplicas or above the region's
	// servers.
	StreamReplicas int
	// StreamLimits bounds ROUTE_<R>'s size (zero fields:
	// ledgerstream.DefaultLimits), as the region's API has it; a full
	// stream refuses submits. Open sets it on an existing stream too.
	StreamLimits ledgerstream.Limits
	// WrapJetStream, if set, wraps the JetStream handle the router builds
	// on its connection before anything uses it: the forwarder, the relay,
	// Submit and JetStream all go through what it returns. It is where a
	// decorator of the handle goes, such as one that counts or traces
	// publishes and their PubAcks.
	WrapJetStream func(jetstream.JetStream) jetstream.JetStream
	// Stats, if set, receives the counters (kept across restarts by the
	// caller); a new one is made otherwise.
	Stats *router.Stats
	// MetricsListen is where /metrics is served ("" for nowhere,
	// "127.0.0.1:0" for a free port).
	MetricsListen string
	// ConnectTimeout bounds how long Open waits for Postgres and NATS to
	// answer (0: one attempt each).
	ConnectTimeout time.Duration
	Log            *slog.Logger
}

// Server is a running region router.
type Server struct {
	cfg     Config
	pool    *pgxpool.Pool
	nc      *nats.Conn
	js      jetstream.JetStream
	rt      *router.Router
	store   *postgres.Store
	metrics *telemetry.Served
}

// Open connects to the region's database and NATS server, waiting for each
// up to cfg.ConnectTimeout, creates the route stream and starts /metrics.
// It returns an error naming what could not be reached.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.StreamReplicas != 0 {
		// Refused before anything is opened.
		if err := ledgerstream.CheckReplicas(cfg.StreamReplicas); err != nil {
			return nil, fmt.Errorf("router %s: %w", cfg.Region, err)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg}
	if err := s.open(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("router %s: %w", cfg.Region, err), s.Close())
	}
	return s, nil
}

func (s *Server) open(ctx context.Context) error {
	cfg := s.cfg
	if err := pgdb.Wait(ctx, cfg.PostgresURL, cfg.ConnectTimeout, cfg.Log); err != nil {
		return err
	}
	var err error
	if s.pool, err = postgres.Connect(ctx, cfg.PostgresURL, time.Minute, 0); err != nil {
		return err
	}
	s.nc, err = natsconn.Connect(ctx, natsconn.Config{URL: cfg.NATSURL, User: cfg.NATSUser, Password: cfg.NATSPassword, CAFile: cfg.NATSCA,
		Name: "paymesh-router-" + cfg.Region, Timeout: cfg.ConnectTimeout, Log: cfg.Log})
	if err != nil {
		return err
	}
	if s.js, err = router.NewJetStream(s.nc, cfg.AckWait); err != nil {
		return err
	}
	if cfg.WrapJetStream != nil {
		s.js = cfg.WrapJetStream(s.js)
	}
	if err := router.EnsureStream(ctx, s.js, cfg.Region, cfg.DuplicateWindow, cfg.StreamReplicas, cfg.StreamLimits); err != nil {
		return err
	}
	stats := cfg.Stats
	if stats == nil {
		stats = &router.Stats{}
	}
	// The metrics first: the router records each duplicate's age in them.
	var ages *telemetry.DuplicateAges
	if cfg.MetricsListen != "" {
		s.metrics, err = telemetry.ServeNew(cfg.MetricsListen, cfg.Log, func(m *telemetry.Metrics) error {
			if err := ObserveRouter(m, cfg.Region, stats); err != nil {
				return err
			}
			if ages, err = telemetry.NewDuplicateAges(m, cfg.Region, "router"); err != nil {
				return err
			}
			if err := m.ObserveBacklog(cfg.Region, router.Stream(cfg.Region), Pending(s.js, cfg.Region)); err != nil {
				return err
			}
			return m.ObserveFill(cfg.Region, router.Stream(cfg.Region), ledgerstream.FillOf(s.js, router.Stream(cfg.Region)))
		})
	}
	s.rt = router.New(s.js, router.Config{Region: cfg.Region, Regions: cfg.Regions, Shards: cfg.Shards, AckWait: cfg.AckWait,
		Stats: stats, Observe: func(ctx context.Context, stage router.Stage, c ledger.Caught) {
			ages.Record(ctx, StageTopic(stage), string(c.Layer), string(c.Cause), c.Age)
		}})
	s.store = postgres.New(s.pool, postgres.Config{Region: cfg.Region, Regions: cfg.Regions})
	return err
}

// Router returns the region's router, to submit commands through.
func (s *Server) Router() *router.Router { return s.rt }

// JetStream returns the router's JetStream handle: a connection with the
// router's permissions, the only one that may publish to ledger subjects.
func (s *Server) JetStream() jetstream.JetStream { return s.js }

// MetricsURL returns the address of /metrics, or "" when it is not served.
func (s *Server) MetricsURL() string {
	if s.metrics == nil {
		return ""
	}
	return s.metrics.URL
}

// Run forwards the route stream to the home regions and relays the
// ledger's outbox until ctx ends. It returns the forwarder's set-up error.
func (s *Server) Run(ctx context.Context) error {
	s.cfg.Log.Info("router running", "region", s.cfg.Region, "stream", router.Stream(s.cfg.Region), "metrics", s.MetricsURL())
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	relayLog := s.cfg.Log.With("service", "relay")
	wg.Go(func() { s.rt.RunRelay(ctx, outbox{s.store, s.store.WatchOutbox(ctx, relayLog)}, relayLog) })
	err := s.rt.RunForwarder(ctx, s.cfg.Log.With("service", "forwarder"))
	cancel()
	wg.Wait()
	return err
}

// Close stops /metrics and closes the NATS connection and the database
// pool, in that order. It returns the metrics server's error.
func (s *Server) Close() error {
	var err error
	if s.metrics != nil {
		err = s.metrics.Close()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	return err
}
