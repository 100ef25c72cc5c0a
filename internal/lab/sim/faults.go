package sim

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/platform/natsconn"
	"github.com/paymesh/paymesh/platform/subjects"
)

// The faults the simulation fires. Each names the service it hits.
const (
	FaultKillLedger = "kill-ledger-eu"
	FaultKillRouter = "kill-router-ap"
	FaultKillAPI    = "kill-api-us"
	FaultKillNATS   = "kill-nats-ap" // one node of ap's cluster, nats-ap-1
	// FaultKillReceiver kills the reference webhook receiver: a delivery
	// it committed and had not answered comes again, a duplicate it must
	// recognise.
	FaultKillReceiver = "kill-receiver"
	// FaultKillLeader kills the node leading eu's ledger stream
	// (leaderKillFault).
	FaultKillLeader = "kill-nats-leader-eu"
	FaultCut        = "cut-eu"
	FaultDegrade    = "degrade-us"
	// FaultLose loses commands on purpose (Config.LoseCommands); it is
	// not part of the default schedule.
	FaultLose = "lose-commands-eu"
)

// NoFaults, as the only fault named, runs the load without faults.
const NoFaults = "none"

// FaultNames are the faults of the schedule, in the order they fire.
var FaultNames = []string{FaultKillLedger, FaultKillRouter, FaultKillAPI, FaultKillNATS, FaultCut, FaultKillReceiver, FaultKillLeader, FaultDegrade, FaultKillPostgres}

// degradeLatency is added to the degraded link's latency: long enough that
// the resets (at the rate of paymesh-lab load's degrade) catch PubAcks in
// flight, whose publishes the routers then retry as duplicates.
const degradeLatency = 150 * time.Millisecond

// fault is one scheduled fault: it fires at At after the load starts and
// is undone For later.
type fault struct {
	Name    string
	At, For time.Duration
	What    string
	fire    func(ctx context.Context) error
	undo    func(ctx context.Context) error
}

// schedule returns the faults of cfg.Faults spread over a load of length
// d: the kills early, the cut in the middle, eu's ledger stream leader
// killed once the cut is healed, the degraded link over the last third
// (long enough for the duplicate-rate alert to fire), eu's Postgres
// primary killed at 60 % and its node back, wiped, at 75 % (or 8 s later).
func (s *sim) schedule(d time.Duration) []fault {
	at := func(f float64) time.Duration { return time.Duration(f * float64(d)).Round(time.Second) }
	cutFor := max(4*time.Second, at(0.08))
	all := []fault{
		s.killFault(FaultKillLedger, "ledger-eu", at(0.04)),
		s.killFault(FaultKillRouter, "router-ap", at(0.08)),
		s.killFault(FaultKillAPI, "api-us", at(0.12)),
		s.killFault(FaultKillNATS, "nats-ap-1", at(0.16)),
		s.cutFault(at(0.22), cutFor),
		s.killFault(FaultKillReceiver, "receiver", at(0.30)),
		s.leaderKillFault("eu", max(at(0.22)+cutFor+time.Second, at(0.34))),
		s.degradeFault(at(0.42), at(0.36)),
		s.pgFailoverFault("eu", at(0.60), max(8*time.Second, at(0.15))),
	}
	var out []fault
	for _, f := range all {
		for _, want := range s.cfg.Faults {
			if f.Name == want {
				out = append(out, f)
			}
		}
	}
	if s.cfg.LoseCommands {
		out = append(out, s.loseFault(at(0.65), max(6*time.Second, at(0.10))))
		sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	}
	return out
}

