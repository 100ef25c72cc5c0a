package router

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

func TestRetryDelay(t *testing.T) {
	if retryDelay(1) != 100*time.Millisecond || retryDelay(2) != 200*time.Millisecond || retryDelay(50) != maxRetryDelay {
		t.Fatalf("retry delays: %v %v %v", retryDelay(1), retryDelay(2), retryDelay(50))
	}
}

// embedded starts a nats-server for one test and returns a JetStream
// handle on it, the regions eu and us, and eu's ledger topology (4 shards).
func embedded(t *testing.T) (jetstream.JetStream, *idgen.Regions, ledgerstream.Topology) {
	t.Helper()
	_, nc := natsembed.MustStart(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := idgen.NewRegions(map[string]uint8{"eu": 1, "us": 2})
	return js, ids, ledgerstream.Topology{Region: "eu", Shards: 4}
}

// usRouterToEU makes eu's ledger stream and us's route stream on one
// embedded server, and returns us's router, with a context that ends with
// the test.
func usRouterToEU(t *testing.T) (context.Context, jetstream.JetStream, *idgen.Regions, ledgerstream.Topology, *Router) {
	t.Helper()
	js, ids, topo := embedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	if err := EnsureStream(ctx, js, "us", 0, 0, ledgerstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	return ctx, js, ids, topo, New(js, Config{Region: "us", Regions: ids, Shards: 4, AckWait: 2 * time.Second})
}

// TestSubmitAndForward: a command submitted in another region than its
// home is stored in the local route stream, forwarded to the home ledger
// stream with the same Nats-Msg-Id, and a resubmit is recognised; a command
// whose account has no known home region is refused with a clear error.
// One embedded server holds both regions' streams.
func TestSubmitAndForward(t *testing.T) {
	ctx, js, ids, topo, r := usRouterToEU(t)
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
	if n := r.Stats().Direct.Load(); n != 0 {
		t.Fatalf("%d submits went straight to a ledger stream; the command's home is another region", n)
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
	m, err := stream.GetLastMsgForSubject(ctx, topo.CommandSubject(cmd, "us")) // forwarded from us, as a client command
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

// TestSubmitHomedHere: a command homed in the router's own region skips
// the route stream and is stored straight in the ledger stream, where a
// resubmit is recognised by its Nats-Msg-Id; while that stream does not
// exist yet the command waits in the route stream; and a copy that reaches
// the ledger stream through the route stream after all (the fallback, or an
// older submitter) is caught by the ledger stream's window on forward.
func TestSubmitHomedHere(t *testing.T) {
	js, ids, topo := embedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := EnsureStream(ctx, js, "eu", 0, 0, ledgerstream.Limits{}); err != nil {
		t.Fatal(err)
	}
	r := New(js, Config{Region: "eu", Regions: ids, Shards: 4, AckWait: 2 * time.Second})
	gen, _ := idgen.NewGenerator(ids, "eu", 1)
	id := func() string { s, _ := gen.NextString(); return s }
	transfer := func() ledger.Command {
		return ledger.Command{Type: ledger.TypeTransfer, TransferID: id(), ClientID: "c", IdempotencyKey: id(), From: id(), To: id(),
			Amount: 5, Currency: "EUR", CreatedAt: time.Now()}
	}
	msgs := func(name string) uint64 {
		t.Helper()
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	early := transfer() // before the ledger made its stream
	if dup, err := r.Submit(ctx, early); err != nil || dup {
		t.Fatalf("submit without a ledger stream: duplicate=%v err=%v, want it stored in the route stream", dup, err)
	}
	if n, d := msgs(Stream("eu")), r.Stats().Direct.Load(); n != 1 || d != 0 {
		t.Fatalf("without a ledger stream: route stream holds %d, %d direct; want 1 and 0", n, d)
	}

	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	cmd := transfer()
	for i, want := range []bool{false, true} {
		dup, err := r.Submit(ctx, cmd)
		if err != nil || dup != want {
			t.Fatalf("submit %d: duplicate=%v err=%v, want duplicate=%v", i, dup, err, want)
		}
	}
	if n, d := msgs(topo.Stream()), r.Stats().Direct.Load(); n != 1 || d != 2 {
		t.Fatalf("ledger stream holds %d, %d direct submits; want 1 and 2", n, d)
	}
	if n := msgs(Stream("eu")); n != 1 {
		t.Fatalf("route stream holds %d, want only the early command", n)
	}
	m, err := js.Stream(ctx, topo.Stream())
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.GetLastMsgForSubject(ctx, topo.CommandSubject(cmd, "eu"))
	if err != nil || got.Header.Get(jetstream.MsgIDHeader) != cmd.MsgKey() {
		t.Fatalf("ledger stream's message for %s: %v %v, want Msg-Id %s", cmd.From, got, err, cmd.MsgKey())
	}

	// The same command through the route stream: forwarded, and recognised.
	again := nats.NewMsg(subjects.RouteShard("eu", "eu", topo.Shard(cmd.From)))
	again.Data = cmd.Encode()
	again.Header.Set(jetstream.MsgIDHeader, cmd.MsgKey())
	if _, err := js.PublishMsg(ctx, again); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.RunForwarder(ctx, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Forwarded.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if f, d := r.Stats().Forwarded.Load(), r.Stats().ForwardDuplicates.Load(); f != 2 || d != 1 {
		t.Fatalf("forwarded %d with %d duplicates, want the early command and the copy, the copy recognised", f, d)
	}
	if n := msgs(topo.Stream()); n != 2 {
		t.Fatalf("ledger stream holds %d, want 2: the early command and one copy of the other", n)
	}
}

// TestForwardsOnlyClientCommands: the route stream carries client commands
// only; a fund, a saga step or bytes that are no command, put there by
// anyone who may publish to it (an API's credential), are terminated and
// counted, never forwarded to the home ledger, while the client command
// beside them is.
func TestForwardsOnlyClientCommands(t *testing.T) {
	ctx, js, ids, topo, r := usRouterToEU(t)
	gen, _ := idgen.NewGenerator(ids, "eu", 1)
	usGen, _ := idgen.NewGenerator(ids, "us", 1)
	id := func(g *idgen.Generator) string { s, _ := g.NextString(); return s }
	a, b := id(gen), id(gen)
	forged := []ledger.Command{
		{Type: ledger.TypeFund, TransferID: id(gen), ClientID: "c", IdempotencyKey: "f", To: a, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()},
		{Type: ledger.TypeCredit, TransferID: id(usGen), ClientID: "c", IdempotencyKey: "s", From: id(usGen), To: a, Amount: 1_000_000, Currency: "EUR", CreatedAt: time.Now()},
	}
	subject := subjects.RouteShard("us", "eu", 1)
	for i, c := range forged {
		if _, err := js.Publish(ctx, subject, c.Encode(), jetstream.WithMsgID(fmt.Sprint("forged-", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, subject, []byte("no command")); err != nil {
		t.Fatal(err)
	}
	cmd := ledger.Command{Type: ledger.TypeTransfer, TransferID: id(gen), ClientID: "c", IdempotencyKey: "k", From: a, To: b,
		Amount: 5, Currency: "EUR", CreatedAt: time.Now()}
	if _, err := r.Submit(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.RunForwarder(ctx, nil) }()
	deadline := time.Now().Add(30 * time.Second)
	for (r.Stats().Forwarded.Load() < 1 || r.Stats().Refused.Load() < 3) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if f, n := r.Stats().Forwarded.Load(), r.Stats().Refused.Load(); f != 1 || n != 3 {
		t.Fatalf("forwarded %d, refused %d; want the client command forwarded and the 3 others refused", f, n)
	}
	stream, _ := js.Stream(ctx, topo.Stream())
	if info, _ := stream.Info(ctx); info.State.Msgs != 1 {
		t.Fatalf("home ledger stream holds %d messages, want only the client command", info.State.Msgs)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, topo.CommandSubject(cmd, "us")); err != nil {
		t.Fatalf("the client command is not in the home ledger stream: %v", err)
	}
}
