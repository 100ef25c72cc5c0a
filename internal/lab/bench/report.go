package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Targets of the headline figures.
const (
	TargetRate          = 15_000 // uniform transfers/s
	TargetVsTPCB        = 10     // uniform / TPC-B tps
	TargetVsNaive       = 7      // uniform / naive
	TargetVsCeiling     = 0.8    // uniform / ceiling
	TargetP99Ms         = 25     // p99 at half the peak rate
	TargetTail          = 3      // p99 / p50 at half the peak rate
	TargetCrossOverSame = 3.0    // cross-region p50 / same-region p50, each submit → COMMIT of its final state, at half the cross run's peak
	TargetDupCost       = 0.10   // time per duplicate / time per first delivery
	TargetVsFloor       = 0.6    // replay / floor (NATS alone delivering the same messages)
	TargetHotShare      = 0.50   // hot / uniform
	TargetDedupShare    = 0.85   // with the pre-filled consume-log / uniform
	TargetPeakRSSMB     = 200
	TargetAPIRate       = 5_000 // transfers/s through the HTTP API
	TargetAPIShare      = 0.45  // HTTP API / uniform
	TargetAPIP99Ms      = 50    // p99 through the HTTP API at the first concurrency (64)
	TargetAPICPUUs      = 350   // process + Postgres CPU per transfer through the HTTP API
	TargetAPICPU        = 2     // the HTTP API's CPU per transfer / uniform's (process + Postgres)
	sharingNotice       = "The publisher, the embedded nats-server and Postgres share this machine's cores with the ledger; compare runs of one invocation, and see the load average below."
)

