package dlq_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/natsauth"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// failing is an applier whose database is always down.
type failing struct{}

func (failing) Apply(context.Context, []ledger.Command) ([]ledger.Result, error) {
	return nil, errors.New("database unavailable")
}

// worker runs a ledger consumer until stop is called.
func worker(tb testing.TB, js jetstream.JetStream, app ledgerstream.Applier, topo ledgerstream.Topology, f *ledgertest.Fixture) (stop func()) {
	tb.Helper()
	c := ledgerstream.NewConsumer(js, app, ledgerstream.ConsumerConfig{Topology: topo, Regions: f.Regions, Stats: f.Stats,
		AckWait: time.Second, MaxDeliver: 2, MaxStepDeliver: 2, BatchSize: 64})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("worker: %v", err)
			}
		}
	}
	tb.Cleanup(stop)
	return stop
}

// connect connects to region eu's server as service's user.
func connect(tb testing.TB, nt *natsembed.Topology, service string) jetstream.JetStream {
	tb.Helper()
	return connectIn(tb, nt, "eu", service)
}

// connectIn connects to region's server as the region's user of service.
func connectIn(tb testing.TB, nt *natsembed.Topology, region, service string) jetstream.JetStream {
	tb.Helper()
	u, err := natsauth.UserOf(region, service)
	if err != nil {
		tb.Fatal(err)
	}
	nc, err := nats.Connect(nt.ClientURL(region), natsauth.ConnectOptions(u.Name, u.Password)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// region is region eu: its streams, its ledger database with the
// dead-letter audit, the operator's Ops and the router's publisher. Each
// side connects as its own user: the ledger (js), the router that publishes
// commands, and the operator.
type region struct {
	nt   *natsembed.Topology
	js   jetstream.JetStream
	topo ledgerstream.Topology
	f    *ledgertest.Fixture
	ops  *dlq.Ops
	pub  *ledgerstream.Publisher
}

func mustRegion(tb testing.TB, others ...string) region {
	tb.Helper()
	ctx := context.Background()
	nt := natsembed.MustStartTopology(tb, append([]string{"eu"}, others...)...)
	js, routerJS, opsJS := connect(tb, nt, natsauth.Ledger), connect(tb, nt, natsauth.Router), connect(tb, nt, natsauth.Ops)
	topo := ledgerstream.Topology{Region: "eu", Shards: 4, DuplicateWindow: time.Second}
	if err := ledgerstream.EnsureStreams(ctx, js, topo); err != nil {
		tb.Fatal(err)
	}
	f := ledgertest.New(tb)
	if err := pgdb.Migrate(ctx, f.Pool, dlq.Migrations()); err != nil {
		tb.Fatal(err)
	}
	return region{nt: nt, js: js, topo: topo, f: f, ops: &dlq.Ops{Region: "eu", JS: opsJS, Pool: f.Pool, Wait: 20 * time.Second},
		pub: ledgerstream.NewPublisher(routerJS, topo, f.Regions, f.Stats)}
}

func waitLetters(tb testing.TB, ops *dlq.Ops, n int) []dlq.Letter {
	tb.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		p, err := ops.List(context.Background(), dlq.Filter{})
		if err != nil {
			tb.Fatal(err)
		}
		if len(p.Letters) >= n {
			return p.Letters
		}
	}
	tb.Fatalf("fewer than %d dead letters after 30s", n)
	return nil
}

// TestRoundTrip: a transfer that could not be applied (max_deliveries) is
// applied exactly once by replay, once the Msg-Id window is past; a
// second replay adds nothing; a replay of a command applied after all is a
// duplicate with its layer; a transfer to a missing account is refused
// again with its reason until the account exists, and then applied exactly
// once by a replay; a discard is recorded once.
func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := mustRegion(t)
	js, topo, f, ops, pub := r.js, r.topo, r.f, r.ops, r.pub
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)

	// The database is down for two deliveries: dead-lettered.
	stop := worker(t, js, failing{}, topo, f)
	lost := f.Transfer(t, a, b, 10)
	if _, err := pub.Publish(ctx, lost); err != nil {
		t.Fatal(err)
	}
	waitLetters(t, ops, 1)
	stop()

	worker(t, js, f.Store, topo, f)
	later := f.ID(t)                    // an account that does not exist yet
	ghost := f.Transfer(t, a, later, 5) // to it
	if _, err := pub.Publish(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	letters := waitLetters(t, ops, 2)
	lostSeq, ghostSeq := letters[0].Seq, letters[1].Seq
	if letters[0].Reason != ledgerstream.ReasonMaxDeliveries || letters[1].Reason != string(ledger.CodeAccountNotFound) {
		t.Fatalf("reasons: got %s %s, want %s %s", letters[0].Reason, letters[1].Reason, ledgerstream.ReasonMaxDeliveries, ledger.CodeAccountNotFound)
	}
	if p, err := ops.List(ctx, dlq.Filter{Reason: string(ledger.CodeAccountNotFound)}); err != nil || len(p.Letters) != 1 || p.Letters[0].Seq != ghostSeq {
		t.Fatalf("list --reason: got %+v %v, want %d", p, err, ghostSeq)
	}
	if p, err := ops.List(ctx, dlq.Filter{Limit: 1}); err != nil || len(p.Letters) != 1 || p.Next != lostSeq {
		t.Fatalf("list --limit 1: got %+v %v, want one letter and next %d", p, err, lostSeq)
	}
	if p, err := ops.List(ctx, dlq.Filter{OlderThan: time.Hour}); err != nil || len(p.Letters) != 0 {
		t.Fatalf("list --older-than 1h: got %+v %v, want none", p, err)
	}
	l, err := ops.Show(ctx, lostSeq)
	if err != nil || !reflect.DeepEqual(l.Command, lost) || l.Deliveries != 2 || l.FirstAt.IsZero() || l.Subject != topo.Subject(a, subjects.ClassCommand, "eu") {
		t.Fatalf("show: got %+v %v", l, err)
	}
	if _, err := ops.Show(ctx, 999); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("show 999: got %v, want ErrNotFound", err)
	}

	// Within the Msg-Id window the stream drops the replay: deferred, not
	// reported as a duplicate (nothing was applied).
	out, err := ops.Replay(ctx, lostSeq, "alice")
	if err == nil && out.Kind == dlq.Deferred {
		time.Sleep(time.Until(out.RetryAt) + 200*time.Millisecond)
		out, err = ops.Replay(ctx, lostSeq, "alice")
	}
	if err != nil || out.Kind != dlq.Applied {
		t.Fatalf("replay: got %v %v, want applied", out, err)
	}
	if got := f.Balance(t, b); got != 10 {
		t.Fatalf("destination: got %d, want 10", got)
	}
	out, err = ops.Replay(ctx, lostSeq, "bob")
	if err != nil || out.Kind != dlq.Replayed || out.Operator != "alice" {
		t.Fatalf("second replay: got %v %v, want replayed by alice", out, err)
	}
	if got := f.Balance(t, b); got != 10 {
		t.Fatalf("destination after a second replay: got %d, want 10", got)
	}

	// The ghost, while its account is still missing: refused again with its
	// reason, and dead-lettered again (nothing was recorded).
	time.Sleep(time.Second)
	out, err = ops.Replay(ctx, ghostSeq, "alice")
	if err != nil || out.Kind != dlq.Refused || out.Reason != string(ledger.CodeAccountNotFound) || out.Layer != "" || out.NewSeq == 0 {
		t.Fatalf("replay before the account exists: got %v %v, want refused account_not_found, dead-lettered again", out, err)
	}
	// Once the account exists, replaying the new dead letter applies the
	// transfer, exactly once; replaying either dead letter again adds nothing.
	f.AccountAs(t, later, "EUR")
	ghostSeq = out.NewSeq
	out, err = ops.Replay(ctx, ghostSeq, "alice")
	if err == nil && out.Kind == dlq.Deferred {
		time.Sleep(time.Until(out.RetryAt) + 200*time.Millisecond)
		out, err = ops.Replay(ctx, ghostSeq, "alice")
	}
	if err != nil || out.Kind != dlq.Applied {
		t.Fatalf("replay after the account exists: got %v %v, want applied", out, err)
	}
	for _, seq := range []uint64{ghostSeq, letters[1].Seq} {
		if out, err := ops.Replay(ctx, seq, "bob"); err != nil || out.Kind != dlq.Replayed {
			t.Fatalf("replay %d again: got %v %v, want replayed", seq, out, err)
		}
	}
	if got := f.Balance(t, later); got != 5 {
		t.Fatalf("the account that came to exist: got %d, want 5 (applied once)", got)
	}
	if p, err := ops.List(ctx, dlq.Filter{Reason: string(ledger.CodeAccountNotFound)}); err != nil || len(p.Letters) != 0 {
		t.Fatalf("account_not_found dead letters after the replay: got %+v %v, want none", p, err)
	}

	// A command applied after all: dead-lettered although applied (its
	// dead letter is written here as the consumer writes one).
	done := f.Transfer(t, a, b, 1)
	f.MustApply(t, done)
	m := pub.Msg(done)
	m.Subject = topo.DLQSubject()
	m.Header.Del(jetstream.MsgIDHeader)
	m.Header.Set(ledgerstream.HeaderDLQReason, ledgerstream.ReasonMaxDeliveries)
	m.Header.Set(ledgerstream.HeaderDLQSubject, topo.Subject(a, subjects.ClassCommand, "eu"))
	m.Header.Set(ledgerstream.HeaderDLQSequence, "1")
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	replayed := ledger.DuplicateKey{Layer: ledger.LayerConsumeLog, Topic: ledger.TopicTransfer, Cause: ledger.CauseDLQReplay}
	before := f.Stats.DuplicatesByKey()[replayed]
	out, err = ops.Replay(ctx, ack.Sequence, "alice")
	if err != nil || out.Kind != dlq.Duplicate || out.Layer != ledger.LayerConsumeLog {
		t.Fatalf("replay of an applied command: got %v %v, want duplicate by dedup_table", out, err)
	}
	// The ledger counts it as a replay's duplicate (its Paymesh-Replay-Of
	// header), once.
	if got := f.Stats.DuplicatesByKey()[replayed] - before; got != 1 {
		t.Fatalf("duplicates by dedup_table of cause dlq_replay: got %d more, want 1 (all: %v)", got, f.Stats.DuplicatesByKey())
	}
	if got := f.Balance(t, b); got != 11 {
		t.Fatalf("destination: got %d, want 11", got)
	}

	// Discard: recorded once, from any number of terminals.
	if _, err := ops.Discard(ctx, out.Seq, "alice", ""); err == nil {
		t.Fatal("discard without a reason: no error")
	}
	d1, err := ops.Discard(ctx, ghostSeq+0, "alice", "customer closed the account")
	if err != nil || d1.Kind != dlq.Replayed {
		t.Fatalf("discard of a replayed letter: got %v %v, want its replay", d1, err)
	}
	stray := f.Transfer(t, a, f.ID(t), 3) // to an account that will never exist
	if _, err := pub.Publish(ctx, stray); err != nil {
		t.Fatal(err)
	}
	strayLetter := waitLetters(t, ops, 1)[0].Seq
	for _, who := range []string{"alice", "bob"} {
		d, err := ops.Discard(ctx, strayLetter, who, "customer closed the account")
		if err != nil || d.Kind != dlq.Discarded || d.Operator != "alice" || d.Why != "customer closed the account" {
			t.Fatalf("discard by %s: got %v %v, want discarded by alice", who, d, err)
		}
	}
	if n := f.Count(t, `SELECT count(*) FROM dlq_audit WHERE action = 'discard'`); n != 1 {
		t.Fatalf("discard records: got %d, want 1", n)
	}
	if p, err := ops.List(ctx, dlq.Filter{}); err != nil || len(p.Letters) != 0 {
		t.Fatalf("dead letters left: got %+v %v, want none", p.Letters, err)
	}
	f.MustVerify(t)
}

