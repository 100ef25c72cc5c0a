package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// urls are the addresses the run prints up front.
type urls struct {
	APIs    map[string]string // region -> base URL
	Metrics []string          // every service's /metrics
}

// endpoints reads the APIs and /metrics addresses from the services'
// mapped environment (PAYMESH_API_LISTEN, PAYMESH_*METRICS_LISTEN).
func (s *sim) endpoints() (urls, error) {
	u := urls{APIs: map[string]string{}}
	for _, name := range s.plan.of(kindService) {
		env, err := s.env(name)
		if err != nil {
			return u, err
		}
		for k, v := range env {
			switch {
			case k == "PAYMESH_API_LISTEN":
				u.APIs[env["PAYMESH_REGION"]] = "http://" + v
			case strings.HasSuffix(k, "METRICS_LISTEN"):
				u.Metrics = append(u.Metrics, "http://"+v+"/metrics")
			}
		}
	}
	sort.Strings(u.Metrics)
	return u, nil
}

// drive runs the load and the fault schedule, printing the status, and
// returns when both are done.
func (s *sim) drive(ctx context.Context, fs []fault, rep *Report) error {
	loads := s.plan.of(kindLoad)
	if len(loads) != 1 {
		return fmt.Errorf("sim: want one load service in docker-compose.yml, found %d (%s)", len(loads), strings.Join(loads, ", "))
	}
	client, err := s.setupClient()
	if err != nil {
		return err
	}
	history := filepath.Join(s.dir, "history.jsonl")
	// After compose's command: the history to check, a load bounded by
	// time, more requests in flight (each waits out WAN round trips), and
	// no fault plan of the load's own: the simulation's schedule is the
	// one that runs.
	extra := []string{"--history", history, "--client", client, "--duration", s.cfg.Load.String(),
		"--transfers", loadTransferLimit, "--concurrency", loadConcurrency, "--faults=", "--seed", fmt.Sprint(s.cfg.Seed)}
	s.setPhase("load")
	load, err := s.startCommand(loads[0], extra)
	if err != nil {
		return err
	}
	s.logf("load: %s %s (log %s)", loads[0], strings.Join(load.spec.Args, " "), load.log)
	start := time.Now()
	s.mu.Lock()
	s.loadStart = start
	s.mu.Unlock()
	faultsDone := make(chan []string, 1)
	go func() { faultsDone <- s.runFaults(ctx, start, fs) }()
	loadDone := make(chan error, 1)
	go func() { loadDone <- load.wait(ctx) }()

	every := statusEvery
	if s.cfg.Live {
		every = liveStatusEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var loadErr error
	loadOver, faultsOver := false, false
	for !loadOver || !faultsOver {
		select {
		case loadErr = <-loadDone:
			loadOver = true
			rep.LoadTime = time.Since(start)
		case errs := <-faultsDone:
			faultsOver = true
			rep.FaultErrors = errs
		case <-tick.C:
			s.status(ctx, start, history, false)
		}
	}
	s.status(ctx, start, history, true)
	if loadErr != nil {
		rep.LoadError = fmt.Sprintf("%v: %s", loadErr, tail(load.log, 5))
	}
	rep.LoadSummary = strings.TrimSpace(tail(load.log, 2))
	entries, err := readHistory(history)
	if err != nil {
		return err
	}
	rep.history = entries
	rep.client = client
	return ctx.Err()
}

// setupClient returns the client id compose's setup service registers
// (the argument after "client").
func (s *sim) setupClient() (string, error) {
	for _, name := range s.plan.of(kindSetup) {
		cmd := s.plan.project.Services[name].Command
		if len(cmd) > 1 && cmd[0] == "client" {
			return cmd[1], nil
		}
	}
	return "", errors.New("sim: no setup service registers a client (command \"client <id>\") in docker-compose.yml")
}

func readHistory(path string) ([]loadgen.HistoryEntry, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // the load acknowledged nothing
	}
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	defer f.Close()
	return loadgen.ReadHistory(f)
}

