package ledgerd_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// BenchmarkApplyPath measures what telemetry costs the ledger's apply path:
// transfers published to the region's stream are delivered through the
// ledger consumers (a process span per delivery, an apply-batch span per
// transaction, acks after commit) and applied by Store.Apply on Postgres
// through a pool with the pgx query tracer; each batch is observed by the
// metrics hook.
//
//   - telemetry=off: no-op tracer and meter providers.
//   - telemetry=on: every span sampled (AlwaysSample, natstrace.IDGenerator)
//     and batched into an in-memory exporter; the production meter provider
//     (Prometheus reader) with the batch histograms and the ledger's
//     observable counters, scraped every second.
//
// One op is one transfer; cpu-ns/op is this process's CPU time per
// transfer (ledger and embedded JetStream, not Postgres), the figure least
// disturbed by other load on the machine. Both modes run on a database and
// a JetStream of their own. Run it with a fixed -benchtime (say 20000x) so
// that both modes apply the same number of transfers; `make
// bench-telemetry` compares them with benchstat.
func BenchmarkApplyPath(b *testing.B) {
	envs := map[bool]*applyEnv{false: newApplyEnv(b, false, 1000), true: newApplyEnv(b, true, 1000)}
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "telemetry=off", true: "telemetry=on"}[on]
		b.Run(name, func(b *testing.B) {
			env := envs[on]
			env.publish(b, b.N)
			env.batches.Store(0)
			env.txTime.Store(0)
			b.ResetTimer()
			cpu := processCPU(b)
			stop := env.consume(b, b.N)
			b.StopTimer()
			cpu = processCPU(b) - cpu
			stop()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "transfers/s")
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			if n := env.batches.Load(); n > 0 {
				b.ReportMetric(float64(b.N)/float64(n), "transfers/batch")
				b.ReportMetric(float64(env.txTime.Load())/float64(n)/1e6, "ms/batch")
			}
			if on {
				env.mustHaveTraced(b)
				env.tel.exp.Reset()
			}
		})
	}
}

// TestApplyPathTelemetry checks that BenchmarkApplyPath's "on" mode really
// traces and measures: every delivery has its process span, the batches
// their apply-batch spans with the statements' spans under them, and the
// scraped metrics count the transfers.
func TestApplyPathTelemetry(t *testing.T) {
	const n = 200
	env := newApplyEnv(t, true, 20)
	env.tel.keep = true
	env.publish(t, n)
	env.consume(t, n)()
	if err := env.tel.tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}

	spans := env.tel.exp.GetSpans()
	batches := map[trace.SpanID]bool{}
	var process, linked int
	for _, s := range spans {
		if s.Name == "apply batch" {
			batches[s.SpanContext.SpanID()] = true
			linked += len(s.Links)
		}
		if strings.HasPrefix(s.Name, "process ledger.eu.") && s.SpanKind == trace.SpanKindConsumer {
			process++
		}
	}
	var statements int
	for _, s := range spans {
		if (s.Name == "db.query" || s.Name == "db.batch") && batches[s.Parent.SpanID()] {
			statements++
		}
	}
	if process != n || len(batches) == 0 || linked < n || statements == 0 {
		t.Fatalf("spans: %d process (want %d), %d apply batch linked to %d deliveries, %d statements under them",
			process, n, len(batches), linked, statements)
	}

	page := env.tel.scrape()
	for _, want := range []string{`paymesh_transfers_applied_total{consumer="ledger",region="eu",stream="LEDGER_EU"} 200`, "paymesh_apply_batch_size_count", "paymesh_apply_duration_seconds_bucket"} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics: no %s in\n%s", want, page)
		}
	}

	// Once the run is over, tracing is off again.
	if _, span := otel.Tracer("test").Start(context.Background(), "after"); span.IsRecording() {
		t.Error("a span after the run records")
	}
}

