// Package server wires one region's ledger: the Postgres store with its
// consume-log, the JetStream streams, the retention job and the batching
// consumers. cmd/paymesh and the demo run it.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/natsauth"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	ljs "github.com/paymesh/paymesh/services/ledger/jetstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// Config is everything a region's ledger needs.
type Config struct {
	Region       string
	Regions      *idgen.Regions
	Node         uint16 // node id in the region, unique per running ledger process
	PostgresURL  string // the region's database
	NATSURL      string // a server of the region
	NATSUser     string // the ledger's user on that server (internal/natsauth); empty if it has none
	NATSPassword string
	Workers      int           // consumers in this process; each applies its own shards in order
	OwnShards    []int         // shards this process applies (default: all); give replicas disjoint sets
	BatchSize    int           // most messages per transaction
	AckWait      time.Duration // JetStream redelivery timeout
	MaxDeliver   int           // deliveries before dead-lettering
	Lease        time.Duration // longest a transaction may sit idle before Postgres ends it
	WindowDays   int           // consume-log retention
	CacheSize    int           // recent-commit cache entries; 0 disables the cache
	Shards       int           // ledger subjects per region
	// DuplicateWindow is the ledger streams' Nats-Msg-Id window (default
	// ljs.DefaultDuplicateWindow).
	DuplicateWindow time.Duration
	// Stats, if set, receives the counters (kept across restarts by the
	// caller); a new one is made otherwise.
	Stats *ledger.Stats
	// Respond renders a client request's response, stored with its
	// idempotency key in the apply transaction (see services/api).
	Respond func(ledger.Result) (int, []byte)
	// Observe receives the applied batches and saga stages (metrics).
	Observe ljs.Observer
	// AfterCommit is the consumers' failpoint (see jetstream.ConsumerConfig).
	AfterCommit func([]jetstream.Msg) error
	// BeforeCommit is the store's failpoint (see postgres.Config).
	BeforeCommit func(ctx context.Context) error
	// Bugs are deliberate bugs for the fault-injection suite's tests only
	// (see ledger.Bugs).
	Bugs ledger.Bugs
	Log  *slog.Logger
}

// Server is a running region ledger.
type Server struct {
	cfg   Config
	Store *postgres.Store
	Stats *ledger.Stats
	Topo  ljs.Topology
	pool  *pgxpool.Pool
	nc    *nats.Conn
	js    jetstream.JetStream
	dedup *dedup.Log
}

// Open connects to Postgres and NATS, migrates the database and creates the
// streams. It returns an error naming what could not be reached.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	gen, err := idgen.NewGenerator(cfg.Regions, cfg.Region, cfg.Node)
	if err != nil {
		return nil, err
	}
	pool, err := postgres.Connect(ctx, cfg.PostgresURL, cfg.Lease, 0)
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", cfg.Region, err)
	}
	opts := append(natsauth.ConnectOptions(cfg.NATSUser, cfg.NATSPassword), nats.Name("paymesh-ledger-"+cfg.Region), nats.MaxReconnects(-1))
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("ledger %s: nats %s: %w", cfg.Region, cfg.NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		pool.Close()
		nc.Close()
		return nil, fmt.Errorf("ledger %s: %w", cfg.Region, err)
	}
	var cache *dedup.Cache
	if cfg.CacheSize > 0 {
		cache = dedup.NewCache(cfg.CacheSize)
	}
	host, _ := os.Hostname()
	stats := cfg.Stats
	if stats == nil {
		stats = &ledger.Stats{}
	}
	s := &Server{cfg: cfg, Stats: stats, pool: pool, nc: nc, js: js,
		Topo: ljs.Topology{Region: cfg.Region, Shards: cfg.Shards, DuplicateWindow: cfg.DuplicateWindow}}
	s.dedup = dedup.New(dedup.Config{
		Holder: fmt.Sprintf("%s/%s-%d/%d", cfg.Region, host, os.Getpid(), cfg.Node), Lease: cfg.Lease,
		WindowDays: cfg.WindowDays, Cache: cache,
	})
	s.Store = postgres.New(pool, postgres.Config{Region: cfg.Region, IDs: gen, Regions: cfg.Regions, Dedup: s.dedup, Stats: s.Stats,
		Respond: cfg.Respond, BeforeCommit: cfg.BeforeCommit, Bugs: cfg.Bugs,
		OnRetry: func(op string, attempt int, err error) {
			cfg.Log.Debug("transaction retried", "op", op, "attempt", attempt, "err", err)
		}})
	if err := s.Store.Migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("ledger %s: %w", cfg.Region, err)
	}
	if err := ljs.EnsureStreams(ctx, js, s.Topo); err != nil {
		s.Close()
		return nil, fmt.Errorf("ledger %s: %w", cfg.Region, err)
	}
	return s, nil
}

// JetStream returns the server's JetStream handle.
func (s *Server) JetStream() jetstream.JetStream { return s.js }

// Run runs the retention job and the consumers until ctx ends. It returns
// the first consumer set-up error.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.dedup.RunRetention(ctx, s.pool, time.Hour, s.cfg.Log) })
	errs := make(chan error, max(s.cfg.Workers, 1))
	own := s.cfg.OwnShards
	if len(own) == 0 {
		own = ljs.AllShards(s.Topo)
	}
	for _, shards := range ljs.Split(own, min(s.cfg.Workers, len(own))) {
		c := ljs.NewConsumer(s.js, s.Store, ljs.ConsumerConfig{
			Topology: s.Topo, Shards: shards, BatchSize: s.cfg.BatchSize, AckWait: s.cfg.AckWait,
			MaxDeliver: s.cfg.MaxDeliver, Regions: s.cfg.Regions, Stats: s.Stats, Log: s.cfg.Log,
			AfterCommit: s.cfg.AfterCommit, Observe: s.cfg.Observe, Bugs: s.cfg.Bugs,
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

// Close releases the connections.
func (s *Server) Close() {
	s.nc.Close()
	s.pool.Close()
}
