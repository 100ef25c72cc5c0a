package natsembed_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/platform/natsauth"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
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
	ack := publishEventually(t, eu, "ledger.us.1", "xfer/c/1", 5*time.Second)
	t.Logf("first cross-region publish acked after %s", time.Since(firstAt))
	if ack.Stream != "LEDGER_US" || ack.Domain != "us" || ack.Duplicate {
		t.Fatalf("first publish: ack %+v, want stream LEDGER_US in domain us, not a duplicate", ack)
	}
	ack, err := publish(eu, "ledger.us.1", "xfer/c/1", 2*time.Second)
	if err != nil || !ack.Duplicate || ack.Sequence != 1 {
		t.Fatalf("repeated Msg-Id: ack %+v, %v; want a duplicate of sequence 1", ack, err)
	}

	// Cut off us: eu cannot reach it, but both keep their own domains.
	topo.Cut("us")
	if topo.LinkUp("us") {
		t.Fatal("us link up after Cut")
	}
	cutAt := time.Now()
	if ack, err := publish(eu, "ledger.us.1", "xfer/c/2", 2*time.Second); err == nil {
		t.Fatalf("publish across the cut: got ack %+v", ack)
	} else {
		t.Logf("publish across the cut failed after %s: %v (no responders: %v)",
			time.Since(cutAt), err, errors.Is(err, jetstream.ErrNoStreamResponse))
	}
	createStream(t, connectJS(t, topo, "eu", natsauth.Ledger), "LEDGER_EU", "ledger.eu.>")
	if ack, err := publish(eu, "ledger.eu.1", "xfer/c/3", 2*time.Second); err != nil || ack.Stream != "LEDGER_EU" {
		t.Fatalf("eu local publish while us is cut: %+v, %v", ack, err)
	}
	if ack, err := publish(us, "ledger.us.2", "xfer/c/4", 2*time.Second); err != nil || ack.Stream != "LEDGER_US" {
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
	ack = publishEventually(t, eu, "ledger.us.1", "xfer/c/2", 10*time.Second)
	t.Logf("heal: link back after %s, cross-region publish after %s", linkAt, time.Since(healAt))
	if ack.Stream != "LEDGER_US" || ack.Duplicate {
		t.Fatalf("publish after heal: ack %+v", ack)
	}
	// The healed link still runs through the proxy: a second cut holds.
	topo.Cut("us")
	if _, err := publish(eu, "ledger.us.1", "xfer/c/6", 2*time.Second); err == nil {
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
	ack = publishEventually(t, eu, "ledger.us.3", "xfer/c/5", 10*time.Second)
	t.Logf("restart: cross-region publish after %s", time.Since(restartAt))
	if ack.Stream != "LEDGER_US" || ack.Sequence != 4 || ack.Duplicate {
		t.Fatalf("publish after restart: ack %+v, want sequence 4", ack)
	}
	// The duplicate window survives the restart too.
	if ack, err := publish(eu, "ledger.us.1", "xfer/c/1", 2*time.Second); err != nil || !ack.Duplicate {
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
	publishEventually(t, eu, "ledger.us.1", "warm-up", 5*time.Second)
	for i := range 3 {
		start := time.Now()
		if _, err := publish(eu, "ledger.us.1", fmt.Sprint("shaped-", i), 2*time.Second); err != nil {
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