// figures derives the headline figures from the runs, each with its target.
func figures(r Result) []Figure {
	var out []Figure
	add := func(name, unit, target string, measured bool, value float64, pass bool) {
		out = append(out, Figure{Name: name, Value: value, Unit: unit, Target: target, Measured: measured, Pass: measured && pass})
	}
	u, haveU := r.RunOf(Uniform)
	add("uniform throughput", "transfers/s", fmt.Sprintf(">= %d", TargetRate), haveU, u.Rate, u.Rate >= TargetRate)
	ratio := func(name string, other float64, have bool, target float64) {
		v := 0.0
		if have && other > 0 {
			v = u.Rate / other
		}
		add(name, "x", fmt.Sprintf(">= %gx", target), haveU && have && other > 0, v, v >= target)
	}
	tps := 0.0
	if r.TPCB != nil {
		tps = r.TPCB.TPS
	}
	ratio("uniform / TPC-B", tps, r.TPCB != nil, TargetVsTPCB)
	n, haveN := r.RunOf(Naive)
	ratio("uniform / naive (batch 1)", n.Rate, haveN, TargetVsNaive)
	ceil := 0.0
	if r.Ceiling != nil {
		ceil = r.Ceiling.Rate
	}
	ratio("uniform / ceiling (its SQL alone)", ceil, r.Ceiling != nil, TargetVsCeiling)
	l, haveL := r.RunOf(Latency)
	add("p50 at half the peak rate", "ms", "(reported)", haveL, l.P50Ms, true)
	add("p99 at half the peak rate", "ms", fmt.Sprintf("<= %d ms", TargetP99Ms), haveL, l.P99Ms, l.P99Ms <= TargetP99Ms)
	tail := 0.0
	if l.P50Ms > 0 {
		tail = l.P99Ms / l.P50Ms
	}
	add("p99 / p50 at half the peak rate", "x", fmt.Sprintf("<= %d", TargetTail), haveL && l.P50Ms > 0, tail, tail <= TargetTail)
	d, haveD := r.RunOf(Replay)
	cost := 0.0
	if haveD && d.Rate > 0 {
		cost = u.Rate / d.Rate // (1/duplicate rate) / (1/first-delivery rate)
	}
	add("duplicate cost / first delivery", "x", fmt.Sprintf("<= %g", TargetDupCost), haveU && haveD && d.Rate > 0, cost, cost <= TargetDupCost)
	f, haveF := r.RunOf(Floor)
	vsFloor := 0.0
	if haveF && f.Rate > 0 {
		vsFloor = d.Rate / f.Rate
	}
	add("replay / floor (NATS delivering the same messages to a consumer that only acks)", "x", fmt.Sprintf(">= %g", TargetVsFloor), haveD && haveF && f.Rate > 0, vsFloor, vsFloor >= TargetVsFloor)
	share := func(name, scenario string, target float64) {
		x, have := r.RunOf(scenario)
		v := 0.0
		if have && u.Rate > 0 {
			v = x.Rate / u.Rate
		}
		add(name, "x", fmt.Sprintf(">= %g", target), haveU && have, v, v >= target)
	}
	share("hot account / uniform", Hot, TargetHotShare)
	share("large consume-log / empty", Dedup, TargetDedupShare)
	off, haveOff := r.RunOf(NoEvents)
	cost = 0.0
	if haveOff && off.Rate > 0 {
		cost = u.Rate / off.Rate
	}
	add("events on / off (uniform / no-events)", "x", "(reported)", haveU && haveOff && off.Rate > 0, cost, true)
	hk, haveHk := r.RunOf(Webhooks)
	cost = 0.0
	if haveHk && hk.Rate > 0 {
		cost = u.Rate / hk.Rate
	}
	add("events and webhooks on / events off (no-events / webhooks)", "x", "(reported)", haveOff && haveHk && hk.Rate > 0, off.Rate/max(hk.Rate, 1e-9), true)
	add("webhooks on / off (uniform / webhooks)", "x", "(reported)", haveU && haveHk && hk.Rate > 0, cost, true)
	if haveHk && hk.Webhooks != nil {
		add("webhooks: deliveries per second (first publish to last 2xx)", "events/s", "(reported)", true, hk.Webhooks.Rate, true)
		add("webhooks: events delivered by the end of the drain", "%", "(reported)", hk.Webhooks.Events > 0, 100*float64(hk.Webhooks.Delivered)/float64(max(hk.Webhooks.Events, 1)), true)
	}
	var rss float64
	for _, x := range r.Runs {
		rss = max(rss, x.PeakRSSMB)
	}
	add("peak RSS of the bench process", "MB", "(reported)", haveU, rss, true)
	if p := r.Process; p != nil {
		add("ledger process: throughput", "transfers/s", "(reported)", true, p.Rate, true)
		add("ledger process: peak RSS", "MB", fmt.Sprintf("<= %d MB", TargetPeakRSSMB), true, p.PeakRSSMB, p.PeakRSSMB <= TargetPeakRSSMB)
	}
	if r.Cross != nil {
		add("cross-region throughput (completed)", "transfers/s", "(reported)", true, r.Cross.Rate, true)
		h := r.Cross.HalfPeak
		v, start := 0.0, 0.0
		if h != nil {
			v, start = h.CommitRatio, h.Ratio
		}
		add("cross-region p50 / same-region p50 at half its peak (to the final state's COMMIT)", "x", fmt.Sprintf("<= %g", TargetCrossOverSame), h != nil, v, v <= TargetCrossOverSame)
		add("the same, to the final transaction's start", "x", "(reported)", h != nil, start, true)
	}
	if x := r.CrossRelay; x != nil && x.HalfPeak != nil {
		add("the same to COMMIT, every saga step left to the relay (cross-relay)", "x", "(reported)", true, x.HalfPeak.CommitRatio, true)
	}
	if p := r.Replicas; p != nil {
		add("topology start, R1 (median)", "s", "(reported)", true, p.StartR1Seconds, true)
		add("topology start, R3 (median)", "s", "(reported)", true, p.StartR3Seconds, true)
		add("uniform throughput at R3", "transfers/s", "(reported)", true, p.R3.Rate, true)
		v := 0.0
		if haveU && u.Rate > 0 {
			v = p.R3.Rate / u.Rate
		}
		add("uniform R3 / R1", "x", "(reported)", haveU && u.Rate > 0, v, true)
	}
	if s := r.Standby; s != nil {
		add("uniform with a synchronous standby / alone (same server)", "x", "(reported)", s.Alone.Rate > 0, s.UniformRatio, true)
		add("HTTP API with a synchronous standby / alone (same server)", "x", "(reported)", s.APIAlone.Rate > 0, s.APIRatio, true)
		add("p99 with a synchronous standby (uniform)", "ms", "(reported)", true, s.WithStandby.P99Ms, true)
		v := 0.0
		if haveU && u.Rate > 0 {
			v = s.WithStandby.Rate / u.Rate
		}
		add("uniform with a synchronous standby / uniform (the machine's Postgres)", "x", "(reported)", haveU && u.Rate > 0, v, true)
		if a := r.API; a != nil && a.Rate > 0 {
			add("HTTP API with a synchronous standby / HTTP API (the machine's Postgres)", "x", "(reported)", true, s.APIWithStandby.Rate/a.Rate, true)
		}
	}
	if a := r.API; a != nil {
		at := fmt.Sprintf(" (%d in flight)", a.Concurrency)
		add("HTTP API throughput"+at, "transfers/s", fmt.Sprintf(">= %d/s", TargetAPIRate), true, a.Rate, a.Rate >= TargetAPIRate)
		add("HTTP API / uniform"+at, "x", fmt.Sprintf(">= %g", TargetAPIShare), haveU && u.Rate > 0, a.share(u), a.share(u) >= TargetAPIShare)
		add("HTTP API p99"+at, "ms", fmt.Sprintf("<= %d ms", TargetAPIP99Ms), true, a.P99Ms, a.P99Ms <= TargetAPIP99Ms)
		cpu := a.CPUPerTransferUs + a.PGCPUPerTransferUs
		add("HTTP API CPU/transfer"+at, "µs", fmt.Sprintf("<= %d µs", TargetAPICPUUs), a.PGCPUPerTransferUs >= 0, cpu, cpu <= TargetAPICPUUs)
		uCPU := u.CPUPerTransferUs + u.PGCPUPerTransferUs
		ratio := 0.0
		if uCPU > 0 {
			ratio = cpu / uCPU
		}
		add("HTTP API CPU/transfer / uniform's"+at, "x", fmt.Sprintf("<= %d", TargetAPICPU), haveU && a.PGCPUPerTransferUs >= 0 && u.PGCPUPerTransferUs >= 0 && uCPU > 0, ratio, ratio <= TargetAPICPU)
	}
	for _, a := range r.APIOther {
		add(fmt.Sprintf("HTTP API throughput (%d in flight)", a.Concurrency), "transfers/s", fmt.Sprintf(">= %d/s", TargetAPIRate), true, a.Rate, a.Rate >= TargetAPIRate)
	}
	if p := r.APIProcess; p != nil {
		add("API as processes: throughput", "transfers/s", fmt.Sprintf(">= %d/s", TargetAPIRate), true, p.Rate, p.Rate >= TargetAPIRate)
		add("API as processes: p99", "ms", "(reported)", true, p.P99Ms, true)
		cpu := p.CPUPerTransferUs + p.PGCPUPerTransferUs
		add("API as processes: CPU/transfer", "µs", fmt.Sprintf("<= %d µs", TargetAPICPUUs), p.CPUPerTransferUs >= 0 && p.PGCPUPerTransferUs >= 0, cpu, cpu <= TargetAPICPUUs)
		if uCPU := u.CPUPerTransferUs + u.PGCPUPerTransferUs; haveU && u.PGCPUPerTransferUs >= 0 && uCPU > 0 && p.PGCPUPerTransferUs >= 0 {
			add("API as processes: CPU/transfer / uniform's", "x", "(reported)", true, cpu/uCPU, true)
		}
	}
	if h := r.Holds; h != nil {
		for _, p := range h.Phases {
			add(fmt.Sprintf("HTTP API %s throughput (%d in flight, holds run)", p.Name, h.Concurrency), "requests/s", "(reported)", true, p.Rate, h.Verified)
		}
	}
	if rd := r.Reads; rd != nil {
		at := fmt.Sprintf(" (%s transfers)", count(rd.Transfers))
		var scans []string
		for _, x := range rd.Reads {
			add("reads: "+x.Name+" p99"+at, "ms", "(reported)", true, x.P99Ms, true)
			for _, t := range x.SeqScans {
				scans = append(scans, x.Name+" on "+t)
			}
		}
		planned := len(rd.Reads) > 0 && rd.Reads[0].Plan != ""
		add("reads: sequential scans"+at, "", "0", planned, float64(len(scans)), len(scans) == 0)
	}
	return out
}

