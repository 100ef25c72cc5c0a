package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// Config selects what Run runs.
type Config struct {
	// PostgresURL is the admin URL of the server the region databases are
	// created on.
	PostgresURL string
	Seeds       []uint64
	// Scenarios to run, by name or number (default: all built).
	Scenarios []string
	// Duration is how long each scenario's workload runs (default 10 s); a
	// scenario that waits for its fault's effect (scenario.effect) runs on
	// until it has had it, for at most effectWait more.
	Duration time.Duration
	// QuietWait bounds the wait for the cluster to drain after the
	// workload (default 2 minutes).
	QuietWait time.Duration
	// Keep keeps the region databases.
	Keep bool
	// bugs switches deliberate bugs on: set only by this package's tests.
	bugs bugs
	// dropBusinessKey drops the transfers' unique (client, idempotency
	// key) constraint before the workload: set only by this package's
	// tests, with bugs.DedupByTransferID.
	dropBusinessKey bool
	// forgeAs makes scenario 12 forge its publishes as this service's user
	// (a user allowed to publish there, "router"): set only by this
	// package's tests, to show the checker fails when a forgery lands.
	forgeAs string
	// asyncCommit turns synchronous_commit off on scenario 6's own
	// Postgres before its restarts: set only by this package's tests, to
	// show the checker fails when acknowledged commits are lost.
	asyncCommit bool
	// asyncStandby takes scenario 22's standby out of the write quorum
	// (an asynchronous standby): set only by this package's tests, to show
	// the checker names the acknowledged commits a failover then loses.
	asyncStandby bool
	// oneServer runs the regions a scenario wants clustered (R3) on one
	// server (R1), as the others: set only by this package's tests, to show
	// the checker fails when scenario 14's disk loss takes acknowledged
	// commands with it.
	oneServer bool
	// quorumLoss makes scenario 13 stop a follower together with each
	// stream leader, so that the region has no leader at all while they
	// are down (quorumDown): set only by this package's tests, so that the deliberate
	// bug of scenario 13 meets publishes into a leaderless stream on every
	// run, not only when one happens to fall in the short election window.
	quorumLoss bool
	// killShare is the share of apply transactions scenario 2 kills before
	// COMMIT (default 3 %): set only by this package's tests, so that the
	// deliberate bug of scenario 2 meets acknowledged commands whose
	// transaction and retry are both killed on every run.
	killShare float64
	// conflictShare is the share of scenario 1's transfers sent again
	// with the same key and another body (default conflictShare, 2 %): set
	// only by this package's tests, so that the deliberate bug of scenario
	// 1 meets conflicting bodies through the API on every run (at 2 %, a
	// run held one at times, and it could end unanswered).
	conflictShare float64
}

// Result is one scenario run's verdict.
type Result struct {
	Scenario string           `json:"scenario"`
	Seed     uint64           `json:"seed"`
	What     string           `json:"what"`
	Counts   string           `json:"fault_counter"`
	Faults   int64            `json:"faults_fired"`
	OK       int              `json:"ok"`
	Fail     int              `json:"fail"`
	Unknown  int              `json:"unknown"`
	Lost     int              `json:"lost"`
	Doubled  int              `json:"doubled"`
	Quiet    bool             `json:"quiet"`
	Checks   []Check          `json:"checks"`
	Stats    map[string]int64 `json:"stats"`
	Elapsed  time.Duration    `json:"elapsed_ns"`
	Error    string           `json:"error,omitempty"`
	// History is the run's operations (kept out of the JSON file).
	History []Op `json:"-"`
}

