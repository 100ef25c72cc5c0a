package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/lab/bench"
	"github.com/paymesh/paymesh/internal/testbed/pgha"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
)

// TestBenchSmall runs every scenario at a tiny size and checks the result's
// structure, not its timing: every transfer committed, the invariants held
// after every run, the figures and the JSON written, and no database left.
// Its deadline only bounds a hang: it takes about 4 minutes on a loaded
// machine (the bench's scenarios one after another).
func TestBenchSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("pmbench_%d_", os.Getpid())
	out := &strings.Builder{}
	res, err := bench.Run(ctx, bench.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: prefix,
		Accounts: 20, Transfers: 300, ReadTransfers: 2000, ReadRuns: 3, CrossTransfers: 60, APITransfers: 80, APIConcurrency: []int{8, 16}, DedupRows: 2000, Window: 64,
		LatencyFor: 500 * time.Millisecond, NaiveFor: 500 * time.Millisecond, PgbenchScale: 1, PgbenchFor: time.Second,
		CPUProfile: filepath.Join(t.TempDir(), "cpu.pprof"), Telemetry: true,
	}, out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	// As shipped: the services traced and exported, their /metrics scraped.
	if tel := res.Telemetry; tel == nil || tel.Spans == 0 || tel.ReceivedBytes == 0 || tel.Scrapes == 0 || tel.ScrapeErrors != 0 {
		t.Errorf("telemetry: %+v", tel)
	}
	for _, s := range []string{bench.Uniform, bench.Replay, bench.Floor, bench.Latency, bench.Hot, bench.Dedup, bench.Webhooks, bench.Naive} {
		r, ok := res.RunOf(s)
		switch {
		case !ok:
			t.Errorf("%s: no run", s)
		case !r.Verified:
			t.Errorf("%s: invariants: %s", s, r.VerifyReport)
		case r.Committed != int64(r.Published) || r.Published == 0:
			t.Errorf("%s: %d of %d committed", s, r.Committed, r.Published)
		case r.Rate <= 0 || r.P99Ms < r.P50Ms || r.PeakRSSMB <= 0 || r.CPUPerTransferUs <= 0:
			t.Errorf("%s: implausible figures %+v", s, r)
		}
	}
	if l, _ := res.RunOf(bench.Latency); !stagesAddUp(t, l) {
		t.Errorf("latency: stages %+v, batch sizes %+v", l.Stages, l.StageBatch)
	}
	if u, _ := res.RunOf(bench.Uniform); u.Published != 300 {
		t.Errorf("uniform published %d, want 300", u.Published)
	}
	if r, _ := res.RunOf(bench.Replay); r.Layers["recent_cache"]+r.Layers["dedup_table"] != 300 {
		t.Errorf("replay: duplicates caught by layer %v, want 300 in all", r.Layers)
	}
	if h, _ := res.RunOf(bench.Webhooks); h.Webhooks == nil || h.Webhooks.Events < 600 || h.Webhooks.Delivered != h.Webhooks.Events || h.Webhooks.Rate <= 0 {
		t.Errorf("webhooks: %+v, want every event of the run (2 per transfer, and the accounts') delivered", h.Webhooks)
	}
	if d, _ := res.RunOf(bench.Dedup); d.DedupRows != 2000 {
		t.Errorf("dedup-table: %d rows filled, want 2000", d.DedupRows)
	}
	if n, _ := res.RunOf(bench.Naive); n.BatchSize != 1 || n.MeanBatch != 1 {
		t.Errorf("naive: batch size %d, mean batch %v, want 1", n.BatchSize, n.MeanBatch)
	}
	if c := res.Ceiling; c == nil || !c.Verified || c.Transfers != 300 || c.Rate <= 0 {
		t.Errorf("ceiling: %+v", c)
	}
	if res.TPCB == nil || res.TPCB.TPS <= 0 {
		t.Errorf("tpcb: %+v", res.TPCB)
	}
	switch s := res.Standby; {
	case s == nil && (pgha.Available() == nil || os.Getenv("PAYMESH_REQUIRE_PGHA") != ""):
		t.Errorf("standby: no run (%v)", pgha.Available())
	case s != nil:
		for _, r := range []bench.LedgerRun{s.Alone, s.WithStandby} {
			if !r.Verified || r.Committed != 300 || r.Rate <= 0 {
				t.Errorf("standby %s: %d committed, %v/s, verified %v %s", r.Scenario, r.Committed, r.Rate, r.Verified, r.VerifyReport)
			}
		}
		for _, a := range []bench.APIRun{s.APIAlone, s.APIWithStandby} {
			if !a.Verified || a.Completed != 80 || a.Rate <= 0 {
				t.Errorf("standby api: %+v", a)
			}
		}
		if s.UniformRatio <= 0 || s.APIRatio <= 0 || s.StandbySeconds <= 0 {
			t.Errorf("standby: ratios %v, %v, made in %vs", s.UniformRatio, s.APIRatio, s.StandbySeconds)
		}
	}
	for _, c := range []*bench.CrossRun{res.Cross, res.CrossRelay} {
		if c == nil || !c.Verified || c.Completed != 60 || c.RelaySteps != (c == res.CrossRelay) {
			t.Errorf("cross-region: %+v", c)
			continue
		}
		// Each transfer's final COMMIT comes after its final
		// transaction's start.
		if h := c.HalfPeak; h == nil || len(h.Hops) != 6 || h.Ratio <= 0 || !hopsAddUp(h.Hops) || h.Hops[5].P50Ms != h.CrossP50Ms ||
			h.CommitRatio <= 0 || h.SameCommitP50Ms < h.SameP50Ms || h.CrossCommitP50Ms < h.CrossP50Ms {
			t.Errorf("cross-region at half its peak (relay steps %v): %+v", c.RelaySteps, h)
		}
	}
	if a := res.API; a == nil || !a.Verified || a.Completed != 80 || a.Rate <= 0 || a.P99Ms < a.P50Ms || a.Concurrency != 8 {
		t.Errorf("api: %+v", a)
	}
	if o := res.APIOther; len(o) != 1 || !o[0].Verified || o[0].Completed != 80 || o[0].Concurrency != 16 {
		t.Errorf("api at 16 in flight: %+v", o)
	}
	if p := res.Replicas; p == nil || !p.R3.Verified || p.R3.Committed != 300 || p.R3.Rate <= 0 || p.StartR1Seconds <= 0 ||
		p.StartR3Seconds <= 0 || len(p.StartsR3) != 3 {
		t.Errorf("replicas: %+v", p)
	}
	var printed strings.Builder
	if res.Print(&printed); res.Replicas != nil && !strings.Contains(printed.String(), "R3 (a cluster of three)") {
		t.Errorf("replicas: no R1/R3 table in\n%s", printed.String())
	}
	if p := printed.String(); !strings.Contains(p, "HTTP API at 8 in flight: ") || !strings.Contains(p, "HTTP API at 16 in flight: ") ||
		!strings.Contains(p, "× uniform's") || !strings.Contains(p, "µs Postgres = ") {
		t.Errorf("api: no line with the API / uniform ratio and the CPU split for each run in\n%s", p)
	}
	if res.Machine.SynchronousCommit == "" || res.Machine.Fsync == "" {
		t.Errorf("machine: %+v", res.Machine)
	}
	for _, f := range res.Figures {
		if !f.Measured {
			t.Errorf("figure %q not measured", f.Name)
		}
	}
	if fi, err := os.Stat(res.Config.CPUProfile); err != nil || fi.Size() == 0 {
		t.Errorf("cpu profile: %v", err)
	}

	path := filepath.Join(t.TempDir(), "bench.json")
	if err := res.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	var back bench.Result
	if b, err := os.ReadFile(path); err != nil || json.Unmarshal(b, &back) != nil || len(back.Runs) != len(res.Runs) {
		t.Fatalf("JSON: %v, %d runs read back", err, len(back.Runs))
	}
	res.Print(io.Discard)

	conn, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE $1`, prefix+"%").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d bench databases left (%v)", left, err)
	}
}

// TestCeiling runs the ceiling baseline at a tiny size: every transfer
// committed in transactions of the batch size by as many loops as the
// ledger has workers, what the loops wrote passing the ledger's invariant
// checks, and the uniform / ceiling figure reported.
func TestCeiling(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &strings.Builder{}
	res, err := bench.Run(ctx, bench.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmbench_ceil_%d_", os.Getpid()),
		Scenarios: []string{bench.Ceiling}, Accounts: 50, Transfers: 1000, BatchSize: 64,
	}, out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	c := res.Ceiling
	if c == nil || !c.Verified || c.Transfers != 1000 || c.Transactions != 16 || c.BatchSize != 64 || c.Loops != 2 || c.Rate <= 0 || c.Capped {
		t.Fatalf("ceiling: %+v\n%s", c, out)
	}
	var printed strings.Builder
	res.Print(&printed)
	if !strings.Contains(printed.String(), "uniform / ceiling") {
		t.Errorf("no uniform / ceiling figure in\n%s", printed.String())
	}
}

// TestLedgerProcess builds the paymesh binary and runs the ledger-process
// scenario at a tiny size: `paymesh ledger` in a process of its own
// applies every transfer, and its peak RSS and CPU are read from /proc.
func TestLedgerProcess(t *testing.T) {
	bin := buildPaymesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &strings.Builder{}
	res, err := bench.Run(ctx, bench.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmbench_proc_%d_", os.Getpid()),
		Scenarios: []string{bench.LedgerProcess}, Accounts: 20, Transfers: 300, LedgerBinary: bin,
	}, out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	p := res.Process
	if p == nil || !p.Verified || p.Transfers != 300 || p.PeakRSSMB <= 0 || p.CPUPerTransferUs <= 0 || p.Rate <= 0 {
		t.Fatalf("ledger process: %+v\n%s", p, out)
	}
}

// TestAPIProcess builds the paymesh binary and runs the api-process
// scenario at a tiny size: `paymesh ledger`, `paymesh router` and `paymesh
// api` in processes of their own, every transfer sent from the bench
// process answered 201 and recorded once, and each process's CPU read from
// /proc.
func TestAPIProcess(t *testing.T) {
	bin := buildPaymesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &strings.Builder{}
	res, err := bench.Run(ctx, bench.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmbench_apiproc_%d_", os.Getpid()),
		Scenarios: []string{bench.APIProcess}, Accounts: 20, Transfers: 300, APITransfers: 101, APIConcurrency: []int{8}, LedgerBinary: bin,
		Telemetry: true,
	}, out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	// The uniform run's ledger and the three services' /metrics, each
	// scraped at least once.
	if tel := res.Telemetry; tel == nil || tel.Scrapes < 4 || tel.ScrapeErrors != 0 {
		t.Errorf("telemetry: %+v", tel)
	}
	p := res.APIProcess
	if p == nil || !p.Verified || p.Transfers != 100 || p.Completed != 100 || p.Concurrency != 8 || p.Rate <= 0 || p.P99Ms < p.P50Ms {
		t.Fatalf("api process: %+v\n%s", p, out)
	}
	if p.ServiceCPUUs["api"] <= 0 {
		t.Errorf("api process: CPU per transfer %v, want > 0", p.ServiceCPUUs["api"])
	}
	// The ledger and the router run, but the API applies its transfers
	// itself: their shares are measured, and may round to 0.
	for _, s := range []string{"ledger", "router"} {
		if cpu, ok := p.ServiceCPUUs[s]; !ok || cpu < 0 {
			t.Errorf("%s process: CPU per transfer %v (measured %v), want it measured", s, cpu, ok)
		}
	}
	if p.PGCPUPerTransferUs <= 0 || p.CPUPerTransferUs <= 0 {
		t.Errorf("api process: CPU %v + Postgres %v µs per transfer", p.CPUPerTransferUs, p.PGCPUPerTransferUs)
	}
	var printed strings.Builder
	if res.Print(&printed); !strings.Contains(printed.String(), "HTTP API as processes") {
		t.Errorf("no api-process line in\n%s", printed.String())
	}
}

