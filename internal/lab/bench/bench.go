// Package bench measures paymesh's ledger on the local Postgres and an
// embedded nats-server: sustained throughput and publish→commit latency,
// a hot account, duplicate replays, a large consume-log and cross-region
// transfers, next to baselines measured in the same run on the same
// database server (the same ledger applying one message per transaction,
// TPC-B, and the apply transaction's SQL alone). `paymesh-lab bench` runs it;
// the figures are printed with their targets and can be written as JSON.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgha"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// Scenario names, in the order they run.
const (
	Uniform = "uniform" // random transfers at full speed: the reference
	Replay  = "replay"  // the uniform run's commands delivered again
	// Floor delivers the replay's messages to consumers that only ack
	// them: what NATS alone costs, the limit of a duplicate's cost.
	Floor   = "floor"
	Latency = "latency"     // paced at half the uniform rate
	Hot     = "hot"         // half the transfers credit one merchant
	Dedup   = "dedup-table" // uniform on a pre-filled consume-log
	// NoEvents is uniform with the events off (--no-events): what
	// recording an event for every change costs.
	NoEvents = "no-events"
	// Webhooks is uniform with a webhook endpoint taking every event, and
	// the delivery worker sending them to a loopback sink as the ledger
	// commits: what the events' delivery costs the ledger.
	Webhooks = "webhooks"
	Naive    = "naive" // baseline: the same ledger, one message per transaction
	TPCB     = "tpcb"  // baseline: TPC-B on the same server
	// Ceiling is a baseline: the apply transaction's own SQL, 256 transfers
	// a transaction, from a loop that does no decoding, planning or NATS.
	Ceiling = "ceiling"
	Cross   = "cross-region" // two regions, half the transfers between them
	// CrossRelay is cross-region with every saga step left to the relay
	// (ledgerd.Config.RelaySteps): the hop the ledger's own publish of
	// its steps takes out, measured beside it.
	CrossRelay = "cross-relay"
	API        = "api" // one region, transfers through its HTTP API
	// APIProcess is the api scenario against `paymesh api`, `paymesh router`
	// and `paymesh ledger`, each in a process of its own.
	APIProcess = "api-process"
	// Holds sends transfers, holds, captures and refunds through one
	// region's HTTP API, a phase each, in one run.
	Holds = "holds"
	// LedgerProcess runs uniform with `paymesh ledger` in a process of its
	// own, for the ledger's own peak RSS and CPU.
	LedgerProcess = "ledger-process"
	// Replicas starts the embedded topology with one server and with a
	// JetStream cluster of three, and runs uniform again at R3.
	Replicas = "replicas"
	// Standby runs uniform and api on a pg_auto_failover primary alone,
	// then with its synchronous standby (StandbyRun).
	Standby = "standby"
	// Reads times the API's reads (lists, a balance as of an instant, a
	// statement) on a region holding ReadTransfers transfers.
	Reads = "reads"
)

// Scenarios lists every scenario in running order.
var Scenarios = []string{Uniform, Replay, Floor, Latency, Replicas, Standby, Hot, Dedup, NoEvents, Webhooks, Naive, Ceiling, TPCB, Cross, CrossRelay, API, APIProcess, Holds, LedgerProcess, Reads}

