// Package demo runs paymesh's demo: three regions in one process (an
// embedded NATS topology, a database per region on the local Postgres, and
// per region a ledger, a router and the HTTP API), funded accounts, and a
// mix of same-region and cross-region transfers with every kind of
// duplicate injected. It ends with the global invariant report.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgserver"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apid"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/webhooks"
)

// Config sets the demo's size and its duplicate injection rates (0..1).
type Config struct {
	PostgresURL string // admin URL of the server to create the region databases on
	// ThrowawayPostgres skips PostgresURL and runs a throwaway cluster from
	// the local binaries, as the demo does when no server answers.
	ThrowawayPostgres bool
	DatabasePrefix    string // region databases are <prefix><region> (default paymesh_demo_)
	Accounts          int    // per region
	Transfers         int
	Seed              uint64
	ClientRetry       float64 // a client sends a request again, sometimes in another region
	ProducerRetry     float64 // a router publishes a message twice with the same Nats-Msg-Id
	DropAck           float64 // a committed ledger message's ack is dropped (forced redelivery)
	Poison            float64 // malformed messages (dead-lettered)
	// HookLoss is the share of the webhook receiver's 2xx answers lost on
	// the way back (paymesh sends those events again).
	HookLoss float64
	// HTTPShare is the share of transfers sent through the HTTP API (the
	// rest go straight to the routers).
	HTTPShare float64
	// CrossShare is the share of transfers between two regions (default 0.5
	// when zero; use a tiny value for almost none).
	CrossShare float64
	// Rate caps the transfers sent per second (0: as fast as they go).
	Rate float64
	// Holds and Refunds are how many holds and refunded transfers the
	// money-flows phase runs after the transfers (0: 1 % and 0.5 % of
	// Transfers, at least 30 and 15; negative: none).
	Holds, Refunds int
	// FixedPorts serves each region's API on its api_port and its
	// services' /metrics on metrics_port, router_metrics_port and
	// api_metrics_port from the region table (for the walkthrough and a
	// Prometheus); otherwise on random ports.
	FixedPorts bool
	// Faults lists the faults to fire while the transfers are sent (see
	// FaultNames); each fires once, at an even spread over the run.
	Faults []string
	// Nodes is how many nats-servers each region runs: 0 or 1 for one
	// server (the default: it starts fastest), 3 for a JetStream cluster
	// with R3 streams (natsembed.TopologyOptions.Nodes).
	Nodes int
	// WAN puts the region table's network latency on every region's link
	// to the hub (regions.Table.LinkDelay); without it the links are plain
	// loopback and the demo runs fast.
	WAN bool
	// Prometheus runs Debian's prometheus on PrometheusConfig, its scrape
	// targets mapped to the regions' /metrics, so that the alert rules of
	// compose and the simulation watch the demo: PrometheusAuto when it is
	// installed, PrometheusOn (Run fails without it), PrometheusOff or ""
	// for none.
	Prometheus string
	// PrometheusConfig is the config to run, its rule files beside it
	// (default: PrometheusConfigFile in the working directory or the
	// nearest one above it).
	PrometheusConfig string
	// Stay keeps the regions running after the report until ctx ends.
	Stay bool
	Keep bool // keep the databases afterwards
	Live bool // redraw one status line (a terminal) instead of printing lines
	// Dashboard is the address of the live page ("" for none); Traces
	// records the spans it lists (the process's tracer provider must feed
	// it). OnDashboard, if set, gets the page's URL once it listens.
	Dashboard   string
	Traces      *dashboard.Recorder
	OnDashboard func(url string)
}

// flowSizes returns how many holds and refunded transfers the money-flows
// phase runs.
func (c Config) flowSizes() (holds, refunds int) {
	size := func(n, share, least int) int {
		switch {
		case n < 0:
			return 0
		case n > 0:
			return n
		}
		return max(c.Transfers/share, least)
	}
	return size(c.Holds, 100, 30), size(c.Refunds, 200, 15)
}

// Report is what the demo prints at the end.
type Report struct {
	Postgres    string // where the databases lived
	Interrupted bool   // stopped early (Ctrl-C): the report covers what ran
	// Completion percentiles, request to final state, in milliseconds.
	SameRegionP50, SameRegionP99, CrossRegionP50, CrossRegionP99 float64
	Faults                                                       []string // the faults that fired, in order
	Commands, Poison, Recorded                                   int64
	Applied, Rejected, DeadLettered, Redeliveries                int64
	Completed, Refunded, RejectedFinal, Unfinished               int64
	Injected                                                     map[string]int64
	Caught                                                       map[string]int64
	// Attributed is the duplicates caught, by the cause paymesh gave
	// each (causes.go checks them against Injected).
	Attributed map[ledger.Cause]int64
	// Repeats counts, by source, the repeats nobody injected that the
	// routers, the APIs and the demo's clients made (repeats.go); the
	// ledgers' are the redeliveries beyond the dropped acks (Unprompted).
	Repeats map[string]int64
	Elapsed time.Duration
	// Nodes is the servers per region; NATSStart is how long the NATS
	// topology took to start (JetStream usable in every region) and
	// RegionsStart the regions' services after it.
	Nodes                   int
	NATSStart, RegionsStart time.Duration
	Verify                  postgres.Report
	Alerts                  AlertsReport
	// Flows is the holds and refunds phase.
	Flows Flows
	// Hooks is the webhooks to the reference receiver.
	Hooks HooksReport
}

