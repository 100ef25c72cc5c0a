package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// poisonRegion is the region whose ledger meets scenario 15's poison.
const poisonRegion = "us"

// poisonDeliveries is the region's MaxStepDeliver in scenario 15: a step
// whose apply fails that many times is dead-lettered.
const poisonDeliveries = 3

// errPoison is the failure of a poisoned step's apply.
var errPoison = errors.New("chaos: a poison step: its apply fails until the operator removes the cause")

// poisoning is scenario 15's state.
type poisoning struct {
	on       atomic.Bool
	hits     atomic.Int64 // applies the poison failed
	letters  atomic.Int64 // poisoned steps found dead-lettered
	replayed atomic.Int64 // of those, replays the ledger applied
	notes    []string     // replays that did not apply, and why
}

// poisoned picks the credit steps the poison fails: one transfer in
// eight, by its ID, so that every delivery of a step fails alike.
func poisoned(c ledger.Command) bool {
	if c.Type != ledger.TypeCredit {
		return false
	}
	h := fnv.New32a()
	h.Write([]byte(c.TransferID))
	return h.Sum32()%8 == 0
}

// poisonApplier fails every batch that holds a poisoned step while the
// poison is on (the ledger then applies the batch one by one, and only
// the poisoned step keeps failing).
type poisonApplier struct {
	next ledgerstream.Applier
	st   *poisoning
}

func (p poisonApplier) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	if p.st.on.Load() {
		for _, c := range cmds {
			if poisoned(c) {
				p.st.hits.Add(1)
				return nil, errPoison
			}
		}
	}
	return p.next.Apply(ctx, cmds)
}

// replayPoisoned waits until the region's ledger has settled every
// delivery, then replays each poisoned step's dead letter as an operator
// would once the cause is gone (paymesh dlq replay), and counts the ones
// the ledger applied.
func (p *poisoning) replayPoisoned(ctx context.Context, e *env) error {
	r := e.c.Region(poisonRegion)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if n, err := ledgerstream.Backlog(ctx, r.Ledger.JetStream(), r.Ledger.Topo); err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the ledger of %s did not settle its deliveries in a minute", poisonRegion)
		}
	}
	js, err := e.c.OperatorJetStream(ctx, poisonRegion)
	if err != nil {
		return err
	}
	pool := r.Ledger.Store.Pool()
	if err := pgdb.Migrate(ctx, pool, dlq.Migrations()); err != nil {
		return err
	}
	ops := &dlq.Ops{Region: poisonRegion, JS: js, Pool: pool, Wait: 30 * time.Second}
	page, err := ops.List(ctx, dlq.Filter{Reason: ledgerstream.ReasonStepMaxDeliveries})
	if err != nil {
		return err
	}
	for _, l := range page.Letters {
		p.letters.Add(1)
		out, err := ops.Replay(ctx, l.Seq, "chaos")
		for err == nil && out.Kind == dlq.Deferred && ctx.Err() == nil {
			time.Sleep(time.Until(out.RetryAt) + 100*time.Millisecond) // the Msg-Id window's end
			out, err = ops.Replay(ctx, l.Seq, "chaos")
		}
		switch {
		case err != nil:
			p.notes = append(p.notes, fmt.Sprintf("replay of %s: %v", l.Command.MsgKey(), err))
		case out.Kind != dlq.Applied:
			p.notes = append(p.notes, fmt.Sprintf("replay of %s: %s, not applied", l.Command.MsgKey(), out.Kind))
		default:
			p.replayed.Add(1)
		}
	}
	return nil
}

func poisonScenario() *scenario {
	st := &poisoning{}
	return &scenario{
		name: "15-poison-step",
		what: fmt.Sprintf("the ledger of %s fails every apply of the credit steps of one transfer in eight (a poison step) "+
			"while the workload runs, with MaxStepDeliver %d: each must be dead-lettered (%s) instead of looping, the "+
			"steps beside it must apply, and once the poison is gone an operator's replay of each dead letter must "+
			"settle its transfer exactly once", poisonRegion, poisonDeliveries, ledgerstream.ReasonStepMaxDeliveries),
		counts:    "poisoned credit steps dead-lettered",
		dupWindow: 2 * time.Second, // a replay waits out the window of its step's first publish
		configure: func(e *env, c *cluster.Config) {
			onLedger(c, func(lc *ledgerd.Config) {
				if lc.Region != poisonRegion {
					return
				}
				lc.MaxStepDeliver = poisonDeliveries
				inner := lc.WrapApplier
				lc.WrapApplier = func(a ledgerstream.Applier) ledgerstream.Applier {
					if inner != nil {
						a = inner(a)
					}
					return poisonApplier{next: a, st: st}
				}
			})
		},
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			st.on.Store(true)
			<-ctx.Done()
			st.on.Store(false) // the cause is gone: what is still retried applies
			return st.replayPoisoned(context.WithoutCancel(ctx), e)
		},
		effect: func(e *env) bool { return e.c.Region(poisonRegion).Ledger.Stats.DeadLettered.Load() > 0 },
		fired:  func(*env) int64 { return st.letters.Load() },
		extra: func(context.Context, *env) ([]Check, error) {
			chk := Check{Name: "poison", OK: true, Checked: st.letters.Load(),
				What: fmt.Sprintf("the poisoned steps were dead-lettered (%d failed applies, %d dead letters) and each replay applied (%d)",
					st.hits.Load(), st.letters.Load(), st.replayed.Load())}
			if st.letters.Load() == 0 {
				chk.fail("no poisoned step was dead-lettered (%d failed applies)", st.hits.Load())
			}
			for _, n := range st.notes {
				chk.fail("%s", n)
			}
			return []Check{chk}, nil
		},
	}
}

func init() { registry = append(registry, poisonScenario) }

// lostDeadLetters is scenario 15's bug: the ledger's dead-letter publishes
// are answered with a PubAck that no stream sent, so a poisoned step is
// taken for dead-lettered and dropped (a decorator of the ledger's
// JetStream handle).
type lostDeadLetters struct {
	jetstream.JetStream
	region string
}

// PublishMsg drops a dead letter and acks it; any other message is
// published.
func (j lostDeadLetters) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if m.Subject == subjects.DLQ(j.region) {
		return &jetstream.PubAck{Stream: subjects.DLQStream(j.region), Sequence: 1}, nil
	}
	return j.JetStream.PublishMsg(ctx, m, opts...)
}
