package ledgerstream_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// harness is one region: an embedded JetStream, a ledger database and the
// region's streams.
type harness struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	topo ledgerstream.Topology
	f    *ledgertest.Fixture
	pub  *ledgerstream.Publisher
}

func mustHarness(tb testing.TB) *harness {
	tb.Helper()
	return mustHarnessTopo(tb, ledgerstream.Topology{Region: "eu", Shards: 4})
}

// mustHarnessTopo is mustHarness with the region's streams as topo has them.
func mustHarnessTopo(tb testing.TB, topo ledgerstream.Topology) *harness {
	tb.Helper()
	_, nc := natsembed.MustStart(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{js: js, nc: nc, topo: topo, f: ledgertest.New(tb)}
	if err := ledgerstream.EnsureStreams(context.Background(), js, h.topo); err != nil {
		tb.Fatal(err)
	}
	// A second call is a no-op: streams are created idempotently.
	if err := ledgerstream.EnsureStreams(context.Background(), js, h.topo); err != nil {
		tb.Fatal(err)
	}
	h.pub = ledgerstream.NewPublisher(js, h.topo, h.f.Regions, h.f.Stats)
	return h
}

// worker runs a ledger consumer until the test ends.
func (h *harness) worker(tb testing.TB, applier ledgerstream.Applier, mod func(*ledgerstream.ConsumerConfig)) *ledgerstream.Consumer {
	tb.Helper()
	cfg := ledgerstream.ConsumerConfig{Topology: h.topo, Regions: h.f.Regions, Stats: h.f.Stats, AckWait: 2 * time.Second, MaxDeliver: 5, BatchSize: 64}
	if mod != nil {
		mod(&cfg)
	}
	c := ledgerstream.NewConsumer(h.js, applier, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("worker: %v", err)
		}
	})
	return c
}

// publishRaw stores a copy of the command without a Nats-Msg-Id, so
// JetStream keeps every copy and the consumer sees each as a delivery.
func (h *harness) publishRaw(tb testing.TB, cmd ledger.Command) {
	tb.Helper()
	m := h.pub.Msg(cmd)
	m.Header.Del(jetstream.MsgIDHeader)
	if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
		tb.Fatal(err)
	}
}

func (h *harness) publishData(tb testing.TB, subject string, data []byte) {
	tb.Helper()
	if _, err := h.js.Publish(context.Background(), subject, data); err != nil {
		tb.Fatal(err)
	}
}

