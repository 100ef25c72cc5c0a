package chaos

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// awaitBacklog waits backlogBuild, then, on a machine too slow to have
// sent anything meanwhile, until the ledger stream holds commands not yet
// applied (a minute at most). It returns the backlog it saw last.
func awaitBacklog(ctx context.Context, led *ledgerd.Server) uint64 {
	time.Sleep(backlogBuild)
	var n uint64
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err := ledgerstream.Backlog(ctx, led.JetStream(), led.Topo); err == nil {
			if n = got; n > 0 {
				break
			}
		}
	}
	return n
}

// backlogBuild is how long scenario 14 stops the ledger of its region
// before the disk loss, so that its ledger stream holds commands not yet
// applied.
const backlogBuild = time.Second

// diskLoss is scenario 14's state.
type diskLoss struct {
	gate    gate
	wiped   atomic.Int64 // the server whose store was deleted, +1 (0: none yet)
	backlog atomic.Int64 // commands waiting in the ledger stream when it was
}

// gate stops a ledger applying while it is shut: the deliveries it gets
// meanwhile are lost, as by a ledger process that died holding them, so
// the commands not yet applied stay in the stream alone (JetStream
// delivers them again after AckWait). A gate that held the deliveries
// instead would keep a backlog smaller than the consumer's buffer in the
// ledger's memory, out of the disk loss's reach.
type gate struct {
	shut atomic.Bool
}

func (g *gate) close() { g.shut.Store(true) }
func (g *gate) open()  { g.shut.Store(false) }

// pass returns m, or nil while the gate is shut.
func (g *gate) pass(m jetstream.Msg) jetstream.Msg {
	if g.shut.Load() {
		return nil
	}
	return m
}

func diskLossScenario() *scenario {
	st := &diskLoss{}
	r := clusteredRegion
	stream := subjects.LedgerStream(r)
	return &scenario{
		name: "14-disk-loss",
		what: fmt.Sprintf("region %s runs a JetStream cluster of three servers (R3 streams); at 20%% of the run its ledger "+
			"stops applying for %v (a backlog builds in %s), then the server leading %s is stopped, its store directory "+
			"deleted, and it is started again empty; the ledger resumes, and the server must catch up from the other two",
			r, backlogBuild, stream, stream),
		counts:    "servers whose store was deleted (and the ledger stream must have held a backlog then)",
		clustered: []string{r},
		minRun:    3 * time.Second,
		configure: func(e *env, c *cluster.Config) {
			prev := c.Ledger
			c.Ledger = func(region string, lc *ledgerd.Config) {
				if prev != nil {
					prev(region, lc)
				}
				if region != r {
					return
				}
				lc.WrapJetStream = wrapped(lc.WrapJetStream, func(js jetstream.JetStream) jetstream.JetStream {
					return jsfault.Wrap(js, nil, st.gate.pass)
				})
			}
		},
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			if !at(ctx, time.Now(), d, 0.2) {
				return nil
			}
			st.gate.close()
			ctx = context.WithoutCancel(ctx)
			st.backlog.Store(int64(awaitBacklog(ctx, e.c.Region(r).Ledger)))
			node, err := e.topo.StreamLeader(r, stream)
			if err != nil {
				st.gate.open()
				return fmt.Errorf("leader of %s: %w", stream, err)
			}
			if err := e.topo.StopNode(r, node); err != nil {
				st.gate.open()
				return err
			}
			err = e.topo.WipeNode(r, node)
			if err == nil {
				err = e.topo.StartNode(r, node)
			}
			st.gate.open()
			if err != nil {
				return err
			}
			e.fired.Add(1)
			st.wiped.Store(int64(node) + 1)
			if e.topo.Replicas(r) == 1 {
				// The region's only server lost its streams and consumers:
				// its services create them again when they start.
				if err := e.c.RestartRegion(ctx, r); err != nil {
					return err
				}
			}
			return e.waitCurrent(ctx, r)
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			wiped := "no server"
			if n := st.wiped.Load(); n > 0 {
				wiped = e.topo.NodeName(r, int(n-1))
			}
			chk := Check{Name: "backlog", Checked: st.backlog.Load(), OK: true,
				What: fmt.Sprintf("%s held %d commands not yet applied when the store of %s was deleted", stream, st.backlog.Load(), wiped)}
			if st.backlog.Load() == 0 {
				chk.fail("the ledger stream held no backlog at the disk loss: the fault lost nothing it could have")
			}
			return []Check{chk, e.currentCheck(ctx, r)}, nil
		},
	}
}

func init() { registry = append(registry, diskLossScenario) }