// buildPaymesh builds the paymesh binary into a temporary directory.
func buildPaymesh(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the paymesh binary")
	}
	bin := filepath.Join(t.TempDir(), "paymesh")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/paymesh/paymesh/cmd/paymesh").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestReads runs the reads scenario on a region of 20,000 transfers: the
// loaded tables pass the ledger's invariant checks, every read answers
// rows, and auto_explain's plan of each uses an index for every table it
// reads (at this size ANALYZE reads every row, so the plans do not depend
// on a sample). Dropping one of migration 00014's indexes fails it.
func TestReads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &strings.Builder{}
	res, err := bench.Run(ctx, bench.Config{
		PostgresURL: pgtest.AdminURL(), DatabasePrefix: fmt.Sprintf("pmbench_reads_%d_", os.Getpid()),
		Scenarios: []string{bench.Reads}, Accounts: 200, Transfers: 300, ReadTransfers: 20_000, ReadRuns: 10,
	}, out)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	r := res.Reads
	// Two change-log rows a transfer, but one in a hundred is REJECTED and
	// has none; each account's funding has two (the issuance account's).
	if r == nil || !r.Verified || r.Transfers != 20_000 || r.Postings != 2*(20_000-200)+2*200 || len(r.Reads) != 8 {
		t.Fatalf("reads: %+v\n%s", r, out)
	}
	for _, x := range r.Reads {
		switch {
		case x.Runs != 10 || x.Rows < 1 || x.P50Ms <= 0 || x.P99Ms < x.P50Ms:
			t.Errorf("%s: implausible figures %+v", x.Name, x)
		case !strings.Contains(x.Plan, "Index"):
			t.Errorf("%s: no plan with an index:\n%s", x.Name, x.Plan)
		case len(x.SeqScans) > 0:
			t.Errorf("%s: scans %v in full:\n%s", x.Name, x.SeqScans, x.Plan)
		}
	}
	var printed strings.Builder
	if res.Print(&printed); !strings.Contains(printed.String(), "reads on a region of 20000 transfers") ||
		!strings.Contains(printed.String(), "reads: sequential scans (20k transfers)") {
		t.Errorf("no reads table or figure in\n%s", printed.String())
	}
}