// killFault kills a service's process with SIGKILL and starts it again
// restartDelay later.
func (s *sim) killFault(name, service string, at time.Duration) fault {
	return fault{Name: name, At: at, For: restartDelay,
		What: fmt.Sprintf("kill -9 %s, restart %s later", service, restartDelay),
		fire: func(context.Context) error {
			p := s.procs.get(service)
			if p == nil {
				return fmt.Errorf("no process %s", service)
			}
			at := time.Now()
			p.kill9()
			if region, ok := strings.CutPrefix(service, "ledger-"); ok {
				s.mu.Lock()
				s.ledgerKills = append(s.ledgerKills, ServiceKill{Service: service, Region: region, KilledAt: at})
				s.mu.Unlock()
			}
			return nil
		},
		undo: func(context.Context) error { return s.procs.get(service).restart() },
	}
}

// wanClient returns the control API client of a region's WAN link.
func (s *sim) wanClient(region string) (*faultproxy.Client, error) {
	r, ok := s.table.Get(region)
	if !ok {
		return nil, fmt.Errorf("no region %s", region)
	}
	if _, ok := s.plan.project.Services[wanServicePrefix+region]; !ok {
		return nil, fmt.Errorf("docker-compose.yml has no %s%s service", wanServicePrefix, region)
	}
	return faultproxy.NewClient(fmt.Sprintf("http://127.0.0.1:%d", r.WANControlPort)), nil
}

// cutFault cuts eu's WAN link and heals it.
func (s *sim) cutFault(at, d time.Duration) fault {
	return fault{Name: FaultCut, At: at, For: d, What: fmt.Sprintf("cut eu's WAN link for %s", d),
		fire: func(ctx context.Context) error {
			c, err := s.wanClient("eu")
			if err != nil {
				return err
			}
			return c.Cut(ctx)
		},
		undo: func(ctx context.Context) error {
			c, err := s.wanClient("eu")
			if err != nil {
				return err
			}
			return c.Heal(ctx)
		},
	}
}

// loseFault loses commands on purpose: it kills eu's ledger, so that the
// commands acknowledged into eu's ledger stream (the saga steps the other
// regions relay, any request eu's API handed to the stream) stay there,
// purges that stream as the ledger's user halfway through (once it holds
// loseAtLeast commands, or loseWait later: a slow machine's load sends
// few), and starts the ledger again after the purge. The run must end in
// FAIL and name the keys.
func (s *sim) loseFault(at, d time.Duration) fault {
	const service = "ledger-eu"
	var purged chan struct{}
	return fault{Name: FaultLose, At: at, For: d,
		What: fmt.Sprintf("kill -9 %s, purge eu's ledger stream %s later, once it holds %d commands (commands lost on purpose), restart it %s later", service, d/2, loseAtLeast, d),
		fire: func(ctx context.Context) error {
			p := s.procs.get(service)
			if p == nil {
				return fmt.Errorf("no process %s", service)
			}
			p.kill9()
			purged = make(chan struct{})
			go func() { defer close(purged); s.purgeLater(ctx, "eu", d/2) }()
			return nil
		},
		undo: func(context.Context) error {
			<-purged
			return s.procs.get(service).restart()
		},
	}
}

// loseFault purges once the stream holds loseAtLeast commands, or after
// loseWait more.
const (
	loseAtLeast = 5
	loseWait    = 30 * time.Second
)

// purgeLater purges a region's ledger stream after a while, as that
// region's ledger user.
func (s *sim) purgeLater(ctx context.Context, region string, after time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(after):
	}
	n, err := s.purgeLedger(ctx, region)
	if err != nil {
		s.logf("fault: purge of %s's ledger stream failed: %v", region, err)
		s.mu.Lock()
		s.laterFaultErrors = append(s.laterFaultErrors, fmt.Sprintf("%s: purge of %s's ledger stream: %v", FaultLose, region, err))
		s.mu.Unlock()
		return
	}
	s.logf("fault %s: purged %s's ledger stream: %d commands its ledger had not applied are gone", FaultLose, region, n)
}