// TestReplayStep: a saga step dead-lettered after its apply failed on
// MaxStepDeliver deliveries (step_max_deliveries) is applied once by
// replay, settling its transfer, and a second replay adds nothing.
func TestReplayStep(t *testing.T) {
	ctx := context.Background()
	r := mustRegion(t, "us")
	js, topo, f, ops := r.js, r.topo, r.f, r.ops
	us, err := idgen.NewGenerator(f.Regions, "us", 9)
	if err != nil {
		t.Fatal(err)
	}
	dest, err := us.NextString()
	if err != nil {
		t.Fatal(err)
	}
	a := f.Account(t, "EUR", 100)
	tr := f.Transfer(t, a, dest, 10)
	f.MustApply(t, tr) // DEBITED, waiting for its confirm from us
	step := tr.Step(ledger.TypeConfirm, "")

	stop := worker(t, js, failing{}, topo, f)
	// The confirm comes from us's router, over the leafnode link: the
	// only user that may send a step in us's name.
	usRouter := ledgerstream.NewPublisher(connectIn(t, r.nt, "us", natsauth.Router), topo, f.Regions, f.Stats)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := usRouter.Publish(ctx, step); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	l := waitLetters(t, ops, 1)[0]
	stop()
	if l.Reason != ledgerstream.ReasonStepMaxDeliveries || l.Deliveries != 2 || !reflect.DeepEqual(l.Command, step) || l.FirstAt.IsZero() {
		t.Fatalf("the step's dead letter: got %+v, want %s after 2 deliveries, with its first delivery", l, ledgerstream.ReasonStepMaxDeliveries)
	}

	worker(t, js, f.Store, topo, f)
	out, err := ops.Replay(ctx, l.Seq, "alice")
	if err == nil && out.Kind == dlq.Deferred {
		time.Sleep(time.Until(out.RetryAt) + 200*time.Millisecond) // the Msg-Id window's end, which replay names
		out, err = ops.Replay(ctx, l.Seq, "alice")
	}
	if err != nil || out.Kind != dlq.Applied {
		t.Fatalf("replay of the step: got %v %v, want applied", out, err)
	}
	if got, err := f.Store.Transfer(ctx, tr.TransferID); err != nil || got.Status != ledger.StatusCompleted {
		t.Fatalf("transfer after the replayed confirm: got %v %v, want COMPLETED", got.Status, err)
	}
	if out, err := ops.Replay(ctx, l.Seq, "bob"); err != nil || out.Kind != dlq.Replayed || out.Operator != "alice" {
		t.Fatalf("second replay: got %v %v, want replayed by alice", out, err)
	}
	f.MustVerify(t)
}
