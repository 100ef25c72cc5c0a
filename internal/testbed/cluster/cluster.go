// Package cluster runs several paymesh regions in one process: per region a
// database and the three services a deployment runs (services/ledger/ledgerd,
// services/router/routerd, services/api/apid, each with its own /metrics),
// on an embedded multi-region NATS topology. The multi-region tests and the
// demo use it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/natsconn"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/router"
	"github.com/paymesh/paymesh/services/router/routerd"
)

// Config describes the regions to run.
type Config struct {
	// Regions maps region names to codes (from deploy/regions).
	Regions map[string]uint8
	// Topology is the running NATS topology. Each region's services
	// connect to all its servers (Topology.ClientURL) and keep their
	// streams at Topology.Replicas: one replica on a single server, three
	// on a cluster of three (natsembed.TopologyOptions.Nodes).
	Topology *natsembed.Topology
	// PostgresURL is the admin URL on which each region's database is
	// created as DatabasePrefix + region (dropped first).
	PostgresURL    string
	DatabasePrefix string
	Shards         int
	BatchSize      int
	AckWait        time.Duration
	// DuplicateWindow is the Nats-Msg-Id window of the route and ledger
	// streams (default ledgerstream.DefaultDuplicateWindow).
	DuplicateWindow time.Duration
	// Inject asks, per asynchronous publish of a router (forwards and
	// relays, the region's router's and the API's) and of a ledger (the
	// saga steps it sends after its COMMIT), for a second copy
	// under the same Nats-Msg-Id (jsfault.JetStream.Twice); Region.Injected
	// counts those whose first copy the stream stored as new (each a
	// duplicate its window must catch).
	Inject func() bool
	// DropAck asks, per ack of a ledger message whose batch committed, to
	// drop it (jsfault.AckDropped): JetStream redelivers the message.
	DropAck func() bool
	// BeforeCommit runs in every apply transaction of the ledger and of
	// the API, as its last statement before COMMIT (a consume-log
	// decorator, ledgertest.FailBeforeCommit): an error aborts the transaction, as a
	// crash would.
	BeforeCommit func(ctx context.Context) error
	// Ledger, Router and API, if set, change a region's service
	// configuration just before the service opens: a test installs its own
	// hooks and decorators through the services' seams here.
	Ledger func(region string, c *ledgerd.Config)
	Router func(region string, c *routerd.Config)
	API    func(region string, c *apid.Config)
	// APIWait and KeyTTL configure each region's HTTP API (see api.Config).
	APIWait time.Duration
	KeyTTL  time.Duration
	// Now is the APIs' clock (see api.Config; default time.Now).
	Now func() time.Time
	// APIAddrs gives a region's API a fixed listen address; the default is
	// a random port on 127.0.0.1.
	APIAddrs map[string]string
	// MetricsAddrs gives a region's services fixed /metrics addresses; the
	// default is a random port on 127.0.0.1 for each.
	MetricsAddrs map[string]MetricsAddrs
	Log          *slog.Logger
}

// MetricsAddrs are the /metrics listen addresses of a region's services
// ("" for a random port on 127.0.0.1).
type MetricsAddrs struct {
	Ledger, Router, API string
}

// connectTimeout bounds the services' wait for Postgres and NATS at start,
// as a region restarted during a NATS fault would wait.
const connectTimeout = 10 * time.Second

// Region is one running region.
type Region struct {
	Name   string
	URL    string // database URL
	Ledger *ledgerd.Server
	Router *router.Router
	API    *api.Handler
	// APIStore is the API's own store: its clients and idempotency keys.
	APIStore *apidb.Store
	// APIURL is the base URL of the region's HTTP API.
	APIURL string
	// LedgerMetricsURL, RouterMetricsURL and APIMetricsURL serve each
	// service's metrics (Prometheus text format or OpenMetrics), one
	// endpoint per service as deployed.
	LedgerMetricsURL, RouterMetricsURL, APIMetricsURL string
	routerSrv                                         *routerd.Server
	apiSrv                                            *apid.Server
	// The addresses and counters, kept across restarts.
	apiAddr       string
	metrics       MetricsAddrs
	ledgerStats   *ledger.Stats
	routerStats   *router.Stats
	injected      *atomic.Int64
	injectedSteps *atomic.Int64 // of injected, the copies of saga steps (relays)
	stop          context.CancelFunc
	done          sync.WaitGroup
}

// Cluster is a set of running regions.
type Cluster struct {
	cfg     Config
	ids     *idgen.Regions
	regions map[string]*Region
	mu      sync.Mutex
	// ops are the operator's connections, by region, opened by the first
	// fund there: only the region's operator user may fund.
	ops map[string]*operator
}