// injectedRedelivery names the duplicates the demo makes by dropping the
// ledger's acks: each makes JetStream deliver that message again.
const injectedRedelivery = "ledger redelivery (acks dropped)"

// Missed is injected duplicates minus the duplicates the layers reported.
// It is zero when each was caught exactly once, and below zero when more
// duplicates arrived than were injected (see Unprompted).
func (r Report) Missed() int64 {
	var in, caught int64
	for _, n := range r.Injected {
		in += n
	}
	for _, n := range r.Caught {
		caught += n
	}
	return in - caught
}

// Unprompted is the repeats nobody injected: the ledger's redeliveries that
// no dropped ack asked for, and the Repeats of the routers and the demo's
// clients. A batch that outlasts AckWait on a loaded machine is delivered
// again, a forward whose PubAck comes late is sent again, and the repeat
// is caught like an injected duplicate. A repeat of a message whose first
// copy was not stored or did not commit is applied, not caught, so these
// bound the extra catches from above.
func (r Report) Unprompted() int64 {
	n := r.unpromptedRedeliveries()
	for _, v := range r.Repeats {
		n += v
	}
	return n
}

// unpromptedRedeliveries is the ledger's redeliveries that no dropped ack
// asked for.
func (r Report) unpromptedRedeliveries() int64 {
	return max(r.Redeliveries-r.Injected[injectedRedelivery], 0)
}

// duplicatesOK: without faults every injected duplicate is reported by
// exactly one layer, and a layer reports nothing else but the repeats
// nobody injected, each at most once. Faults blur the count both ways: a
// restart or a cut link redelivers messages nobody injected, and a PubAck
// lost to the fault hides a duplicate the broker dropped. Then the count is
// reported, and the invariants decide.
func (r Report) duplicatesOK() bool {
	return len(r.Faults) > 0 || r.Interrupted || (r.duplicatesExplained() && r.attributionOK())
}

func (r Report) duplicatesExplained() bool { return r.Missed() <= 0 && -r.Missed() <= r.Unprompted() }

// OK reports whether every check passed.
func (r Report) OK() bool {
	return !r.Interrupted && r.Verify.OK() && r.duplicatesOK() && r.Recorded == r.Commands && r.DeadLettered == r.Poison && r.Unfinished == 0 &&
		r.Flows.OK() && r.Hooks.OK()
}

