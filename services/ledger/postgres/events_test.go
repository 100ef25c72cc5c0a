package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// eventLog reads every event of an account, in sequence order, as
// "type object status" lines, and fails unless the sequences are 1, 2, …
func eventLog(tb testing.TB, f *ledgertest.Fixture, account string) []string {
	tb.Helper()
	rows, err := f.Pool.Query(context.Background(), `SELECT sequence, type, object_id, status FROM events WHERE account_id = $1 ORDER BY sequence`, account)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var seq int64
		var typ, obj, status string
		if err := rows.Scan(&seq, &typ, &obj, &status); err != nil {
			tb.Fatal(err)
		}
		if seq != int64(len(out)+1) {
			tb.Fatalf("account %s: event %d has sequence %d (a gap or a repeat)", account, len(out)+1, seq)
		}
		out = append(out, typ+" "+obj+" "+status)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// sameLog fails unless got is want, with the lines of each on failure.
func sameLog(tb testing.TB, what string, got, want []string) {
	tb.Helper()
	if !slices.Equal(got, want) {
		tb.Fatalf("%s: events\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// ev is an eventLog line.
func ev(typ ledger.EventType, obj string, status any) string {
	return fmt.Sprintf("%s %s %v", typ, obj, status)
}

// TestEvents runs every kind of change through the ledger and reads back
// the events each recorded in its transaction: an account's opening and
// actions, a transfer's creation and each status it reaches (within a
// region, across regions to completion and to refund, as a hold through
// capture, void and expiry), a refund; a duplicate, a refused action and a
// credit step record none, and each account's sequence runs 1, 2, … in
// the order of its changes.
func TestEvents(t *testing.T) {
	ctx := context.Background()
	eu, us := ledgertest.New(t), ledgertest.New(t, ledgertest.Region("us"))
	regions := map[string]*ledgertest.Fixture{"eu": eu, "us": us}
	a, b := eu.Account(t, "EUR", 1000), eu.Account(t, "EUR", 0)
	c, usd := us.Account(t, "EUR", 0), us.Account(t, "USD", 0)
	fundOfA := eventLog(t, eu, a)
	if len(fundOfA) != 3 || fundOfA[0] != ev(ledger.AccountOpened, a, ledger.AccountOpen) ||
		!strings.HasPrefix(fundOfA[1], string(ledger.TransferCreated)) || !strings.HasPrefix(fundOfA[2], string(ledger.TransferCompleted)) {
		t.Fatalf("a funded account: events %q, want opened, then the funding's created and completed", fundOfA)
	}

	local := eu.Transfer(t, a, b, 100)
	eu.MustApply(t, local)
	eu.Apply(t, local) // a duplicate: no event
	rejected := eu.Transfer(t, a, b, 1_000_000)
	refused(t, "an overdraft", eu.Apply(t, rejected)[0], ledger.CodeInsufficientFunds)
	h1, h2, h3 := hold(t, eu, a, b, 10, time.Hour), hold(t, eu, a, b, 20, time.Hour), hold(t, eu, a, b, 30, time.Minute)
	eu.Apply(t, h1, h2, h3)
	eu.MustApply(t, action(t, eu, ledger.TypeCapture, h1, 0))
	eu.MustApply(t, action(t, eu, ledger.TypeVoid, h2, 0))
	refused(t, "a void of a voided hold", eu.Apply(t, action(t, eu, ledger.TypeVoid, h2, 0))[0], ledger.CodeTransferNotHeld)
	eu.Clock.Step(time.Minute)
	relay(t, eu, regions) // h3's expiry
	cross, bounced := eu.Transfer(t, a, c, 40), eu.Transfer(t, a, usd, 50)
	eu.Apply(t, cross, bounced)
	relay(t, eu, regions) // the credits in us
	relay(t, us, regions) // confirm and refuse back in eu
	ref := refund(t, eu, local, 30)
	eu.MustApply(t, ref)
	eu.MustApply(t, change(t, eu, ledger.TypeFreeze, b))
	eu.MustApply(t, change(t, eu, ledger.TypeUnfreeze, b))

	sameLog(t, "the payer's account", eventLog(t, eu, a), append(fundOfA,
		ev(ledger.TransferCreated, local.TransferID, ledger.StatusCompleted), ev(ledger.TransferCompleted, local.TransferID, ledger.StatusCompleted),
		ev(ledger.TransferCreated, rejected.TransferID, ledger.StatusRejected), ev(ledger.TransferRejected, rejected.TransferID, ledger.StatusRejected),
		ev(ledger.TransferCreated, h1.TransferID, ledger.StatusHeld), ev(ledger.TransferHeld, h1.TransferID, ledger.StatusHeld),
		ev(ledger.TransferCreated, h2.TransferID, ledger.StatusHeld), ev(ledger.TransferHeld, h2.TransferID, ledger.StatusHeld),
		ev(ledger.TransferCreated, h3.TransferID, ledger.StatusHeld), ev(ledger.TransferHeld, h3.TransferID, ledger.StatusHeld),
		ev(ledger.TransferCaptured, h1.TransferID, ledger.StatusCompleted), ev(ledger.TransferCompleted, h1.TransferID, ledger.StatusCompleted),
		ev(ledger.TransferVoided, h2.TransferID, ledger.StatusVoided),
		ev(ledger.TransferExpired, h3.TransferID, ledger.StatusExpired),
		ev(ledger.TransferCreated, cross.TransferID, ledger.StatusDebited), ev(ledger.TransferCreated, bounced.TransferID, ledger.StatusDebited),
		ev(ledger.TransferCompleted, cross.TransferID, ledger.StatusCompleted), ev(ledger.TransferRefunded, bounced.TransferID, ledger.StatusRefunded),
	))
	sameLog(t, "the payee's account", eventLog(t, eu, b), []string{
		ev(ledger.AccountOpened, b, ledger.AccountOpen),
		ev(ledger.RefundCreated, ref.TransferID, ledger.StatusCompleted), ev(ledger.RefundCompleted, ref.TransferID, ledger.StatusCompleted),
		ev(ledger.AccountFrozen, b, ledger.AccountIsFrozen), ev(ledger.AccountUnfrozen, b, ledger.AccountOpen),
	})
	sameLog(t, "the credited account in us", eventLog(t, us, c), []string{ev(ledger.AccountOpened, c, ledger.AccountOpen)})

	// The feed: the client's events, oldest first, a page at a time, each
	// once, with its object; filtered by type.
	var all []ledger.RecordedEvent
	var at *ledger.EventPosition
	for page := 0; ; page++ {
		evs, err := eu.Store.EventsPage(ctx, ledger.EventFilter{Client: "c1", After: at}, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		all = append(all, evs...)
		at = &evs[len(evs)-1].Position
		if page > 100 {
			t.Fatal("the feed does not end")
		}
	}
	if want := eu.Count(t, `SELECT count(*) FROM events WHERE client_id = 'c1'`); len(all) != want {
		t.Fatalf("paging the feed read %d events, want the %d recorded", len(all), want)
	}
	seen := map[string]bool{}
	for _, e := range all {
		key := fmt.Sprintf("%s.%d", e.Account, e.Sequence)
		if seen[key] {
			t.Fatalf("the feed gave event %s twice", key)
		}
		seen[key] = true
		if e.Type == ledger.TransferCompleted && e.Object == cross.TransferID && (e.Transfer.To != c || e.Transfer.Amount != 40 || e.Transfer.Status != ledger.StatusCompleted) {
			t.Fatalf("the cross-region completion's object: %+v", e.Transfer)
		}
	}
	held, err := eu.Store.EventsPage(ctx, ledger.EventFilter{Client: "c1", Types: []ledger.EventType{ledger.TransferHeld, ledger.AccountFrozen}}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 4 || held[3].Type != ledger.AccountFrozen || held[3].Opened.ID != b || !held[3].Opened.Frozen || held[0].Transfer.ExpiresAt.IsZero() {
		t.Fatalf("the feed of transfer.held and account.frozen: %+v, want the 3 holds and the freeze", held)
	}
	if evs, err := eu.Store.EventsPage(ctx, ledger.EventFilter{Client: "c2"}, 100); err != nil || len(evs) != 0 {
		t.Fatalf("another client's feed: %d events %v, want none", len(evs), err)
	}
}

// TestEventsOff: a ledger with events off records none.
func TestEventsOff(t *testing.T) {
	f := ledgertest.New(t, func(c *postgres.Config) { c.NoEvents = true })
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	f.MustApply(t, f.Transfer(t, a, b, 10))
	if n := f.Count(t, `SELECT count(*) FROM events`); n != 0 {
		t.Fatalf("%d events with events off, want none", n)
	}
}

// TestEventSequencesUnderConcurrency: batches applied at once from many
// connections, all on one account, number its events without a gap or a
// repeat, and the feed read while they commit never skips one: every
// event is read once.
func TestEventSequencesUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 1_000_000), f.Account(t, "EUR", 0)
	const workers, batches, size = 6, 10, 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range batches {
				cmds := make([]ledger.Command, size)
				for i := range cmds {
					cmds[i] = f.Transfer(t, a, b, 1)
				}
				if _, err := f.Store.Apply(ctx, cmds); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Follow the feed while the batches commit.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var read []ledger.RecordedEvent
	var at *ledger.EventPosition
	var giveUp time.Time // a minute after the last commit
	for finished := false; ; {
		select {
		case <-done:
			if !finished {
				finished, giveUp = true, time.Now().Add(time.Minute)
			}
		default:
		}
		if finished && time.Now().After(giveUp) {
			t.Fatalf("the feed read %d events, %d are recorded: it skipped some", len(read), f.Count(t, `SELECT count(*) FROM events`))
		}
		evs, err := f.Store.EventsPage(ctx, ledger.EventFilter{Client: "c1", After: at}, 50)
		if err != nil {
			t.Fatal(err)
		}
		read = append(read, evs...)
		if len(evs) > 0 {
			at = &evs[len(evs)-1].Position
		} else {
			time.Sleep(time.Millisecond)
		}
		if finished && len(evs) == 0 && f.Count(t, `SELECT count(*) FROM events`) == len(read) {
			break
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	log := eventLog(t, f, a) // fails on a gap
	if want := 3 + 2*workers*batches*size; len(log) != want {
		t.Fatalf("account a: %d events, want %d", len(log), want)
	}
	// Each event once; an account's may come out of sequence order (two
	// of its transactions overlapped), never with one missing.
	seqs := map[string][]int64{}
	for _, e := range read {
		seqs[e.Account] = append(seqs[e.Account], e.Sequence)
	}
	for account, got := range seqs {
		slices.Sort(got)
		for i, s := range got {
			if s != int64(i+1) {
				t.Fatalf("the feed read account %s's events %v: not each of 1..%d once", account, got, len(got))
			}
		}
	}
	if len(seqs[a]) != len(log) {
		t.Fatalf("the feed read %d of account a's %d events", len(seqs[a]), len(log))
	}
}

// TestPruneEvents: the retention job deletes the events older than the
// retention and keeps the rest; an account's next event continues its
// sequence; a retention that is not positive is refused.
func TestPruneEvents(t *testing.T) {
	ctx := context.Background()
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	if _, err := f.Pool.Exec(ctx, `UPDATE events SET created_at = now() - interval '31 days'`); err != nil {
		t.Fatal(err)
	}
	f.MustApply(t, f.Transfer(t, a, b, 10))
	for _, bad := range []time.Duration{0, -time.Hour} {
		if _, err := f.Store.PruneEvents(ctx, bad, 0); err == nil {
			t.Fatalf("a retention of %v: no error", bad)
		}
	}
	n, err := f.Store.PruneEvents(ctx, postgres.DefaultEventRetention, 2)
	if err != nil || n != 4 {
		t.Fatalf("prune: %d %v, want the 4 old events (two openings, the funding's two)", n, err)
	}
	if got := f.Count(t, `SELECT count(*) FROM events`); got != 2 {
		t.Fatalf("%d events left, want the transfer's 2", got)
	}
	f.MustApply(t, f.Transfer(t, a, b, 10))
	if seq := f.Count(t, `SELECT max(sequence) FROM events WHERE account_id = $1`, a); seq != 7 {
		t.Fatalf("account a's last sequence after the prune: %d, want 7", seq)
	}
}

// TestVerifyEvents: verify passes on a ledger's events and names each kind
// of damage: a transfer's event lost, one recorded twice, a gap in an
// account's sequence.
func TestVerifyEvents(t *testing.T) {
	ctx := context.Background()
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	tr := f.Transfer(t, a, b, 10)
	f.MustApply(t, tr)
	f.MustVerify(t)
	for _, c := range []struct {
		name, damage, want string
	}{
		{"a lost event", `DELETE FROM events WHERE object_id = '` + tr.TransferID + `' AND type = 'transfer.completed'`, "transfer.completed events, want 1"},
		{"an event twice", `INSERT INTO events (account_id, sequence, client_id, type, object_id, status)
			SELECT account_id, sequence + 100, client_id, type, object_id, status FROM events WHERE object_id = '` + tr.TransferID + `' AND type = 'transfer.created'`, "2 transfer.created events"},
		{"a gap", `UPDATE events SET sequence = sequence + 1 WHERE account_id = '` + b + `'`, "its counter is at 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := f.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, c.damage); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			rep, err := f.Store.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || !strings.Contains(rep.String(), c.want) {
				t.Fatalf("verify after %s:\n%s\nwant a failure naming %q", c.name, rep, c.want)
			}
		})
	}
}