// operator is a connection as a region's operator user, and a router
// over it that publishes to the region's ledger stream.
type operator struct {
	nc *nats.Conn
	js jetstream.JetStream
	rt *router.Router
}

// Start creates each region's database and starts its ledger and router.
// It returns an error naming the region that could not start.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Shards <= 0 {
		cfg.Shards = ledgerstream.DefaultShards
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
		r := &Region{Name: name, URL: url, apiAddr: cfg.APIAddrs[name], metrics: cfg.MetricsAddrs[name], injected: new(atomic.Int64), injectedSteps: new(atomic.Int64)}
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

// Injected returns how many second copies Config.Inject made in the
// region's routers (its own and its API's) and its ledger (the saga steps
// it sends), across restarts, of messages whose first copy was new (see
// jsfault.JetStream.Injected).
func (r *Region) Injected() int64 { return r.injected.Load() }

// InjectedSteps returns how many of Injected's copies were of saga steps
// (the ledger's or a relay's publishes; the others are forwards and
// submits).
func (r *Region) InjectedSteps() int64 { return r.injectedSteps.Load() }

// countInjected counts a second copy in Injected, and in InjectedSteps
// when it is a saga step.
func (r *Region) countInjected(c *nats.Msg) {
	r.injected.Add(1)
	if cmd, err := ledger.DecodeCommand(c.Data); err == nil && cmd.IsStep() {
		r.injectedSteps.Add(1)
	}
}

// publisherJetStream decorates a router's JetStream handle with inject's
// second copies, counted in the region's Injected; nil for no decorator.
func (r *Region) publisherJetStream(inject func() bool) func(jetstream.JetStream) jetstream.JetStream {
	if inject == nil {
		return nil
	}
	return func(js jetstream.JetStream) jetstream.JetStream {
		return &jsfault.JetStream{JetStream: js, Twice: inject, Injected: r.countInjected}
	}
}

// ledgerJetStream decorates region r's ledger's JetStream handle: the acks
// that Config.DropAck drops, and the second copies Config.Inject makes of
// the saga steps the ledger sends (its only asynchronous publishes),
// counted in r's Injected.
func (c *Cluster) ledgerJetStream(r *Region) func(jetstream.JetStream) jetstream.JetStream {
	return func(js jetstream.JetStream) jetstream.JetStream {
		if c.cfg.DropAck == nil && c.cfg.Inject == nil {
			return js
		}
		var deliver func(jetstream.Msg) jetstream.Msg
		if c.cfg.DropAck != nil {
			deliver = func(m jetstream.Msg) jetstream.Msg { return jsfault.DropAck(m, c.cfg.DropAck) }
		}
		return &jsfault.JetStream{JetStream: js, Twice: c.cfg.Inject, Injected: r.countInjected, Deliver: deliver}
	}
}

// consumeLog decorates a store's consume-log with Config.BeforeCommit.
func (c *Cluster) consumeLog(l postgres.ConsumeLog) postgres.ConsumeLog {
	if c.cfg.BeforeCommit == nil {
		return l
	}
	return ledgertest.FailBeforeCommit(l, c.cfg.BeforeCommit)
}