// Run runs the demo, writing progress to out. It returns an error when the
// demo cannot start (no Postgres, ports taken, Prometheus asked for and
// missing) or is interrupted.
func Run(ctx context.Context, cfg Config, out io.Writer) (Report, error) {
	table, err := regions.Default()
	if err != nil {
		return Report{}, err
	}
	promFile, promOff, err := checkPrometheus(cfg)
	if err != nil {
		return Report{}, err
	}
	if cfg.DatabasePrefix == "" {
		cfg.DatabasePrefix = "paymesh_demo_"
	}
	var names []string
	addrs := map[string]string{}
	metricsAddrs := map[string]cluster.MetricsAddrs{}
	for _, r := range table.Regions {
		names = append(names, r.Name)
		if cfg.FixedPorts {
			addrs[r.Name] = fmt.Sprintf("127.0.0.1:%d", r.APIPort)
			metricsAddrs[r.Name] = cluster.MetricsAddrs{Ledger: fmt.Sprintf("127.0.0.1:%d", r.MetricsPort),
				Router: fmt.Sprintf("127.0.0.1:%d", r.RouterMetricsPort), API: fmt.Sprintf("127.0.0.1:%d", r.APIMetricsPort)}
		}
	}
	pgWhere := cfg.PostgresURL
	if err := pgdb.Reachable(ctx, cfg.PostgresURL, 3*time.Second); err != nil || cfg.ThrowawayPostgres {
		if err != nil {
			fmt.Fprintf(out, "PostgreSQL: no server at %s (%v)\n", pgdb.Redact(cfg.PostgresURL), err)
		}
		tw, err := pgserver.StartThrowaway(ctx)
		if err != nil {
			return Report{}, fmt.Errorf("the demo needs PostgreSQL: %w", err)
		}
		defer func() {
			if err := tw.Stop(); err != nil {
				fmt.Fprintf(out, "stopping the throwaway cluster: %v\n", err)
			} else {
				fmt.Fprintf(out, "throwaway PostgreSQL cluster stopped and removed (%s)\n", tw.Dir)
			}
		}()
		fmt.Fprintf(out, "PostgreSQL: started a throwaway cluster from the local binaries in %s\n", tw.Dir)
		cfg.PostgresURL, pgWhere = tw.URL, "throwaway cluster in "+tw.Dir
	}
	dir, err := os.MkdirTemp("", "paymesh-demo-nats-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	// With Stay the links serve their control API, for paymesh-lab load --faults.
	topts := natsembed.TopologyOptions{Regions: names, Dir: dir, Nodes: cfg.Nodes, LinkControl: cfg.Stay}
	if cfg.WAN {
		topts.Links = wanLinks(table)
		fmt.Fprintf(out, "WAN latency on the links to the hub (one way): %s\n", describeLinks(names, topts.Links))
	}
	natsAt := time.Now()
	topo, err := natsembed.StartTopology(topts)
	if err != nil {
		return Report{}, err
	}
	defer topo.Shutdown()
	natsStart := time.Since(natsAt)

	rng := mrand.New(mrand.NewPCG(cfg.Seed, 0x9e3779b9))
	var rngMu sync.Mutex
	coin := func(p float64) func() bool {
		return func() bool {
			rngMu.Lock()
			defer rngMu.Unlock()
			return rng.Float64() < p
		}
	}
	var dropped atomic.Int64
	dropAck := coin(cfg.DropAck)
	regionsAt := time.Now()
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: table.Codes(), Topology: topo, PostgresURL: cfg.PostgresURL, DatabasePrefix: cfg.DatabasePrefix,
		Shards: 8, BatchSize: 128, AckWait: 2 * time.Second, APIWait: 2 * time.Second, APIAddrs: addrs, MetricsAddrs: metricsAddrs,
		Inject: coin(cfg.ProducerRetry),
		// Webhook receivers on this machine (the demo's, the walkthrough's),
		// and retries at the demo's pace: from 250 ms, doubling up to 2 s.
		API: func(_ string, a *apid.Config) {
			a.WebhookAllowHosts = []string{"127.0.0.1", "localhost"}
			a.WebhookSchedule = webhooks.Schedule{First: 250 * time.Millisecond, Longest: 2 * time.Second, MaxAge: webhooks.DefaultSchedule.MaxAge}
		},
		DropAck: func() bool {
			if dropAck() {
				dropped.Add(1)
				return true
			}
			return false
		},
		Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return Report{}, fmt.Errorf("start the regions: %w", err)
	}
	defer func() {
		c.Stop()
		if !cfg.Keep {
			_ = c.Drop(context.Background())
		}
	}()
	regionsStart := time.Since(regionsAt)
	apiKey, err := registerClient(ctx, c)
	if err != nil {
		return Report{}, err
	}
	hk, err := startHooks(ctx, c, cfg, apiKey, coin(cfg.HookLoss), names)
	if err != nil {
		return Report{}, err
	}
	defer hk.stop()
	nodes := topo.Nodes(names[0])
	fmt.Fprintf(out, "paymesh-lab demo: regions %s on one embedded NATS topology (hub + leafnodes), databases %s<region>\n",
		strings.Join(names, ", "), cfg.DatabasePrefix)
	fmt.Fprintf(out, "  NATS: %s per region, streams R%d; started in %s, the regions' services in %s\n",
		map[bool]string{true: "one server", false: fmt.Sprintf("a JetStream cluster of %d", nodes)}[nodes == 1], nodes,
		natsStart.Round(time.Millisecond), regionsStart.Round(time.Millisecond))
	for _, n := range names {
		r := c.Region(n)
		fmt.Fprintf(out, "  %s: API %s\n", n, r.APIURL)
		fmt.Fprintf(out, "  %s: /metrics ledger %s router %s api %s\n", n, r.LedgerMetricsURL, r.RouterMetricsURL, r.APIMetricsURL)
	}
	prom, err := startPrometheus(ctx, c, hk.srv.MetricsURL(), promFile, promOff, out)
	if err != nil {
		return Report{}, err
	}
	defer prom.stop()
	fmt.Fprintf(out, "  API key of client %q: %s\n", demoClient, apiKey)
	fmt.Fprintf(out, "  webhook receiver (paymesh receiver, in-process): %s, endpoint %s takes every event of %q; %.0f%% of its answers are lost on the way back\n",
		hk.srv.URL(), hk.endpoint, demoClient, 100*cfg.HookLoss)

	d := &driver{cfg: cfg, c: c, topo: topo, rng: rng, rngMu: &rngMu, names: names, apiKey: apiKey, injected: map[string]int64{}, out: out,
		caught: map[string]int64{}, gens: map[string]*idgen.Generator{}}
	for _, n := range names {
		if d.gens[n], err = idgen.NewGenerator(c.IDs(), n, 900); err != nil {
			return Report{}, err
		}
	}
	d.faults = cfg.Faults
	var dash *dashboard.Dashboard
	if cfg.Dashboard != "" {
		rs := hk.srv.Receiver().Stats()
		dash = dashboard.New(dashboard.Config{Source: dashboard.ClusterSource{C: c}, Recorder: cfg.Traces, Progress: d.status, Alerts: prom.history,
			Webhooks: func() dashboard.WebhookSample {
				return dashboard.WebhookSample{Received: rs.Received(), Duplicates: rs.AllDuplicates()}
			}})
		dctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		defer stop()
		url, err := dash.Serve(dctx, cfg.Dashboard)
		if err != nil {
			return Report{}, fmt.Errorf("live dashboard on %s: %w (use --dashboard off, or another address)", cfg.Dashboard, err)
		}
		go dash.Run(dctx)
		fmt.Fprintf(out, "live dashboard: %s\n", url)
		if cfg.OnDashboard != nil {
			cfg.OnDashboard(url)
		}
	}
	fmt.Fprintf(out, "fault schedule: %s\n", d.schedule())
	start := time.Now()
	err = d.run(ctx)
	if err == nil {
		d.setPhase("draining")
		err = d.waitQuiet(ctx)
	}
	var flows Flows
	if holds, refunds := cfg.flowSizes(); err == nil && (holds > 0 || refunds > 0) {
		d.setPhase("holds and refunds")
		fmt.Fprintf(out, "holds and refunds through the HTTP API: %d holds (captured, a third in part; voided; left to expire), %d transfers refunded\n", holds, refunds)
		flows, err = d.flows(ctx, holds, refunds)
	}
	interrupted := errors.Is(err, context.Canceled)
	if err != nil && !interrupted {
		return Report{}, err
	}
	var hooks HooksReport
	if !interrupted {
		d.setPhase("webhooks")
		hooks = d.hooks(ctx, hk)
	}
	// Interrupted (Ctrl-C): report what ran, on a context of its own, and
	// check the invariants without requiring quiescence.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// Each dropped ack makes JetStream deliver that message again.
	d.injected[injectedRedelivery] = dropped.Load()
	rep := d.report(rctx, time.Since(start))
	rep.Flows, rep.Hooks = flows, hooks
	rep.Faults, rep.Postgres, rep.Interrupted = d.fired, pgWhere, interrupted
	rep.Nodes, rep.NATSStart, rep.RegionsStart = nodes, natsStart, regionsStart
	rep.Alerts = prom.report(rctx)
	rep.Verify, err = postgres.VerifyGlobal(rctx, c.Stores(), !interrupted)
	d.setPhase("done")
	if dash != nil {
		dash.SetFinal(rep.Verify, err)
	}
	if err != nil {
		return rep, err
	}
	if cfg.Stay {
		rep.Print(out)
		fmt.Fprintf(out, "\nThe regions keep running (Ctrl-C to stop). Try:\n  export PAYMESH_API_KEY=%s\n  go run ./cmd/paymesh accounts create --currency EUR\n", apiKey)
		links := make([]string, len(names))
		for i, n := range names {
			links[i] = n + "=" + topo.LinkControlURL(n)
		}
		fmt.Fprintf(out, "  go run ./cmd/paymesh-lab load --overdraft %d --faults default --wan %s   # load with WAN link faults\n", demoOverdraft, strings.Join(links, ","))
		<-ctx.Done()
	}
	return rep, nil
}