// drained waits until the ledger consumers have acked or terminated every
// message in the stream.
func (h *harness) drained(tb testing.TB) {
	tb.Helper()
	// On a loaded machine a long backlog may take minutes: fail only when
	// it stopped shrinking for 60 s.
	least, since := uint64(math.MaxUint64), time.Now()
	for time.Since(since) < 60*time.Second {
		n, err := ledgerstream.Backlog(context.Background(), h.js, h.topo)
		if err == nil && n == 0 {
			return
		}
		if err == nil && n < least {
			least, since = n, time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("the ledger consumers stopped draining: %d messages left, none applied in 60s", least)
}

// dlq reads every dead letter.
func (h *harness) dlq(tb testing.TB) []*jetstream.RawStreamMsg {
	tb.Helper()
	ctx := context.Background()
	s, err := h.js.Stream(ctx, h.topo.DLQStream())
	if err != nil {
		tb.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestDeliveredManyTimes: a transfer stored 1, 2 and 50 times in the stream
// and consumed by two workers at once is applied exactly once.
func TestDeliveredManyTimes(t *testing.T) {
	h := mustHarness(t)
	type tc struct {
		from, to string
		cmd      ledger.Command
		copies   int
	}
	var cases []tc
	for _, n := range []int{1, 2, 50} {
		a, b := h.f.Account(t, "EUR", 1000), h.f.Account(t, "EUR", 0)
		cases = append(cases, tc{a, b, h.f.Transfer(t, a, b, 100), n})
	}
	// Interleave the copies so both workers see copies of each.
	for i := range 50 {
		for _, c := range cases {
			if i < c.copies {
				h.publishRaw(t, c.cmd)
			}
		}
	}
	h.worker(t, h.f.Store, nil)
	h.worker(t, h.f.Store, nil)
	h.drained(t)
	for _, c := range cases {
		if got := h.f.Balance(t, c.from); got != 900 {
			t.Errorf("%d copies: source balance %d, want 900", c.copies, got)
		}
		if got := h.f.Balance(t, c.to); got != 100 {
			t.Errorf("%d copies: destination balance %d, want 100", c.copies, got)
		}
		if got := h.f.Count(t, `SELECT count(*) FROM postings WHERE transfer_id = $1`, c.cmd.TransferID); got != 2 {
			t.Errorf("%d copies: %d change-log rows, want 2", c.copies, got)
		}
	}
	if got, want := h.f.Stats.Applied.Load(), int64(3+3); got != want { // 3 fundings + 3 transfers
		t.Errorf("applied: got %d, want %d", got, want)
	}
	var dups int64
	for _, n := range h.f.Stats.Duplicates() {
		dups += n
	}
	if dups != 1+49 {
		t.Errorf("duplicates caught: got %d (%v), want 50", dups, h.f.Stats.Duplicates())
	}

	// A producer retry with the same Nats-Msg-Id is dropped by JetStream.
	a, b := h.f.Account(t, "EUR", 10), h.f.Account(t, "EUR", 0)
	cmd := h.f.Transfer(t, a, b, 10)
	for i, want := range []bool{false, true} {
		dup, err := h.pub.Publish(context.Background(), cmd)
		if err != nil || dup != want {
			t.Fatalf("publish %d: duplicate=%v err=%v, want duplicate=%v", i, dup, err, want)
		}
	}
	if got := h.f.Stats.Duplicates()[string(ledger.LayerMsgID)]; got != 1 {
		t.Fatalf("msg_id duplicates: got %d, want 1", got)
	}
	h.drained(t)
	if got := h.f.Balance(t, b); got != 10 {
		t.Fatalf("balance after producer retry: got %d, want 10", got)
	}
	h.f.MustVerify(t)
}

// TestCrashAfterCommitBeforeAck: the worker commits and "crashes" before
// acking; the message comes back after AckWait and is not doubled.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	cmd := h.f.Transfer(t, a, b, 40)
	// The first ack is lost on its way, as when the worker crashes after
	// its COMMIT: a decorator of the consumer's JetStream handle drops it.
	var acks atomic.Int64
	js := h.js
	h.js = jsfault.Wrap(js, nil, func(m jetstream.Msg) jetstream.Msg {
		return jsfault.DropAck(m, func() bool { return acks.Add(1) == 1 })
	})
	h.worker(t, h.f.Store, func(c *ledgerstream.ConsumerConfig) { c.AckWait = time.Second })
	h.js = js
	if _, err := h.pub.Publish(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	h.drained(t)
	if acks.Load() < 2 {
		t.Fatalf("the message was not redelivered after the crash")
	}
	if got := h.f.Stats.Redeliveries.Load(); got < 1 {
		t.Fatalf("redeliveries: got %d, want >= 1", got)
	}
	if got := h.f.Stats.Duplicates()[string(ledger.LayerConsumeLog)]; got != 1 {
		t.Fatalf("dedup_table duplicates: got %d (%v), want 1", got, h.f.Stats.Duplicates())
	}
	if got := h.f.Balance(t, a); got != 60 {
		t.Fatalf("balance: got %d, want 60", got)
	}
	h.f.MustVerify(t)
}

// TestRedeliveryWhileFirstAttemptRuns: the first attempt takes longer than
// AckWait, so JetStream redelivers the message while it still runs. The
// redelivery's claim waits on the first attempt's uncommitted claim and then
// sees a duplicate.
func TestRedeliveryWhileFirstAttemptRuns(t *testing.T) {
	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	cmd := h.f.Transfer(t, a, b, 70)
	var slowOnce sync.Once
	inHook := make(chan struct{})
	held := make(chan error, 1) // the first attempt's hold ended: nil once the redelivery waited on it
	slow := ledgertest.On(t, h.f.Pool, h.f.URL, func(c *postgres.Config) {
		c.Stats = h.f.Stats
		c.Dedup = ledgertest.FailBeforeCommit(c.Dedup, func(ctx context.Context) error {
			first := false
			slowOnce.Do(func() { first = true })
			if first {
				close(inHook)
				// Past the 1 s AckWait, until the redelivery's claim waits
				// on this attempt's.
				held <- h.lockWaiter(ctx, time.Minute)
			}
			return nil
		})
	})
	fast := ledgertest.On(t, h.f.Pool, h.f.URL, func(c *postgres.Config) { c.Stats = h.f.Stats })
	oneSecond := func(c *ledgerstream.ConsumerConfig) { c.AckWait = time.Second }
	h.worker(t, slow.Store, oneSecond)
	if _, err := h.pub.Publish(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	<-inHook
	h.worker(t, fast.Store, oneSecond)
	if err := <-held; err != nil {
		t.Fatalf("the scenario did not happen: %v", err)
	}
	h.drained(t)
	// The slow attempt counts its apply once its COMMIT returns.
	for deadline := time.Now().Add(30 * time.Second); h.f.Stats.Applied.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := h.f.Stats.Redeliveries.Load(); got < 1 {
		t.Fatalf("redeliveries: got %d, want >= 1 (the scenario did not happen)", got)
	}
	if got := h.f.Stats.Applied.Load(); got != 2 { // the funding + the transfer
		t.Fatalf("applied: got %d, want 2", got)
	}
	if got := h.f.Balance(t, a); got != 30 {
		t.Fatalf("balance: got %d, want 30", got)
	}
	h.f.MustVerify(t)
}

// lockWaiter waits until a session of the ledger database waits for a lock,
// for at most timeout.
func (h *harness) lockWaiter(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var n int
		err := h.f.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		switch {
		case err == nil && n > 0:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("no transaction waited on a lock within %s (last error: %v)", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPoisonMessages: messages that can never apply go to the dead-letter
// stream with their reason, and the rest of their batch commits.
func TestPoisonMessages(t *testing.T) {
	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	good1, good2 := h.f.Transfer(t, a, b, 10), h.f.Transfer(t, a, b, 20)
	ghost := h.f.Transfer(t, a, h.f.ID(t), 5) // unknown destination
	subject := h.topo.Subject(a, subjects.ClassCommand, h.topo.Region)

	h.publishRaw(t, good1)
	h.publishData(t, subject, []byte(`{"type":"transfer",`))                                              // not JSON
	h.publishData(t, subject, []byte(`{"type":"transfer","amount":1.5,"currency":"EUR"}`))                // fractional amount
	h.publishData(t, subject, []byte(`{"type":"transfer","amount":10,"currency":"EUR","surprise":true}`)) // unknown field
	h.publishRaw(t, ghost)
	zero, negative := h.f.Transfer(t, a, b, 1), h.f.Transfer(t, a, b, 1)
	zero.Amount, negative.Amount = 0, -5
	h.publishRaw(t, zero)
	h.publishRaw(t, negative)
	h.publishRaw(t, good2)

	h.worker(t, h.f.Store, nil)
	h.drained(t)

	if got := h.f.Balance(t, b); got != 30 {
		t.Fatalf("destination: got %d, want 30 (both good transfers)", got)
	}
	reasons := map[string]int{}
	for _, m := range h.dlq(t) {
		reasons[m.Header.Get(ledgerstream.HeaderDLQReason)]++
		if m.Header.Get(ledgerstream.HeaderDLQDetail) == "" || m.Header.Get(ledgerstream.HeaderDLQSequence) == "" {
			t.Errorf("dead letter without detail or sequence: %v", m.Header)
		}
	}
	want := map[string]int{"invalid_request": 2, "invalid_amount": 3, "account_not_found": 1}
	if fmt.Sprint(reasons) != fmt.Sprint(want) {
		t.Fatalf("dead-letter reasons: got %v, want %v", reasons, want)
	}
	if got := h.f.Stats.DeadLettered.Load(); got != 6 {
		t.Fatalf("dead-lettered: got %d, want 6", got)
	}
	if got := h.f.Balance(t, a); got != 70 {
		t.Fatalf("source: got %d, want 70 (only the good transfers moved money)", got)
	}
	// The ghost awaits its account: nothing recorded, so that a replay can
	// still apply it.
	var le *ledger.Error
	if tr, err := h.f.Store.Transfer(context.Background(), ghost.TransferID); !errors.As(err, &le) || le.Code != ledger.CodeNotFound {
		t.Fatalf("the transfer to a missing account: got %+v %v, want nothing recorded", tr, err)
	}
	h.f.MustVerify(t)
}

// failing is an applier whose database is always down.
type failing struct{ calls atomic.Int64 }

func (f *failing) Apply(context.Context, []ledger.Command) ([]ledger.Result, error) {
	f.calls.Add(1)
	return nil, errors.New("database unavailable")
}

// TestMaxDeliverDeadLetters: a message that keeps failing is dead-lettered
// on its last delivery, not dropped.
func TestMaxDeliverDeadLetters(t *testing.T) {
	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 100), h.f.Account(t, "EUR", 0)
	cmd := h.f.Transfer(t, a, b, 10)
	app := &failing{}
	h.worker(t, app, func(c *ledgerstream.ConsumerConfig) { c.MaxDeliver = 3; c.AckWait = time.Second })
	if _, err := h.pub.Publish(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}
	h.drained(t)
	if app.calls.Load() != 3 {
		t.Fatalf("apply attempts: got %d, want 3", app.calls.Load())
	}
	dl := h.dlq(t)
	if len(dl) != 1 || dl[0].Header.Get(ledgerstream.HeaderDLQReason) != ledgerstream.ReasonMaxDeliveries || dl[0].Header.Get(ledgerstream.HeaderDLQDelivery) != "3" {
		t.Fatalf("dead letters: got %d, want 1 with reason max_deliveries after 3 deliveries", len(dl))
	}
	if c, err := ledger.DecodeCommand(dl[0].Data); err != nil || !reflect.DeepEqual(c, cmd) {
		t.Fatalf("dead letter keeps the command: got %+v %v", c, err)
	}
}

// TestRandomizedRunVerifies: 10,000 random transfers with 20% duplicate
// deliveries leave a ledger that passes every invariant, which a tampered
// balance then fails.
func TestRandomizedRunVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	h := mustHarness(t)
	rng := rand.New(rand.NewPCG(42, 2))
	accounts := make([]string, 50)
	for i := range accounts {
		accounts[i] = h.f.Account(t, "EUR", 10_000)
	}
	const n = 10_000
	var dupes int
	for i := range n {
		from := accounts[rng.IntN(len(accounts))]
		to := accounts[rng.IntN(len(accounts))]
		for to == from {
			to = accounts[rng.IntN(len(accounts))]
		}
		cmd := h.f.Transfer(t, from, to, 1+rng.Int64N(900))
		m := h.pub.Msg(cmd)
		m.Header.Del(jetstream.MsgIDHeader)
		copies := 1
		if rng.IntN(100) < 20 {
			copies, dupes = 2, dupes+1
		}
		for range copies {
			if _, err := h.pub.PublishAsync(m); err != nil {
				t.Fatal(err)
			}
		}
		if i%1000 == 999 {
			<-h.js.PublishAsyncComplete()
		}
	}
	<-h.js.PublishAsyncComplete()
	h.worker(t, h.f.Store, nil)
	h.worker(t, h.f.Store, nil)
	h.drained(t)
	st := h.f.Stats
	var caught int64
	for _, v := range st.Duplicates() {
		caught += v
	}
	if got := st.Applied.Load() + st.Rejected.Load(); got != n+int64(len(accounts)) {
		t.Fatalf("recorded transfers: got %d, want %d", got, n+len(accounts))
	}
	// A batch that outlives AckWait on a loaded machine is delivered
	// again after its commit, and the redelivery is a duplicate caught
	// too (a CI run: 2,020 caught, 1,960 sent twice): each is counted in
	// Redeliveries, and nothing else may add to the count.
	if redelivered := st.Redeliveries.Load(); caught < int64(dupes) || caught > int64(dupes)+redelivered {
		t.Fatalf("duplicates caught: got %d, want %d (the copies sent), up to %d more (the redeliveries)", caught, dupes, redelivered)
	}
	t.Logf("applied %d, rejected %d, duplicates %v", st.Applied.Load(), st.Rejected.Load(), st.Duplicates())
	h.f.MustVerify(t)

	if _, err := h.f.Pool.Exec(context.Background(), `UPDATE accounts SET balance = balance + 1 WHERE id = $1`, accounts[7]); err != nil {
		t.Fatal(err)
	}
	rep, err := h.f.Store.Verify(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatalf("verify passed a tampered balance:\n%s", rep)
	}
}

// poisonedBatch wraps the real store but fails any batch of more than one
// command that contains the marked key, like a command that breaks a batch's
// writes would.
type poisonedBatch struct {
	ledgerstream.Applier
	key    string
	failed atomic.Int64
}

func (p *poisonedBatch) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	for _, c := range cmds {
		if c.IdempotencyKey == p.key && len(cmds) > 1 {
			p.failed.Add(1)
			return nil, errors.New("batch broken by one command")
		}
	}
	return p.Applier.Apply(ctx, cmds)
}

// TestFailedBatchIsSplit: when a batch fails as a whole, its commands are
// applied one by one, so the others neither wait for redelivery nor use up
// their deliveries.
func TestFailedBatchIsSplit(t *testing.T) {
	h := mustHarness(t)
	a, b := h.f.Account(t, "EUR", 1000), h.f.Account(t, "EUR", 0)
	var cmds []ledger.Command
	for range 20 {
		cmds = append(cmds, h.f.Transfer(t, a, b, 10))
	}
	for _, c := range cmds {
		h.publishRaw(t, c)
	}
	app := &poisonedBatch{Applier: h.f.Store, key: cmds[7].IdempotencyKey}
	h.worker(t, app, nil)
	h.drained(t)
	if app.failed.Load() == 0 {
		t.Fatal("no batch failed: the scenario did not happen")
	}
	if got := h.f.Balance(t, b); got != 200 {
		t.Fatalf("balance: got %d, want 200", got)
	}
	if got := h.f.Stats.Redeliveries.Load(); got != 0 {
		t.Fatalf("redeliveries: got %d, want 0", got)
	}
	h.f.MustVerify(t)
}