// Config sizes a bench run. Defaults fills in its zero fields.
type Config struct {
	PostgresURL    string   `json:"-"`
	DatabasePrefix string   `json:"database_prefix"`
	Scenarios      []string `json:"scenarios"`
	Accounts       int      `json:"accounts"`
	Transfers      int      `json:"transfers"`
	BatchSize      int      `json:"batch_size"`
	BatchSizes     []int    `json:"batch_sizes,omitempty"` // a sweep of the uniform run
	Workers        int      `json:"workers"`
	Shards         int      `json:"shards"`
	CacheSize      int      `json:"cache_size"`
	Window         int      `json:"window"`     // published but not yet committed, at most
	DedupRows      int64    `json:"dedup_rows"` // consume-log rows written before the dedup-table run
	// ReadTransfers is how many transfers the reads scenario's region
	// holds; ReadRuns how many times it runs each read.
	ReadTransfers  int           `json:"read_transfers"`
	ReadRuns       int           `json:"read_runs"`
	Limit          time.Duration `json:"limit"` // longest publish phase of a full-speed run
	LatencyFor     time.Duration `json:"latency_for"`
	NaiveFor       time.Duration `json:"naive_for"`
	CrossTransfers int           `json:"cross_transfers"`
	APITransfers   int           `json:"api_transfers"`
	// APIConcurrency lists the api scenario's runs by requests in flight;
	// the first is the headline figure.
	APIConcurrency []int         `json:"api_concurrency"`
	PgbenchScale   int           `json:"pgbench_scale"`
	PgbenchFor     time.Duration `json:"pgbench_for"`
	Quick          bool          `json:"quick"`
	// LedgerBinary is the paymesh binary the ledger-process and
	// api-process scenarios run (`<binary> ledger`, `<binary> api`, ...);
	// without it they are skipped.
	LedgerBinary string `json:"-"`
	Keep         bool   `json:"keep"`
	CPUProfile   string `json:"cpu_profile,omitempty"`
	// APIProfile is where a CPU profile of the first api run goes (empty:
	// none).
	APIProfile string `json:"api_cpu_profile,omitempty"`
	Seed       uint64 `json:"seed"`
	// Telemetry runs the services as they ship: traced with the sampler
	// of the OTEL_* variables (paymesh's RetrySampler by default) and exported over
	// OTLP, and their /metrics scraped every 5 s.
	Telemetry bool `json:"telemetry"`
}

// Defaults fills in c's zero fields: the full run's sizes, or with Quick
// the quick run's (about a minute).
func (c Config) Defaults() Config {
	def := func(v *int, full, quick int) {
		if *v <= 0 {
			*v = map[bool]int{false: full, true: quick}[c.Quick]
		}
	}
	defD := func(v *time.Duration, full, quick time.Duration) {
		if *v <= 0 {
			*v = map[bool]time.Duration{false: full, true: quick}[c.Quick]
		}
	}
	if c.PostgresURL == "" {
		c.PostgresURL = pgdb.DefaultURL
	}
	if c.DatabasePrefix == "" {
		c.DatabasePrefix = "paymesh_bench_"
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios
	}
	def(&c.Accounts, 10_000, 2_000)
	def(&c.Transfers, 200_000, 30_000)
	def(&c.BatchSize, ledgerstream.DefaultBatchSize, ledgerstream.DefaultBatchSize)
	def(&c.Workers, 2, 2)
	def(&c.Shards, ledgerstream.DefaultShards, ledgerstream.DefaultShards)
	def(&c.CacheSize, 100_000, 100_000)
	def(&c.Window, 4096, 4096)
	def(&c.CrossTransfers, 20_000, 4_000)
	def(&c.APITransfers, 20_000, 4_000)
	if len(c.APIConcurrency) == 0 {
		c.APIConcurrency = []int{64, 256}
	}
	def(&c.PgbenchScale, 10, 10)
	def(&c.ReadTransfers, 10_000_000, 1_000_000)
	def(&c.ReadRuns, 200, 100)
	if c.DedupRows <= 0 {
		c.DedupRows = map[bool]int64{false: 10_000_000, true: 1_000_000}[c.Quick]
	}
	defD(&c.Limit, 60*time.Second, 15*time.Second)
	defD(&c.LatencyFor, 20*time.Second, 6*time.Second)
	defD(&c.NaiveFor, 15*time.Second, 5*time.Second)
	defD(&c.PgbenchFor, 15*time.Second, 5*time.Second)
	if c.Seed == 0 {
		c.Seed = 1
	}
	return c
}

