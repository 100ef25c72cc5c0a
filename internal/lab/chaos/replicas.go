package chaos

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/subjects"
)

// waitCurrent waits, at most currentWait, until every replica of the
// region's streams has caught up with its leader.
func (e *env) waitCurrent(ctx context.Context, region string) error {
	ctx, cancel := context.WithTimeout(ctx, currentWait)
	defer cancel()
	if err := e.topo.WaitStreamsCurrent(ctx, region); err != nil {
		return fmt.Errorf("region %s: replicas not current: %w", region, err)
	}
	return nil
}

// currentCheck is the R3 scenarios' "current" check: every running server
// of the region holds the leader's last sequence and message count of
// every stream (Topology.WaitStreamsCurrent), and every stream (ledger,
// dead letters, route) has a leader and as many replicas as the region has
// servers, each current, none offline or lagging. A follower that was
// current may lag for a moment behind writes still arriving (a router's
// acks on its work queue), so the check looks again until one look finds
// every replica current or currentWait has passed, and reports that look.
func (e *env) currentCheck(ctx context.Context, region string) Check {
	want := e.topo.Replicas(region)
	ctx, cancel := context.WithTimeout(ctx, currentWait)
	defer cancel()
	var chk Check
	until(ctx, func() bool {
		chk = e.lookCurrent(ctx, region, want)
		return chk.OK
	})
	return chk
}

// lookCurrent is one look of currentCheck.
func (e *env) lookCurrent(ctx context.Context, region string, want int) Check {
	chk := Check{Name: "current", OK: true,
		What: fmt.Sprintf("every stream of %s is kept by all %d of its servers, each replica current", region, want)}
	// Every running server holds the leader's last sequence and message
	// count of every stream.
	err := e.topo.WaitStreamsCurrent(ctx, region)
	chk.Checked++
	if err != nil {
		chk.fail("%v", err)
	}
	// And JetStream counts every server as a current replica.
	r := e.c.Region(region)
	for _, s := range []struct {
		name string
		js   jetstream.JetStream
	}{
		{subjects.LedgerStream(region), r.Ledger.JetStream()},
		{subjects.DLQStream(region), r.Ledger.JetStream()},
		{subjects.RouteStream(region), r.RouterJetStream()},
	} {
		chk.Checked++
		stream, err := s.js.Stream(ctx, s.name)
		if err != nil {
			chk.fail("%s: %v", s.name, err)
			continue
		}
		info, err := stream.Info(ctx)
		if err != nil {
			chk.fail("%s: %v", s.name, err)
			continue
		}
		if info.Config.Replicas != want {
			chk.fail("%s has %d replicas, want %d", s.name, info.Config.Replicas, want)
		}
		if want == 1 {
			continue
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			chk.fail("%s has no leader", s.name)
			continue
		}
		if len(info.Cluster.Replicas) != want-1 {
			chk.fail("%s: leader %s and %d followers, want %d", s.name, info.Cluster.Leader, len(info.Cluster.Replicas), want-1)
		}
		for _, p := range info.Cluster.Replicas {
			if !p.Current || p.Offline || p.Lag > 0 {
				chk.fail("%s: replica on %s is not current (current %t, offline %t, lag %d)", s.name, p.Name, p.Current, p.Offline, p.Lag)
			}
		}
	}
	return chk
}
