package ledgerstream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router"
)

// connectAs connects to every server of the region as the service's user.
func connectAs(t *testing.T, topo *natsembed.Topology, region, service string) jetstream.JetStream {
	t.Helper()
	u, err := natsauth.UserOf(region, service)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(topo.ClientURL(region), natsauth.ConnectOptions(u.Name, u.Password)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// waitPeers waits until the stream's leader reports want-1 current
// replicas, and returns its info.
func waitPeers(t *testing.T, js jetstream.JetStream, stream string, want int) *jetstream.StreamInfo {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := js.Stream(ctx, stream)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = s.Info(ctx)
		}
		cancel()
		if err == nil && info.Config.Replicas == want && info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == want-1 {
			current := 0
			for _, p := range info.Cluster.Replicas {
				if p.Current {
					current++
				}
			}
			if current == want-1 {
				return info
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not %d current peers after 20s: %+v, %v", stream, want, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEnsureStreamsScalesToR3: on a region cluster of three servers,
// EnsureStreams and router.EnsureStream create R1 streams at the default
// and scale the same streams, their messages and the ledger's durable
// consumers to three replicas when asked; a count JetStream refuses, or
// one above the region's servers, is an error that leaves the streams as
// they were.
func TestEnsureStreamsScalesToR3(t *testing.T) {
	// A deadline of its own: without one each JetStream call has the
	// client's 5 s, which a cluster just formed on a loaded machine can
	// take to place a stream (seen once: "context deadline exceeded").
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topo := natsembed.MustStartTopologyWith(t, natsembed.TopologyOptions{Regions: []string{"eu"}, Nodes: 3})
	led, rt := connectAs(t, topo, "eu", natsauth.Ledger), connectAs(t, topo, "eu", natsauth.Router)
	topology := ledgerstream.Topology{Region: "eu", Shards: 2}
	if err := ledgerstream.EnsureStreams(ctx, led, topology); err != nil {
		t.Fatal(err)
	}
	if err := router.EnsureStream(ctx, rt, "eu", 0, 0, ledgerstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		js     jetstream.JetStream
		stream string
	}{{led, topology.Stream()}, {led, topology.DLQStream()}, {rt, router.Stream("eu")}} {
		if info := waitPeers(t, c.js, c.stream, 1); info.Config.Replicas != 1 {
			t.Fatalf("%s at the default: %d replicas, want 1", c.stream, info.Config.Replicas)
		}
	}
	s, err := led.Stream(ctx, topology.Stream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: ledgerstream.ShardDurable(0),
		FilterSubject: topology.ShardSubjects(0), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := rt.Publish(ctx, subjects.LedgerSubject(topology.Region, 0, subjects.ClassCommand, topology.Region), []byte("m"), jetstream.WithMsgID(string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}

	topology.Replicas = 3
	if err := ledgerstream.EnsureStreams(ctx, led, topology); err != nil {
		t.Fatal(err)
	}
	if err := router.EnsureStream(ctx, rt, "eu", 0, 3, ledgerstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	waitPeers(t, led, topology.DLQStream(), 3)
	waitPeers(t, rt, router.Stream("eu"), 3)
	if info := waitPeers(t, led, topology.Stream(), 3); info.State.Msgs != 5 {
		t.Fatalf("%s after scaling: %d messages, want 5", topology.Stream(), info.State.Msgs)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := s.Consumer(ctx, ledgerstream.ShardDurable(0))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Cluster != nil && len(info.Cluster.Replicas) == 2 && info.NumPending == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s after scaling: cluster %+v, %d pending; want 3 peers, 5 pending", ledgerstream.ShardDurable(0), info.Cluster, info.NumPending)
		}
		time.Sleep(50 * time.Millisecond)
	}

	for _, bad := range []int{-1, 6} {
		topology.Replicas = bad
		if err := ledgerstream.EnsureStreams(ctx, led, topology); err == nil || !strings.Contains(err.Error(), "want 1 to 5") {
			t.Errorf("EnsureStreams with %d replicas: got %v, want a replica count error", bad, err)
		}
		if err := router.EnsureStream(ctx, rt, "eu", 0, bad, ledgerstream.Limits{}); err == nil || !strings.Contains(err.Error(), "want 1 to 5") {
			t.Errorf("router.EnsureStream with %d replicas: got %v, want a replica count error", bad, err)
		}
	}
	topology.Replicas = 5 // JetStream's limit, above the region's three servers
	if err := ledgerstream.EnsureStreams(ctx, led, topology); err == nil {
		t.Error("EnsureStreams with 5 replicas on 3 servers: no error")
	}
	waitPeers(t, led, topology.Stream(), 3)
}

// TestEnsureStreamsR3OnOneServer: a single server keeps no replicas, and
// EnsureStreams says so instead of creating the streams.
func TestEnsureStreamsR3OnOneServer(t *testing.T) {
	topo := natsembed.MustStartTopology(t, "eu")
	led := connectAs(t, topo, "eu", natsauth.Ledger)
	topology := ledgerstream.Topology{Region: "eu", Replicas: 3}
	if err := ledgerstream.EnsureStreams(context.Background(), led, topology); err == nil {
		t.Fatal("R3 streams on one server: no error")
	}
	if _, err := led.Stream(context.Background(), topology.Stream()); err == nil {
		t.Fatal("R3 streams on one server: the stream exists")
	}
}