func (c *Cluster) startRegion(ctx context.Context, r *Region) (err error) {
	// Every server of the region, and as many stream replicas as it has
	// servers: a cluster region's services survive the loss of one.
	url := c.cfg.Topology.ClientURL(r.Name)
	replicas := c.cfg.Topology.Replicas(r.Name)
	// Each service connects as its own user of the region's server
	// (platform/natsauth), so it runs with the permissions it has in
	// docker-compose.
	user := func(service string) natsauth.User {
		u, err := natsauth.UserOf(r.Name, service)
		if err != nil {
			panic(err) // natsauth.Services are known
		}
		return u
	}
	listen := func(addr string) string {
		if addr == "" {
			return "127.0.0.1:0"
		}
		return addr
	}
	log := c.cfg.Log.With("region", r.Name)
	defer func() {
		if err != nil {
			r.closeApps()
		}
	}()
	lu := user(natsauth.Ledger)
	lcfg := ledgerd.Config{
		Region: r.Name, Regions: c.ids, Node: 1, PostgresURL: r.URL, NATSURL: url, NATSUser: lu.Name, NATSPassword: lu.Password, Workers: 2,
		BatchSize: c.cfg.BatchSize, AckWait: c.cfg.AckWait, MaxDeliver: 1000, Shards: c.cfg.Shards, DuplicateWindow: c.cfg.DuplicateWindow, StreamReplicas: replicas,
		CacheSize: 10_000, WrapJetStream: c.ledgerJetStream(r), WrapConsumeLog: c.consumeLog, Log: log.With("service", "ledger"),
		Answers: apidb.Answers{}, AnswersSchema: new(apidb.Migrations()), Stats: r.ledgerStats, MetricsListen: listen(r.metrics.Ledger), ConnectTimeout: connectTimeout,
	}
	if c.cfg.Ledger != nil {
		c.cfg.Ledger(r.Name, &lcfg)
	}
	if r.Ledger, err = ledgerd.Open(ctx, lcfg); err != nil {
		return err
	}
	ru := user(natsauth.Router)
	rcfg := routerd.Config{
		Region: r.Name, Regions: c.ids, PostgresURL: r.URL, NATSURL: url, NATSUser: ru.Name, NATSPassword: ru.Password,
		Shards: c.cfg.Shards, AckWait: c.cfg.AckWait, DuplicateWindow: c.cfg.DuplicateWindow, StreamReplicas: replicas, WrapJetStream: r.publisherJetStream(c.cfg.Inject),
		Stats: r.routerStats, MetricsListen: listen(r.metrics.Router), ConnectTimeout: connectTimeout, Log: log,
	}
	if c.cfg.Router != nil {
		c.cfg.Router(r.Name, &rcfg)
	}
	if r.routerSrv, err = routerd.Open(ctx, rcfg); err != nil {
		return err
	}
	r.Router = r.routerSrv.Router()
	au := user(natsauth.API)
	acfg := apid.Config{
		Region: r.Name, Regions: c.ids, Node: 2, PostgresURL: r.URL, NATSURL: url, NATSUser: au.Name, NATSPassword: au.Password,
		Shards: c.cfg.Shards, AckWait: c.cfg.AckWait, DuplicateWindow: c.cfg.DuplicateWindow, StreamReplicas: replicas, WrapJetStream: r.publisherJetStream(c.cfg.Inject),
		// The API submits through a router of its own connection,
		// counted with the region's router.
		RouterStats: r.Router.Stats(),
		// The transfers it applies itself count with the ledger's, and
		// meet the same faults before COMMIT.
		LedgerStats: r.Ledger.Stats, WrapConsumeLog: c.consumeLog,
		Wait: c.cfg.APIWait, KeyTTL: c.cfg.KeyTTL, Now: c.cfg.Now,
		Listen: listen(r.apiAddr), MetricsListen: listen(r.metrics.API), ConnectTimeout: connectTimeout, Log: log.With("service", "api"),
	}
	if c.cfg.API != nil {
		c.cfg.API(r.Name, &acfg)
	}
	if r.apiSrv, err = apid.Open(ctx, acfg); err != nil {
		return err
	}
	r.API, r.APIStore, r.APIURL = r.apiSrv.API(), r.apiSrv.Store(), r.apiSrv.URL()
	r.LedgerMetricsURL, r.RouterMetricsURL, r.APIMetricsURL = r.Ledger.MetricsURL(), r.routerSrv.MetricsURL(), r.apiSrv.MetricsURL()
	// A restart listens where this run did.
	r.apiAddr = strings.TrimPrefix(r.APIURL, "http://")
	r.metrics = MetricsAddrs{Ledger: hostPort(r.LedgerMetricsURL), Router: hostPort(r.RouterMetricsURL), API: hostPort(r.APIMetricsURL)}

	runCtx, stop := context.WithCancel(context.Background())
	r.stop = stop
	for name, a := range map[string]interface{ Run(context.Context) error }{"ledger": r.Ledger, "router": r.routerSrv, "api": r.apiSrv} {
		r.done.Go(func() {
			if err := a.Run(runCtx); err != nil {
				log.Error(name+" stopped", "err", err)
			}
		})
	}
	return nil
}

// hostPort returns the host:port of a /metrics URL.
func hostPort(metricsURL string) string {
	return strings.TrimSuffix(strings.TrimPrefix(metricsURL, "http://"), "/metrics")
}

// closeApps closes the services that were opened, the API first.
func (r *Region) closeApps() {
	if r.apiSrv != nil {
		_ = r.apiSrv.Close()
	}
	if r.routerSrv != nil {
		_ = r.routerSrv.Close()
	}
	if r.Ledger != nil {
		_ = r.Ledger.Close()
	}
}

func (r *Region) close() {
	if r.stop == nil {
		return
	}
	// The API's HTTP server closes at once, dropping requests in
	// progress, as a crash would.
	_ = r.apiSrv.Close()
	r.stop()
	r.done.Wait()
	_ = r.routerSrv.Close()
	_ = r.Ledger.Close()
	r.stop = nil
}