// Passed reports whether every check passed and the fault fired.
func (r Result) Passed() bool {
	if r.Error != "" || r.Faults == 0 {
		return false
	}
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// Check returns the named check (a zero Check when there is none).
func (r Result) Check(name string) Check {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	return Check{}
}

// Run runs every selected scenario once per seed, one after another,
// writing a line per run to out, and returns the results.
func Run(ctx context.Context, cfg Config, out io.Writer) ([]Result, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	if cfg.QuietWait <= 0 {
		cfg.QuietWait = 2 * time.Minute
	}
	if len(cfg.Seeds) == 0 {
		cfg.Seeds = []uint64{1}
	}
	names := cfg.Scenarios
	if len(names) == 0 {
		names = Scenarios()
	}
	var builds []func() *scenario
	for _, n := range names {
		build, err := builderByName(strings.TrimSpace(n))
		if err != nil {
			return nil, err
		}
		builds = append(builds, build)
	}
	var results []Result
	for _, build := range builds {
		for _, seed := range cfg.Seeds {
			if ctx.Err() != nil {
				return results, ctx.Err()
			}
			r := runScenario(ctx, cfg, build(), seed)
			verdict := "PASS"
			if !r.Passed() {
				verdict = "FAIL"
			}
			fmt.Fprintf(out, "%s %s seed %d: faults %d, ops %d/%d/%d, %s\n", verdict, r.Scenario, r.Seed, r.Faults, r.OK, r.Fail, r.Unknown,
				r.Elapsed.Round(100*time.Millisecond))
			results = append(results, r)
		}
	}
	return results, nil
}

func runScenario(ctx context.Context, cfg Config, s *scenario, seed uint64) Result {
	began := time.Now()
	r := Result{Scenario: s.name, Seed: seed, What: s.what, Counts: s.counts}
	fail := func(err error) Result {
		r.Error, r.Elapsed = err.Error(), time.Since(began)
		return r
	}
	e, err := start(ctx, cfg, s, seed)
	if err != nil {
		return fail(err)
	}
	defer e.stop()
	if err := e.open(ctx); err != nil {
		return fail(fmt.Errorf("open accounts: %w", err))
	}
	if cfg.dropBusinessKey {
		for _, n := range e.names {
			if _, err := e.c.Region(n).Ledger.Store.Pool().Exec(ctx,
				`ALTER TABLE transfers DROP CONSTRAINT transfers_client_id_idempotency_key_key`); err != nil {
				return fail(err)
			}
		}
	}
	workers := s.workers
	if workers == 0 {
		workers = 6
	}
	d := max(cfg.Duration, s.minRun)
	e.active.Store(true)
	fctx, cancel := e.untilEffect(ctx, d)
	faultErr := make(chan error, 1)
	go func() {
		if s.fault == nil {
			faultErr <- nil
			return
		}
		faultErr <- s.fault(fctx, e, d)
	}()
	e.run(ctx, fctx, workers)
	err = <-faultErr
	cancel()
	e.active.Store(false)
	if err != nil {
		return fail(fmt.Errorf("fault: %w", err))
	}
	e.waitForHolds(ctx) // the holds left open expire before the checks
	qctx, qcancel := context.WithTimeout(ctx, cfg.QuietWait)
	r.Quiet = e.c.WaitQuiet(qctx) == nil
	qcancel()
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer ccancel()
	quiet := Check{Name: "quiet", What: "the cluster drained after the workload", OK: r.Quiet, Checked: 1}
	if !r.Quiet {
		n, _ := e.c.Backlog(cctx)
		quiet.Failures = []string{fmt.Sprintf("backlog %d after %s", n, cfg.QuietWait)}
	}

	v, err := check(cctx, e.c, e.hist, r.Quiet)
	if err != nil {
		return fail(fmt.Errorf("check: %w", err))
	}
	i6, err := checkReplay(cctx, e.c)
	if err != nil {
		return fail(fmt.Errorf("replay: %w", err))
	}
	r.Checks = append(v.checks, i6, quiet, e.causes())
	if s.extra != nil {
		extra, err := s.extra(cctx, e)
		if err != nil {
			return fail(err)
		}
		r.Checks = append(r.Checks, extra...)
	}
	r.Lost, r.Doubled = v.lost, v.doubled
	counts := e.hist.Counts()
	r.OK, r.Fail, r.Unknown = counts[OK], counts[Fail], counts[Unknown]
	r.Faults = e.fired.Load()
	if s.fired != nil {
		r.Faults = s.fired(e)
	}
	r.Stats = map[string]int64{}
	for _, n := range e.names {
		st := e.c.Region(n).Ledger.Stats
		r.Stats["ledger_redeliveries"] += st.Redeliveries.Load()
		r.Stats["apply_failed"] += st.ApplyFailed.Load()
		r.Stats["ledger_retries"] += st.Retries.Load()
		r.Stats["ledger_gave_up"] += st.GaveUp.Load()
		r.Stats["ledger_commits_unanswered"] += st.CommitsUnanswered.Load()
		r.Stats["ledger_applied"] += st.Applied.Load()
		r.Stats["dead_lettered"] += st.DeadLettered.Load()
		for layer, v := range st.Duplicates() {
			r.Stats["duplicates_"+layer] += v
		}
	}
	for _, p := range []string{PurposeFirst, PurposeRetry, PurposeResubmit, PurposeConflict, PurposeBurst, PurposeLate} {
		r.Stats["sent_"+p] = e.sent.get(p)
	}
	if err := e.flowStats(cctx, r.Stats); err != nil {
		return fail(fmt.Errorf("flow stats: %w", err))
	}
	e.events.m.Range(func(k, v any) bool {
		r.Stats[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	r.History = e.hist.Ops()
	r.Elapsed = time.Since(began)
	return r
}

// Print writes the results as a table, then the failures of every failed
// check.
func Print(w io.Writer, results []Result) {
	fmt.Fprintf(w, "%-19s %4s %7s %20s %5s %7s  %-4s %-4s %-4s %-4s %-4s %-4s %-4s %-5s %s\n",
		"scenario", "seed", "faults", "ops ok/fail/unknown", "lost", "doubled", I1, I2, I3, I4, I5, I6, I7, "quiet", "other")
	for _, r := range results {
		if r.Error != "" {
			fmt.Fprintf(w, "%-19s %4d ERROR %s\n", r.Scenario, r.Seed, r.Error)
			continue
		}
		v := func(name string) string {
			c := r.Check(name)
			if c.Name == "" {
				return "-"
			}
			if c.OK {
				return "PASS"
			}
			return "FAIL"
		}
		var other []string
		for _, c := range r.Checks {
			if !strings.HasPrefix(c.Name, "I") && c.Name != "quiet" {
				other = append(other, c.Name+" "+v(c.Name))
			}
		}
		faults := fmt.Sprint(r.Faults)
		if r.Faults == 0 {
			faults = "0 FAIL"
		}
		fmt.Fprintf(w, "%-19s %4d %7s %20s %5d %7d  %-4s %-4s %-4s %-4s %-4s %-4s %-4s %-5s %s\n", r.Scenario, r.Seed, faults,
			fmt.Sprintf("%d/%d/%d", r.OK, r.Fail, r.Unknown), r.Lost, r.Doubled,
			v(I1), v(I2), v(I3), v(I4), v(I5), v(I6), v(I7), v("quiet"), strings.Join(other, ", "))
	}
	for _, r := range results {
		for _, c := range r.Checks {
			if c.OK {
				continue
			}
			fmt.Fprintf(w, "\nFAIL %s seed %d %s (%s):\n", r.Scenario, r.Seed, c.Name, c.What)
			for _, f := range c.Failures {
				fmt.Fprintf(w, "  %s\n", f)
			}
		}
	}
}

// AllPassed reports whether every run passed.
func AllPassed(results []Result) bool {
	for _, r := range results {
		if !r.Passed() {
			return false
		}
	}
	return len(results) > 0
}

// WriteJSON writes the results to path.
func WriteJSON(path string, results []Result) error {
	b, err := json.MarshalIndent(map[string]any{"results": results}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