const demoClient = "demo"

// demoOverdraft is the largest overdraft the demo's client may give an
// account.
const demoOverdraft = 100_000

// httpAttempts is how many times the demo's clients send a request that
// gets 409, 429 or 5xx (with the server's Retry-After, about 20 s in all).
const httpAttempts = 20

// registerClient creates the demo's API client in every region.
func registerClient(ctx context.Context, c *cluster.Cluster) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	key := "pm_demo_" + hex.EncodeToString(b)
	for _, s := range c.APIStores() {
		if err := s.PutClient(ctx, api.RegisteredClient{ID: demoClient, Name: "demo", RatePerSec: 100_000, MaxOverdraft: demoOverdraft}, key); err != nil {
			return "", err
		}
	}
	return key, nil
}

// driver creates the accounts and pushes the transfers.
type driver struct {
	cfg         Config
	c           *cluster.Cluster
	rng         *mrand.Rand
	rngMu       *sync.Mutex
	names       []string
	gens        map[string]*idgen.Generator
	apiKey      string
	accounts    map[string][]string
	cmds        []ledger.Command
	injected    map[string]int64
	caught      map[string]int64 // caught outside the ledgers and routers (HTTP replays)
	poison      int64
	commands    int64
	out         io.Writer
	lastLine    time.Time
	lastApplied map[string]int64
	sent        atomic.Int64
	resubmits   atomic.Int64 // submits sent again after an error (see repeatSubmit)
	retries     retryCounter // the HTTP clients' transport (see repeatHTTP)
	mu          sync.Mutex   // guards cmds, injected, caught, poison, fired and phase
	faults      []string
	fired       []string
	phase       string
	topo        *natsembed.Topology
}