// status prints one status line: the load's progress, the transfers
// recorded per region, the faults fired and the alerts firing.
func (s *sim) status(ctx context.Context, start time.Time, history string, final bool) {
	acked := countLines(history)
	el := time.Since(start)
	var rec []string
	for _, r := range s.table.Regions {
		var n int64
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		err := s.stores[r.Name].Pool().QueryRow(qctx, `SELECT count(*) FROM transfers WHERE type = 'transfer'`).Scan(&n)
		cancel()
		if err != nil {
			rec = append(rec, r.Name+" ?")
			continue
		}
		rec = append(rec, fmt.Sprintf("%s %d", r.Name, n))
	}
	s.mu.Lock()
	fired := len(s.fired)
	last := ""
	if fired > 0 {
		last = " (last " + s.fired[fired-1] + ")"
	}
	s.mu.Unlock()
	line := fmt.Sprintf("[%4.0fs/%s] acknowledged %d (%.0f/s)  recorded %s  faults %d/%d%s  alerts: %s",
		el.Seconds(), s.cfg.Load, acked, float64(acked)/max(el.Seconds(), 1e-3), strings.Join(rec, " "),
		fired, len(s.cfg.Faults), last, s.firingNow())
	if s.cfg.Live && !final {
		fmt.Fprintf(s.out, "\r%-160s", line)
		return
	}
	if s.cfg.Live {
		fmt.Fprint(s.out, "\r")
	}
	s.logf("%s", line)
}