// purgeLedger purges a region's ledger stream with the credentials and
// the CA of its ledger (from compose's environment) and returns the
// messages purged.
// The API submits the transfers of its own region's accounts there, so
// what the ledger has not applied yet, and the API already answered 202
// (its wait ran out while the ledger was down), is gone.
func (s *sim) purgeLedger(ctx context.Context, region string) (uint64, error) {
	env, err := s.env("ledger-" + region)
	if err != nil {
		return 0, err
	}
	nc, err := natsconn.Connect(ctx, natsconn.Config{URL: env["PAYMESH_NATS_URL"], User: env["PAYMESH_NATS_USER"], Password: env["PAYMESH_NATS_PASSWORD"],
		CAFile: env["PAYMESH_NATS_CA"], Name: "paymesh-sim-purge", Timeout: 10 * time.Second})
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	st, err := js.Stream(ctx, subjects.LedgerStream(region))
	if err != nil {
		return 0, err
	}
	var info *jetstream.StreamInfo
	for end := time.Now().Add(loseWait); ; {
		if info, err = st.Info(ctx); err != nil {
			return 0, err
		}
		if info.State.Msgs >= loseAtLeast || time.Now().After(end) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	// What arrives between the count and the purge goes too: the count
	// is at least what was lost.
	if err := st.Purge(ctx); err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// degradeFault raises latency and connection resets on us's link for d,
// then restores the shape it had.
func (s *sim) degradeFault(at, d time.Duration) fault {
	var before faultproxy.Shape
	return fault{Name: FaultDegrade, At: at, For: d,
		What: fmt.Sprintf("raise us's WAN link latency by %s and reset %.1f connections/s for %s, then restore it", degradeLatency, loadgen.DegradeResetRate, d),
		fire: func(ctx context.Context) error {
			c, err := s.wanClient("us")
			if err != nil {
				return err
			}
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			before = st.Shape
			s.mu.Lock()
			s.degraded[0] = time.Now()
			s.mu.Unlock()
			return c.SetShape(ctx, faultproxy.Shape{Latency: before.Latency + degradeLatency, Jitter: before.Jitter, ResetRate: loadgen.DegradeResetRate})
		},
		undo: func(ctx context.Context) error {
			c, err := s.wanClient("us")
			if err != nil {
				return err
			}
			s.mu.Lock()
			s.degraded[1] = time.Now()
			s.mu.Unlock()
			return c.SetShape(ctx, before)
		},
	}
}

// describe writes the schedule.
func describe(fs []fault) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "  at %5s  %-20s %s\n", f.At, f.Name, f.What)
	}
	return b.String()
}

// runFaults fires each fault at its time after start and undoes it, and
// returns when all are done or ctx ends. Each fault fired, and each
// failure, goes to the log and the report.
func (s *sim) runFaults(ctx context.Context, start time.Time, fs []fault) []string {
	var errs []string
	type pending struct {
		f  fault
		at time.Time
	}
	var undo []pending
	next := 0
	for next < len(fs) || len(undo) > 0 {
		now := time.Now()
		switch {
		case len(undo) > 0 && !now.Before(undo[0].at):
			u := undo[0]
			undo = undo[1:]
			if err := u.f.undo(ctx); err != nil {
				errs = append(errs, fmt.Sprintf("%s: undo: %v", u.f.Name, err))
				s.logf("fault %s: undo failed: %v", u.f.Name, err)
			} else {
				s.logf("fault %s: undone", u.f.Name)
			}
			continue
		case next < len(fs) && !now.Before(start.Add(fs[next].At)):
			f := fs[next]
			next++
			if err := f.fire(ctx); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", f.Name, err))
				s.logf("fault %s: failed: %v", f.Name, err)
				continue
			}
			s.mu.Lock()
			s.fired = append(s.fired, f.Name)
			s.mu.Unlock()
			s.logf("fault %s: %s", f.Name, f.What)
			undo = append(undo, pending{f, time.Now().Add(f.For)})
			// Keep the undo list in time order.
			for i := len(undo) - 1; i > 0 && undo[i].at.Before(undo[i-1].at); i-- {
				undo[i], undo[i-1] = undo[i-1], undo[i]
			}
			continue
		}
		select {
		case <-ctx.Done():
			return append(errs, ctx.Err().Error())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errs
}