// FaultNames are the faults the demo can fire.
var FaultNames = []string{"cut-us", "restart-eu-ledger", "restart-ap-nats"}

// schedule describes when each fault fires.
func (d *driver) schedule() string {
	if len(d.faults) == 0 {
		return "none"
	}
	var parts []string
	for i, f := range d.faults {
		parts = append(parts, fmt.Sprintf("%s at %d%% of the transfers", f, 100*(i+1)/(len(d.faults)+1)))
	}
	return strings.Join(parts, ", ")
}

// fault fires the i-th scheduled fault if sent transfers have reached its
// point of the run.
func (d *driver) fault(ctx context.Context, sent int) error {
	i := len(d.fired)
	if i >= len(d.faults) || sent < d.cfg.Transfers*(i+1)/(len(d.faults)+1) {
		return nil
	}
	f := d.faults[i]
	d.mu.Lock()
	d.fired = append(d.fired, f)
	d.mu.Unlock()
	fmt.Fprintf(d.out, "fault: %s\n", f)
	switch f {
	case "cut-us":
		d.topo.Cut("us")
		go func() {
			time.Sleep(3 * time.Second)
			d.topo.Heal("us")
			fmt.Fprintln(d.out, "fault healed: us is linked again")
		}()
	case "restart-eu-ledger":
		return d.c.RestartRegion(ctx, "eu")
	case "restart-ap-nats":
		return d.topo.RestartRegion("ap")
	default:
		return fmt.Errorf("unknown fault %q (known: %s)", f, strings.Join(FaultNames, ", "))
	}
	return nil
}

func (d *driver) setPhase(p string) {
	d.mu.Lock()
	d.phase = p
	d.mu.Unlock()
}

// status is the run's progress for the live page.
func (d *driver) status() dashboard.Progress {
	d.mu.Lock()
	defer d.mu.Unlock()
	return dashboard.Progress{Sent: d.sent.Load(), Total: int64(d.cfg.Transfers), Faults: d.faults,
		Fired: slices.Clone(d.fired), Phase: d.phase}
}

func (d *driver) id(region string) string {
	s, err := d.gens[region].NextString()
	if err != nil {
		panic(err) // this process's generator: it cannot run out for decades
	}
	return s
}

func (d *driver) float() float64 {
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	return d.rng.Float64()
}

func (d *driver) intn(n int) int {
	d.rngMu.Lock()
	defer d.rngMu.Unlock()
	return d.rng.IntN(n)
}

func (d *driver) run(ctx context.Context) error {
	d.setPhase("opening and funding accounts")
	d.accounts = map[string][]string{}
	for _, r := range d.names {
		store := d.c.Region(r).Ledger.Store
		for range d.cfg.Accounts {
			a, _, err := store.CreateAccount(ctx, ledger.NewAccount{ClientID: demoClient, Currency: "EUR"})
			if err != nil {
				return err
			}
			d.accounts[r] = append(d.accounts[r], a.ID)
			fund := ledger.Command{Type: ledger.TypeFund, TransferID: d.id(r), ClientID: "ops", IdempotencyKey: "fund-" + a.ID,
				To: a.ID, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()}
			d.commands++
			if err := d.c.Submit(ctx, r, fund); err != nil {
				return err
			}
		}
	}
	if err := d.waitQuiet(ctx); err != nil {
		return err
	}
	d.setPhase("sending")
	fmt.Fprintf(d.out, "opened and funded %d accounts per region; sending %d transfers (%.0f%% through the HTTP API)\n",
		d.cfg.Accounts, d.cfg.Transfers, 100*d.cfg.HTTPShare)
	start := time.Now()

	var wg sync.WaitGroup
	work := make(chan ledger.Command)
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for cmd := range work {
				if err := d.send(ctx, cmd); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
				d.sent.Add(1)
			}
		})
	}
	for i := range d.cfg.Transfers {
		src := d.names[d.intn(len(d.names))]
		dst := src
		cross := d.cfg.CrossShare
		if cross == 0 {
			cross = 0.5
		}
		if d.float() < cross {
			for dst == src {
				dst = d.names[d.intn(len(d.names))]
			}
		}
		if d.cfg.Rate > 0 {
			due := start.Add(time.Duration(float64(i) / d.cfg.Rate * float64(time.Second)))
			if wait := time.Until(due); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			}
		}
		from := d.accounts[src][d.intn(len(d.accounts[src]))]
		to := d.accounts[dst][d.intn(len(d.accounts[dst]))]
		for to == from {
			to = d.accounts[dst][d.intn(len(d.accounts[dst]))]
		}
		cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: d.id(src), ClientID: demoClient,
			IdempotencyKey: fmt.Sprintf("t-%d-%d", d.cfg.Seed, i), From: from, To: to, Amount: 1 + int64(d.intn(5000)),
			Currency: "EUR", CreatedAt: time.Now()}
		d.commands++
		if err := d.fault(ctx, i); err != nil {
			close(work)
			wg.Wait()
			return err
		}
		select {
		case work <- cmd:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		case <-ctx.Done():
			close(work)
			wg.Wait()
			return ctx.Err()
		}
		d.progress(false)
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	return nil
}

