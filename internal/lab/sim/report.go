package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// Report is what a run found.
type Report struct {
	RunDir   string
	Elapsed  time.Duration // the whole run, start-up to report
	LoadTime time.Duration // how long the load ran
	// LoadSummary is the load's last lines; LoadError why it failed.
	LoadSummary, LoadError string
	// Acknowledged counts the keys answered 201 or 202; Completed,
	// Refunded, Rejected and Unfinished their final states in their home
	// regions.
	Acknowledged, Completed, Refunded, Rejected, Unfinished int64
	// Request-to-final-state percentiles in milliseconds, per kind.
	SameP50, SameP99, CrossP50, CrossP99 float64
	// Pairs is the cross-region p50 of each pair of regions (payer's
	// first) against its link's round trip.
	Pairs []PairLatency
	// Duplicates caught during the run, by region and layer (from
	// Prometheus, counter resets of restarted services included).
	Duplicates map[string]map[string]float64
	// DuplicateRate is duplicates per delivery by region: before the
	// degraded link, while it was degraded (and a router ack wait after),
	// and after; or over the whole run when it did not run.
	DuplicateRate map[string]map[string]float64
	Scheduled     []string // the faults of the schedule
	Fired         []string // the faults that fired
	FaultErrors   []string
	// LeaderKills are the kills of a stream's leader node (FaultKillLeader)
	// that were undone: which node led the stream, and which led it while
	// that one was down.
	LeaderKills []LeaderKill
	// Failover is what the kill of eu's Postgres primary cost (nil: the
	// fault did not fire).
	Failover *Failover `json:",omitempty"`
	// LedgerKills are the kills of a region's ledger, with the time the
	// region wrote nothing.
	LedgerKills []ServiceKill `json:",omitempty"`
	// Hooks is the audit of compose's reference receiver (nil: compose
	// runs none): the load's client's events, their deliveries, the
	// redeliveries asked for, the duplicates the receiver recorded by
	// cause, and what it applied.
	Hooks *HooksAudit `json:",omitempty"`
	// Verify is the global invariant report (postgres.VerifyGlobal on each
	// region's database, nothing in transit required); Tools says
	// whether each verify-<region> process passed.
	Verify postgres.Report
	Tools  map[string]bool
	// Transport is what the servers said of their links' encryption
	// after the load; TransportError why it could not be read.
	Transport      Transport
	TransportError string `json:",omitempty"`
	// Lost are acknowledged keys their home region never recorded;
	// Doubled those recorded more than once or under another transfer;
	// Stuck those recorded whose transfer never reached a final state (a
	// saga step lost), with the transfer and its state.
	Lost, Doubled, Stuck []string
	// Failed are the services that exited with an error after the faults
	// were undone (their logs' last lines); RouterLogs, when something was
	// left unfinished, the last lines of each router's log.
	Failed, RouterLogs []string
	// Restarted counts, per service, the starts by its compose restart
	// policy after it exited on its own (a start-up that timed out while
	// a fault was on, for one).
	Restarted map[string]int
	// Alerts are the alerts seen during the run and whether each cleared.
	Alerts []AlertSeen
	// Panels are the dashboard's panel queries that returned no data
	// (PanelsChecked how many ran).
	PanelsEmpty   []string
	PanelsChecked int
	// PanelsUnchecked are panels that can have no data in this run.
	PanelsUnchecked []string
	// WantAlert is the alert the degraded link must fire and clear ("":
	// not checked, the degrade fault did not run).
	WantAlert string
	// AlertRequired makes WantAlert a check of the verdict; without it
	// (--quick) the alert is reported for information. A quick run's
	// degrade (16 s) does not always make us's own routers lose a PubAck:
	// the duplicates of publishes *to* us are counted by the sending
	// region's router.
	AlertRequired bool
	// DegradedFrom and DegradedTo are when the degraded link began and
	// ended.
	DegradedFrom, DegradedTo time.Time
	// Explained is why the duplicates came (dups.go; nil: not read).
	Explained *Explained `json:",omitempty"`
	Checks    []Check
	// Pass is OK() when the report was judged.
	Pass bool

	history []loadgen.HistoryEntry
	client  string
}