// Validate checks the sizes and scenario names.
func (c Config) Validate() error {
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios, s) {
			return fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(Scenarios, ", "))
		}
	}
	if !dbPrefixRE.MatchString(c.DatabasePrefix) {
		return fmt.Errorf("database prefix %q: want at most 40 lower-case letters, digits and underscores, starting with a letter or underscore", c.DatabasePrefix)
	}
	switch {
	case c.Accounts < 2:
		return errors.New("need at least 2 accounts")
	case c.Transfers < 1 || c.CrossTransfers < 1 || c.APITransfers < 1:
		return errors.New("need at least 1 transfer")
	case c.ReadTransfers < 1 || c.ReadRuns < 1:
		return errors.New("the reads scenario needs at least 1 transfer and 1 run")
	case c.Window < 1 || c.Workers < 1 || c.Shards < 1:
		return errors.New("window, workers and shards must be positive")
	}
	for _, n := range c.APIConcurrency {
		if n < 1 {
			return fmt.Errorf("api concurrency %d must be positive", n)
		}
	}
	for _, b := range append([]int{c.BatchSize}, c.BatchSizes...) {
		if b < 1 {
			return fmt.Errorf("batch size %d must be positive", b)
		}
	}
	return nil
}

// dbPrefixRE is what a database prefix may be: a Postgres identifier that
// needs no quoting, short enough that every scenario's suffix fits in 63
// bytes.
var dbPrefixRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

func (c Config) has(s string) bool { return slices.Contains(c.Scenarios, s) }

// LedgerRun is one measured ledger run.
type LedgerRun struct {
	Scenario  string `json:"scenario"`
	Database  string `json:"database"`
	BatchSize int    `json:"batch_size"`
	Workers   int    `json:"workers"`
	Shards    int    `json:"shards"`
	Published int    `json:"published"`
	Committed int64  `json:"committed"`
	// Capped is set when the publish phase hit its time limit before
	// every transfer was sent.
	Capped bool `json:"capped,omitempty"`
	// Seconds runs from the first publish to the last commit; Rate is
	// Committed over it.
	Seconds   float64 `json:"seconds"`
	Rate      float64 `json:"rate"`
	PacedRate float64 `json:"paced_rate,omitempty"`
	// Publish→commit latency percentiles in milliseconds.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
	// CPU per committed message in microseconds: this process (ledger,
	// publisher and nats-server), and the run database's Postgres
	// backends (-1 when /proc could not be read).
	CPUPerTransferUs   float64 `json:"cpu_per_transfer_us"`
	PGCPUPerTransferUs float64 `json:"pg_cpu_per_transfer_us"`
	PeakRSSMB          float64 `json:"peak_rss_mb"`
	MeanBatch          float64 `json:"mean_batch"`
	MeanBatchMs        float64 `json:"mean_batch_ms"`
	// Layers counts the duplicates each dedup layer caught (replay).
	Layers    map[string]int64 `json:"layers,omitempty"`
	DedupRows int64            `json:"dedup_rows,omitempty"`
	// Webhooks is the webhooks scenario's delivery.
	Webhooks *HookRun `json:"webhooks,omitempty"`
	// Stages breaks the publish→commit latency down by stage (latency).
	Stages []Stage `json:"stages,omitempty"`
	// StageBatch is the size of the batches the stages' messages were
	// applied in.
	StageBatch BatchFill `json:"stage_batch,omitzero"`
	// Verified: every invariant held afterwards and every transfer was
	// recorded exactly once; otherwise VerifyReport says what failed.
	Verified     bool   `json:"verified"`
	VerifyReport string `json:"verify_report,omitempty"`
}

// Machine describes where the figures were measured.
type Machine struct {
	CPUs              int    `json:"cpus"`
	LoadAverage       string `json:"load_average"`
	GoVersion         string `json:"go_version"`
	Postgres          string `json:"postgres"`
	SynchronousCommit string `json:"synchronous_commit"`
	Fsync             string `json:"fsync"`
	WALSyncMethod     string `json:"wal_sync_method"`
	SharedBuffers     string `json:"shared_buffers"`
}

// Figure is a headline figure with its target.
type Figure struct {
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Target   string  `json:"target"`
	Pass     bool    `json:"pass"`
	Measured bool    `json:"measured"`
}

