package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/internal/testbed/scrape"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

var regionCodes = map[string]uint8{"eu": 1, "us": 2, "ap": 3}

// rate returns a thread-safe coin with probability p.
func rate(seed uint64, p float64) func() bool {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 1))
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < p
	}
}

type harness struct {
	c     *cluster.Cluster
	topo  *natsembed.Topology
	gens  map[string]*idgen.Generator
	accts map[string][]string
}

func mustCluster(tb testing.TB, inject, dropAck func() bool) *harness {
	tb.Helper()
	return mustClusterOn(tb, natsembed.MustStartTopology(tb, "eu", "us", "ap"), inject, dropAck, nil)
}

// mustClusterOn runs the three regions on topo, with adjust (if not nil)
// changing each region's ledger configuration.
func mustClusterOn(tb testing.TB, topo *natsembed.Topology, inject, dropAck func() bool, adjust func(string, *ledgerd.Config)) *harness {
	tb.Helper()
	ctx := context.Background()
	prefix := fmt.Sprintf("pmtest_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e6)
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: regionCodes, Topology: topo, PostgresURL: pgtest.AdminURL(), DatabasePrefix: prefix,
		Shards: 4, BatchSize: 64, AckWait: 2 * time.Second, Inject: inject, DropAck: dropAck, Ledger: adjust,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Stop()
		if err := c.Drop(context.Background()); err != nil {
			tb.Errorf("drop: %v", err)
		}
	})
	h := &harness{c: c, topo: topo, gens: map[string]*idgen.Generator{}, accts: map[string][]string{}}
	for r := range regionCodes {
		if h.gens[r], err = idgen.NewGenerator(c.IDs(), r, 900); err != nil {
			tb.Fatal(err)
		}
	}
	return h
}