// RestartRegion stops a region's ledger, router and API as a crash would
// and starts them again on the same database, NATS server, API address and
// /metrics addresses.
// The restarted region is a new *Region: callers holding the old one see it
// closed, callers asking Region(name) again get the new one.
func (c *Cluster) RestartRegion(ctx context.Context, name string) error {
	old := c.Region(name)
	old.close()
	r := &Region{Name: name, URL: old.URL, apiAddr: old.apiAddr, metrics: old.metrics,
		ledgerStats: old.Ledger.Stats, routerStats: old.Router.Stats(), injected: old.injected, injectedSteps: old.injectedSteps}
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
func (r *Region) RouterJetStream() jetstream.JetStream { return r.routerSrv.JetStream() }

// Submit hands a command to the router of region via. A fund, which only
// a region's operator may send (platform/natsauth), goes from the
// operator's user of its home region instead, whatever via says.
func (c *Cluster) Submit(ctx context.Context, via string, cmd ledger.Command) error {
	rt, err := c.SubmitterOf(ctx, via, cmd)
	if err != nil {
		return err
	}
	_, err = rt.Submit(ctx, cmd)
	return err
}

// SubmitterOf returns the router that submits cmd from region via: via's
// own, or for a fund the operator's of the fund's home region. It returns
// an error when via is not running or the operator cannot connect.
func (c *Cluster) SubmitterOf(ctx context.Context, via string, cmd ledger.Command) (*router.Router, error) {
	if cmd.Type != ledger.TypeFund {
		r := c.Region(via)
		if r == nil || r.Router == nil {
			return nil, fmt.Errorf("region %s is not running", via)
		}
		return r.Router, nil
	}
	home, err := c.ids.HomeRegion(cmd.To)
	if err != nil {
		return nil, err
	}
	return c.operator(ctx, home)
}

// operator returns a router that publishes as region's operator user.
func (c *Cluster) operator(ctx context.Context, region string) (*router.Router, error) {
	o, err := c.operatorConn(ctx, region)
	if err != nil {
		return nil, err
	}
	return o.rt, nil
}

// OperatorJetStream returns a JetStream handle of region's operator user
// (platform/natsauth): what paymesh dlq connects as.
func (c *Cluster) OperatorJetStream(ctx context.Context, region string) (jetstream.JetStream, error) {
	o, err := c.operatorConn(ctx, region)
	if err != nil {
		return nil, err
	}
	return o.js, nil
}

func (c *Cluster) operatorConn(ctx context.Context, region string) (*operator, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if o := c.ops[region]; o != nil {
		return o, nil
	}
	u, err := natsauth.UserOf(region, natsauth.Ops)
	if err != nil {
		return nil, err
	}
	nc, err := natsconn.Connect(ctx, natsconn.Config{URL: c.cfg.Topology.ClientURL(region), User: u.Name, Password: u.Password,
		Name: "paymesh-ops-" + region, Log: c.cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("operator of %s: %w", region, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("operator of %s: %w", region, err)
	}
	if c.ops == nil {
		c.ops = map[string]*operator{}
	}
	o := &operator{nc: nc, js: js, rt: router.New(js, router.Config{Region: region, Regions: c.ids, Shards: c.cfg.Shards})}
	c.ops[region] = o
	return o, nil
}

// Stores returns every region's ledger store.
func (c *Cluster) Stores() []*postgres.Store {
	var out []*postgres.Store
	for _, n := range c.Names() {
		out = append(out, c.Region(n).Ledger.Store)
	}
	return out
}

// APIStores returns every region's API store (clients and idempotency
// keys).
func (c *Cluster) APIStores() []*apidb.Store {
	var out []*apidb.Store
	for _, n := range c.Names() {
		out = append(out, c.Region(n).APIStore)
	}
	return out
}

// Backlog counts the work still moving anywhere: route streams not yet
// forwarded, ledger streams not yet applied, requests an API may still
// apply itself, outbox rows not yet relayed and transfers still DEBITED.
// Zero means the cluster is quiet.
func (c *Cluster) Backlog(ctx context.Context) (int64, error) {
	var n int64
	for _, name := range c.Names() {
		r := c.Region(name)
		b, err := ledgerstream.Backlog(ctx, r.Ledger.JetStream(), r.Ledger.Topo)
		if err != nil {
			return 0, err
		}
		n += int64(b)
		route, err := r.RouterJetStream().Stream(ctx, router.Stream(name))
		if err != nil {
			return 0, err
		}
		info, err := route.Info(ctx)
		if err != nil {
			return 0, err
		}
		n += int64(info.State.Msgs) // a work queue: what is left is not forwarded yet
		if a := r.API; a != nil {
			n += a.Applying()
		}
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
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.ops {
		o.nc.Close()
	}
	c.ops = nil
}

// Drop removes the regions' databases.
func (c *Cluster) Drop(ctx context.Context) error {
	var errs []error
	for _, n := range c.Names() {
		errs = append(errs, pgdb.Drop(ctx, c.cfg.PostgresURL, c.cfg.DatabasePrefix+n))
	}
	return errors.Join(errs...)
}
