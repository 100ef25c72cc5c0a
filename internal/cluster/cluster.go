// Package cluster runs several paymesh regions in one process: per region a
// database, a ledger and a router (forwarder and outbox relay), on an
// embedded multi-region NATS topology. The multi-region tests and the demo
// use it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/paymesh/paymesh/internal/natsauth"
	"github.com/paymesh/paymesh/internal/natsembed"
	"github.com/paymesh/paymesh/internal/pgdb"
	"github.com/paymesh/paymesh/internal/telemetry"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	ljs "github.com/paymesh/paymesh/services/ledger/jetstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/ledger/server"
	"github.com/paymesh/paymesh/services/router"
)

// Config describes the regions to run.
type Config struct {
	// Regions maps region names to codes (from deploy/regions).
	Regions map[string]uint8
	// Topology is the running NATS topology, one server per region.
	Topology *natsembed.Topology
	// PostgresURL is the admin URL on which each region's database is
	// created as DatabasePrefix + region (dropped first).
	PostgresURL    string
	DatabasePrefix string
	Shards         int
	BatchSize      int
	AckWait        time.Duration
	// DuplicateWindow is the Nats-Msg-Id window of the route and ledger
	// streams (default ljs.DefaultDuplicateWindow).
	DuplicateWindow time.Duration
	// Inject asks, per router publish, for a duplicate (see router.Config).
	Inject func() bool
	// DropAck asks, per committed ledger batch of msgs messages, to skip
	// its acks (a forced redelivery).
	DropAck func(msgs int) bool
	// BeforeCommit runs in every ledger apply transaction just before its
	// COMMIT (a failpoint: an error aborts the transaction, as a crash
	// would).
	BeforeCommit func(ctx context.Context) error
	// Bugs are deliberate bugs for the fault-injection suite's tests only
	// (see ledger.Bugs), passed to the ledger, the router and the API; the
	// zero value is the correct ledger, router and API.
	Bugs ledger.Bugs
	// APIWait and KeyTTL configure each region's HTTP API (see api.Config).
	APIWait time.Duration
	KeyTTL  time.Duration
	// Now is the APIs' clock (see api.Config; default time.Now).
	Now func() time.Time
	// APIAddrs gives a region's API a fixed listen address; the default is
	// a random port on 127.0.0.1.
	APIAddrs map[string]string
	Log      *slog.Logger
}

// Region is one running region.
type Region struct {
	Name   string
	URL    string // database URL
	Ledger *server.Server
	Router *router.Router
	API    *api.Server
	// APIURL is the base URL of the region's HTTP API.
	APIURL string
	// MetricsURL serves the region's metrics (Prometheus text format or
	// OpenMetrics).
	MetricsURL string
	metrics    *telemetry.Metrics
	mend       *telemetry.Endpoint
	apiAddr    string // the address to listen on, kept across restarts
	http       *http.Server
	// The counters, kept across restarts.
	ledgerStats *ledger.Stats
	routerStats *router.Stats
	nc          *nats.Conn          // the router's
	apiNC       *nats.Conn          // the API's
	js          jetstream.JetStream // the router's
	stop        context.CancelFunc
	done        sync.WaitGroup
}

// Cluster is a set of running regions.
type Cluster struct {
	cfg     Config
	ids     *idgen.Regions
	regions map[string]*Region
	mu      sync.Mutex
}

// Start creates each region's database and starts its ledger and router.
// It returns an error naming the region that could not start.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Shards <= 0 {
		cfg.Shards = ljs.DefaultShards
	}
	ids, err := idgen.NewRegions(cfg.Regions)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, ids: ids, regions: map[string]*Region{}}
	for name := range cfg.Regions {
		url, err := pgdb.Create(ctx, cfg.PostgresURL, cfg.DatabasePrefix+name, true)
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		r := &Region{Name: name, URL: url}
		c.regions[name] = r
		if err := c.startRegion(ctx, r); err != nil {
			c.Stop()
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
	}
	return c, nil
}

// IDs returns the region table for IDs.
func (c *Cluster) IDs() *idgen.Regions { return c.ids }

// Region returns a running region.
func (c *Cluster) Region(name string) *Region {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.regions[name]
}

// Names returns the region names.
func (c *Cluster) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.regions {
		out = append(out, n)
	}
	return out
}