// applyEnv is one region's ledger server on a fresh database and an
// embedded JetStream, with funded accounts, and the telemetry of one mode.
type applyEnv struct {
	tel *pipeline
	srv *ledgerd.Server
	pub *ledgerstream.Publisher
	ids *idgen.Generator
	// groups are the accounts by shard (shards with two or more): a
	// transfer stays in its source's shard, so that the two workers' batches
	// never wait for each other's row locks.
	groups [][]string
	next   int // transfers built so far, to spread them over the accounts
	// batches and txTime count the applied batches and their transaction time.
	batches, txTime atomic.Int64
}

func newApplyEnv(tb testing.TB, on bool, accounts int) *applyEnv {
	tb.Helper()
	tel := newPipeline(tb, on)
	ns, _ := natsembed.MustStart(tb)
	_, url := pgtest.MustDatabase(tb) // empty: the server migrates it
	regions, err := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2, "ap": 3})
	if err != nil {
		tb.Fatal(err)
	}
	const region = "eu"
	observe, err := ledgerd.NewObserver(tel.metrics, region, ledgerstream.Topology{Region: region}.Stream())
	if err != nil {
		tb.Fatal(err)
	}
	env := &applyEnv{tel: tel}
	record := observe.Batch
	observe.Batch = func(ctx context.Context, b ledgerstream.Batch) {
		env.batches.Add(1)
		env.txTime.Add(int64(b.Took()))
		record(ctx, b)
	}
	ctx := context.Background()
	// The production ledger's settings (cmd/paymesh defaults).
	srv, err := ledgerd.Open(ctx, ledgerd.Config{Region: region, Regions: regions, Node: 1, PostgresURL: url, NATSURL: ns.ClientURL(),
		Workers: 2, BatchSize: 128, AckWait: 30 * time.Second, MaxDeliver: 10, WindowDays: 3, CacheSize: 100_000, Shards: 16,
		Observe: observe})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Close() })
	if err := ledgerd.ObserveLedger(tel.metrics, region, srv.Topo.Stream(), srv.Stats); err != nil {
		tb.Fatal(err)
	}
	if err := ledgerd.ObserveStore(tel.metrics, region, srv.Store); err != nil {
		tb.Fatal(err)
	}
	ids, err := idgen.NewGenerator(regions, region, 2)
	if err != nil {
		tb.Fatal(err)
	}
	env.srv, env.pub, env.ids = srv, ledgerstream.NewPublisher(srv.JetStream(), srv.Topo, regions, nil), ids

	// Open and fund the accounts directly through the store.
	var funds []ledger.Command
	shards := make([][]string, srv.Topo.Shards)
	for range accounts {
		a, _, err := srv.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "bench", Currency: "EUR"})
		if err != nil {
			tb.Fatal(err)
		}
		shard := srv.Topo.Shard(a.ID)
		shards[shard] = append(shards[shard], a.ID)
		funds = append(funds, ledger.Command{Type: ledger.TypeFund, TransferID: env.id(tb), ClientID: "bench",
			IdempotencyKey: "fund-" + a.ID, To: a.ID, Amount: 1 << 40, Currency: "EUR", CreatedAt: time.Now()})
	}
	for len(funds) > 0 {
		batch := funds[:min(len(funds), 128)]
		funds = funds[len(batch):]
		rs, err := srv.Store.Apply(ctx, batch)
		if err != nil {
			tb.Fatal(err)
		}
		for _, r := range rs {
			if r.Kind != ledger.Applied {
				tb.Fatalf("funding: %v %v", r.Kind, r.Err)
			}
		}
	}
	for _, g := range shards {
		if len(g) >= 2 {
			env.groups = append(env.groups, g)
		}
	}
	if len(env.groups) == 0 {
		tb.Fatal("no shard has two accounts")
	}
	return env
}