// countLines counts the lines of a file (0 when it does not exist).
func countLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// jsz is the part of nats-server's /jsz answer the drain reads.
type jsz struct {
	Accounts []struct {
		Streams []struct {
			Name  string `json:"name"`
			State struct {
				Msgs uint64 `json:"messages"`
			} `json:"state"`
			Consumers []struct {
				Name       string `json:"name"`
				NumPending uint64 `json:"num_pending"`
				AckPending int    `json:"num_ack_pending"`
			} `json:"consumer_detail"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

// inFlight returns the messages the regions' streams still hold for a
// consumer (route streams: every message left; every consumer: pending
// and unacknowledged), read from each nats-server's monitoring port; a
// node of a cluster reports only the streams it leads, so each replicated
// stream counts once.
func (s *sim) inFlight(ctx context.Context) (uint64, error) {
	var n uint64
	for _, name := range s.plan.of(kindNATS) {
		if name == hubService {
			continue
		}
		mon, err := s.mapper.Addr(fmt.Sprintf("%s:%d", name, natsMonitorPort))
		if err != nil {
			return 0, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+mon+"/jsz?accounts=true&streams=true&consumers=true&stream-leader-only=true", nil)
		if err != nil {
			return 0, err
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, fmt.Errorf("%s monitor: %w", name, err)
		}
		var j jsz
		err = json.NewDecoder(res.Body).Decode(&j)
		res.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("%s monitor: %w", name, err)
		}
		for _, a := range j.Accounts {
			for _, st := range a.Streams {
				if strings.HasPrefix(st.Name, "ROUTE_") {
					n += st.State.Msgs
				}
				for _, c := range st.Consumers {
					n += c.NumPending + uint64(c.AckPending)
				}
			}
		}
	}
	return n, nil
}

// drain waits until nothing is in flight in the streams and the global
// invariants hold with nothing in transit (twice in a row), or until
// drainTimeout; it returns the last global report.
func (s *sim) drain(ctx context.Context) (postgres.Report, error) {
	s.setPhase("draining")
	deadline := time.Now().Add(drainTimeout)
	stores := s.storeList()
	var rep postgres.Report
	var err error
	quiet := 0
	for {
		var n uint64
		n, err = s.inFlight(ctx)
		if err == nil && n == 0 {
			rep, err = postgres.VerifyGlobal(ctx, stores, true)
			if err == nil && rep.OK() {
				if quiet++; quiet == 2 {
					return rep, nil
				}
			} else {
				quiet = 0
			}
		} else {
			quiet = 0
		}
		if time.Now().After(deadline) {
			s.logf("drain: not quiet after %s (in flight %d, %v); checking as it is", drainTimeout, n, err)
			rep, err = postgres.VerifyGlobal(ctx, stores, true)
			return rep, err
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (s *sim) storeList() []*postgres.Store {
	var out []*postgres.Store
	for _, r := range s.table.Regions {
		out = append(out, s.stores[r.Name])
	}
	return out
}

// row is one recorded transfer of the load's client.
type row struct {
	ID, Status string
}

// checkHistory checks that every acknowledged key is recorded exactly once
// in its home region (the region of its source account), under the
// transfer id the API answered, and counts the final states.
func (s *sim) checkHistory(ctx context.Context, rep *Report) error {
	byRegion := map[string]map[string][]row{}
	for _, r := range s.table.Regions {
		rows, err := s.stores[r.Name].Pool().Query(ctx, `SELECT idempotency_key, id, status FROM transfers WHERE client_id = $1 AND type = 'transfer'`, rep.client)
		if err != nil {
			return fmt.Errorf("sim: region %s: read transfers: %w", r.Name, err)
		}
		m := map[string][]row{}
		for rows.Next() {
			var key string
			var x row
			if err := rows.Scan(&key, &x.ID, &x.Status); err != nil {
				rows.Close()
				return fmt.Errorf("sim: region %s: read transfers: %w", r.Name, err)
			}
			m[key] = append(m[key], x)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("sim: region %s: read transfers: %w", r.Name, err)
		}
		byRegion[r.Name] = m
	}
	seen := map[string]bool{}
	for _, e := range rep.history {
		if seen[e.Key] {
			continue
		}
		seen[e.Key] = true
		rep.Acknowledged++
		home, err := s.ids.HomeRegion(e.From)
		if err != nil {
			return fmt.Errorf("sim: history: key %s: source account %q: %w", e.Key, e.From, err)
		}
		rows := byRegion[home][e.Key]
		switch {
		case len(rows) == 0:
			rep.Lost = append(rep.Lost, fmt.Sprintf("%s (asked %s, answered %d, transfer %s, home %s)", e.Key, e.Region, e.Status, e.TransferID, home))
			continue
		case len(rows) > 1:
			rep.Doubled = append(rep.Doubled, fmt.Sprintf("%s (%d times in %s)", e.Key, len(rows), home))
		case rows[0].ID != e.TransferID:
			rep.Doubled = append(rep.Doubled, fmt.Sprintf("%s (answered transfer %s, recorded %s in %s)", e.Key, e.TransferID, rows[0].ID, home))
		}
		switch rows[0].Status {
		case "COMPLETED":
			rep.Completed++
		case "REFUNDED":
			rep.Refunded++
		case "REJECTED":
			rep.Rejected++
		default:
			rep.Unfinished++
			rep.Stuck = append(rep.Stuck, fmt.Sprintf("%s (transfer %s still %s in %s)", e.Key, rows[0].ID, rows[0].Status, home))
		}
	}
	var same, cross []time.Duration
	for _, r := range s.table.Regions {
		cs, err := s.stores[r.Name].Completions(ctx)
		if err != nil {
			return err
		}
		pairs := map[string][]time.Duration{}
		for _, c := range cs {
			if c.Cross {
				cross = append(cross, c.Duration)
				pairs[c.To] = append(pairs[c.To], c.Duration)
			} else {
				same = append(same, c.Duration)
			}
		}
		for _, to := range slices.Sorted(maps.Keys(pairs)) {
			p := PairLatency{From: r.Name, To: to, Transfers: len(pairs[to]), P50Ms: percentile(pairs[to], 0.50)}
			if !s.cfg.NoWANLatency {
				p.RTT = s.table.RoundTrip(r.Name, to)
			}
			rep.Pairs = append(rep.Pairs, p)
		}
	}
	rep.SameP50, rep.SameP99 = percentile(same, 0.50), percentile(same, 0.99)
	rep.CrossP50, rep.CrossP99 = percentile(cross, 0.50), percentile(cross, 0.99)
	return nil
}

// percentile returns the q-quantile of ds in milliseconds (0 for none).
func percentile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return float64(ds[int(q*float64(len(ds)-1))].Microseconds()) / 1000
}

// runTools runs the commands compose keeps for after the load (the
// verify-<region> services, and dlq-<region>, the operator's list of the
// region's dead letters) and records whether each passed.
func (s *sim) runTools(ctx context.Context, rep *Report) {
	rep.Tools = map[string]bool{}
	for _, name := range s.plan.of(kindTool) {
		err := s.runCommand(ctx, name, nil)
		rep.Tools[name] = err == nil
		if err != nil {
			s.logf("  %s: %v", name, err)
		}
	}
}