// count renders n as 10M, 250k or 300.
func count(n int64) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000 && n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return fmt.Sprint(n)
}

// Print writes the result's summary: the machine, the figures with their
// targets and verdicts, and what each figure means.
func (r Result) Print(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "\n== paymesh-lab bench (%s) ==\n%s\n", fmtSeconds(r.Elapsed), sharingNotice)
	fmt.Fprintf(w, "machine: %d CPUs (load average %s at the start), %s; PostgreSQL %s with synchronous_commit=%s, fsync=%s, wal_sync_method=%s, shared_buffers=%s\n",
		m.CPUs, m.LoadAverage, m.GoVersion, m.Postgres, m.SynchronousCommit, m.Fsync, m.WALSyncMethod, m.SharedBuffers)
	if t := r.Telemetry; t != nil {
		fmt.Fprintf(w, "telemetry as shipped: sampler %s, %d spans exported by the bench process to %s (%d bytes received from every process), %d scrapes of /metrics (%d failed)\n",
			t.Sampler, t.Spans, t.Endpoint, t.ReceivedBytes, t.Scrapes, t.ScrapeErrors)
	} else {
		fmt.Fprintf(w, "telemetry off (--telemetry=false): no tracing, no /metrics\n")
	}
	if r.Config.Quick {
		fmt.Fprintf(w, "--quick: %d transfers, %d consume-log rows in the dedup-table run (the full run writes 10,000,000)\n", r.Config.Transfers, r.Config.DedupRows)
	}
	fmt.Fprintf(w, "%-38s %14s  %-12s %s\n", "figure", "value", "target", "")
	for _, f := range r.Figures {
		verdict := "MISS"
		switch {
		case !f.Measured:
			verdict = "not run"
		case strings.HasPrefix(f.Target, "("):
			verdict = ""
		case f.Pass:
			verdict = "PASS"
		}
		value := "-"
		if f.Measured {
			value = fmt.Sprintf("%.2f %s", f.Value, f.Unit)
			if f.Value >= 100 {
				value = fmt.Sprintf("%.0f %s", f.Value, f.Unit)
			}
		}
		fmt.Fprintf(w, "%-38s %14s  %-12s %s\n", f.Name, value, f.Target, verdict)
	}
	r.printReplicas(w)
	r.printStages(w)
	r.printHops(w)
	r.printAPI(w)
	r.printReads(w)
	if len(r.Sweep) > 0 {
		fmt.Fprintf(w, "batch-size sweep:")
		for _, s := range r.Sweep {
			fmt.Fprintf(w, "  %d: %.0f/s", s.BatchSize, s.Rate)
		}
		fmt.Fprintf(w, "  (best %d)\n", r.BestBatch)
	}
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s  invariants after every run (store.Verify, every transfer recorded once)\n", verdict)
	fmt.Fprintln(w, "Latency is publish→commit: CreatedAt set when the command is published, commit time taken by the ledger's after-commit hook (after COMMIT returned, before the acks).")
	fmt.Fprintln(w, "CPU per transfer counts this whole process (ledger, publisher, embedded nats-server) plus the run database's Postgres backends (not the WAL writer or checkpointer).")
	fmt.Fprintln(w, "Peak RSS is the process high-water mark up to each run: ledger, publisher, nats-server and the bench's own bookkeeping.")
}

