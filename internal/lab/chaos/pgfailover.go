package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/pgha"
)

// pgFailover is scenario 22's state.
type pgFailover struct {
	killed   string        // the primary killed
	promoted string        // the node that took writes after it
	took     time.Duration // from the kill to the first write on the new primary
	applied  map[string]int64
	rejoined atomic.Bool // the killed node is a standby again
}

// pgFailoverScenario is the Postgres failover: the regions'
// databases live on a pg_auto_failover formation the run starts (a
// primary and a synchronous standby), and the services reach it through
// its multi-host URL. At 10 % of the run the primary's WAL senders stop
// for half a second (the standby falls behind; commits wait for it), then
// the primary is killed as a crash of its machine would (keeper and
// server, SIGKILL). The monitor promotes the standby; the ledgers' COMMITs
// cut by the kill are resolved by their read-back against it. The killed
// node then comes back wiped, a standby again from a fresh base backup.
func pgFailoverScenario() *scenario {
	st := &pgFailover{}
	return &scenario{
		name: "22-pg-failover",
		what: "the regions' Postgres is a pg_auto_failover formation (a primary, a synchronous standby); at 10% of the " +
			"run the primary's WAL senders stop for 0.5 s, then the primary is killed (keeper and server, SIGKILL): " +
			"the standby is promoted, and the killed node comes back wiped as a standby",
		counts: "Postgres primaries killed",
		ownHA:  true,
		minRun: 4 * time.Second,
		effect: func(*env) bool { return st.rejoined.Load() },
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			old, err := e.ha.Primary(ctx)
			if err != nil {
				return fmt.Errorf("the formation's primary: %w", err)
			}
			if old == nil {
				return errors.New("the formation has no primary")
			}
			if e.cfg.asyncStandby {
				if err := asyncStandby(ctx, e.ha, old); err != nil {
					return err
				}
			}
			if !at(ctx, time.Now(), d, 0.1) {
				return nil
			}
			ctx = context.WithoutCancel(ctx) // the formation is left whole
			resume, err := old.PauseReplication(ctx)
			if err != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond)
			killed := time.Now()
			if err := e.ha.Kill(old); err != nil {
				return err
			}
			_ = resume() // the senders are gone with their server
			e.fired.Add(1)
			p, err := e.ha.WaitPrimary(ctx, old)
			if err != nil {
				return err
			}
			st.killed, st.promoted, st.took = old.Name, p.Name, time.Since(killed)
			st.applied = e.appliedNow()
			if err := e.ha.Rejoin(ctx, old); err != nil {
				return err
			}
			st.rejoined.Store(true)
			return nil
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			chk := Check{Name: "failover", OK: true, Checked: 1}
			if st.promoted == "" {
				chk.What = "the standby took writes after the primary was killed"
				chk.fail("no failover completed")
				return []Check{chk}, nil
			}
			chk.What = fmt.Sprintf("%s killed, %s took writes %v later; the ledgers applied transfers after it, the killed "+
				"node is a standby again, and every region's API is ready and reads an account", st.killed, st.promoted, st.took.Round(time.Millisecond))
			e.recovered(ctx, &chk, st.applied, "the failover")
			states, err := e.ha.States(ctx)
			if err != nil {
				return nil, err
			}
			for _, s := range states {
				chk.Checked++
				if want := map[bool]string{true: "primary", false: "secondary"}[s.Name == st.promoted]; s.Reported != want || s.Goal != want {
					chk.fail("%s is %s (goal %s), want %s", s.Name, s.Reported, s.Goal, want)
				}
			}
			return []Check{chk}, nil
		},
	}
}

// asyncStandby is scenario 22's deliberate bug (Config.asyncStandby): the
// standby is taken out of the write quorum, so the primary answers COMMIT
// without waiting for it, and the commits it answered while its senders
// were stopped die with it.
func asyncStandby(ctx context.Context, f *pgha.Formation, primary *pgha.Node) error {
	for _, n := range f.Nodes {
		if n != primary {
			if err := f.SetQuorum(ctx, n, false); err != nil {
				return err
			}
		}
	}
	return primary.WaitSetting(ctx, "synchronous_standby_names", "")
}

func init() { registry = append(registry, pgFailoverScenario) }