func (e *applyEnv) id(tb testing.TB) string {
	s, err := e.ids.NextString()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// publish stores n transfers between the accounts in the region's stream.
// With telemetry on, each carries the trace context of a sampled remote
// parent, as the router's forwards do when tracing is on.
func (e *applyEnv) publish(tb testing.TB, n int) {
	tb.Helper()
	ctx := context.Background()
	js := e.srv.JetStream()
	for n > 0 {
		chunk := min(n, 1000)
		n -= chunk
		futures := make([]jetstream.PubAckFuture, 0, chunk)
		for range chunk {
			g, k := e.groups[e.next%len(e.groups)], e.next/len(e.groups)
			e.next++
			from, to := g[k%len(g)], g[(k+1)%len(g)]
			m := e.pub.Msg(ledger.Command{Type: ledger.TypeTransfer, TransferID: e.id(tb), ClientID: "bench",
				IdempotencyKey: "t-" + e.id(tb), From: from, To: to, Amount: 1, Currency: "EUR", CreatedAt: time.Now()})
			if e.tel.on {
				tid, sid := natstrace.IDGenerator{}.NewIDs(ctx)
				natstrace.Inject(trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
					TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})), m)
			}
			f, err := e.pub.PublishAsync(m)
			if err != nil {
				tb.Fatal(err)
			}
			futures = append(futures, f)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			tb.Fatal("publish: no acks after a minute")
		}
		for _, f := range futures {
			select {
			case err := <-f.Err():
				tb.Fatal(err)
			default:
			}
		}
	}
}

// consume runs the ledger with the env's telemetry until it has applied n
// more transfers and acked every delivery, then scrapes the metrics once
// more. The returned func stops the ledger and switches tracing off.
func (e *applyEnv) consume(tb testing.TB, n int) (stop func()) {
	tb.Helper()
	st := e.srv.Stats
	base := st.Applied.Load() + st.Rejected.Load()
	e.tel.activate()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = e.srv.Run(ctx) })
	wg.Go(func() { e.tel.collect(ctx) })
	stop = func() {
		cancel()
		wg.Wait()
		e.tel.deactivate()
		if runErr != nil {
			tb.Fatalf("run: %v", runErr)
		}
	}

	deadline := time.Now().Add(5 * time.Minute)
	for st.Applied.Load()+st.Rejected.Load()-base < int64(n) {
		if time.Now().After(deadline) {
			stop()
			tb.Fatalf("applied %d of %d transfers in 5 minutes", st.Applied.Load()+st.Rejected.Load()-base, n)
		}
		time.Sleep(time.Millisecond)
	}
	for {
		left, err := ledgerstream.Backlog(ctx, e.srv.JetStream(), e.srv.Topo)
		if err == nil && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			tb.Fatalf("backlog: %d left (%v)", left, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r := st.Rejected.Load(); r > 0 {
		stop()
		tb.Fatalf("%d transfers rejected", r)
	}
	e.tel.scrape()
	return stop
}

// mustHaveTraced fails unless the run exported process, apply-batch and
// statement spans: a figure measured with tracing silently off is
// worthless.
func (e *applyEnv) mustHaveTraced(tb testing.TB) {
	tb.Helper()
	if err := e.tel.tp.ForceFlush(context.Background()); err != nil {
		tb.Fatal(err)
	}
	x := e.tel.exp
	if x.process.Load() == 0 || x.batch.Load() == 0 || x.db.Load() == 0 {
		tb.Fatalf("telemetry=on exported %d process, %d apply batch and %d statement spans; want some of each",
			x.process.Load(), x.batch.Load(), x.db.Load())
	}
	x.process.Store(0)
	x.batch.Store(0)
	x.db.Store(0)
}

// processCPU is the CPU time this process (the ledger, and the embedded
// JetStream server of both modes) has used, user and system. Postgres's is
// not in it: it is the same in both modes.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pipeline is one mode's telemetry.
type pipeline struct {
	on      bool
	keep    bool                     // keep the exported spans (no resets)
	tp      *sdktrace.TracerProvider // nil when off
	exp     *countingExporter        // nil when off
	metrics *telemetry.Metrics
}

func newPipeline(tb testing.TB, on bool) *pipeline {
	tb.Helper()
	installSwitch()
	if !on {
		return &pipeline{metrics: telemetry.Disabled()}
	}
	m, err := telemetry.New()
	if err != nil {
		tb.Fatal(err)
	}
	exp := &countingExporter{InMemoryExporter: tracetest.NewInMemoryExporter()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithIDGenerator(natstrace.IDGenerator{}))
	tb.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = m.Shutdown(context.Background())
	})
	return &pipeline{on: true, tp: tp, exp: exp, metrics: m}
}