// send delivers one transfer through a router or the HTTP API, with the
// injected duplicates.
func (d *driver) send(ctx context.Context, cmd ledger.Command) error {
	via := d.names[d.intn(len(d.names))]
	if d.float() < d.cfg.HTTPShare {
		return d.sendHTTP(ctx, via, cmd)
	}
	d.mu.Lock()
	d.cmds = append(d.cmds, cmd)
	d.mu.Unlock()
	if err := d.submit(ctx, via, cmd); err != nil {
		return err
	}
	if d.float() < d.cfg.ClientRetry {
		d.mu.Lock()
		d.injected[injectedClientRetry]++
		d.mu.Unlock()
		if err := d.submit(ctx, d.names[d.intn(len(d.names))], cmd); err != nil {
			return err
		}
	}
	if d.float() < d.cfg.Poison {
		d.mu.Lock()
		d.poison++
		d.mu.Unlock()
		home, _ := d.c.IDs().HomeRegion(cmd.From)
		m := nats.NewMsg(ledgerstream.Topology{Region: home, Shards: 8}.CommandSubject(cmd, home))
		m.Data = []byte(strings.Replace(string(cmd.Encode()), `"amount":`, `"amount":0.5,"x":`, 1))
		// Only routers may publish to ledger subjects (platform/natsauth).
		if _, err := d.c.Region(home).RouterJetStream().PublishMsg(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// submit hands a command to a region's router, retrying while the region
// restarts (a client would retry too).
func (d *driver) submit(ctx context.Context, via string, cmd ledger.Command) error {
	var err error
	for range 50 {
		sub, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = d.c.Submit(sub, via, cmd)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		d.resubmits.Add(1) // the command may be stored already: its repeat is caught
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("submit in %s: %w", via, err)
}

// sendHTTP posts the transfer to a region's API with a fresh key, and
// sometimes posts it again with the same key in another region.
func (d *driver) sendHTTP(ctx context.Context, via string, cmd ledger.Command) error {
	key := api.NewIdempotencyKey()
	req := api.TransferRequest{From: cmd.From, To: cmd.To, Amount: cmd.Amount, Currency: cmd.Currency}
	// A key left in flight by a region restart answers 409 until its lease
	// (the API's wait + 5 s) ends: retry for longer than that, as a client
	// would.
	r, err := d.apiClient(via).SendTransfer(ctx, req, key)
	if err != nil {
		return fmt.Errorf("POST /v1/transfers in %s: %w", via, err)
	}
	var body api.TransferBody
	if err := json.Unmarshal(r.Body, &body); err != nil {
		return err
	}
	cmd.TransferID, cmd.IdempotencyKey = body.ID, key
	d.mu.Lock()
	d.cmds = append(d.cmds, cmd)
	d.mu.Unlock()
	if d.float() < d.cfg.ClientRetry {
		again, err := d.apiClient(d.names[d.intn(len(d.names))]).SendTransfer(ctx, req, key)
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.injected[injectedHTTPRetry]++
		if again.Replayed {
			d.caught[string(ledger.LayerIdempotencyKey)]++
		}
		d.mu.Unlock()
	}
	return nil
}

func (d *driver) waitQuiet(ctx context.Context) error {
	for {
		n, err := d.c.Backlog(ctx)
		if err == nil && n == 0 {
			if n, err = d.c.Backlog(ctx); err == nil && n == 0 {
				d.progress(true)
				return nil
			}
		}
		d.progress(false)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// progress prints the status: a progress bar, per-region throughput since
// the last line, the work in flight, duplicates caught per layer, and the
// faults fired.
func (d *driver) progress(final bool) {
	if !final && time.Since(d.lastLine) < 500*time.Millisecond {
		return
	}
	if !d.cfg.Live && !final && time.Since(d.lastLine) < 2*time.Second {
		return
	}
	elapsed := time.Since(d.lastLine).Seconds()
	d.lastLine = time.Now()
	if d.lastApplied == nil {
		d.lastApplied = map[string]int64{}
	}
	layers := map[string]int64{}
	var rates []string
	var dlq int64
	for _, n := range d.names {
		r := d.c.Region(n)
		st := r.Ledger.Stats
		a := st.Applied.Load()
		rates = append(rates, fmt.Sprintf("%s %4.0f/s", n, float64(a-d.lastApplied[n])/elapsed))
		d.lastApplied[n] = a
		dlq += st.DeadLettered.Load()
		for k, v := range st.Duplicates() {
			layers[k] += v
		}
		rs := r.Router.Stats()
		layers[string(ledger.LayerMsgID)] += rs.DuplicateSubmits.Load() + rs.ForwardDuplicates.Load() + rs.RelayDuplicates.Load()
	}
	var dups []string
	for _, k := range sortedKeys(layers) {
		dups = append(dups, fmt.Sprintf("%s %d", k, layers[k]))
	}
	inflight := "?"
	if n, err := d.c.Backlog(context.Background()); err == nil {
		inflight = fmt.Sprint(n)
	}
	sent := d.sent.Load()
	const width = 20
	done := 0
	if d.cfg.Transfers > 0 {
		done = int(sent) * width / d.cfg.Transfers
	}
	bar := strings.Repeat("#", done) + strings.Repeat("-", width-done)
	end := "\r"
	if final || !d.cfg.Live {
		end = "\n"
	}
	fmt.Fprintf(d.out, "[%s] %d/%d  %s  in flight %s  dups: %s  dead-lettered %d  faults %d/%d%s",
		bar, sent, d.cfg.Transfers, strings.Join(rates, " "), inflight, strings.Join(dups, ", "), dlq, len(d.fired), len(d.faults), end)
}

func (d *driver) report(ctx context.Context, elapsed time.Duration) Report {
	rep := Report{Commands: d.commands, Poison: d.poison, Injected: d.injected, Caught: map[string]int64{},
		Attributed: map[ledger.Cause]int64{}, Elapsed: elapsed}
	for k, v := range d.caught {
		rep.Caught[k] += v
	}
	for _, n := range d.names {
		r := d.c.Region(n)
		st := r.Ledger.Stats
		rep.Applied += st.Applied.Load()
		rep.Rejected += st.Rejected.Load()
		// What the dead-letter stream holds, not the ledger's counter: a
		// dead letter whose PubAck a NATS restart lost is published again,
		// and the stream drops the repeat unseen by the counter.
		if dl, err := r.Ledger.JetStream().Stream(ctx, r.Ledger.Topo.DLQStream()); err == nil {
			if info, err := dl.Info(ctx); err == nil {
				rep.DeadLettered += int64(info.State.Msgs)
			}
		}
		rep.Redeliveries += st.Redeliveries.Load()
		for k, v := range st.Duplicates() {
			rep.Caught[k] += v
		}
		rs := r.Router.Stats()
		rep.Caught[string(ledger.LayerMsgID)] += rs.DuplicateSubmits.Load() + rs.ForwardDuplicates.Load() + rs.RelayDuplicates.Load()
		rep.Injected[injectedRepublish] += r.Injected() - r.InjectedSteps()
		rep.Injected[injectedStepResend] += r.InjectedSteps()
		for c, n := range st.DuplicatesByCause() {
			rep.Attributed[c] += n
		}
		for k, n := range rs.DuplicatesByCause() {
			rep.Attributed[k.Cause] += n
		}
		rep.Attributed[ledger.CauseClientRetry] += r.API.Stats.Replays.Load() // every replay of a key is a client's retry
		var recorded int64
		_ = r.Ledger.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM transfers`).Scan(&recorded)
		rep.Recorded += recorded
	}
	var same, cross []time.Duration
	for _, n := range d.names {
		cs, err := d.c.Region(n).Ledger.Store.Completions(ctx)
		if err != nil {
			continue
		}
		for _, c := range cs {
			if c.Cross {
				cross = append(cross, c.Duration)
			} else {
				same = append(same, c.Duration)
			}
		}
	}
	rep.Repeats = d.repeats(ctx)
	rep.SameRegionP50, rep.SameRegionP99 = percentile(same, 0.50), percentile(same, 0.99)
	rep.CrossRegionP50, rep.CrossRegionP99 = percentile(cross, 0.50), percentile(cross, 0.99)
	for _, cmd := range d.cmds {
		home, _ := d.c.IDs().HomeRegion(cmd.From)
		t, err := d.c.Region(home).Ledger.Store.Transfer(ctx, cmd.TransferID)
		switch {
		case err != nil:
			rep.Unfinished++
		case t.Status == ledger.StatusCompleted:
			rep.Completed++
		case t.Status == ledger.StatusRefunded:
			rep.Refunded++
		case t.Status == ledger.StatusRejected:
			rep.RejectedFinal++
		default:
			rep.Unfinished++
		}
	}
	return rep
}

// Print writes the final report.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\n== paymesh demo report (%s) ==\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "NATS: %d server(s) per region (R%d streams), started in %s; the regions' services in %s\n",
		r.Nodes, r.Nodes, r.NATSStart.Round(time.Millisecond), r.RegionsStart.Round(time.Millisecond))
	if r.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: the report covers what ran; work still in flight shows as unfinished")
	}
	fmt.Fprintf(w, "commands %d (recorded %d); transfers completed %d, refunded %d, rejected %d, unfinished %d\n",
		r.Commands, r.Recorded, r.Completed, r.Refunded, r.RejectedFinal, r.Unfinished)
	fmt.Fprintf(w, "poison %d, dead-lettered %d; ledger redeliveries %d\n", r.Poison, r.DeadLettered, r.Redeliveries)
	fmt.Fprintf(w, "completion time, request to final state: same-region p50 %.1f ms p99 %.1f ms; cross-region p50 %.1f ms p99 %.1f ms\n",
		r.SameRegionP50, r.SameRegionP99, r.CrossRegionP50, r.CrossRegionP99)
	if len(r.Faults) > 0 {
		fmt.Fprintf(w, "faults fired: %s\n", strings.Join(r.Faults, ", "))
	}
	fmt.Fprintln(w, "duplicates injected:")
	for _, k := range sortedKeys(r.Injected) {
		fmt.Fprintf(w, "  %-48s %6d\n", k, r.Injected[k])
	}
	fmt.Fprintln(w, "duplicates caught, by layer:")
	for _, k := range sortedKeys(r.Caught) {
		fmt.Fprintf(w, "  %-48s %6d\n", k, r.Caught[k])
	}
	fmt.Fprintln(w, "repeats nobody injected (a loaded machine's late answers; each may be caught once):")
	repeats := map[string]int64{repeatLedger: r.unpromptedRedeliveries()}
	for k, v := range r.Repeats {
		repeats[k] = v
	}
	for _, k := range sortedKeys(repeats) {
		fmt.Fprintf(w, "  %-48s %6d\n", k, repeats[k])
	}
	r.Alerts.print(w)
	line := func(ok bool, format string, args ...any) {
		verdict := "PASS"
		if !ok {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "%s  "+format+"\n", append([]any{verdict}, args...)...)
	}
	r.printAttribution(w, line)
	if len(r.Faults) == 0 && !r.Interrupted {
		line(r.duplicatesExplained(), "every injected duplicate was caught exactly once (injected minus caught: %d; repeats nobody injected, "+
			"each caught at most once: %d)", r.Missed(), r.Unprompted())
	} else {
		fmt.Fprintf(w, "INFO  injected minus caught: %d (faults add redeliveries nobody injected, and lose PubAcks of duplicates the broker dropped)\n", r.Missed())
	}
	line(r.Recorded == r.Commands, "every command recorded exactly once (%d sent, %d recorded)", r.Commands, r.Recorded)
	line(r.Unfinished == 0, "every transfer reached a final state (%d unfinished)", r.Unfinished)
	line(r.DeadLettered == r.Poison, "every poison message dead-lettered (%d sent, %d dead-lettered)", r.Poison, r.DeadLettered)
	if f := r.Flows; f.Holds > 0 || f.Refunded > 0 || len(f.Problems) > 0 {
		line(len(f.Problems) == 0, "holds: %d held; %d captured (%d in part, %d captures sent again and replayed), %d voided, %d of %d left alone expired; %d late voids and captures refused transfer_not_held",
			f.Holds, f.Captured, f.CapturedInPart, f.Replayed, f.Voided, f.Expired, f.LeftToExpire, f.LateRefused)
		line(len(f.Problems) == 0, "refunds: %d transfers refunded by their payee (%d in two parts); %d refunds past the total refused refund_exceeds_captured",
			f.Refunded, f.Twice, f.PastTotal)
		for _, p := range f.Problems {
			fmt.Fprintf(w, "        %s\n", p)
		}
	}
	if !r.Interrupted {
		r.Hooks.print(w, line)
	}
	fmt.Fprint(w, r.Verify.String())
}

// wanLinks returns the shape of each region's link to the hub: the one-way
// delay the region table's round trips give it.
func wanLinks(t regions.Table) map[string]faultproxy.Shape {
	links := map[string]faultproxy.Shape{}
	for _, r := range t.Regions {
		links[r.Name] = faultproxy.Shape{Latency: t.LinkDelay(r.Name)}
	}
	return links
}

func describeLinks(names []string, links map[string]faultproxy.Shape) string {
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + " " + links[n].Latency.String()
	}
	return strings.Join(parts, ", ")
}

func sortedKeys(m map[string]int64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// percentile returns the q-quantile of ds in milliseconds (0 for none).
func percentile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(q * float64(len(ds)-1))
	return float64(ds[i].Microseconds()) / 1000
}
