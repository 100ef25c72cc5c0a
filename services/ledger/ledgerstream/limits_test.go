package ledgerstream_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/router"
)

func mustJetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	_, nc := natsembed.MustStart(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

func mustInfo(tb testing.TB, js jetstream.JetStream, stream string) *jetstream.StreamInfo {
	tb.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		tb.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		tb.Fatalf("stream %s: %v", stream, err)
	}
	return info
}

// checkBounded fails unless the stream has no age limit, refuses new
// messages when full, and has the retention and limits wanted.
func checkBounded(tb testing.TB, cfg jetstream.StreamConfig, retention jetstream.RetentionPolicy, l ledgerstream.Limits) {
	tb.Helper()
	if cfg.MaxAge != 0 || cfg.Discard != jetstream.DiscardNew || cfg.Retention != retention ||
		cfg.MaxMsgs != l.MaxMsgs || cfg.MaxBytes != l.MaxBytes {
		tb.Errorf("%s: got max age %v, discard %v, retention %v, %d messages, %d bytes; want 0, DiscardNew, %v, %d, %d",
			cfg.Name, cfg.MaxAge, cfg.Discard, cfg.Retention, cfg.MaxMsgs, cfg.MaxBytes, retention, l.MaxMsgs, l.MaxBytes)
	}
}