// AlertSeen is one alert (name and labels) seen firing, and whether it
// was no longer firing at the end.
type AlertSeen struct {
	Name    string
	Labels  map[string]string
	Fired   bool
	Cleared bool
	// FiredAt is when a poll first saw it firing; ClearedAt when one
	// first saw it no longer firing after that (zero while it fires).
	FiredAt, ClearedAt time.Time
}

// Check is one PASS/FAIL line of the report.
type Check struct {
	Name   string
	OK     bool
	Info   bool   `json:",omitempty"` // a note, not a verdict
	Detail string `json:",omitempty"`
}

// OK reports whether every check passed.
func (r *Report) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return len(r.Checks) > 0
}

// judge fills in the checks.
func (r *Report) judge() {
	add := func(ok bool, name, detail string) {
		r.Checks = append(r.Checks, Check{Name: name, OK: ok, Detail: detail})
	}
	add(r.LoadError == "", "the load ran to its end", r.LoadError)
	missing := []string{}
	for _, f := range r.Scheduled {
		if !slices.Contains(r.Fired, f) {
			missing = append(missing, f)
		}
	}
	add(len(missing) == 0 && len(r.FaultErrors) == 0, fmt.Sprintf("every scheduled fault fired and was undone (%d of %d)", len(r.Fired), len(r.Scheduled)),
		strings.Join(append(missing, r.FaultErrors...), "; "))
	for _, k := range r.LeaderKills {
		add(k.LeaderWhileDown != k.Killed && strings.HasPrefix(k.LeaderWhileDown, "nats-"),
			fmt.Sprintf("%s kept a leader while its leader %s was down (%s)", k.Stream, k.Killed, k.LeaderWhileDown), "")
	}
	if fo := r.Failover; fo != nil {
		add(fo.check())
	}
	for _, k := range r.LedgerKills {
		gap := k.Gap.Round(10 * time.Millisecond).String()
		if k.Error != "" {
			gap = "unknown (" + k.Error + ")"
		}
		r.Checks = append(r.Checks, Check{Name: fmt.Sprintf("INFO %s killed (restarted %s later): %s's last commit before → first after: %s",
			k.Service, restartDelay, k.Region, gap), OK: true, Info: true})
	}
	add(r.Acknowledged > 0, fmt.Sprintf("the load was acknowledged (%d keys)", r.Acknowledged), "")
	add(len(r.Lost) == 0, fmt.Sprintf("every acknowledged key is in its home ledger (%d lost)", len(r.Lost)), strings.Join(r.Lost, "\n"))
	add(len(r.Doubled) == 0, fmt.Sprintf("no acknowledged key applied twice (%d doubled)", len(r.Doubled)), strings.Join(r.Doubled, "\n"))
	add(len(r.Failed) == 0, fmt.Sprintf("every service was running once the load had drained (%d exited; restarted by compose's policy: %s)",
		len(r.Failed), restarts(r.Restarted)), strings.Join(r.Failed, "\n"))
	add(r.Unfinished == 0, fmt.Sprintf("every recorded transfer reached a final state (%d unfinished)", r.Unfinished),
		strings.Join(append(slices.Clone(r.Stuck), r.RouterLogs...), "\n"))
	add(r.Verify.OK() && len(r.Verify.Checks) > 0, "global invariants (verify --all --quiescent, in process)", "")
	if h := r.Hooks; h != nil {
		add(h.OK() && h.Events > 0 && h.Applied > 0, fmt.Sprintf("every event of the load's client applied once at the reference receiver, or failed with its attempts; "+
			"every redelivery a duplicate (%d events, %d lost, %d doubled; %d redelivered, %d duplicates)", h.Events, h.Lost, h.Doubled, h.Redelivered, h.Duplicated()),
			strings.Join(append(slices.Clone(h.Unapplied), h.Mismatch...), "\n"))
	}
	tp := r.Transport.problems()
	if r.TransportError != "" {
		tp = append([]string{r.TransportError}, tp...)
	}
	add(len(tp) == 0, "every link encrypted: TLS on every NATS client connection, route and leafnode, TLS and scram-sha-256 on every Postgres connection", strings.Join(tp, "\n"))
	for _, name := range slices.Sorted(maps.Keys(r.Tools)) {
		what := "compose's per-region verify, as a process"
		if strings.HasPrefix(name, "dlq-") {
			what = "compose's per-region dead-letter list, as the region's operator, as a process"
		}
		add(r.Tools[name], name+" ("+what+")", "")
	}
	if r.WantAlert != "" {
		fired, cleared := false, true
		var topics []string
		for _, a := range r.Alerts {
			if a.Name == r.WantAlert && a.Labels["region"] == "us" && !a.FiredAt.Before(r.DegradedFrom) {
				fired = true
				cleared = cleared && a.Cleared
				topics = append(topics, a.Labels["topic"])
			}
		}
		check := add
		if !r.AlertRequired {
			check = func(ok bool, name, detail string) {
				verdict := "seen"
				if !ok {
					verdict = "not seen"
				}
				r.Checks = append(r.Checks, Check{Name: fmt.Sprintf("INFO %s (%s; required of full runs only)", name, verdict), OK: true, Info: true, Detail: detail})
			}
		}
		check(fired, fmt.Sprintf("%s fired for us once its link was degraded (topics %s)", r.WantAlert, strings.Join(topics, ", ")), "")
		check(fired && cleared, r.WantAlert+" for us cleared after the link was restored", "")
		if e := r.Explained; e != nil {
			check(e.check())
			if e.Traced {
				check(e.jaegerCheck())
			}
		}
	}
	for _, p := range r.PanelsUnchecked {
		r.Checks = append(r.Checks, Check{Name: "INFO panel not checked: " + p, OK: true, Info: true})
	}
	if r.PanelsChecked > 0 || len(r.PanelsEmpty) > 0 {
		add(len(r.PanelsEmpty) == 0, fmt.Sprintf("every dashboard panel query returned data (%d queries)", r.PanelsChecked), strings.Join(r.PanelsEmpty, "\n"))
	}
	r.Pass = r.OK()
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\n== paymesh sim report (%s; load %s) ==\n", r.Elapsed.Round(time.Second), r.LoadTime.Round(time.Second))
	fmt.Fprintf(w, "run folder %s\n", r.RunDir)
	if r.LoadSummary != "" {
		fmt.Fprintf(w, "load: %s\n", strings.ReplaceAll(strings.TrimSpace(r.LoadSummary), "\n    ", "\n      "))
	}
	fmt.Fprintf(w, "acknowledged keys %d (%.0f/s): completed %d, refunded %d, rejected %d, unfinished %d\n",
		r.Acknowledged, float64(r.Acknowledged)/max(r.LoadTime.Seconds(), 1e-3), r.Completed, r.Refunded, r.Rejected, r.Unfinished)
	fmt.Fprintf(w, "request to final state: same-region p50 %.1f ms p99 %.1f ms; cross-region p50 %.1f ms p99 %.1f ms\n",
		r.SameP50, r.SameP99, r.CrossP50, r.CrossP99)
	if len(r.Pairs) > 0 {
		fmt.Fprintf(w, "cross-region p50 by pair, against the link's round trip:")
		for _, p := range r.Pairs {
			fmt.Fprintf(w, "  %s", p)
		}
		fmt.Fprintln(w)
	}
	printByRegion(w, "duplicates caught, by region and layer (Prometheus, increase over the run):", "%.0f", r.Duplicates)
	printByRegion(w, "duplicate rate (duplicates per delivery), by region:", "%.4f", r.DuplicateRate)
	if r.Explained != nil {
		r.Explained.print(w)
	}
	if h := r.Hooks; h != nil {
		fmt.Fprintf(w, "webhooks to the reference receiver: %d events, %d delivered, %d failed, %d waiting, %d attempts, %d redelivered on request; "+
			"received %d duplicates (%s); applied %d, parked %d, effects %d\n",
			h.Events, h.Delivered, h.Failed, h.Waiting, h.Attempts, h.Redelivered, h.Duplicated(), h.ByCause(), h.Applied, h.Parked, h.Effects)
	}
	fired := strings.Join(r.Fired, ", ")
	if fired == "" {
		fired = "none"
	}
	fmt.Fprintf(w, "faults fired: %s\n", fired)
	for _, k := range r.LeaderKills {
		fmt.Fprintf(w, "%s: leader %s killed; led by %s while it was down\n", k.Stream, k.Killed, k.LeaderWhileDown)
	}
	if !r.DegradedFrom.IsZero() {
		fmt.Fprintf(w, "us's link degraded from %s to %s\n", r.DegradedFrom.Format(time.TimeOnly), r.DegradedTo.Format(time.TimeOnly))
	}
	if len(r.Alerts) > 0 {
		fmt.Fprintln(w, "alerts seen:")
		sort.Slice(r.Alerts, func(i, j int) bool {
			return r.Alerts[i].Name+labels(r.Alerts[i].Labels) < r.Alerts[j].Name+labels(r.Alerts[j].Labels)
		})
		for _, a := range r.Alerts {
			state := fmt.Sprintf("fired at %s, still firing", a.FiredAt.Format(time.TimeOnly))
			if a.Cleared {
				state = fmt.Sprintf("fired at %s, cleared at %s", a.FiredAt.Format(time.TimeOnly), a.ClearedAt.Format(time.TimeOnly))
			}
			fmt.Fprintf(w, "  %s%s: %s\n", a.Name, labels(a.Labels), state)
		}
	}
	fmt.Fprintf(w, "links: %s\n", strings.ReplaceAll(r.Transport.String(), "\n", "\n       "))
	for _, c := range r.Checks {
		v := "PASS  "
		switch {
		case c.Info:
			v = ""
		case !c.OK:
			v = "FAIL  "
		}
		fmt.Fprintf(w, "%s%s\n", v, c.Name)
		if c.Detail != "" && !c.OK {
			for _, line := range strings.Split(c.Detail, "\n") {
				fmt.Fprintf(w, "        %s\n", line)
			}
		}
	}
	fmt.Fprint(w, r.Verify.String())
	if r.OK() {
		fmt.Fprintln(w, "PASS")
	} else {
		fmt.Fprintln(w, "FAIL")
	}
}