// Result is everything a bench run measured.
type Result struct {
	Started time.Time   `json:"started"`
	Machine Machine     `json:"machine"`
	Config  Config      `json:"config"`
	Runs    []LedgerRun `json:"runs"`
	// Sweep holds the uniform run at each --batch-sizes size.
	Sweep     []LedgerRun `json:"sweep,omitempty"`
	BestBatch int         `json:"best_batch,omitempty"`
	TPCB      *TPCBResult `json:"tpcb,omitempty"`
	Ceiling   *CeilingRun `json:"ceiling,omitempty"`
	Cross     *CrossRun   `json:"cross,omitempty"`
	// CrossRelay is the cross-relay scenario: Cross with the relay alone
	// sending the saga steps.
	CrossRelay *CrossRun `json:"cross_relay,omitempty"`
	// API is the api scenario at the first APIConcurrency, APIOther at the
	// others.
	API      *APIRun  `json:"api,omitempty"`
	APIOther []APIRun `json:"api_other,omitempty"`
	// APIProcess is the api-process scenario.
	APIProcess *APIProcessRun `json:"api_process,omitempty"`
	Holds      *HoldsRun      `json:"holds,omitempty"`
	Process    *ProcessRun    `json:"ledger_process,omitempty"`
	Replicas   *ReplicasRun   `json:"replicas,omitempty"`
	Standby    *StandbyRun    `json:"standby,omitempty"`
	Reads      *ReadsRun      `json:"reads,omitempty"`
	// Telemetry is what the services' telemetry did (with --telemetry).
	Telemetry *Telemetry `json:"telemetry,omitempty"`
	Figures   []Figure   `json:"figures"`
	Elapsed   float64    `json:"elapsed_seconds"`
}

// RunOf returns the first run of a scenario.
func (r Result) RunOf(scenario string) (LedgerRun, bool) {
	for _, x := range r.Runs {
		if x.Scenario == scenario {
			return x, true
		}
	}
	return LedgerRun{}, false
}

// env is what the scenarios of one bench run share.
type env struct {
	cfg     Config
	out     io.Writer
	nats    natsTarget // where the ledger runs go: the bench's server, or the replicas scenario's cluster
	nc      *nats.Conn
	table   regions.Table
	regions *idgen.Regions
	gens    []*idgen.Generator            // the single-region runs' transfer IDs
	regGens map[string][]*idgen.Generator // account and funding IDs per region
	genN    atomic.Uint64
	rng     interface{ IntN(int) int }
	seq     atomic.Int64
	mu      sync.Mutex
	dbs     map[string]bool // created and not dropped yet
	// tel is the services' telemetry as shipped (Config.Telemetry); nil
	// without it.
	tel *shipped
}

// generators per region: a sonyflake generator mints 25,600 IDs a second
// at most, so the publisher draws from several nodes.
const generators = 4

func (e *env) nextID(region string) (string, error) {
	gs := e.regGens[region]
	id, err := gs[e.genN.Add(1)%uint64(len(gs))].Next()
	if err != nil {
		return "", err
	}
	return e.regions.Format(id)
}