// TestStreamsBoundedBySize: the ledger, dead-letter and route streams keep
// messages with no age limit, bounded by size (the defaults, or the
// topology's), and refuse new messages when full; every shard of the
// ledger stream has its durable consumer before a ledger runs.
func TestStreamsBoundedBySize(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	topo := ledgerstream.Topology{Region: "eu", Shards: 4, DLQLimits: ledgerstream.Limits{MaxMsgs: 50}}
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if err := router.EnsureStream(ctx, js, "eu", 0, 0, ledgerstream.Limits{MaxBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	checkBounded(t, mustInfo(t, js, topo.Stream()).Config, jetstream.InterestPolicy, ledgerstream.DefaultLimits)
	checkBounded(t, mustInfo(t, js, topo.DLQStream()).Config, jetstream.LimitsPolicy,
		ledgerstream.Limits{MaxMsgs: 50, MaxBytes: ledgerstream.DefaultDLQLimits.MaxBytes})
	checkBounded(t, mustInfo(t, js, router.Stream("eu")).Config, jetstream.WorkQueuePolicy,
		ledgerstream.Limits{MaxMsgs: ledgerstream.DefaultLimits.MaxMsgs, MaxBytes: 1 << 20})
	for _, shard := range ledgerstream.AllShards(topo) {
		if _, err := js.Consumer(ctx, topo.Stream(), ledgerstream.ShardDurable(shard)); err != nil {
			t.Errorf("consumer %s: %v", ledgerstream.ShardDurable(shard), err)
		}
	}
}

// TestEnsureStreamsUpdatesAgeLimitedStream: a ledger stream an older
// version created (limits retention, a 7-day age limit, DiscardOld, no
// consumers) is changed on start to the size-bounded interest stream, and
// keeps the commands it held.
func TestEnsureStreamsUpdatesAgeLimitedStream(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	topo := ledgerstream.Topology{Region: "eu", Shards: 4}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: topo.Stream(), Subjects: []string{topo.Subjects()},
		Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, MaxAge: 7 * 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	for shard := range 4 {
		if _, err := js.Publish(ctx, subjects.LedgerSubject(topo.Region, shard, subjects.ClassCommand, topo.Region), []byte("held")); err != nil {
			t.Fatal(err)
		}
	}
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	info := mustInfo(t, js, topo.Stream())
	checkBounded(t, info.Config, jetstream.InterestPolicy, ledgerstream.DefaultLimits)
	if info.State.Msgs != 4 {
		t.Errorf("after the update: got %d messages, want the 4 unconsumed ones", info.State.Msgs)
	}
	if n, err := ledgerstream.Backlog(ctx, js, topo); err != nil || n != 4 {
		t.Errorf("backlog after the update: got %d, %v; want 4", n, err)
	}
}

// TestFullStreamRefuses: a ledger stream at its bound refuses the next
// publish with an error, and the commands it acknowledged stay; once the
// ledger has applied them, they leave the stream and a publish succeeds
// again.
func TestFullStreamRefuses(t *testing.T) {
	h := mustHarnessTopo(t, ledgerstream.Topology{Region: "eu", Shards: 4, Limits: ledgerstream.Limits{MaxMsgs: 3}})
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	var cmds []ledger.Command
	for range 4 {
		cmds = append(cmds, h.f.Transfer(t, a, b, 10))
	}
	for i, cmd := range cmds[:3] {
		if _, err := h.pub.Publish(context.Background(), cmd); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	_, err := h.pub.Publish(context.Background(), cmds[3])
	if err == nil || !strings.Contains(err.Error(), "maximum messages exceeded") {
		t.Fatalf("publish to a full stream: got %v, want maximum messages exceeded", err)
	}
	if info := mustInfo(t, h.js, h.topo.Stream()); info.State.Msgs != 3 || info.State.FirstSeq != 1 {
		t.Fatalf("full stream: got %d messages from sequence %d, want the 3 acknowledged from 1", info.State.Msgs, info.State.FirstSeq)
	}
	h.worker(t, h.f.Store, nil)
	h.drained(t)
	if info := mustInfo(t, h.js, h.topo.Stream()); info.State.Msgs != 0 {
		t.Fatalf("after the ledger applied them: got %d messages, want 0 (an applied command leaves the stream)", info.State.Msgs)
	}
	if _, err := h.pub.Publish(context.Background(), cmds[3]); err != nil {
		t.Fatalf("publish after the stream drained: %v", err)
	}
	h.drained(t)
	if got := h.f.Balance(t, b); got != 40 {
		t.Fatalf("destination balance: got %d, want 40 (every acknowledged transfer applied once)", got)
	}
}

// TestRouteStreamFullRefusesSubmit: a full route stream refuses a submit
// (Submit returns the error) and keeps the commands it stored.
func TestRouteStreamFullRefusesSubmit(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	if err := router.EnsureStream(ctx, js, "eu", 0, 0, ledgerstream.Limits{MaxMsgs: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := js.Publish(ctx, "route.eu.us."+string(rune('0'+i)), []byte("cmd")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := js.Publish(ctx, "route.eu.us.2", []byte("cmd"))
	if err == nil || !strings.Contains(err.Error(), "maximum messages exceeded") {
		t.Fatalf("publish to a full route stream: got %v, want maximum messages exceeded", err)
	}
	if info := mustInfo(t, js, router.Stream("eu")); info.State.Msgs != 2 {
		t.Fatalf("full route stream: got %d messages, want the 2 acknowledged", info.State.Msgs)
	}
}

// TestNegativeLimitsRefused: limits below zero are refused before any
// stream is touched, with an error that says so.
func TestNegativeLimitsRefused(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	for _, l := range []ledgerstream.Limits{{MaxMsgs: -1}, {MaxBytes: -1}} {
		err := ledgerstream.EnsureStreams(ctx, js, ledgerstream.Topology{Region: "eu", Limits: l})
		if !errors.Is(err, ledgerstream.ErrLimits) {
			t.Errorf("EnsureStreams with limits %+v: got %v, want ErrLimits", l, err)
		}
		err = ledgerstream.EnsureStreams(ctx, js, ledgerstream.Topology{Region: "eu", DLQLimits: l})
		if !errors.Is(err, ledgerstream.ErrLimits) {
			t.Errorf("EnsureStreams with DLQ limits %+v: got %v, want ErrLimits", l, err)
		}
		if err := router.EnsureStream(ctx, js, "eu", 0, 0, l); !errors.Is(err, ledgerstream.ErrLimits) {
			t.Errorf("router.EnsureStream with limits %+v: got %v, want ErrLimits", l, err)
		}
	}
	if _, err := js.Stream(ctx, ledgerstream.Topology{Region: "eu"}.Stream()); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("after refused limits: got %v, want no ledger stream", err)
	}
}