// printHops writes the cross-region run's half-peak phase, hop by hop.
func (r Result) printHops(w io.Writer) {
	for _, x := range []*CrossRun{r.Cross, r.CrossRelay} {
		if x == nil || x.HalfPeak == nil {
			continue
		}
		name := Cross
		if x.RelaySteps {
			name = CrossRelay + " (every saga step left to the relay)"
		}
		h := x.HalfPeak
		fmt.Fprintf(w, "%s at half its peak (%.0f/s, %d transfers): to the final state's COMMIT, same-region p50 %.1f ms p99 %.1f ms, cross-region p50 %.1f ms p99 %.1f ms (%.1f x); to the final transaction's start, same-region p50 %.1f ms p99 %.1f ms, cross-region p50 %.1f ms p99 %.1f ms (%.1f x); the cross-region ones hop by hop, from the transactions' starts:\n",
			name, h.PacedRate, h.Transfers, h.SameCommitP50Ms, h.SameCommitP99Ms, h.CrossCommitP50Ms, h.CrossCommitP99Ms, h.CommitRatio,
			h.SameP50Ms, h.SameP99Ms, h.CrossP50Ms, h.CrossP99Ms, h.Ratio)
		printStageTable(w, h.Hops)
	}
}

// printStageTable writes stages with their p50, p99, mean and slowest-1 % mean.
func printStageTable(w io.Writer, stages []Stage) {
	fmt.Fprintf(w, "  %-52s %9s %9s %9s %14s\n", "stage", "p50 ms", "p99 ms", "mean ms", "slowest 1% ms")
	for _, s := range stages {
		fmt.Fprintf(w, "  %-52s %9.2f %9.2f %9.2f %14.2f\n", s.Name, s.P50Ms, s.P99Ms, s.MeanMs, s.TailMs)
	}
}

// printStages writes the latency run's breakdown by stage.
func (r Result) printStages(w io.Writer) {
	l, ok := r.RunOf(Latency)
	if !ok || len(l.Stages) == 0 {
		return
	}
	fmt.Fprintf(w, "latency at half the peak rate (%.0f/s), by stage, over %d messages:\n", l.PacedRate, l.Stages[0].Messages)
	printStageTable(w, l.Stages)
	b := l.StageBatch
	fmt.Fprintf(w, "  %-52s %9d %9d %9s %14.1f\n", "batch size (messages)", b.P50, b.P99, "", b.Slowest)
}