// activate makes this mode's tracer provider the one every tracer uses.
func (p *pipeline) activate() {
	if p.on {
		tracing.use(p.tp)
	} else {
		tracing.use(tracenoop.NewTracerProvider())
	}
}

func (p *pipeline) deactivate() { tracing.use(tracenoop.NewTracerProvider()) }

// collect scrapes the metrics every second and, unless keep, drops the
// exported spans every quarter second so that memory does not grow with
// the run, until ctx ends.
func (p *pipeline) collect(ctx context.Context) {
	if !p.on {
		return
	}
	scrape, reset := time.NewTicker(time.Second), time.NewTicker(250*time.Millisecond)
	defer scrape.Stop()
	defer reset.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-scrape.C:
			p.scrape()
		case <-reset.C:
			if !p.keep {
				p.exp.Reset()
			}
		}
	}
}

// scrape collects the metrics as a Prometheus scrape of /metrics does.
func (p *pipeline) scrape() string {
	if !p.on {
		return ""
	}
	w := httptest.NewRecorder()
	p.metrics.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	return w.Body.String()
}

// countingExporter is an in-memory exporter that also counts, across
// resets, the spans of each kind it received.
type countingExporter struct {
	*tracetest.InMemoryExporter
	process, batch, db atomic.Int64
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		switch name := s.Name(); {
		case strings.HasPrefix(name, "process "):
			e.process.Add(1)
		case name == "apply batch":
			e.batch.Add(1)
		case strings.HasPrefix(name, "db."):
			e.db.Add(1)
		}
	}
	return e.InMemoryExporter.ExportSpans(ctx, spans)
}

// switchable is a tracer provider whose tracers delegate to whichever
// provider it currently uses. Tracers obtained with otel.Tracer bind to the
// first global provider set, so the tests of this package install this one
// once, as the global, and switch what it uses.
type switchable struct {
	embedded.TracerProvider
	current atomic.Pointer[delegate]
	tracers sync.Map // name -> *switchTracer
}

type delegate struct{ tp trace.TracerProvider }

var (
	tracing     = &switchable{}
	installOnce sync.Once
)

func installSwitch() {
	installOnce.Do(func() {
		tracing.use(tracenoop.NewTracerProvider())
		otel.SetTracerProvider(tracing)
	})
}

func (s *switchable) use(tp trace.TracerProvider) { s.current.Store(&delegate{tp}) }

// Tracer returns the tracer of that name (the options of its first call
// are kept).
func (s *switchable) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	if t, ok := s.tracers.Load(name); ok {
		return t.(*switchTracer)
	}
	t, _ := s.tracers.LoadOrStore(name, &switchTracer{s: s, name: name, opts: opts})
	return t.(*switchTracer)
}

type switchTracer struct {
	embedded.Tracer
	s     *switchable
	name  string
	opts  []trace.TracerOption
	bound atomic.Pointer[boundTracer]
}

// boundTracer is a tracer of the delegate it came from.
type boundTracer struct {
	from *delegate
	t    trace.Tracer
}

func (t *switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	d := t.s.current.Load()
	b := t.bound.Load()
	if b == nil || b.from != d {
		b = &boundTracer{from: d, t: d.tp.Tracer(t.name, t.opts...)}
		t.bound.Store(b)
	}
	return b.t.Start(ctx, name, opts...)
}
