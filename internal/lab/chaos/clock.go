package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// PurposeAfterStep marks a request the API had answered, sent again with
// the same key and body after a clock step (scenario 10): it may be
// refused or answered, but never applied a second time (I3).
const PurposeAfterStep = "after-step"

// Scenario 10's clock: the APIs' key TTL is one minute, longer than any
// run, so keys expire only through the steps. A forward step of two
// minutes expires every key made before it; keys made during a backward
// step of two minutes are expired once the clock comes back. The forward
// step stays within ledger.MaxClockSkew, so that the ledger still takes the
// commands stamped by the stepped clock.
const (
	clockKeyTTL   = time.Minute
	clockStep     = 2 * time.Minute
	clockInterval = 400 * time.Millisecond
	clockResends  = 4 // answered keys sent again after each step
)

// clockFault is scenario 10's state: the APIs' clock, an offset from
// time.Now, and its counters.
type clockFault struct {
	offset  atomic.Int64 // nanoseconds
	steps   atomic.Int64
	expired atomic.Int64 // keys the cleanup deleted after a step
	resent  atomic.Int64 // answered keys sent again after a step
	gone    atomic.Int64 // ... whose key had been deleted by then
	// byTransfer counts those of gone whose transfer was already recorded:
	// the API's business-key lookup (TransferByKey) answers them; the
	// others reach the ledger, whose unique (client, idempotency key)
	// business key drops them.
	byTransfer atomic.Int64
	wg         sync.WaitGroup // the resends in flight
	ran        time.Duration  // how long the steps went on
}

func (f *clockFault) now() time.Time { return time.Now().Add(time.Duration(f.offset.Load())) }

// step moves the clock to offset, runs every region's key cleanup, and
// sends a few answered keys again (each in a goroutine of its own, tracked
// by wg, with a context that outlives the fault's: an answer may take the
// API's Wait).
func (f *clockFault) step(ctx context.Context, e *env, offset time.Duration) {
	f.offset.Store(int64(offset))
	f.steps.Add(1)
	for _, n := range e.names {
		if r := e.c.Region(n); r != nil && r.API != nil {
			if deleted, err := r.API.CleanupKeys(ctx); err == nil {
				f.expired.Add(deleted)
			}
		}
	}
	var answered []Op
	for _, op := range e.hist.Ops() {
		if op.Path == "api" && op.Outcome == OK && op.Purpose != PurposeAfterStep && !isAction(op) {
			answered = append(answered, op)
		}
	}
	if len(answered) == 0 {
		return
	}
	for range clockResends {
		op := answered[e.intn(len(answered))]
		home, err := e.c.IDs().HomeRegion(op.Body.From)
		if err != nil || e.c.Region(home) == nil {
			continue
		}
		_, kept, err := e.c.Region(home).APIStore.Key(ctx, op.Client, op.Key)
		if err != nil {
			continue
		}
		if !kept {
			f.gone.Add(1)
			if ids, err := keyTransfers(ctx, e, op); err == nil && len(ids) > 0 {
				f.byTransfer.Add(1)
			}
		}
		f.resent.Add(1)
		via := e.names[e.intn(len(e.names))]
		f.wg.Go(func() {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			defer cancel()
			e.postAt(pctx, PurposeAfterStep, via, op.Key, op.Body, op.apiPath, op.payload) // the same request
		})
	}
}

// keyTransfers returns the IDs of the transfers op's key made in its home
// region, read straight from the table (not through the store's
// TransferByKey, which a deliberate bug disables).
func keyTransfers(ctx context.Context, e *env, op Op) ([]string, error) {
	home, err := e.c.IDs().HomeRegion(op.Body.From)
	if err != nil {
		return nil, err
	}
	rows, err := e.c.Region(home).Ledger.Store.Pool().Query(ctx,
		`SELECT id FROM transfers WHERE client_id = $1 AND idempotency_key = $2`, op.Client, op.Key)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// clockScenario is the scenario 10: while the workload runs
// (through the API as well as the routers), the APIs' clock is stepped
// forward past the idempotency keys' TTL, backward, and back to the real
// time, over and over, until the steps have expired keys and some answered
// key was sent again after its key was gone; after every step the key
// cleanup runs and a few answered keys are sent again with the same body.
// No key may be applied twice (I3), every answered resend must name the
// transfer its key made (same-transfer), and the steps must really expire
// keys (expired).
func clockScenario() *scenario {
	f := &clockFault{}
	return &scenario{
		name: "10-clock-steps",
		what: "the APIs' clock (key TTL 1 min) stepped every 400 ms through +2 min, 0, -2 min, 0: after each step " +
			"the key cleanup runs and 4 answered keys are sent again with the same body; none may apply twice",
		counts: "clock steps",
		keyTTL: clockKeyTTL,
		now:    f.now,
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			offsets := []time.Duration{clockStep, 0, -clockStep, 0}
			i, start := 0, time.Now()
			err := every(ctx, clockInterval, func() {
				f.step(ctx, e, offsets[i%len(offsets)])
				i++
			})
			f.ran = time.Since(start)
			if f.offset.Load() != 0 { // leave the clock right
				f.step(context.WithoutCancel(ctx), e, 0)
			}
			f.wg.Wait()
			return err
		},
		fired: func(*env) int64 { return f.steps.Load() },
		// The steps go on until they have expired keys and some answered
		// key has been sent again after its key was gone: on a loaded
		// machine the API answers its first requests after several steps.
		effect: func(*env) bool { return f.expired.Load() > 0 && f.gone.Load() > 0 },
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			outcomes := map[Outcome]int{}
			same := Check{Name: "same-transfer", What: "every answered resend after a step names the transfer its key made", OK: true}
			for _, op := range e.hist.Ops() {
				if op.Purpose != PurposeAfterStep {
					continue
				}
				outcomes[op.Outcome]++
				if op.Outcome != OK {
					continue
				}
				same.Checked++
				ids, err := keyTransfers(ctx, e, op)
				switch {
				case err != nil:
					return nil, err
				case len(ids) == 0:
					same.fail("key %s: answered %s after a step, but the key made no transfer", op.Key, op.Transfer)
				case !slices.Contains(ids, op.Transfer):
					same.fail("key %s: answered %s after a step, but the key's transfer is %s", op.Key, op.Transfer,
						strings.Join(ids, ", "))
				}
			}
			chk := Check{Name: "expired", OK: true, Checked: f.resent.Load(), What: fmt.Sprintf("the steps expired keys "+
				"the cleanup deleted (%d), and answered keys were sent again after theirs was gone (%d of %d resends, "+
				"%d of them with their transfer recorded: the API's business-key lookup answers those; resends "+
				"ok/fail/unknown %d/%d/%d)", f.expired.Load(), f.gone.Load(), f.resent.Load(), f.byTransfer.Load(),
				outcomes[OK], outcomes[Fail], outcomes[Unknown])}
			if f.expired.Load() == 0 {
				chk.fail("the cleanup deleted no key after %d steps in %s", f.steps.Load(), f.ran.Round(time.Millisecond))
			}
			if f.gone.Load() == 0 {
				chk.fail("none of %d keys sent again after %d steps in %s had been deleted", f.resent.Load(), f.steps.Load(),
					f.ran.Round(time.Millisecond))
			}
			return []Check{chk, same}, nil
		},
	}
}

func init() { registry = append(registry, clockScenario) }