func (c *Cluster) startRegion(ctx context.Context, r *Region) error {
	var afterCommit func([]jetstream.Msg) error
	if c.cfg.DropAck != nil {
		afterCommit = func(msgs []jetstream.Msg) error {
			if c.cfg.DropAck(len(msgs)) {
				return errors.New("acks dropped")
			}
			return nil
		}
	}
	m, err := telemetry.New()
	if err != nil {
		return err
	}
	observe, err := m.LedgerObserver(r.Name, ljs.Topology{Region: r.Name}.Stream())
	if err != nil {
		return err
	}
	url := c.cfg.Topology.ClientURL(r.Name)
	// Each service connects as its own user of the region's server
	// (internal/natsauth), so it runs with the permissions it has in
	// docker-compose.
	user := func(service string) natsauth.User {
		u, err := natsauth.UserOf(r.Name, service)
		if err != nil {
			panic(err) // natsauth.Services are known
		}
		return u
	}
	connect := func(service string) (*nats.Conn, jetstream.JetStream, error) {
		u := user(service)
		opts := append(natsauth.ConnectOptions(u.Name, u.Password), nats.Name("paymesh-"+service+"-"+r.Name),
			nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("nats as %s: %w", u.Name, err)
		}
		js, err := router.NewJetStream(nc, c.cfg.AckWait)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return nc, js, nil
	}
	lu := user(natsauth.Ledger)
	srv, err := server.Open(ctx, server.Config{Observe: observe,
		Region: r.Name, Regions: c.ids, Node: 1, PostgresURL: r.URL, NATSURL: url, NATSUser: lu.Name, NATSPassword: lu.Password, Workers: 2,
		BatchSize: c.cfg.BatchSize, AckWait: c.cfg.AckWait, MaxDeliver: 1000, Shards: c.cfg.Shards, DuplicateWindow: c.cfg.DuplicateWindow,
		CacheSize: 10_000, AfterCommit: afterCommit, BeforeCommit: c.cfg.BeforeCommit, Bugs: c.cfg.Bugs, Log: c.cfg.Log.With("region", r.Name, "service", "ledger"),
		Respond: api.Respond, Stats: r.ledgerStats,
	})
	if err != nil {
		return err
	}
	nc, js, err := connect(natsauth.Router)
	if err != nil {
		srv.Close()
		return err
	}
	apiNC, apiJS, err := connect(natsauth.API)
	if err != nil {
		srv.Close()
		nc.Close()
		return err
	}
	closeNATS := func() {
		nc.Close()
		apiNC.Close()
	}
	if err := router.EnsureStream(ctx, js, r.Name, c.cfg.DuplicateWindow); err != nil {
		srv.Close()
		closeNATS()
		return err
	}
	rtCfg := router.Config{Region: r.Name, Regions: c.ids, Shards: c.cfg.Shards, Inject: c.cfg.Inject, AckWait: c.cfg.AckWait,
		Bugs: c.cfg.Bugs, Stats: r.routerStats}
	rt := router.New(js, rtCfg)
	// The API submits through a router of its own connection, counted
	// with the region's router.
	rtCfg.Stats = rt.Stats()
	apiRouter := router.New(apiJS, rtCfg)
	gen, err := idgen.NewGenerator(c.ids, r.Name, 2)
	if err != nil {
		srv.Close()
		closeNATS()
		return err
	}
	apiSrv := api.New(api.Config{Region: r.Name, Regions: c.ids, IDs: gen, Store: srv.Store, Router: apiRouter, NATS: apiNC,
		Wait: c.cfg.APIWait, KeyTTL: c.cfg.KeyTTL, Now: c.cfg.Now, Bugs: c.cfg.Bugs, Log: c.cfg.Log.With("region", r.Name, "service", "api")})
	if err := apiSrv.Listen(); err != nil {
		srv.Close()
		closeNATS()
		return err
	}
	addr := r.apiAddr
	if addr == "" {
		addr = c.cfg.APIAddrs[r.Name]
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		apiSrv.Close()
		srv.Close()
		closeNATS()
		return err
	}
	err = m.ObserveLedger(r.Name, srv.Topo.Stream(), srv.Stats)
	if err == nil {
		err = m.ObserveRouter(r.Name, rt.Stats())
	}
	if err == nil {
		err = m.ObserveStore(r.Name, srv.Store)
	}
	if err == nil {
		err = m.ObserveAPI(r.Name, &apiSrv.Stats)
	}
	var mend *telemetry.Endpoint
	if err == nil {
		mend, err = m.Serve("127.0.0.1:0", c.cfg.Log)
	}
	if err != nil {
		ln.Close()
		apiSrv.Close()
		srv.Close()
		closeNATS()
		return err
	}
	r.metrics, r.mend, r.MetricsURL = m, mend, mend.URL
	r.http = &http.Server{Handler: otelhttp.NewHandler(apiSrv, "paymesh api"), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	r.API, r.APIURL = apiSrv, "http://"+ln.Addr().String()
	go func() { _ = r.http.Serve(ln) }()
	runCtx, stop := context.WithCancel(context.Background())
	r.Ledger, r.Router, r.nc, r.apiNC, r.js, r.stop = srv, rt, nc, apiNC, js, stop
	log := c.cfg.Log.With("region", r.Name)
	r.done.Go(func() {
		if err := srv.Run(runCtx); err != nil {
			log.Error("ledger stopped", "err", err)
		}
	})
	r.done.Go(func() {
		if err := rt.RunForwarder(runCtx, log.With("service", "forwarder")); err != nil {
			log.Error("forwarder stopped", "err", err)
		}
	})
	r.done.Go(func() { rt.RunRelay(runCtx, srv.Store, log.With("service", "relay")) })
	r.done.Go(func() { apiSrv.RunCleanup(runCtx, time.Hour) })
	return nil
}

func (r *Region) close() {
	if r.stop == nil {
		return
	}
	_ = r.http.Close()
	_ = r.mend.Close()
	_ = r.metrics.Shutdown(context.Background())
	r.API.Close()
	r.stop()
	r.done.Wait()
	r.Ledger.Close()
	r.nc.Close()
	r.apiNC.Close()
	r.stop = nil
}

// RestartRegion stops a region's ledger, router and API as a crash would
// and starts them again on the same database, NATS server and API address.
// The restarted region is a new *Region: callers holding the old one see it
// closed, callers asking Region(name) again get the new one.
func (c *Cluster) RestartRegion(ctx context.Context, name string) error {
	old := c.Region(name)
	old.close()
	r := &Region{Name: name, URL: old.URL, apiAddr: strings.TrimPrefix(old.APIURL, "http://"),
		ledgerStats: old.Ledger.Stats, routerStats: old.Router.Stats()}
	if err := c.startRegion(ctx, r); err != nil {
		return err
	}
	c.mu.Lock()
	c.regions[name] = r
	c.mu.Unlock()
	return nil
}

// RouterJetStream returns the JetStream handle of the region's router: a
// connection with the router's permissions, the only one that may publish
// to ledger subjects.
func (r *Region) RouterJetStream() jetstream.JetStream { return r.js }

// Submit hands a command to the router of region via.
func (c *Cluster) Submit(ctx context.Context, via string, cmd ledger.Command) error {
	_, err := c.Region(via).Router.Submit(ctx, cmd)
	return err
}

// Stores returns every region's ledger store.
func (c *Cluster) Stores() []*postgres.Store {
	var out []*postgres.Store
	for _, n := range c.Names() {
		out = append(out, c.Region(n).Ledger.Store)
	}
	return out
}

// Backlog counts the work still moving anywhere: route streams not yet
// forwarded, ledger streams not yet applied, outbox rows not yet relayed
// and transfers still DEBITED. Zero means the cluster is quiet.
func (c *Cluster) Backlog(ctx context.Context) (int64, error) {
	var n int64
	for _, name := range c.Names() {
		r := c.Region(name)
		b, err := ljs.Backlog(ctx, r.Ledger.JetStream(), r.Ledger.Topo)
		if err != nil {
			return 0, err
		}
		n += int64(b)
		route, err := r.js.Stream(ctx, router.Stream(name))
		if err != nil {
			return 0, err
		}
		info, err := route.Info(ctx)
		if err != nil {
			return 0, err
		}
		n += int64(info.State.Msgs) // a work queue: what is left is not forwarded yet
		unsent, _, err := r.Ledger.Store.OutboxLag(ctx)
		if err != nil {
			return 0, err
		}
		n += unsent
		var debited int64
		if err := r.Ledger.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM transfers WHERE status = 'DEBITED'`).Scan(&debited); err != nil {
			return 0, err
		}
		n += debited
	}
	return n, nil
}

// WaitQuiet waits until Backlog is zero twice in a row, or ctx ends.
func (c *Cluster) WaitQuiet(ctx context.Context) error {
	zeros := 0
	for zeros < 2 {
		n, err := c.Backlog(ctx)
		if err == nil && n == 0 {
			zeros++
		} else {
			zeros = 0
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not quiet (backlog %d, last error %v): %w", n, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// Stop stops every region and drops nothing: databases stay until Drop.
func (c *Cluster) Stop() {
	for _, n := range c.Names() {
		c.Region(n).close()
	}
}

// Drop removes the regions' databases.
func (c *Cluster) Drop(ctx context.Context) error {
	var errs []error
	for _, n := range c.Names() {
		errs = append(errs, pgdb.Drop(ctx, c.cfg.PostgresURL, c.cfg.DatabasePrefix+n))
	}
	return errors.Join(errs...)
}