// share is the API run's rate over the uniform run's, 0 without one.
func (a APIRun) share(u LedgerRun) float64 {
	if u.Rate <= 0 {
		return 0
	}
	return a.Rate / u.Rate
}

// printAPI writes one line per HTTP API run: its rate against the uniform
// run of the same invocation, and where its CPU goes, next to uniform's.
func (r Result) printAPI(w io.Writer) {
	u, haveU := r.RunOf(Uniform)
	runs := r.APIOther
	if r.API != nil {
		runs = append([]APIRun{*r.API}, runs...)
	}
	for _, a := range runs {
		fmt.Fprintf(w, "HTTP API at %d in flight: %.0f/s", a.Concurrency, a.Rate)
		if haveU && u.Rate > 0 {
			fmt.Fprintf(w, " = %.2f × uniform's %.0f/s (target >= %g)", a.share(u), u.Rate, TargetAPIShare)
		}
		fmt.Fprintf(w, "; p50 %.1f ms, p99 %.1f ms; CPU per transfer %s", a.P50Ms, a.P99Ms, cpuSplit(a.CPUPerTransferUs, a.PGCPUPerTransferUs))
		if haveU {
			fmt.Fprintf(w, " (uniform: %s)", cpuSplit(u.CPUPerTransferUs, u.PGCPUPerTransferUs))
		}
		fmt.Fprintln(w)
	}
	if p := r.APIProcess; p != nil {
		fmt.Fprintf(w, "HTTP API as processes (api, router, ledger; the load from the bench process), %d in flight: %.0f/s", p.Concurrency, p.Rate)
		if haveU && u.Rate > 0 {
			fmt.Fprintf(w, " = %.2f × uniform", p.share(u))
		}
		fmt.Fprintf(w, "; p50 %.1f ms, p99 %.1f ms; CPU per transfer: api %.0f + router %.0f + ledger %.0f + Postgres %.0f = %.0f µs (the bench's client and nats-server: %.0f µs more)\n",
			p.P50Ms, p.P99Ms, p.ServiceCPUUs["api"], p.ServiceCPUUs["router"], p.ServiceCPUUs["ledger"], p.PGCPUPerTransferUs,
			p.CPUPerTransferUs+p.PGCPUPerTransferUs, p.BenchCPUUs)
	}
}

// printReads writes the reads scenario's table: each read's latency, rows
// and whether its plan scans a table in full.
func (r Result) printReads(w io.Writer) {
	rd := r.Reads
	if rd == nil {
		return
	}
	fmt.Fprintf(w, "reads on a region of %d transfers and %d change-log rows (%.0f MB), %d accounts, %d runs each, one session:\n",
		rd.Transfers, rd.Postings, rd.SizeMB, rd.Accounts, r.Config.ReadRuns)
	for _, x := range rd.Reads {
		fmt.Fprintf(w, "  %-14s p50 %7.2f ms  p99 %7.2f ms  %5.1f rows  %-36s %s\n", x.Name, x.P50Ms, x.P99Ms, x.Rows, scanVerdict(x), x.What)
	}
}

// cpuSplit renders process + Postgres CPU per transfer and their sum.
func cpuSplit(process, pg float64) string {
	if pg < 0 {
		return fmt.Sprintf("%.0f µs process + Postgres unread", process)
	}
	return fmt.Sprintf("%.0f µs process + %.0f µs Postgres = %.0f µs", process, pg, process+pg)
}

// OK reports whether every run's invariants held.
func (r Result) OK() bool {
	for _, x := range append(append([]LedgerRun(nil), r.Runs...), r.Sweep...) {
		if !x.Verified {
			return false
		}
	}
	return (r.Ceiling == nil || r.Ceiling.Verified) && (r.Cross == nil || r.Cross.Verified) && (r.CrossRelay == nil || r.CrossRelay.Verified) && (r.API == nil || r.API.Verified) && !slices.ContainsFunc(r.APIOther, func(a APIRun) bool { return !a.Verified }) &&
		(r.APIProcess == nil || r.APIProcess.Verified) && (r.Process == nil || r.Process.Verified) &&
		(r.Replicas == nil || r.Replicas.R3.Verified) && (r.Reads == nil || r.Reads.Verified)
}

func fmtSeconds(s float64) string { return fmt.Sprintf("%.0fs", s) }