// Run runs the selected scenarios and returns what they measured. Progress
// goes to out, a line a second. It returns an error when a scenario could
// not run; the databases it made are dropped either way (unless Keep).
func Run(ctx context.Context, cfg Config, out io.Writer) (Result, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	started := time.Now()
	res := Result{Started: started, Config: cfg}
	e := &env{cfg: cfg, out: out, rng: randSource(cfg.Seed), dbs: map[string]bool{}, regGens: map[string][]*idgen.Generator{}}
	var err error
	if e.table, err = regions.Default(); err != nil {
		return res, err
	}
	if e.regions, err = idgen.NewRegions(e.table.Codes()); err != nil {
		return res, err
	}
	for _, name := range e.regions.Names() {
		for n := range generators {
			g, err := idgen.NewGenerator(e.regions, name, uint16(900+n))
			if err != nil {
				return res, err
			}
			e.regGens[name] = append(e.regGens[name], g)
		}
	}
	e.gens = e.regGens[region]
	if res.Machine, err = machine(ctx, cfg.PostgresURL); err != nil {
		return res, err
	}
	defer e.cleanup(ctx)

	dir, err := os.MkdirTemp("", "paymesh-bench-nats-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ns, err := natsembed.Start(natsembed.Options{Name: "bench", StoreDir: dir})
	if err != nil {
		return res, err
	}
	defer ns.Shutdown()
	e.nats.url = ns.ClientURL()
	if e.nc, err = nats.Connect(e.nats.url, nats.Name("paymesh-bench")); err != nil {
		return res, err
	}
	defer e.nc.Close()
	if e.nats.js, err = jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(cfg.Window)); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "paymesh-lab bench: %d accounts, %d transfers, batch size %d, %d workers, %d shards, window %d; Postgres %s (synchronous_commit=%s, fsync=%s), %d CPUs, load %s\n",
		cfg.Accounts, cfg.Transfers, cfg.BatchSize, cfg.Workers, cfg.Shards, cfg.Window,
		res.Machine.Postgres, res.Machine.SynchronousCommit, res.Machine.Fsync, res.Machine.CPUs, res.Machine.LoadAverage)

	if cfg.Telemetry {
		if e.tel, err = startTelemetry(ctx); err != nil {
			return res, err
		}
		defer e.tel.close(context.WithoutCancel(ctx))
		fmt.Fprintf(out, "telemetry as shipped: traces to %s, /metrics scraped every %s\n", e.tel.endpoint, scrapeEvery)
	}
	err = e.runAll(ctx, &res)
	if e.tel != nil {
		e.tel.flush(ctx)
		res.Telemetry = e.tel.result()
	}
	res.Elapsed = time.Since(started).Seconds()
	res.Figures = figures(res)
	return res, err
}

