package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/paymesh/paymesh/platform/subjects"
)

// The R3 scenarios (13 and 14) attack clusteredRegion, which runs a
// JetStream cluster of three servers with every stream kept on all three;
// the other regions keep their one server.
const (
	clusteredRegion = "us"
	// nodeDown is how long a killed or wiped server stays down;
	// quorumDown how long scenario 13's bug case (Config.quorumLoss) keeps
	// a leader and a follower down, so that the region's routers publish
	// into a leaderless stream on every run.
	nodeDown   = 2 * time.Second
	quorumDown = 6 * time.Second
	// currentWait bounds the wait for a restarted server's replicas to
	// catch up with their leaders.
	currentWait = 30 * time.Second
	// electionWait bounds the wait for a stream to elect a new leader
	// once its leader is down.
	electionWait = 15 * time.Second
)

// leaderKill is scenario 13's state: what each kill saw.
type leaderKill struct {
	mu    sync.Mutex
	kills []kill
}

// kill is one stream leader killed: the stream, the server that led it,
// and the server that took over while it was down (-1: none did).
type kill struct {
	stream    string
	old, next int
	err       error
}

func leaderKillScenario() *scenario {
	st := &leaderKill{}
	r := clusteredRegion
	streams := []string{subjects.LedgerStream(r), subjects.RouteStream(r)}
	return &scenario{
		name: "13-leader-kill",
		what: fmt.Sprintf("region %s runs a JetStream cluster of three servers (R3 streams); at 15%% of the run the server "+
			"leading %s is stopped, left down for %v and started again, then, once every replica is current, the server "+
			"leading %s (whichever it is by then: the same one again if it won the leadership back)", r, streams[0], nodeDown, streams[1]),
		counts:    "stream leaders killed (and each stream must elect a new leader while its old one is down)",
		clustered: []string{r},
		minRun:    3 * nodeDown,
		fault: func(ctx context.Context, e *env, d time.Duration) error {
			start := time.Now()
			for i, stream := range streams {
				if !at(ctx, start, d, []float64{0.15, 0.5}[i]) {
					return nil
				}
				leader, err := e.topo.StreamLeader(r, stream)
				if err != nil {
					return fmt.Errorf("leader of %s: %w", stream, err)
				}
				if err := e.topo.StopNode(r, leader); err != nil {
					return err
				}
				e.fired.Add(1)
				k := kill{stream: stream, old: leader}
				follower := -1
				if e.cfg.quorumLoss {
					follower = (leader + 1) % e.topo.Nodes(r)
					if err := e.topo.StopNode(r, follower); err != nil {
						return err
					}
					k.next, k.err = -1, fmt.Errorf("%s stopped too: no quorum, on purpose", e.topo.NodeName(r, follower))
				} else {
					k.next, k.err = newLeader(e, r, stream, leader)
				}
				st.mu.Lock()
				st.kills = append(st.kills, k)
				st.mu.Unlock()
				down := nodeDown
				if follower >= 0 {
					down = quorumDown
				}
				time.Sleep(down)
				if err := e.topo.StartNode(r, leader); err != nil {
					return err
				}
				if follower >= 0 {
					if err := e.topo.StartNode(r, follower); err != nil {
						return err
					}
				}
				if err := e.waitCurrent(context.WithoutCancel(ctx), r); err != nil {
					return err
				}
			}
			return nil
		},
		extra: func(ctx context.Context, e *env) ([]Check, error) {
			st.mu.Lock()
			defer st.mu.Unlock()
			chk := Check{Name: "failover", OK: true}
			var seen []string
			for _, k := range st.kills {
				chk.Checked++
				if k.err != nil {
					chk.fail("%s: no new leader while %s was down: %v", k.stream, e.topo.NodeName(r, k.old), k.err)
					continue
				}
				seen = append(seen, fmt.Sprintf("%s %s→%s", k.stream, e.topo.NodeName(r, k.old), e.topo.NodeName(r, k.next)))
			}
			chk.What = "each stream elected a new leader while its leader was down (" + strings.Join(seen, ", ") + ")"
			return []Check{chk, e.currentCheck(ctx, r)}, nil
		},
	}
}

// newLeader waits until stream has a leader other than old, and returns it.
func newLeader(e *env, region, stream string, old int) (int, error) {
	deadline := time.Now().Add(electionWait)
	for {
		l, err := e.topo.StreamLeader(region, stream)
		if err == nil && l != old {
			return l, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("still led by %s", e.topo.NodeName(region, l))
			}
			return -1, fmt.Errorf("after %v: %w", electionWait, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func init() { registry = append(registry, leaderKillScenario) }
