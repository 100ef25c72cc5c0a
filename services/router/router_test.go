package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
	ljs "github.com/paymesh/paymesh/services/ledger/jetstream"
)

func TestRetryDelay(t *testing.T) {
	if retryDelay(1) != 100*time.Millisecond || retryDelay(2) != 200*time.Millisecond || retryDelay(50) != maxRetryDelay {
		t.Fatalf("retry delays: %v %v %v", retryDelay(1), retryDelay(2), retryDelay(50))
	}
}

// TestSubmitAndForward: a submitted command is stored in the local route
// stream, forwarded to the home ledger stream with the same Nats-Msg-Id, and
// a resubmit is recognised; a command whose account has no known home region
// is refused with a clear error.
func TestSubmitAndForward(t *testing.T) {
	_, nc := natsembed.MustStart(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2})
	topo := ljs.Topology{Region: "eu", Shards: 4}
	if err := ljs.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if err := EnsureStream(ctx, js, "eu", 0, 0); err != nil {
		t.Fatal(err)
	}
	r := New(js, Config{Region: "eu", Regions: ids, Shards: 4, AckWait: 2 * time.Second})
	gen, _ := idgen.NewGenerator(ids, "eu", 1)
	id := func() string { s, _ := gen.NextString(); return s }
	cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: id(), ClientID: "c", IdempotencyKey: "k", From: id(), To: id(),
		Amount: 5, Currency: "EUR", CreatedAt: time.Now()}
	for i, want := range []bool{false, true} {
		dup, err := r.Submit(ctx, cmd)
		if err != nil || dup != want {
			t.Fatalf("submit %d: duplicate=%v err=%v, want duplicate=%v", i, dup, err, want)
		}
	}
	bad := cmd
	bad.From = "mars-0000000000001"
	if _, err := r.Submit(ctx, bad); err == nil || !strings.Contains(err.Error(), "cannot route") {
		t.Fatalf("unroutable: got %v", err)
	}
	go func() { _ = r.RunForwarder(ctx, nil) }()
	stream, _ := js.Stream(ctx, topo.Stream())
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Forwarded.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	m, err := stream.GetLastMsgForSubject(ctx, topo.Subject(cmd.From))
	if err != nil {
		t.Fatalf("home stream has no message: %v", err)
	}
	if got := m.Header.Get(jetstream.MsgIDHeader); got != cmd.MsgKey() {
		t.Fatalf("forwarded Msg-Id %q, want %q", got, cmd.MsgKey())
	}
	if info, _ := stream.Info(ctx); info.State.Msgs != 1 {
		t.Fatalf("home stream holds %d messages, want 1", info.State.Msgs)
	}
}