func (e *env) runAll(ctx context.Context, res *Result) error {
	cfg := e.cfg
	add := func(r LedgerRun) {
		res.Runs = append(res.Runs, r)
		fmt.Fprintln(e.out, r.line())
	}
	uniform, rig, w, err := e.uniformRun(ctx, Uniform, cfg.BatchSize, false, 0, cfg.Limit, cfg.CPUProfile)
	if err != nil {
		return err
	}
	add(uniform)
	if cfg.has(Replay) {
		run, err := rig.drive(ctx, phase{scenario: Replay, w: w, replay: true, limit: cfg.Limit})
		if err == nil {
			run.BatchSize = cfg.BatchSize
			err = rig.verify(ctx, &run, int64(uniform.Published))
		}
		if err != nil {
			rig.close(ctx)
			return fmt.Errorf("%s: %w", Replay, err)
		}
		add(run)
	}
	if cfg.has(Floor) {
		run, err := rig.floorRun(ctx, w)
		if err != nil {
			rig.close(ctx)
			return fmt.Errorf("%s: %w", Floor, err)
		}
		add(run)
	}
	if cfg.has(Latency) {
		rate := uniform.Rate / 2
		lw, err := e.newWorkload(Latency+fmt.Sprint(e.seq.Add(1)), max(1, int(rate*cfg.LatencyFor.Seconds())), len(rig.accounts), -1)
		if err == nil {
			var run LedgerRun
			run, err = rig.drive(ctx, phase{scenario: Latency, w: lw, rate: rate, limit: 2 * cfg.LatencyFor, stages: true})
			if err == nil {
				run.BatchSize = cfg.BatchSize
				err = rig.verify(ctx, &run, int64(uniform.Published+run.Published))
			}
			if err == nil {
				add(run)
			}
		}
		if err != nil {
			rig.close(ctx)
			return fmt.Errorf("%s: %w", Latency, err)
		}
	}
	rig.close(ctx)
	if cfg.has(Replicas) {
		r, err := e.replicas(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", Replicas, err)
		}
		res.Replicas = &r
		fmt.Fprintln(e.out, r.R3.line())
	}
	if cfg.has(Standby) {
		if err := pgha.Available(); err != nil {
			fmt.Fprintf(e.out, "%-13s skipped: %v\n", Standby, err)
		} else {
			s, err := e.standby(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", Standby, err)
			}
			res.Standby = &s
			fmt.Fprintln(e.out, s.line())
		}
	}

	for _, s := range []struct {
		name  string
		batch int
		hot   bool
		fill  int64
		limit time.Duration
	}{
		{Hot, cfg.BatchSize, true, 0, cfg.Limit},
		{Dedup, cfg.BatchSize, false, cfg.DedupRows, cfg.Limit},
		{NoEvents, cfg.BatchSize, false, 0, cfg.Limit},
		{Webhooks, cfg.BatchSize, false, 0, cfg.Limit},
		{Naive, 1, false, 0, cfg.NaiveFor},
	} {
		if !cfg.has(s.name) {
			continue
		}
		run, rig, _, err := e.uniformRun(ctx, s.name, s.batch, s.hot, s.fill, s.limit, "")
		if err != nil {
			return err
		}
		rig.close(ctx)
		add(run)
	}
	if cfg.has(Ceiling) {
		e.checkpoint(ctx)
		c, err := e.ceiling(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", Ceiling, err)
		}
		res.Ceiling = &c
		fmt.Fprintln(e.out, c.line())
	}
	if cfg.has(TPCB) {
		t, err := e.tpcb(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", TPCB, err)
		}
		res.TPCB = &t
		fmt.Fprintf(e.out, "%-13s %8.0f tps  (%s, scale %d, %d clients, %s)\n", TPCB, t.TPS, t.Tool, t.Scale, t.Clients, time.Duration(t.Seconds*float64(time.Second)))
	}
	if cfg.has(Cross) {
		c, err := e.cross(ctx, false)
		if err != nil {
			return fmt.Errorf("%s: %w", Cross, err)
		}
		res.Cross = &c
		fmt.Fprintln(e.out, c.line())
	}
	if cfg.has(CrossRelay) {
		c, err := e.cross(ctx, true)
		if err != nil {
			return fmt.Errorf("%s: %w", CrossRelay, err)
		}
		res.CrossRelay = &c
		fmt.Fprintln(e.out, c.line())
	}
	if cfg.has(API) {
		for i, n := range cfg.APIConcurrency {
			a, err := e.api(ctx, n)
			if err != nil {
				return fmt.Errorf("%s at %d in flight: %w", API, n, err)
			}
			if i == 0 {
				res.API = &a
			} else {
				res.APIOther = append(res.APIOther, a)
			}
			fmt.Fprintln(e.out, a.line())
		}
	}
	if cfg.has(APIProcess) {
		if cfg.LedgerBinary == "" {
			fmt.Fprintf(e.out, "%-13s skipped: no paymesh binary to run (make build, or paymesh-lab bench --paymesh)\n", APIProcess)
		} else {
			p, err := e.apiProcess(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", APIProcess, err)
			}
			res.APIProcess = &p
			fmt.Fprintln(e.out, p.line())
		}
	}
	if cfg.has(Holds) {
		h, err := e.holds(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", Holds, err)
		}
		res.Holds = &h
		fmt.Fprintln(e.out, h.line())
	}
	if cfg.has(LedgerProcess) {
		if cfg.LedgerBinary == "" {
			fmt.Fprintf(e.out, "%-13s skipped: no paymesh binary to run (make build, or paymesh-lab bench --paymesh)\n", LedgerProcess)
		} else {
			e.checkpoint(ctx)
			p, err := e.ledgerProcess(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", LedgerProcess, err)
			}
			res.Process = &p
			fmt.Fprintln(e.out, p.line())
		}
	}
	if cfg.has(Reads) {
		r, err := e.reads(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", Reads, err)
		}
		res.Reads = &r
		fmt.Fprintln(e.out, r.line())
	}
	for _, b := range cfg.BatchSizes {
		run, rig, _, err := e.uniformRun(ctx, fmt.Sprintf("sweep-%d", b), b, false, 0, cfg.Limit, "")
		if err != nil {
			return err
		}
		rig.close(ctx)
		res.Sweep = append(res.Sweep, run)
		fmt.Fprintln(e.out, run.line())
		if res.BestBatch == 0 || run.Rate > rateOf(res.Sweep, res.BestBatch) {
			res.BestBatch = b
		}
	}
	return nil
}