// printByRegion writes a region -> name -> value table, one line per
// region, under a title (nothing when it is empty).
func printByRegion(w io.Writer, title, format string, t map[string]map[string]float64) {
	if len(t) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	for _, region := range slices.Sorted(maps.Keys(t)) {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(t[region])) {
			parts = append(parts, fmt.Sprintf("%s "+format, k, t[region][k]))
		}
		fmt.Fprintf(w, "  %-4s %s\n", region, strings.Join(parts, ", "))
	}
}

func labels(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k == "alertname" {
			continue
		}
		parts = append(parts, k+"="+m[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// WriteJSON writes the report to path as JSON.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("sim: report: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("sim: report: %w", err)
	}
	return nil
}

// restarts describes the restarts by the restart policy: "none", or
// "router-ap ×1, ...".
func restarts(n map[string]int) string {
	if len(n) == 0 {
		return "none"
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(n)) {
		out = append(out, fmt.Sprintf("%s ×%d", name, n[name]))
	}
	return strings.Join(out, ", ")
}

// PairLatency is the cross-region transfers' p50 from one region to
// another, against the round trip of the link between them (0 when the
// links ran without the table's latency).
type PairLatency struct {
	From, To  string
	Transfers int
	P50Ms     float64
	RTT       time.Duration
}

func (p PairLatency) String() string {
	if p.RTT <= 0 {
		return fmt.Sprintf("%s→%s %.0f ms (%d, no link latency)", p.From, p.To, p.P50Ms, p.Transfers)
	}
	return fmt.Sprintf("%s→%s %.0f ms = %.1f × %s (%d)", p.From, p.To, p.P50Ms, p.P50Ms/float64(p.RTT.Milliseconds()), p.RTT, p.Transfers)
}