// stagesAddUp checks the latency run's breakdown: a stage for every step
// from publish to ack, each seen for every committed message and never
// negative, whose means add up to the publish→ack mean, and the total's
// median the run's.
func stagesAddUp(t *testing.T, l bench.LedgerRun) bool {
	t.Helper()
	const steps = 8 // publish → stored … COMMIT → ack
	if len(l.Stages) != steps+2 || l.StageBatch.P50 < 1 || l.StageBatch.Slowest < 1 {
		t.Logf("%d stages, want %d steps, the total and the PubAck", len(l.Stages), steps)
		return false
	}
	var sum float64
	for _, s := range l.Stages[:steps] {
		if s.Messages != int(l.Committed) || s.P50Ms < 0 || s.MeanMs < 0 || s.TailMs < 0 {
			t.Logf("stage %q: %+v over %d committed", s.Name, s, l.Committed)
			return false
		}
		sum += s.MeanMs
	}
	total := l.Stages[steps]
	if math.Abs(sum-total.MeanMs) > 0.01+total.MeanMs/100 || total.P50Ms != l.P50Ms {
		t.Logf("stage means add up to %.3f ms, total %.3f ms; total p50 %.3f ms, the run's %.3f ms", sum, total.MeanMs, total.P50Ms, l.P50Ms)
		return false
	}
	return true
}

// hopsAddUp reports whether the cross-region hops (the last their total)
// were each timed on every transfer, their means adding up to the total's.
// A hop may be negative: a step is "relayed" when the relay marks it sent,
// after its PubAck, and the destination may have begun its credit by then.
func hopsAddUp(hops []bench.Stage) bool {
	total := hops[len(hops)-1]
	var sum float64
	for _, h := range hops[:len(hops)-1] {
		if h.Messages != total.Messages || h.Messages == 0 {
			return false
		}
		sum += h.MeanMs
	}
	return math.Abs(sum-total.MeanMs) <= 0.01+total.MeanMs/100
}