func rateOf(runs []LedgerRun, batch int) float64 {
	for _, r := range runs {
		if r.BatchSize == batch {
			return r.Rate
		}
	}
	return 0
}

// cleanup drops whatever database is left (an interrupted run) unless Keep.
func (e *env) cleanup(ctx context.Context) {
	e.mu.Lock()
	names := make([]string, 0, len(e.dbs))
	for n := range e.dbs {
		names = append(names, n)
	}
	e.mu.Unlock()
	for _, n := range names {
		e.dropDB(ctx, n)
	}
}

// progress prints a line a second for a phase: what it is, how far it got
// (done of total; done < 0 prints only the elapsed time) and the rate of the
// last second. The returned func stops it.
func (e *env) progress(what string, count func() (done, total int64)) func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		start, last := time.Now(), int64(0)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			done, total := count()
			if done < 0 {
				fmt.Fprintf(e.out, "  %-16s working (%s)\n", what, time.Since(start).Round(time.Second))
				continue
			}
			fmt.Fprintf(e.out, "  %-16s %9d/%d committed  %7d/s\n", what, done, total, done-last)
			last = done
		}
	})
	return func() { close(stop); wg.Wait() }
}

// machine reads the database server's durability settings.
func machine(ctx context.Context, url string) (Machine, error) {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		m.LoadAverage = strings.Join(f[:min(3, len(f))], " ")
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return m, fmt.Errorf("postgres %s: %w", pgdb.Redact(url), err)
	}
	defer conn.Close(ctx)
	for _, q := range []struct {
		sql string
		to  *string
	}{
		{`SHOW server_version`, &m.Postgres},
		{`SHOW synchronous_commit`, &m.SynchronousCommit},
		{`SHOW fsync`, &m.Fsync},
		{`SHOW wal_sync_method`, &m.WALSyncMethod},
		{`SHOW shared_buffers`, &m.SharedBuffers},
	} {
		if err := conn.QueryRow(ctx, q.sql).Scan(q.to); err != nil {
			return m, fmt.Errorf("postgres: %s: %w", q.sql, err)
		}
	}
	return m, nil
}

// line is a run's one-line summary.
func (r LedgerRun) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-13s %8.0f/s  %d of %d in %.1fs  p50 %.1f ms  p99 %.1f ms  batch %d (mean %.1f, %.1f ms)  CPU %.0f µs/msg",
		r.Scenario, r.Rate, r.Committed, r.Published, r.Seconds, r.P50Ms, r.P99Ms, r.BatchSize, r.MeanBatch, r.MeanBatchMs, r.CPUPerTransferUs)
	if r.PGCPUPerTransferUs >= 0 {
		fmt.Fprintf(&b, " + Postgres %.0f µs/msg", r.PGCPUPerTransferUs)
	}
	fmt.Fprintf(&b, "  peak RSS %.0f MB", r.PeakRSSMB)
	if r.PacedRate > 0 {
		fmt.Fprintf(&b, "  paced at %.0f/s", r.PacedRate)
	}
	if h := r.Webhooks; h != nil {
		fmt.Fprintf(&b, "  webhooks: %d of %d events delivered, %.0f/s, the last %.1fs after the last commit", h.Delivered, h.Events, h.Rate, h.DrainSeconds)
	}
	if r.Capped {
		b.WriteString("  (publishing stopped at the time limit)")
	}
	if len(r.Layers) > 0 {
		fmt.Fprintf(&b, "  caught by %v", r.Layers)
	}
	b.WriteString("  " + invariants(r.Verified, r.VerifyReport))
	return b.String()
}

// invariants is a run's verdict on its invariant checks, with the report
// of what failed.
func invariants(ok bool, report string) string {
	if ok {
		return "invariants PASS"
	}
	return "invariants FAIL: " + report
}

// WriteJSON writes the result to path.
func (r Result) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