func (h *harness) id(tb testing.TB, region string) string {
	tb.Helper()
	s, err := h.gens[region].NextString()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// open creates n funded accounts in every region; funding goes through the
// router of the region like any command.
func (h *harness) open(tb testing.TB, n int, funds int64) {
	tb.Helper()
	ctx := context.Background()
	for _, r := range []string{"eu", "us", "ap"} {
		for range n {
			a, _, err := h.c.Region(r).Ledger.Store.CreateAccount(ctx, ledger.NewAccount{ClientID: "c", Currency: "EUR"})
			if err != nil {
				tb.Fatal(err)
			}
			h.accts[r] = append(h.accts[r], a.ID)
			fund := ledger.Command{Type: ledger.TypeFund, TransferID: h.id(tb, r), ClientID: "c", IdempotencyKey: "fund-" + a.ID,
				To: a.ID, Amount: funds, Currency: "EUR", CreatedAt: time.Now()}
			if err := h.c.Submit(ctx, r, fund); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

func (h *harness) transfer(tb testing.TB, from, to string, amount int64) ledger.Command {
	tb.Helper()
	src, _ := h.c.IDs().HomeRegion(from)
	return ledger.Command{Type: ledger.TypeTransfer, TransferID: h.id(tb, src), ClientID: "c", IdempotencyKey: "k-" + h.id(tb, src),
		From: from, To: to, Amount: amount, Currency: "EUR", CreatedAt: time.Now()}
}

func (h *harness) quiet(tb testing.TB, d time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := h.c.WaitQuiet(ctx); err != nil {
		tb.Fatal(err)
	}
}

func (h *harness) verify(tb testing.TB) {
	tb.Helper()
	rep, err := postgres.VerifyGlobal(context.Background(), h.c.Stores(), true)
	if err != nil {
		tb.Fatal(err)
	}
	if !rep.OK() {
		tb.Fatalf("global verify:\n%s", rep)
	}
}

// status reads a transfer's status in its home region, "" while it is not
// there yet.
func (h *harness) status(tb testing.TB, cmd ledger.Command) ledger.Status {
	tb.Helper()
	src, _ := h.c.IDs().HomeRegion(cmd.From)
	t, err := h.c.Region(src).Ledger.Store.Transfer(context.Background(), cmd.TransferID)
	if err != nil {
		return ""
	}
	return t.Status
}

// final reads a transfer's status in its home region.
func (h *harness) final(tb testing.TB, cmd ledger.Command) ledger.Transfer {
	tb.Helper()
	src, _ := h.c.IDs().HomeRegion(cmd.From)
	t, err := h.c.Region(src).Ledger.Store.Transfer(context.Background(), cmd.TransferID)
	if err != nil {
		tb.Fatalf("transfer %s: %v", cmd.TransferID, err)
	}
	return t
}

// TestCrossRegionTransfers: transfers eu→us, us→ap, ap→eu and within
// regions, submitted in random regions, with duplicates injected at every
// hop: client resubmits, router forwards and outbox relays (same Msg-Id),
// and ledger redeliveries (dropped acks). Every transfer ends COMPLETED,
// REFUNDED or REJECTED, the global invariants hold, and the duplicate
// counters show the injected duplicates were caught.
func TestCrossRegionTransfers(t *testing.T) {
	h := mustCluster(t, rate(1, 0.2), rate(2, 0.2))
	h.open(t, 8, 100_000)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	pairs := [][2]string{{"eu", "us"}, {"us", "ap"}, {"ap", "eu"}, {"eu", "eu"}, {"us", "us"}, {"ap", "ap"}}
	var cmds []ledger.Command
	var resubmits, missing int
	for i := range 1000 {
		p := pairs[i%len(pairs)]
		from := h.accts[p[0]][rng.IntN(8)]
		to := h.accts[p[1]][rng.IntN(8)]
		for to == from {
			to = h.accts[p[1]][rng.IntN(8)]
		}
		if i%37 == 0 && p[0] != p[1] {
			to = h.id(t, p[1]) // no such account in the destination region
			missing++
		}
		cmd := h.transfer(t, from, to, 1+rng.Int64N(500))
		cmds = append(cmds, cmd)
		via := []string{"eu", "us", "ap"}[rng.IntN(3)]
		if err := h.c.Submit(ctx, via, cmd); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(100) < 20 { // a client retry, possibly in another region
			resubmits++
			if err := h.c.Submit(ctx, []string{"eu", "us", "ap"}[rng.IntN(3)], cmd); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.quiet(t, 2*time.Minute)

	states := map[ledger.Status]int{}
	for _, cmd := range cmds {
		tr := h.final(t, cmd)
		states[tr.Status]++
		if _, err := h.c.IDs().HomeRegion(cmd.To); err == nil && tr.Status == ledger.StatusDebited {
			t.Errorf("transfer %s still DEBITED", tr.ID)
		}
	}
	t.Logf("final states: %v", states)
	if states[ledger.StatusRefunded] != missing {
		t.Errorf("refunded: got %d, want the %d transfers to missing accounts", states[ledger.StatusRefunded], missing)
	}
	if states[ledger.StatusCompleted]+states[ledger.StatusRefunded]+states[ledger.StatusRejected] != len(cmds) {
		t.Errorf("final states %v do not cover all %d transfers", states, len(cmds))
	}

	var injected, caughtByMsgID, ledgerDups, redeliveries, routeDups int64
	for _, n := range h.c.Names() {
		r := h.c.Region(n)
		injected += r.Injected()
		caughtByMsgID += r.Router.Stats().ForwardDuplicates.Load() + r.Router.Stats().RelayDuplicates.Load() +
			r.Ledger.Stats.Duplicates()[string(ledger.LayerMsgID)] // the steps the ledgers send
		routeDups += r.Router.Stats().DuplicateSubmits.Load()
		for layer, v := range r.Ledger.Stats.Duplicates() {
			if layer != string(ledger.LayerMsgID) {
				ledgerDups += v
			}
		}
		redeliveries += r.Ledger.Stats.Redeliveries.Load()
	}
	t.Logf("resubmits %d (route stream caught %d), router duplicates injected %d (Msg-Id caught %d), ledger redeliveries %d, ledger duplicates caught %d",
		resubmits, routeDups, injected, caughtByMsgID, redeliveries, ledgerDups)
	if injected == 0 || caughtByMsgID < injected {
		t.Errorf("router duplicates: injected %d, caught by Msg-Id %d", injected, caughtByMsgID)
	}
	if redeliveries == 0 || ledgerDups == 0 {
		t.Errorf("ledger redeliveries %d, ledger duplicates caught %d: the redelivery injection did not bite", redeliveries, ledgerDups)
	}
	if resubmits == 0 || routeDups == 0 {
		t.Errorf("client resubmits %d, caught %d", resubmits, routeDups)
	}
	h.verify(t)
}

// TestRegionCutOff: while us is cut off, every region still accepts
// commands bound for it and keeps applying its own: eu stores us-homed
// commands until the link heals (more of them than one forwarder may hold
// unacked), holds its credit steps for us in its outbox, and completes
// eu→eu transfers meanwhile. After the heal everything completes and
// nothing is left in transit.
func TestRegionCutOff(t *testing.T) {
	h := mustCluster(t, nil, nil)
	h.open(t, 4, 10_000)
	h.quiet(t, time.Minute)
	ctx := context.Background()

	h.topo.Cut("us")
	var waiting, local []ledger.Command
	submit := func(via string, cmd ledger.Command) {
		t.Helper()
		sub, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := h.c.Submit(sub, via, cmd); err != nil {
			t.Fatalf("submit in %s while us is cut off: %v", via, err)
		}
	}
	for i := range 1100 { // us-homed, submitted in eu: stored in eu
		cmd := h.transfer(t, h.accts["us"][i%4], h.accts["eu"][i%4], 1)
		waiting = append(waiting, cmd)
		submit("eu", cmd)
	}
	for i := range 20 {
		for _, p := range [][2]string{{"eu", "us"}, {"us", "ap"}} { // credits wait in the outbox
			cmd := h.transfer(t, h.accts[p[0]][i%4], h.accts[p[1]][(i+1)%4], 10)
			waiting = append(waiting, cmd)
			submit(p[0], cmd)
		}
		cmd := h.transfer(t, h.accts["eu"][i%4], h.accts["eu"][(i+1)%4], 10)
		local = append(local, cmd)
		submit("eu", cmd)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, cmd := range local {
		for h.status(t, cmd) != ledger.StatusCompleted {
			if time.Now().After(deadline) {
				t.Fatalf("eu→eu transfer %s did not complete while us was cut off", cmd.TransferID)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n, err := h.c.Backlog(ctx); err != nil || n < int64(len(waiting)) {
		t.Fatalf("backlog while cut off: %d %v, want at least the %d commands waiting for us", n, err, len(waiting))
	}
	h.topo.Heal("us")
	h.quiet(t, 2*time.Minute)
	for _, cmd := range append(waiting, local...) {
		if tr := h.final(t, cmd); tr.Status != ledger.StatusCompleted {
			t.Errorf("transfer %s: %s %s, want COMPLETED", tr.ID, tr.Status, tr.Reason)
		}
	}
	h.verify(t)
}

// TestRestarts: a region's ledger and router restarted as after a crash, and
// one NATS server restarted, in the middle of a run, lose nothing.
func TestRestarts(t *testing.T) {
	h := mustCluster(t, nil, nil)
	h.open(t, 4, 10_000)
	h.quiet(t, time.Minute)
	ctx := context.Background()
	var cmds []ledger.Command
	submit := func(n int) {
		for i := range n {
			p := [][2]string{{"eu", "us"}, {"us", "ap"}, {"ap", "eu"}, {"eu", "eu"}}[i%4]
			cmd := h.transfer(t, h.accts[p[0]][i%4], h.accts[p[1]][(i+2)%4], 7)
			cmds = append(cmds, cmd)
			for {
				sub, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := h.c.Submit(sub, p[0], cmd)
				cancel()
				if err == nil {
					break
				}
				time.Sleep(200 * time.Millisecond) // the region's NATS server is restarting
			}
		}
	}
	submit(100)
	if err := h.c.RestartRegion(ctx, "eu"); err != nil {
		t.Fatal(err)
	}
	submit(100)
	if err := h.topo.RestartRegion("ap"); err != nil {
		t.Fatal(err)
	}
	submit(100)
	h.quiet(t, 2*time.Minute)
	for _, cmd := range cmds {
		if tr := h.final(t, cmd); tr.Status != ledger.StatusCompleted {
			t.Errorf("transfer %s: %s %s, want COMPLETED", tr.ID, tr.Status, tr.Reason)
		}
	}
	h.verify(t)
}

// TestR3NodeLossMidRun runs every region as a JetStream cluster of three:
// the services keep their streams at three replicas, and stopping the node
// that leads us's ledger stream in the middle of a run, and keeping it down
// to the end, loses nothing: every transfer completes and the global
// invariants hold. The node then starts again and catches up.
func TestR3NodeLossMidRun(t *testing.T) {
	topo := natsembed.MustStartTopologyWith(t, natsembed.TopologyOptions{Regions: []string{"eu", "us", "ap"}, Nodes: 3})
	h := mustClusterOn(t, topo, nil, nil, nil)
	ctx := context.Background()
	for _, r := range h.c.Names() {
		for _, stream := range []string{subjects.LedgerStream(r), subjects.DLQStream(r), subjects.RouteStream(r)} {
			leader, err := topo.StreamLeader(r, stream)
			if err != nil {
				t.Fatal(err)
			}
			sd := streamOn(t, topo, r, leader, stream)
			if sd.Config.Replicas != 3 || sd.Cluster == nil || len(sd.Cluster.Replicas) != 2 {
				t.Fatalf("%s: %d replicas, cluster %+v; want 3 peers", stream, sd.Config.Replicas, sd.Cluster)
			}
		}
	}
	h.open(t, 4, 10_000)
	h.quiet(t, time.Minute)
	var cmds []ledger.Command
	submit := func(n int) {
		for i := range n {
			p := [][2]string{{"eu", "us"}, {"us", "ap"}, {"ap", "eu"}, {"us", "us"}}[i%4]
			cmd := h.transfer(t, h.accts[p[0]][i%4], h.accts[p[1]][(i+2)%4], 7)
			cmds = append(cmds, cmd)
			for {
				sub, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := h.c.Submit(sub, p[0], cmd)
				cancel()
				if err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond) // a retry with the same Msg-Id
			}
		}
	}
	submit(200)
	stream := subjects.LedgerStream("us")
	leader, err := topo.StreamLeader("us", stream)
	if err != nil {
		t.Fatal(err)
	}
	stopAt := time.Now()
	if err := topo.StopNode("us", leader); err != nil {
		t.Fatal(err)
	}
	submit(200)
	t.Logf("%s (leader of %s) stopped; 200 more transfers submitted in %s", topo.NodeName("us", leader), stream, time.Since(stopAt))
	h.quiet(t, 2*time.Minute)
	for _, cmd := range cmds {
		if tr := h.final(t, cmd); tr.Status != ledger.StatusCompleted {
			t.Errorf("transfer %s: %s %s, want COMPLETED", tr.ID, tr.Status, tr.Reason)
		}
	}
	h.verify(t)
	if err := topo.StartNode("us", leader); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := topo.WaitStreamsCurrent(wait, "us"); err != nil {
		t.Fatal(err)
	}
}

// streamOn returns node i's copy of the stream in region.
func streamOn(t *testing.T, topo *natsembed.Topology, region string, i int, stream string) server.StreamDetail {
	t.Helper()
	jsz, err := topo.NodeServer(region, i).Jsz(&server.JSzOptions{Accounts: true, Streams: true, Config: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range jsz.AccountDetails {
		for _, sd := range a.Streams {
			if sd.Name == stream {
				return sd
			}
		}
	}
	t.Fatalf("%s has no stream %s", topo.NodeName(region, i), stream)
	return server.StreamDetail{}
}

// stepsRefused is a ledger's JetStream handle that refuses to publish saga
// steps, as a ledger whose NATS user may not send them would find.
type stepsRefused struct{ jetstream.JetStream }

func (j stepsRefused) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if cmd, err := ledger.DecodeCommand(m.Data); err == nil && cmd.IsStep() {
		return nil, errors.New("steps refused")
	}
	return j.JetStream.PublishMsgAsync(m, opts...)
}

// TestLedgerSendsItsSteps: a ledger publishes the saga steps its batch
// wrote right after the COMMIT, so the relay sends none of them; a
// ledger that cannot publish them (eu's, here) leaves them to its region's
// relay, which sends them once their handoff is over, and every transfer
// completes either way. The outbox records each step sent.
func TestLedgerSendsItsSteps(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu", "us", "ap")
	ctx := context.Background()
	c, err := cluster.Start(ctx, cluster.Config{
		Regions: regionCodes, Topology: topo, PostgresURL: pgtest.AdminURL(),
		DatabasePrefix: fmt.Sprintf("pmtest_steps_%d_", os.Getpid()), Shards: 4, BatchSize: 64, AckWait: 5 * time.Second,
		Ledger: func(region string, lc *ledgerd.Config) {
			if region == "eu" {
				lc.WrapJetStream = func(js jetstream.JetStream) jetstream.JetStream { return stepsRefused{js} }
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(); _ = c.Drop(context.Background()) })
	h := &harness{c: c, topo: topo, gens: map[string]*idgen.Generator{}, accts: map[string][]string{}}
	for r := range regionCodes {
		if h.gens[r], err = idgen.NewGenerator(c.IDs(), r, 900); err != nil {
			t.Fatal(err)
		}
	}
	h.open(t, 2, 100_000)
	h.quiet(t, time.Minute)

	const n = 20
	var cmds []ledger.Command
	for i := range n {
		for _, p := range [][2]string{{"us", "ap"}, {"eu", "us"}} {
			cmd := h.transfer(t, h.accts[p[0]][i%2], h.accts[p[1]][i%2], 10)
			cmds = append(cmds, cmd)
			if err := c.Submit(ctx, p[0], cmd); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.quiet(t, 2*time.Minute)
	for _, cmd := range cmds {
		if tr := h.final(t, cmd); tr.Status != ledger.StatusCompleted {
			t.Errorf("transfer %s: %s %s, want COMPLETED", tr.ID, tr.Status, tr.Reason)
		}
	}
	h.verify(t)

	// us sends the credits of us→ap and the confirms of eu→us, ap the
	// confirms of us→ap: 3n steps, by the ledgers.
	stats := func(r string) (sent, left, relayed int64) {
		reg := c.Region(r)
		return reg.Ledger.Stats.StepsSent.Load(), reg.Ledger.Stats.StepsLeft.Load(), reg.Router.Stats().Relayed.Load()
	}
	var sent, left, relayed int64
	for _, r := range []string{"us", "ap"} {
		s, l, rl := stats(r)
		sent, left, relayed = sent+s, left+l, relayed+rl
	}
	t.Logf("us and ap: %d steps sent by the ledgers, %d left, %d relayed", sent, left, relayed)
	for _, r := range c.Names() { // as /metrics says
		reg := c.Region(r)
		for name, want := range map[string]int64{"paymesh_saga_steps_sent_total": reg.Ledger.Stats.StepsSent.Load(),
			"paymesh_saga_steps_left_total": reg.Ledger.Stats.StepsLeft.Load()} {
			if got := scrape.Sum(t, reg.LedgerMetricsURL, name, map[string]string{"region": r}); got != want {
				t.Errorf("%s: %s %d, want %d", r, name, got, want)
			}
		}
	}
	if sent+left != 3*n || sent == 0 {
		t.Errorf("us and ap's ledgers sent %d steps and left %d, want the %d their batches wrote, sent", sent, left, 3*n)
	}
	if relayed > left {
		t.Errorf("us and ap's relays sent %d steps, more than the %d their ledgers left", relayed, left)
	}
	// eu's credits of eu→us: its ledger could send none; its relay did.
	s, l, rl := stats("eu")
	t.Logf("eu: %d steps sent by the ledger, %d left, %d relayed", s, l, rl)
	if s != 0 || l != n || rl < n {
		t.Errorf("eu: its ledger sent %d steps and left %d, its relay sent %d; want 0, %d and at least %d", s, l, rl, n, n)
	}
	for _, r := range c.Names() {
		var unsent, untried int
		if err := c.Region(r).Ledger.Store.Pool().QueryRow(ctx,
			`SELECT count(*) FILTER (WHERE sent_at IS NULL), count(*) FILTER (WHERE attempts = 0) FROM outbox`).Scan(&unsent, &untried); err != nil {
			t.Fatal(err)
		}
		if unsent != 0 || untried != 0 {
			t.Errorf("%s: %d outbox rows not marked sent, %d with no attempt counted", r, unsent, untried)
		}
	}
}
