// Package receiverd runs the reference webhook receiver (services/receiver)
// as a service, behind paymesh receiver: its database migrated, deliveries
// taken at /webhooks, the gaps that last reported (logged, at /gaps and on
// /metrics), and its counts on /metrics.
package receiverd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/receiver"
)

// Config configures a receiver service.
type Config struct {
	// Listen is the deliveries' address (default 127.0.0.1:0);
	// MetricsListen /metrics' ("" serves none).
	Listen, MetricsListen string
	PostgresURL           string
	// ConnectTimeout bounds the wait for Postgres at start (default 30 s).
	ConnectTimeout time.Duration
	// Secrets verify deliveries (the endpoint's secret, and during a
	// rotation the one before).
	Secrets []string
	// GapTimeout is how long a parked event waits before its gap is
	// reported (default 10 minutes).
	GapTimeout time.Duration
	Log        *slog.Logger
}

// Path is where deliveries are posted.
const Path = "/webhooks"

// Server is a running receiver.
type Server struct {
	cfg     Config
	pool    *pgxpool.Pool
	recv    *receiver.Receiver
	ln      net.Listener
	http    *http.Server
	metrics *telemetry.Served
	gaps    atomic.Int64
}

// Open connects to the database, waiting up to cfg.ConnectTimeout,
// migrates it, and binds cfg.Listen. It returns an error naming what could
// not be reached, migrated or bound, or a secret that is not one.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.GapTimeout <= 0 {
		cfg.GapTimeout = 10 * time.Minute
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 30 * time.Second
	}
	if err := receiver.CheckSecrets(cfg.Secrets); err != nil {
		return nil, err // before anything is opened
	}
	s := &Server{cfg: cfg}
	if err := s.open(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("receiver: %w", err), s.Close())
	}
	return s, nil
}

func (s *Server) open(ctx context.Context) error {
	cfg := s.cfg
	if err := pgdb.Wait(ctx, cfg.PostgresURL, cfg.ConnectTimeout, cfg.Log); err != nil {
		return err
	}
	var err error
	if s.pool, err = pgxpool.New(ctx, cfg.PostgresURL); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	if err := pgdb.Migrate(ctx, s.pool, receiver.Migrations()); err != nil {
		return err
	}
	if s.recv, err = receiver.New(receiver.Config{DB: s.pool, Secrets: cfg.Secrets, Effects: receiver.Orders{}, Log: cfg.Log}); err != nil {
		return err
	}
	if cfg.MetricsListen != "" {
		if s.metrics, err = telemetry.ServeNew(cfg.MetricsListen, cfg.Log, s.observe); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.Handle(Path, s.recv)
	mux.HandleFunc("GET /gaps", s.serveGaps)
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// Receiver returns the receiver the service runs.
func (s *Server) Receiver() *receiver.Receiver { return s.recv }

// URL is where deliveries are posted: the endpoint's URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + Path }

// MetricsURL is the /metrics address ("" when none is served).
func (s *Server) MetricsURL() string {
	if s.metrics == nil {
		return ""
	}
	return s.metrics.URL
}

// serveGaps answers GET /gaps: the gaps older than the gap timeout.
func (s *Server) serveGaps(w http.ResponseWriter, r *http.Request) {
	gaps, err := s.recv.Gaps(r.Context(), s.cfg.GapTimeout)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Gaps []receiver.Gap `json:"gaps"`
	}{append([]receiver.Gap{}, gaps...)})
}

// Run serves deliveries, and reports lasting gaps, until ctx ends, then
// lets the deliveries in progress finish. It returns the HTTP server's
// error.
func (s *Server) Run(ctx context.Context) error {
	s.cfg.Log.Info("receiver listening", "url", s.URL(), "metrics", s.MetricsURL())
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.watchGaps(ctx) })
	wg.Go(func() {
		<-ctx.Done()
		shut, done := context.WithTimeout(context.Background(), 10*time.Second)
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

// watchGaps reads the lasting gaps every quarter of the gap timeout (at
// most every 30 s), logs each new one once, and keeps their number for
// /metrics.
func (s *Server) watchGaps(ctx context.Context) {
	every := min(s.cfg.GapTimeout/4, 30*time.Second)
	seen := map[receiver.Gap]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		gaps, err := s.recv.Gaps(ctx, s.cfg.GapTimeout)
		if err != nil {
			s.cfg.Log.Warn("receiver gaps not read", "err", err)
			continue
		}
		s.gaps.Store(int64(len(gaps)))
		now := map[receiver.Gap]bool{}
		for _, g := range gaps {
			key := receiver.Gap{Account: g.Account, Next: g.Next}
			now[key] = true
			if !seen[key] {
				s.cfg.Log.Warn("webhook events wait for one that has not come", "account", g.Account, "missing", g.Next,
					"parked", g.Parked, "since", g.Since)
			}
		}
		seen = now
	}
}

// Close stops /metrics and the HTTP server, and closes the pool. It returns
// the servers' errors, joined.
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
	if s.pool != nil {
		s.pool.Close()
	}
	return errors.Join(errs...)
}
