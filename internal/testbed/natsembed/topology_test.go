package natsembed_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
)

// connectJS connects to region's server as its service's user.
func connectJS(t *testing.T, topo *natsembed.Topology, region, service string) jetstream.JetStream {
	t.Helper()
	u, err := natsauth.UserOf(region, service)
	if err != nil {
		t.Fatal(err)
	}
	url := topo.ClientURL(region)
	opts := append(natsauth.ConnectOptions(u.Name, u.Password), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s as %s: %v", url, u.Name, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func createStream(t *testing.T, js jetstream.JetStream, name, subjects string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{subjects},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
}

// publish publishes one message with a Msg-Id, giving up after timeout.
func publish(js jetstream.JetStream, subject, msgID string, timeout time.Duration) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return js.Publish(ctx, subject, []byte(msgID), jetstream.WithMsgID(msgID))
}

// publishEventually retries a publish until it is acked or within expires.
func publishEventually(t *testing.T, js jetstream.JetStream, subject, msgID string, within time.Duration) *jetstream.PubAck {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ack, err := publish(js, subject, msgID, time.Second)
		if err == nil {
			return ack
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %s %s: still failing after %s: %v", subject, msgID, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestTopologyCrossRegionPublishCutHealRestart(t *testing.T) {
	start := time.Now()
	topo := natsembed.MustStartTopology(t, "eu", "us", "ap")
	t.Logf("topology started in %s", time.Since(start))
	for _, r := range topo.Regions() {
		if !topo.LinkUp(r) {
			t.Fatalf("region %s: link not up after start", r)
		}
	}

	// Each step runs as the service that does it in paymesh: a region's
	// ledger creates its streams, routers publish to ledger subjects.
	usLedger := connectJS(t, topo, "us", natsauth.Ledger)
	us := connectJS(t, topo, "us", natsauth.Router)
	eu := connectJS(t, topo, "eu", natsauth.Router)
	createStream(t, usLedger, "LEDGER_US", "ledger.us.>")

	// Cross-region publish from eu lands in us's stream, deduplicated by
	// Msg-Id. The stream's interest may take a moment to reach eu.
	firstAt := time.Now()
	ack := publishEventually(t, eu, "ledger.us.1.cmd.eu", "xfer/c/1", 30*time.Second)
	t.Logf("first cross-region publish acked after %s", time.Since(firstAt))
	if ack.Stream != "LEDGER_US" || ack.Domain != "us" || ack.Duplicate {
		t.Fatalf("first publish: ack %+v, want stream LEDGER_US in domain us, not a duplicate", ack)
	}
	ack, err := publish(eu, "ledger.us.1.cmd.eu", "xfer/c/1", 2*time.Second)
	if err != nil || !ack.Duplicate || ack.Sequence != 1 {
		t.Fatalf("repeated Msg-Id: ack %+v, %v; want a duplicate of sequence 1", ack, err)
	}

	// Cut off us: eu cannot reach it, but both keep their own domains.
	topo.Cut("us")
	if topo.LinkUp("us") {
		t.Fatal("us link up after Cut")
	}
	cutAt := time.Now()
	if ack, err := publish(eu, "ledger.us.1.cmd.eu", "xfer/c/2", 2*time.Second); err == nil {
		t.Fatalf("publish across the cut: got ack %+v", ack)
	} else {
		t.Logf("publish across the cut failed after %s: %v (no responders: %v)",
			time.Since(cutAt), err, errors.Is(err, jetstream.ErrNoStreamResponse))
	}
	createStream(t, connectJS(t, topo, "eu", natsauth.Ledger), "LEDGER_EU", "ledger.eu.>")
	if ack, err := publish(eu, "ledger.eu.1.cmd.eu", "xfer/c/3", 2*time.Second); err != nil || ack.Stream != "LEDGER_EU" {
		t.Fatalf("eu local publish while us is cut: %+v, %v", ack, err)
	}
	if ack, err := publish(us, "ledger.us.2.cmd.us", "xfer/c/4", 2*time.Second); err != nil || ack.Stream != "LEDGER_US" {
		t.Fatalf("us local publish while cut off: %+v, %v", ack, err)
	}
	// The cut-off region keeps full control of its domain.
	createStream(t, usLedger, "DLQ_US", "dlq.us.ledger")

	// Heal: eu reaches us again.
	healAt := time.Now()
	topo.Heal("us")
	linkAt := time.Since(healAt)
	if !topo.LinkUp("us") {
		t.Fatal("us link not up after Heal")
	}
	ack = publishEventually(t, eu, "ledger.us.1.cmd.eu", "xfer/c/2", 30*time.Second)
	t.Logf("heal: link back after %s, cross-region publish after %s", linkAt, time.Since(healAt))
	if ack.Stream != "LEDGER_US" || ack.Duplicate {
		t.Fatalf("publish after heal: ack %+v", ack)
	}
	// The healed link still runs through the proxy: a second cut holds.
	topo.Cut("us")
	if _, err := publish(eu, "ledger.us.1.cmd.eu", "xfer/c/6", 2*time.Second); err == nil {
		t.Fatal("publish across the second cut: acked")
	}
	topo.Heal("us")
	if !topo.LinkUp("us") {
		t.Fatal("us link not up after the second Heal")
	}

	// Restart us: its stream and messages survive, and eu publishes again.
	restartAt := time.Now()
	if err := topo.RestartRegion("us"); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart: link back after %s", time.Since(restartAt))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var info *jetstream.StreamInfo
	for {
		// us's connection reconnects to the same URL by itself.
		s, err := usLedger.Stream(ctx, "LEDGER_US")
		if err == nil {
			if info, err = s.Info(ctx); err == nil {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("LEDGER_US after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("LEDGER_US after restart: %d messages, want 3", info.State.Msgs)
	}
	ack = publishEventually(t, eu, "ledger.us.3.cmd.eu", "xfer/c/5", 30*time.Second)
	t.Logf("restart: cross-region publish after %s", time.Since(restartAt))
	if ack.Stream != "LEDGER_US" || ack.Sequence != 4 || ack.Duplicate {
		t.Fatalf("publish after restart: ack %+v, want sequence 4", ack)
	}
	// The duplicate window survives the restart too.
	if ack, err := publish(eu, "ledger.us.1.cmd.eu", "xfer/c/1", 2*time.Second); err != nil || !ack.Duplicate {
		t.Fatalf("repeated Msg-Id after restart: %+v, %v; want a duplicate", ack, err)
	}
}

func TestStartTopologyRejects(t *testing.T) {
	for name, o := range map[string]natsembed.TopologyOptions{
		"NoRegions":       {Dir: t.TempDir()},
		"NoDir":           {Regions: []string{"eu"}},
		"Repeated":        {Regions: []string{"eu", "eu"}, Dir: t.TempDir()},
		"Hub":             {Regions: []string{"hub"}, Dir: t.TempDir()},
		"LinkOfNoRegion":  {Regions: []string{"eu"}, Dir: t.TempDir(), Links: map[string]faultproxy.Shape{"us": {}}},
		"NegativeLatency": {Regions: []string{"eu"}, Dir: t.TempDir(), Links: map[string]faultproxy.Shape{"eu": {Latency: -time.Second}}},
	} {
		if topo, err := natsembed.StartTopology(o); err == nil {
			topo.Shutdown()
			t.Errorf("%s: started", name)
		}
	}
	topo := natsembed.MustStartTopology(t, "eu")
	if err := topo.RestartRegion("mars"); err == nil {
		t.Error("RestartRegion of an unknown region: no error")
	}
}

// TestTopologyLinkShape starts us's link with 25 ms of latency: a
// JetStream publish from eu to us's stream crosses it twice (the message
// and its ack), so it takes at least 50 ms. The link's control API changes
// the shape while it runs.
func TestTopologyLinkShape(t *testing.T) {
	const lat = 25 * time.Millisecond
	topo, err := natsembed.StartTopology(natsembed.TopologyOptions{Regions: []string{"eu", "us"}, Dir: t.TempDir(),
		Links: map[string]faultproxy.Shape{"us": {Latency: lat}}, LinkControl: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Shutdown)
	if got := topo.Link("us").Shape(); got.Latency != lat {
		t.Fatalf("us link shape: got %v, want latency %s", got, lat)
	}
	if got := topo.Link("eu").Shape(); got != (faultproxy.Shape{}) {
		t.Fatalf("eu link shape: got %v, want none", got)
	}
	createStream(t, connectJS(t, topo, "us", natsauth.Ledger), "LEDGER_US", "ledger.us.>")
	eu := connectJS(t, topo, "eu", natsauth.Router)
	publishEventually(t, eu, "ledger.us.1.cmd.eu", "warm-up", 30*time.Second)
	for i := range 3 {
		start := time.Now()
		if _, err := publish(eu, "ledger.us.1.cmd.eu", fmt.Sprint("shaped-", i), 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 2*lat {
			t.Fatalf("publish across a %s link took %s, want at least %s", lat, took, 2*lat)
		}
	}

	ctl := faultproxy.NewClient(topo.LinkControlURL("us"))
	want := faultproxy.Shape{Latency: time.Millisecond, Jitter: time.Millisecond}
	if err := ctl.SetShape(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if got := topo.Link("us").Shape(); got != want {
		t.Fatalf("after the control API: got %v, want %v", got, want)
	}
	if topo.LinkControlURL("eu") == "" {
		t.Fatal("eu has no link control URL")
	}
}

// createR3Stream creates a stream kept by three servers.
func createR3Stream(t *testing.T, js jetstream.JetStream, name, subjects string) *jetstream.StreamInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s jetstream.Stream
	var err error
	for {
		s, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subjects},
			Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, Replicas: 3})
		// Right after the start a server may not have told the
		// cluster's meta leader it is online yet: "no suitable peers for
		// placement" until it has.
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.ErrorCode(server.JSClusterNoPeersErrF) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create R3 stream %s: %v", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// readAll reads every message of the stream through a new ordered consumer
// and returns their Msg-Ids, in stream order.
func readAll(t *testing.T, js jetstream.JetStream, stream string) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		ids, err := tryReadAll(ctx, js, stream)
		cancel()
		if err == nil {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("read %s: %v", stream, err)
		}
		t.Logf("read %s: %v", stream, err)
		time.Sleep(100 * time.Millisecond)
	}
}

func tryReadAll(ctx context.Context, js jetstream.JetStream, stream string) ([]string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var ids []string
	for uint64(len(ids)) < info.State.Msgs {
		batch, err := c.Fetch(int(info.State.Msgs)-len(ids), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// TestTopologyR3 runs each region as a three-node JetStream cluster: an R3
// stream has three peers; publishes without a Msg-Id from another region
// are stored once, though every node has a link to the hub; stopping the
// stream's leader loses no acked message and publishes go on; a wiped node
// started again catches up.
func TestTopologyR3(t *testing.T) {
	start := time.Now()
	topo := natsembed.MustStartTopologyWith(t, natsembed.TopologyOptions{Regions: []string{"eu", "us"}, Nodes: 3})
	t.Logf("R3 topology (2 regions, 7 servers) started in %s", time.Since(start))
	leafs, err := topo.Hub().Leafz(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range leafs.Leafs {
		names = append(names, l.Name)
	}
	slices.Sort(names)
	if want := []string{"eu-1", "eu-2", "eu-3", "us-1", "us-2", "us-3"}; !slices.Equal(names, want) {
		t.Fatalf("hub's leafnodes: got %v, want %v", names, want)
	}
	for _, r := range topo.Regions() {
		if !topo.LinkUp(r) || topo.Nodes(r) != 3 || topo.Replicas(r) != 3 || topo.NodeName(r, 2) != r+"-3" {
			t.Fatalf("region %s: link up %v, %d nodes, replicas %d, node 2 %q; want up, 3, 3, %s-3",
				r, topo.LinkUp(r), topo.Nodes(r), topo.Replicas(r), topo.NodeName(r, 2), r)
		}
		if urls := strings.Split(topo.ClientURL(r), ","); len(urls) != 3 {
			t.Fatalf("region %s: client URLs %v, want 3", r, urls)
		}
	}

	usLedger := connectJS(t, topo, "us", natsauth.Ledger)
	info := createR3Stream(t, usLedger, "LEDGER_US", "ledger.us.>")
	if info.Cluster == nil || info.Cluster.Name != "us" || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("LEDGER_US cluster: got %+v, want leader and 2 replicas in cluster us", info.Cluster)
	}
	eu := connectJS(t, topo, "eu", natsauth.Router)
	publishEventually(t, eu, "ledger.us.1.cmd.eu", "warm-up", 30*time.Second)
	const plain = 20
	for i := range plain {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := eu.Publish(ctx, "ledger.us.2.cmd.eu", []byte("no msg id"))
		cancel()
		if err != nil {
			t.Fatalf("plain publish %d: %v", i, err)
		}
	}
	if got := len(readAll(t, usLedger, "LEDGER_US")); got != 1+plain {
		t.Fatalf("LEDGER_US: %d messages after %d publishes, want each stored once", got, 1+plain)
	}

	// Stop the stream's leader: acked messages survive on the other two,
	// and publishes, from us and from eu, are acked again once they elect.
	leader, err := topo.StreamLeader("us", "LEDGER_US")
	if err != nil {
		t.Fatal(err)
	}
	if name := topo.NodeName("us", leader); name != info.Cluster.Leader {
		t.Fatalf("StreamLeader: node %d (%s), stream info says %s", leader, name, info.Cluster.Leader)
	}
	us := connectJS(t, topo, "us", natsauth.Router)
	var acked []string
	for i := range 10 {
		id := fmt.Sprint("before-", i)
		publishEventually(t, us, "ledger.us.3.cmd.us", id, 30*time.Second)
		acked = append(acked, id)
	}
	stopAt := time.Now()
	if err := topo.StopNode("us", leader); err != nil {
		t.Fatal(err)
	}
	if err := topo.StopNode("us", leader); err == nil {
		t.Fatal("StopNode of a stopped node: no error")
	}
	for i := range 10 {
		for from, js := range map[string]jetstream.JetStream{"us": us, "eu": eu} {
			id := fmt.Sprintf("after-%d-%p", i, js)
			publishEventually(t, js, "ledger.us.3.cmd."+from, id, 30*time.Second)
			acked = append(acked, id)
		}
	}
	t.Logf("leader %s stopped: 20 publishes acked after %s", topo.NodeName("us", leader), time.Since(stopAt))
	if !topo.LinkUp("us") {
		t.Fatal("us link not up with one node stopped")
	}
	newLeader, err := topo.StreamLeader("us", "LEDGER_US")
	if err != nil || newLeader == leader {
		t.Fatalf("StreamLeader after stopping node %d: got %d, %v", leader, newLeader, err)
	}
	got := readAll(t, usLedger, "LEDGER_US")
	for _, id := range acked {
		if !slices.Contains(got, id) {
			t.Fatalf("acked message %s lost after the leader stopped (stream has %d)", id, len(got))
		}
	}
	if len(got) != 1+plain+len(acked) {
		t.Fatalf("LEDGER_US: %d messages, want %d", len(got), 1+plain+len(acked))
	}

	// Wipe the stopped node's disk and start it: it catches up.
	if err := topo.WipeNode("us", newLeader); err == nil {
		t.Fatal("WipeNode of a running node: no error")
	}
	if err := topo.WipeNode("us", leader); err != nil {
		t.Fatal(err)
	}
	if err := topo.StartNode("us", leader); err != nil {
		t.Fatal(err)
	}
	if err := topo.StartNode("us", leader); err == nil {
		t.Fatal("StartNode of a running node: no error")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	catchAt := time.Now()
	if err := topo.WaitStreamsCurrent(ctx, "us"); err != nil {
		t.Fatal(err)
	}
	t.Logf("wiped node caught up in %s", time.Since(catchAt))
	jsz, err := topo.NodeServer("us", leader).Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	var msgs uint64
	for _, a := range jsz.AccountDetails {
		for _, s := range a.Streams {
			if s.Name == "LEDGER_US" {
				msgs = s.State.Msgs
			}
		}
	}
	if want := uint64(len(got)); msgs != want {
		t.Fatalf("wiped node after catching up: %d messages, want %d", msgs, want)
	}
}

// TestTopologyR3CutHealRestart: Cut and Heal take a cluster region's three
// links down and up together, and RestartRegion restarts all three nodes
// with their streams.
func TestTopologyR3CutHealRestart(t *testing.T) {
	topo := natsembed.MustStartTopologyWith(t, natsembed.TopologyOptions{Regions: []string{"eu", "us"}, Nodes: 3})
	createR3Stream(t, connectJS(t, topo, "us", natsauth.Ledger), "LEDGER_US", "ledger.us.>")
	eu, us := connectJS(t, topo, "eu", natsauth.Router), connectJS(t, topo, "us", natsauth.Router)
	publishEventually(t, eu, "ledger.us.1.cmd.eu", "one", 30*time.Second)

	topo.Cut("us")
	if topo.LinkUp("us") {
		t.Fatal("us link up after Cut")
	}
	leafs, err := topo.Hub().Leafz(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leafs.Leafs {
		if strings.HasPrefix(l.Name, "us-") {
			t.Fatalf("hub still sees %s after Cut", l.Name)
		}
	}
	if _, err := publish(eu, "ledger.us.1.cmd.eu", "two", 2*time.Second); err == nil {
		t.Fatal("publish across the cut: acked")
	}
	publishEventually(t, us, "ledger.us.1.cmd.us", "local", 30*time.Second)
	topo.Heal("us")
	if !topo.LinkUp("us") {
		t.Fatal("us link not up after Heal")
	}
	publishEventually(t, eu, "ledger.us.1.cmd.eu", "two", 30*time.Second)

	if err := topo.RestartRegion("us"); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, connectJS(t, topo, "us", natsauth.Ledger), "LEDGER_US"); !slices.Equal(got, []string{"one", "local", "two"}) {
		t.Fatalf("LEDGER_US after restart: %v, want one, local, two", got)
	}
	publishEventually(t, eu, "ledger.us.1.cmd.eu", "three", 30*time.Second)
}

// TestTopologyNodesRejected: a region is one server or three, and the node
// operations refuse what does not exist or is in the wrong state.
func TestTopologyNodesRejected(t *testing.T) {
	for _, n := range []int{-1, 2, 4, 5} {
		if topo, err := natsembed.StartTopology(natsembed.TopologyOptions{Regions: []string{"eu"}, Dir: t.TempDir(), Nodes: n}); err == nil {
			topo.Shutdown()
			t.Errorf("Nodes %d: started", n)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("%d nodes per region: want 1", n)) {
			t.Errorf("Nodes %d: got %v", n, err)
		}
	}
	topo := natsembed.MustStartTopology(t, "eu")
	if topo.Nodes("eu") != 1 || topo.Replicas("eu") != 1 || topo.NodeName("eu", 0) != "eu" {
		t.Fatalf("single server: %d nodes, replicas %d, node 0 %q", topo.Nodes("eu"), topo.Replicas("eu"), topo.NodeName("eu", 0))
	}
	for name, err := range map[string]error{
		"StopNode mars":    topo.StopNode("mars", 0),
		"StopNode eu 1":    topo.StopNode("eu", 1),
		"StartNode eu -1":  topo.StartNode("eu", -1),
		"StartNode eu 0":   topo.StartNode("eu", 0), // running
		"WipeNode eu 0":    topo.WipeNode("eu", 0),  // running
		"WaitStreams mars": topo.WaitStreamsCurrent(context.Background(), "mars"),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := topo.StreamLeader("eu", "NOPE"); err == nil {
		t.Error("StreamLeader of a stream that does not exist: no error")
	}
	createStream(t, connectJS(t, topo, "eu", natsauth.Ledger), "LEDGER_EU", "ledger.eu.>")
	if i, err := topo.StreamLeader("eu", "LEDGER_EU"); err != nil || i != 0 {
		t.Errorf("StreamLeader on a single server: got %d, %v; want 0", i, err)
	}
	if err := topo.WaitStreamsCurrent(context.Background(), "eu"); err != nil {
		t.Error(err)
	}
	// A single server stops, is wiped and starts again empty.
	if err := topo.StopNode("eu", 0); err != nil {
		t.Fatal(err)
	}
	if err := topo.WipeNode("eu", 0); err != nil {
		t.Fatal(err)
	}
	if err := topo.StartNode("eu", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := topo.StreamLeader("eu", "LEDGER_EU"); err == nil {
		t.Error("StreamLeader after wiping a single server: the stream is still there")
	}
}

// TestTopologyRegionNodes: RegionNodes runs one region as a cluster while
// the others keep one server, and refuses counts other than 1 and 3 and
// regions the topology does not have.
func TestTopologyRegionNodes(t *testing.T) {
	for name, tc := range map[string]struct {
		nodes map[string]int
		want  string
	}{
		"Two":      {map[string]int{"us": 2}, "2 nodes in region us: want 1"},
		"NoRegion": {map[string]int{"mars": 3}, `nodes for "mars", which is not a region`},
	} {
		topo, err := natsembed.StartTopology(natsembed.TopologyOptions{Regions: []string{"eu", "us"}, Dir: t.TempDir(), RegionNodes: tc.nodes})
		if err == nil {
			topo.Shutdown()
			t.Errorf("%s: started", name)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", name, err, tc.want)
		}
	}
	topo := natsembed.MustStartTopologyWith(t, natsembed.TopologyOptions{Regions: []string{"eu", "us"}, RegionNodes: map[string]int{"us": 3}})
	for r, want := range map[string]int{"eu": 1, "us": 3} {
		if topo.Nodes(r) != want || topo.Replicas(r) != want || len(strings.Split(topo.ClientURL(r), ",")) != want {
			t.Errorf("region %s: %d nodes, replicas %d, client URLs %q; want %d of each", r, topo.Nodes(r), topo.Replicas(r), topo.ClientURL(r), want)
		}
	}
	createR3Stream(t, connectJS(t, topo, "us", natsauth.Ledger), "LEDGER_US", "ledger.us.>")
	publishEventually(t, connectJS(t, topo, "eu", natsauth.Router), "ledger.us.1.cmd.eu", "from eu", 5*time.Second)
}
