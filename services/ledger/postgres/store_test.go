package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

func kinds(rs []ledger.Result) map[ledger.ResultKind]int {
	m := map[ledger.ResultKind]int{}
	for _, r := range rs {
		m[r.Kind]++
	}
	return m
}

// TestExactlyOnce delivers one transfer 1, 2 and 50 times, one delivery
// after another, all in one batch, and concurrently from many workers: it is
// applied once, with one pair of change-log rows and one balance change.
func TestExactlyOnce(t *testing.T) {
	f := ledgertest.New(t)
	for _, n := range []int{1, 2, 50} {
		for _, mode := range []string{"Sequential", "OneBatch", "Concurrent"} {
			t.Run(fmt.Sprintf("%s%d", mode, n), func(t *testing.T) {
				a, b := f.Account(t, "EUR", 1000), f.Account(t, "EUR", 0)
				cmd := f.Transfer(t, a, b, 100)
				var rs []ledger.Result
				switch mode {
				case "Sequential":
					for range n {
						rs = append(rs, f.Apply(t, cmd)...)
					}
				case "OneBatch":
					batch := make([]ledger.Command, n)
					for i := range batch {
						batch[i] = cmd
					}
					rs = f.Apply(t, batch...)
				case "Concurrent":
					var mu sync.Mutex
					var wg sync.WaitGroup
					for range n {
						wg.Go(func() {
							r := f.Apply(t, cmd)
							mu.Lock()
							rs = append(rs, r...)
							mu.Unlock()
						})
					}
					wg.Wait()
				}
				if k := kinds(rs); k[ledger.Applied] != 1 || k[ledger.Duplicate] != n-1 {
					t.Fatalf("got %v, want 1 applied and %d duplicates", k, n-1)
				}
				if got := f.Balance(t, a); got != 900 {
					t.Errorf("source balance: got %d, want 900", got)
				}
				if got := f.Balance(t, b); got != 100 {
					t.Errorf("destination balance: got %d, want 100", got)
				}
				if got := f.Count(t, `SELECT count(*) FROM postings WHERE transfer_id = $1`, cmd.TransferID); got != 2 {
					t.Errorf("change-log rows: got %d, want 2", got)
				}
			})
		}
	}
	f.MustVerify(t)
	dups := f.Stats.Duplicates()
	if dups[string(ledger.LayerConsumeLog)] == 0 {
		t.Errorf("duplicates by layer %v: want some caught by the dedup table", dups)
	}
}

// TestAwaitingAccount: a request naming an account that does not exist is
// no refusal. Nothing is recorded and its consume-log claim is given back,
// so every delivery dead-letters it again, and once the account exists the
// same command applies, exactly once; the rest of its batch is unaffected.
func TestAwaitingAccount(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	later := f.ID(t) // an account that will exist
	tests := []struct {
		name   string
		cmd    ledger.Command
		create func(t *testing.T) // makes the missing account exist
	}{
		{"UnknownDestination", f.Transfer(t, a, later, 7), func(t *testing.T) { f.AccountAs(t, later, "EUR") }},
		{"UnknownSource", f.Transfer(t, f.ID(t), b, 1), nil},
		{"FundUnknownCurrency", ledger.Command{Type: ledger.TypeFund, TransferID: f.ID(t), ClientID: "c1", IdempotencyKey: "jpy",
			To: a, Amount: 1, Currency: "JPY", CreatedAt: f.Clock.Now()}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for delivery := 1; delivery <= 3; delivery++ {
				before := []int64{f.Balance(t, a), f.Balance(t, b)}
				ok := f.Transfer(t, a, b, 1)
				rs := f.Apply(t, tt.cmd, ok)
				r := rs[0]
				if r.Kind != ledger.AwaitingAccount || !r.DeadLetter || r.Err == nil || r.Err.Code != ledger.CodeAccountNotFound || r.Transfer.ID != "" {
					t.Fatalf("delivery %d: got %v %v deadLetter=%v transfer %q, want awaiting_account account_not_found, dead-lettered, nothing recorded",
						delivery, r.Kind, r.Err, r.DeadLetter, r.Transfer.ID)
				}
				if !strings.Contains(r.Err.Error(), "does not exist") && !strings.Contains(r.Err.Error(), "no issuance account") {
					t.Errorf("reason %q is not clear", r.Err.Error())
				}
				if rs[1].Kind != ledger.Applied {
					t.Fatalf("the rest of the batch: got %v %v, want applied", rs[1].Kind, rs[1].Err)
				}
				if got := []int64{f.Balance(t, a), f.Balance(t, b)}; got[0] != before[0]-1 || got[1] != before[1]+1 {
					t.Fatalf("balances: got %v, want %v moved by the good transfer only", got, before)
				}
				if n := f.Count(t, `SELECT count(*) FROM transfers WHERE id = $1`, tt.cmd.TransferID); n != 0 {
					t.Fatalf("delivery %d: %d transfer rows, want none", delivery, n)
				}
				if n := f.Count(t, `SELECT count(*) FROM dedup_log WHERE msg_key = $1`, tt.cmd.MsgKey()); n != 0 {
					t.Fatalf("delivery %d: %d consume-log rows, want the claim given back", delivery, n)
				}
			}
			if tt.create == nil {
				return
			}
			tt.create(t)
			before := f.Balance(t, a)
			if r := f.Apply(t, tt.cmd)[0]; r.Kind != ledger.Applied || r.DeadLetter {
				t.Fatalf("after the account exists: got %v %v deadLetter=%v, want applied", r.Kind, r.Err, r.DeadLetter)
			}
			if r := f.Apply(t, tt.cmd)[0]; r.Kind != ledger.Duplicate {
				t.Fatalf("applied, then redelivered: got %v %v, want duplicate", r.Kind, r.Err)
			}
			if got := f.Balance(t, a); got != before-tt.cmd.Amount {
				t.Fatalf("source: got %d, want %d (moved exactly once)", got, before-tt.cmd.Amount)
			}
			if got := f.Balance(t, later); got != tt.cmd.Amount {
				t.Fatalf("the new account: got %d, want %d", got, tt.cmd.Amount)
			}
		})
	}
	if got := f.Stats.AwaitingAccount.Load(); got != 9 {
		t.Errorf("awaiting-account count: got %d, want 9 (three deliveries of three requests)", got)
	}
	f.MustVerify(t)
}

func TestRefusals(t *testing.T) {
	f := ledgertest.New(t)
	a, b, usd := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0), f.Account(t, "USD", 0)
	huge := f.Account(t, "EUR", 0)
	// Fill huge to the top of int64 through the issuance account.
	f.MustApply(t, ledger.Command{Type: ledger.TypeFund, TransferID: f.ID(t), ClientID: "c1", IdempotencyKey: "top",
		To: huge, Amount: 1<<63 - 1 - 100, Currency: "EUR", CreatedAt: f.Clock.Now()})

	// An account with an overdraft limit can send more than it holds.
	od, _, err := f.Store.CreateAccount(context.Background(), ledger.NewAccount{ClientID: "c1", Currency: "EUR", Floor: -1000})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cmd  ledger.Command
		code ledger.Code
	}{
		{"ErrInsufficientFunds", f.Transfer(t, a, b, 101), ledger.CodeInsufficientFunds},
		{"ErrCurrencyMismatch", f.Transfer(t, a, usd, 1), ledger.CodeCurrencyMismatch},
		{"ErrBalanceOverflow", f.Transfer(t, od.ID, huge, 500), ledger.CodeBalanceOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := []int64{f.Balance(t, a), f.Balance(t, b), f.Balance(t, usd), f.Balance(t, huge)}
			// A refused command in a batch does not stop the others.
			ok := f.Transfer(t, a, b, 1)
			rs := f.Apply(t, tt.cmd, ok)
			r := rs[0]
			if r.Kind != ledger.Rejected || r.Err == nil || r.Err.Code != tt.code || r.DeadLetter {
				t.Fatalf("got %v %v deadLetter=%v, want rejected %s, not dead-lettered", r.Kind, r.Err, r.DeadLetter, tt.code)
			}
			if r.Err.Message == "" || !strings.Contains(r.Err.Error(), string(tt.code)) {
				t.Errorf("reason %q is not clear", r.Err.Error())
			}
			if rs[1].Kind != ledger.Applied {
				t.Fatalf("the rest of the batch: got %v, want applied", rs[1].Kind)
			}
			after := []int64{f.Balance(t, a), f.Balance(t, b), f.Balance(t, usd), f.Balance(t, huge)}
			want := []int64{before[0] - 1, before[1] + 1, before[2], before[3]}
			if fmt.Sprint(after) != fmt.Sprint(want) {
				t.Errorf("balances: got %v, want %v (only the good transfer moved money)", after, want)
			}
			tr, err := f.Store.Transfer(context.Background(), tt.cmd.TransferID)
			if err != nil || tr.Status != ledger.StatusRejected || tr.Reason != tt.code {
				t.Errorf("recorded transfer: got %+v %v, want REJECTED %s", tr, err, tt.code)
			}
			// The refusal is recorded: a redelivery is a duplicate, not a retry.
			if r := f.Apply(t, tt.cmd)[0]; r.Kind != ledger.Duplicate {
				t.Errorf("redelivery: got %v, want duplicate", r.Kind)
			}
		})
	}
	t.Run("ErrAccountClosed", func(t *testing.T) {
		c := f.Account(t, "EUR", 0)
		f.MustApply(t, change(t, f, ledger.TypeClose, c))
		if r := f.Apply(t, f.Transfer(t, a, c, 1))[0]; r.Err == nil || r.Err.Code != ledger.CodeAccountClosed {
			t.Fatalf("got %v %v, want account_closed", r.Kind, r.Err)
		}
	})
	t.Run("ErrInvalidAccount", func(t *testing.T) {
		for _, n := range []ledger.NewAccount{{ClientID: "", Currency: "EUR"}, {ClientID: "c", Currency: "euro"}, {ClientID: "c", Currency: "EUR", Floor: 5}} {
			if _, _, err := f.Store.CreateAccount(context.Background(), n); ledger.ErrorCode(err) == "" {
				t.Errorf("create %+v: got %v, want a domain error", n, err)
			}
		}
	})
	f.MustVerify(t)
}

// TestFloorWithinBatch debits one account several times in one batch: the
// floor check sees each earlier debit.
func TestFloorWithinBatch(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	rs := f.Apply(t, f.Transfer(t, a, b, 40), f.Transfer(t, a, b, 40), f.Transfer(t, a, b, 40), f.Transfer(t, a, b, 20))
	got := []ledger.ResultKind{rs[0].Kind, rs[1].Kind, rs[2].Kind, rs[3].Kind}
	want := []ledger.ResultKind{ledger.Applied, ledger.Applied, ledger.Rejected, ledger.Applied}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if bal := f.Balance(t, a); bal != 0 {
		t.Fatalf("balance: got %d, want 0", bal)
	}
	f.MustVerify(t)
}

// TestBusinessKeyAfterExpiry: once the consume-log partition holding a
// message is dropped, a redelivery passes the consume-log but is caught by
// the business unique key, and a reuse of the key for another request is a
// conflict.
func TestBusinessKeyAfterExpiry(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	cmd := f.Transfer(t, a, b, 10)
	f.MustApply(t, cmd)

	f.Clock.Step(5 * 24 * time.Hour)
	m, err := f.Log.Maintain(context.Background(), f.Pool)
	if err != nil || len(m.Dropped) == 0 {
		t.Fatalf("maintain: dropped %v, err %v; want old partitions dropped", m.Dropped, err)
	}
	if n := f.Count(t, `SELECT count(*) FROM dedup_log WHERE msg_key = $1`, cmd.MsgKey()); n != 0 {
		t.Fatalf("consume-log rows of the expired message: got %d, want 0", n)
	}
	r := f.Apply(t, cmd)[0]
	if r.Kind != ledger.Duplicate || r.Layer != ledger.LayerBusinessKey || r.Transfer.ID != cmd.TransferID {
		t.Fatalf("late redelivery: got %v/%s %s, want duplicate/business_key of %s", r.Kind, r.Layer, r.Transfer.ID, cmd.TransferID)
	}
	other := cmd
	other.Amount, other.TransferID = 11, f.ID(t)
	if r := f.Apply(t, other)[0]; r.Kind != ledger.Conflict || r.Err.Code != ledger.CodeIdempotencyKeyReused {
		t.Fatalf("same key, other body: got %v %v, want conflict idempotency_key_reused", r.Kind, r.Err)
	}
	reused := f.Transfer(t, a, b, 1)
	reused.TransferID = cmd.TransferID
	if r := f.Apply(t, reused)[0]; r.Kind != ledger.Invalid || r.Err.Code != ledger.CodeTransferIDReused || !r.DeadLetter {
		t.Fatalf("reused transfer id: got %v %v, want invalid transfer_id_reused, dead-lettered", r.Kind, r.Err)
	}
	if got := f.Balance(t, a); got != 90 {
		t.Fatalf("balance: got %d, want 90", got)
	}
	f.MustVerify(t)
}

// TestStateMachineCAS: illegal and repeated transitions are refused and
// counted, and a writer holding a stale version loses the compare-and-set.
func TestStateMachineCAS(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	done := f.MustApply(t, f.Transfer(t, a, b, 10)).Transfer

	t.Run("ErrIllegalTransition", func(t *testing.T) {
		_, err := f.Store.Advance(ctx, done.ID, done.Status, done.Version, ledger.EventComplete)
		if ledger.ErrorCode(err) != ledger.CodeIllegalTransition {
			t.Fatalf("repeated completion: got %v, want illegal_transition", err)
		}
		if f.Stats.IllegalTransitions.Load() != 1 {
			t.Fatalf("illegal transitions counted: got %d, want 1", f.Stats.IllegalTransitions.Load())
		}
	})
	t.Run("ErrStaleVersion", func(t *testing.T) {
		// A debited transfer (the first half of a cross-region saga), read
		// by two workers at (DEBITED, v1).
		id := f.ID(t)
		if _, err := f.Pool.Exec(ctx, `
			INSERT INTO transfers (id, client_id, idempotency_key, fingerprint, type, from_account, to_account, amount, currency, status, version, created_at)
			VALUES ($1, 'c1', $1, '\x00', 'transfer', $2, $3, 5, 'EUR', 'DEBITED', 1, now())`, id, a, b); err != nil {
			t.Fatal(err)
		}
		first, err := f.Store.Advance(ctx, id, ledger.StatusDebited, 1, ledger.EventConfirm)
		if err != nil || first.Status != ledger.StatusCompleted || first.Version != 2 {
			t.Fatalf("first writer: got %s v%d %v, want COMPLETED v2", first.Status, first.Version, err)
		}
		cur, err := f.Store.Advance(ctx, id, ledger.StatusDebited, 1, ledger.EventRefund)
		if ledger.ErrorCode(err) != ledger.CodeStaleVersion || cur.Status != ledger.StatusCompleted {
			t.Fatalf("stale writer: got %s %v, want stale_version with the current COMPLETED", cur.Status, err)
		}
		if f.Stats.StaleVersions.Load() != 1 {
			t.Fatalf("stale versions counted: got %d, want 1", f.Stats.StaleVersions.Load())
		}
		if _, err := f.Pool.Exec(ctx, `DELETE FROM transfers WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ErrStaleBalanceABA", func(t *testing.T) {
		// The balance goes 90 -> 50 -> 90: a CAS on the balance alone would
		// accept a writer that read 90 at the start. The version does not.
		read, err := f.Store.Account(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		f.MustApply(t, f.Transfer(t, a, b, 40))
		back := f.Transfer(t, b, a, 40)
		f.MustApply(t, back)
		now, _ := f.Store.Account(ctx, a)
		if now.Balance != read.Balance || now.Version != read.Version+2 {
			t.Fatalf("setup: balance %d v%d, want %d v%d", now.Balance, now.Version, read.Balance, read.Version+2)
		}
		tag, err := f.Pool.Exec(ctx, postgres.UpdateBalancesSQL, []string{a}, []int64{read.Version}, []int64{read.Version + 1}, []int64{read.Balance - 90},
			[]int64{read.Held}, []int64{read.Held})
		if err != nil || tag.RowsAffected() != 0 {
			t.Fatalf("stale balance CAS: updated %d rows (%v), want 0", tag.RowsAffected(), err)
		}
	})
	f.MustVerify(t)
}

// TestVerifyDetectsTampering: verify passes on a clean ledger and names the
// account, transfer or message that breaks each invariant.
func TestVerifyDetectsTampering(t *testing.T) {
	ctx := context.Background()
	tamper := map[string]struct {
		sql   func(a, b string, c ledger.Command) (string, []any)
		check string
	}{
		"Balance": {func(a, _ string, _ ledger.Command) (string, []any) {
			return `UPDATE accounts SET balance = balance + 1 WHERE id = $1`, []any{a}
		}, "balance equals the sum of its change-log"},
		"ChangeLog": {func(_, _ string, c ledger.Command) (string, []any) {
			return `DELETE FROM postings WHERE transfer_id = $1 AND leg = 'credit'`, []any{c.TransferID}
		}, "transfers have the change-log rows their status implies"},
		"Money": {func(a, _ string, _ ledger.Command) (string, []any) {
			return `WITH x AS (UPDATE accounts SET balance = balance + 7, version = version + 1 WHERE id = $1 RETURNING balance, version)
			        INSERT INTO postings (transfer_id, leg, account_id, amount, balance_after, account_version)
			        SELECT 'forged', 'credit', $1, 7, balance, version FROM x`, []any{a}
		}, "money per currency equals funding"},
		"PostingVersion": {func(a, _ string, _ ledger.Command) (string, []any) {
			return `UPDATE postings SET account_version = account_version + 100 WHERE account_id = $1 AND account_version = 1`, []any{a}
		}, "balance equals the sum of its change-log"},
		"ConsumeLog": {func(_, _ string, c ledger.Command) (string, []any) {
			return `DELETE FROM dedup_log WHERE msg_key = $1`, []any{c.MsgKey()}
		}, "consume-log rows match applied messages"},
	}
	for name, tt := range tamper {
		t.Run(name, func(t *testing.T) {
			f := ledgertest.New(t)
			a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
			cmd := f.Transfer(t, a, b, 10)
			f.MustApply(t, cmd)
			f.MustVerify(t)
			sql, args := tt.sql(a, b, cmd)
			if _, err := f.Pool.Exec(ctx, sql, args...); err != nil {
				t.Fatal(err)
			}
			rep, err := f.Store.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() {
				t.Fatalf("verify passed a tampered ledger:\n%s", rep)
			}
			for _, c := range rep.Checks {
				if c.Name == tt.check && (c.OK || len(c.Failures) == 0) {
					t.Fatalf("check %q did not fail:\n%s", tt.check, rep)
				}
			}
		})
	}
}

// TestCommitOutcomeUnknown cuts the connection while COMMIT is in flight.
// When the server committed, the apply reads the consume-log row back and
// reports success; when it did not, the batch is retried. Either way the
// transfer is applied exactly once. Cut while the server is still
// committing, the read-back may run first and see nothing: the retry then
// waits for the commit and finds the transfer applied (one retry at most).
func TestCommitOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       faultproxy.Mode
		maxRetries int64 // and at least minRetries
		minRetries int64
	}{
		{"CommittedThenCut", faultproxy.DropAnswer, 0, 0},
		{"CutWhileCommitting", faultproxy.DropAfter, 1, 0},
		{"CutBeforeCommit", faultproxy.DropBefore, 1, 1},
	} {
		mode := tc.mode
		t.Run(tc.name, func(t *testing.T) {
			f, proxy := proxiedFixture(t)
			a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
			cmd := f.Transfer(t, a, b, 30)

			proxy.Trap([]byte("commit"), mode)
			r := f.Apply(t, cmd)[0]
			if proxy.Fired() != 1 {
				t.Fatalf("the fault did not fire")
			}
			if r.Kind != ledger.Applied {
				t.Fatalf("got %v, want applied", r.Kind)
			}
			// The cut may reach a pooled connection only after Apply is
			// done with it (a CI run read the balance on it: "connection
			// reset by peer"): the check reads on fresh ones.
			f.Pool.Reset()
			if got := f.Balance(t, a); got != 70 {
				t.Fatalf("balance: got %d, want 70 (applied exactly once)", got)
			}
			if got := f.Stats.Retries.Load(); got < tc.minRetries || got > tc.maxRetries {
				t.Fatalf("retries: got %d, want %d to %d", got, tc.minRetries, tc.maxRetries)
			}
			if got := f.Stats.CommitsUnanswered.Load(); mode != faultproxy.DropBefore && got != 1 {
				t.Fatalf("commits unanswered: got %d, want 1 (the read-back ran)", got)
			}
			f.MustVerify(t)
		})
	}
}

// proxiedFixture is a ledger whose every connection runs through a fault
// proxy in front of the test server.
func proxiedFixture(t *testing.T) (*ledgertest.Fixture, *faultproxy.Proxy) {
	t.Helper()
	_, url := pgtest.MustDatabase(t, postgres.Migrations()...)
	proxy, err := faultproxy.New("127.0.0.1:5432")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(mustPort(t, proxy.Addr()))
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return ledgertest.On(t, pool, url), proxy
}

func mustPort(tb testing.TB, addr string) int {
	tb.Helper()
	var port int
	if _, err := fmt.Sscanf(addr[strings.LastIndex(addr, ":")+1:], "%d", &port); err != nil {
		tb.Fatal(err)
	}
	return port
}

// TestLateCommitIsFenced: a worker that hangs inside its transaction past
// the lease loses its claims. Postgres ends its session; a second worker,
// which was waiting on the claim, applies the transfer; the first worker's
// late COMMIT fails, is counted, and its rerun sees a duplicate.
func TestLateCommitIsFenced(t *testing.T) {
	pool, url := pgtest.MustDatabase(t, postgres.Migrations()...)
	leased, err := postgres.Connect(context.Background(), url, time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(leased.Close)
	inHook := make(chan struct{})
	var once sync.Once
	slow := ledgertest.On(t, leased, url, func(c *postgres.Config) {
		c.Dedup = ledgertest.FailBeforeCommit(c.Dedup, func(context.Context) error {
			hung := false
			once.Do(func() { hung = true })
			if hung {
				close(inHook)
				time.Sleep(2500 * time.Millisecond) // past the 1 s lease
			}
			return nil
		})
	})
	fast := ledgertest.On(t, pool, url)
	a, b := fast.Account(t, "EUR", 100), fast.Account(t, "EUR", 0)
	cmd := fast.Transfer(t, a, b, 25)

	slowResult := make(chan ledger.Result)
	go func() { slowResult <- slow.Apply(t, cmd)[0] }()
	<-inHook
	if r := fast.Apply(t, cmd)[0]; r.Kind != ledger.Applied {
		t.Fatalf("second worker: got %v, want applied once the first lost its lease", r.Kind)
	}
	if r := <-slowResult; r.Kind != ledger.Duplicate {
		t.Fatalf("first worker after its late commit failed: got %v, want duplicate", r.Kind)
	}
	if got := slow.Stats.Fenced.Load(); got != 1 {
		t.Fatalf("fenced late commits: got %d, want 1", got)
	}
	if got := fast.Balance(t, a); got != 75 {
		t.Fatalf("balance: got %d, want 75", got)
	}
	fast.MustVerify(t)
}

// TestBatchIsolation: commands that could break a batch's writes are refused
// inside the plan, and the rest of the batch commits.
func TestBatchIsolation(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	var mint string
	if err := f.Pool.QueryRow(ctx, `SELECT id FROM accounts WHERE kind = 'issuance' AND currency = 'EUR'`).Scan(&mint); err != nil {
		t.Fatal(err)
	}
	intoMint := ledger.Command{Type: ledger.TypeFund, TransferID: f.ID(t), ClientID: "c1", IdempotencyKey: "mint",
		To: mint, Amount: 5, Currency: "EUR", CreatedAt: f.Clock.Now()}
	first := f.Transfer(t, a, b, 1)
	sameID := f.Transfer(t, a, b, 2)
	sameID.TransferID = first.TransferID
	rs := f.Apply(t, intoMint, first, sameID, f.Transfer(t, a, b, 3))

	if r := rs[0]; r.Kind != ledger.Rejected || r.Err.Code != ledger.CodeSameAccount {
		t.Errorf("fund into the issuance account: got %v %v, want rejected same_account", r.Kind, r.Err)
	}
	if rs[1].Kind != ledger.Applied || rs[3].Kind != ledger.Applied {
		t.Errorf("good commands: got %v and %v, want applied", rs[1].Kind, rs[3].Kind)
	}
	if r := rs[2]; r.Kind != ledger.Invalid || r.Err.Code != ledger.CodeTransferIDReused || !r.DeadLetter {
		t.Errorf("same transfer id twice in a batch: got %v %v, want invalid transfer_id_reused, dead-lettered", r.Kind, r.Err)
	}
	if got := f.Balance(t, b); got != 4 {
		t.Errorf("balance: got %d, want 4", got)
	}
	f.MustVerify(t)
}

// TestReplayAnswers: a duplicate caught by the consume-log answers with the
// stored transfer; a transfer to a missing account is dead-lettered again
// (in case the first dead-letter publish was lost); a repeated fund is a
// duplicate, not a conflict; a reused key is dead-lettered.
func TestReplayAnswers(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	ok := f.Transfer(t, a, b, 10)
	ghost := f.Transfer(t, a, f.ID(t), 10)
	fund := ledger.Command{Type: ledger.TypeFund, TransferID: f.ID(t), ClientID: "c1", IdempotencyKey: "fund-again",
		To: b, Amount: 7, Currency: "EUR", CreatedAt: f.Clock.Now()}
	f.Apply(t, ok, ghost, fund)

	rs := f.Apply(t, ok, ghost, fund)
	if r := rs[0]; r.Kind != ledger.Duplicate || r.Transfer.ID != ok.TransferID || r.Transfer.Status != ledger.StatusCompleted || r.DeadLetter {
		t.Errorf("replayed transfer: got %v %s %s deadLetter=%v", r.Kind, r.Transfer.ID, r.Transfer.Status, r.DeadLetter)
	}
	if r := rs[1]; r.Kind != ledger.AwaitingAccount || !r.DeadLetter || r.Err == nil || r.Err.Code != ledger.CodeAccountNotFound {
		t.Errorf("redelivered transfer to a missing account: got %v deadLetter=%v %v, want awaiting_account, dead-lettered again", r.Kind, r.DeadLetter, r.Err)
	}
	if r := rs[2]; r.Kind != ledger.Duplicate {
		t.Errorf("replayed fund: got %v %v, want duplicate", r.Kind, r.Err)
	}

	// After the consume-log forgot them, the business key must agree.
	f.Clock.Step(5 * 24 * time.Hour)
	if _, err := f.Log.Maintain(context.Background(), f.Pool); err != nil {
		t.Fatal(err)
	}
	if r := f.Apply(t, fund)[0]; r.Kind != ledger.Duplicate || r.Layer != ledger.LayerBusinessKey {
		t.Errorf("late fund retry: got %v/%s %v, want duplicate/business_key", r.Kind, r.Layer, r.Err)
	}
	reused := fund
	reused.Amount = 8
	if r := f.Apply(t, reused)[0]; r.Kind != ledger.Conflict || !r.DeadLetter {
		t.Errorf("reused key: got %v deadLetter=%v, want conflict, dead-lettered", r.Kind, r.DeadLetter)
	}
	// The same misuse submitted by an API that did not claim the key: the
	// API answers it 422 from the key's row; no dead letter.
	reused.KeyExpiresAt = reused.CreatedAt.Add(time.Hour)
	if r := f.Apply(t, reused)[0]; r.Kind != ledger.Conflict || r.DeadLetter {
		t.Errorf("reused key, unclaimed: got %v deadLetter=%v, want conflict, not dead-lettered", r.Kind, r.DeadLetter)
	}
	if got := f.Balance(t, b); got != 17 {
		t.Errorf("balance: got %d, want 17", got)
	}
	f.MustVerify(t)
}

// TestCachedRedeliveriesNeedNoTransaction: a batch made only of
// redeliveries of recent commits is answered by the recent-commit cache
// without touching the database (here: after its pool is closed), and a
// batch with one new command still goes to the database.
func TestCachedRedeliveriesNeedNoTransaction(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	cmds := []ledger.Command{f.Transfer(t, a, b, 10), f.Transfer(t, a, b, 20)}

	pool, err := postgres.Connect(context.Background(), f.URL, time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	log := dedup.New(dedup.Config{Holder: "cache-test", WindowDays: 3, Cache: dedup.NewCache(100)})
	store := postgres.New(pool, postgres.Config{Region: "eu", Regions: f.Regions, IDs: f.IDs, Dedup: postgres.NewConsumeLog(log)})
	if _, err := store.Apply(context.Background(), cmds); err != nil {
		t.Fatal(err)
	}
	pool.Close()

	again := append(cmds, cmds[0]) // a repeat inside the batch too
	var tx ledger.TxTimes
	res, err := store.Apply(ledger.WithTxTimes(context.Background(), &tx), again)
	if tx != (ledger.TxTimes{}) {
		t.Errorf("times of a transaction %+v, want none", tx)
	}
	if err != nil {
		t.Fatalf("cached redeliveries went to the database: %v", err)
	}
	for i, r := range res {
		if r.Kind != ledger.Duplicate || (i < 2 && r.Layer != ledger.LayerRecentCache) {
			t.Errorf("result %d: %+v, want a duplicate caught by the cache", i, r)
		}
	}
	if _, err := store.Apply(context.Background(), append(again, f.Transfer(t, a, b, 5))); err == nil {
		t.Fatal("a batch with a new command was answered without the database")
	}
	if got := f.Balance(t, b); got != 30 {
		t.Fatalf("balance %d, want 30", got)
	}
}

// TestTxTimes: the store tells the caller that asks (ledger.WithTxTimes)
// when its transaction began, sent COMMIT and had COMMIT's answer.
func TestTxTimes(t *testing.T) {
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	before := time.Now()
	var tx ledger.TxTimes
	if _, err := f.Store.Apply(ledger.WithTxTimes(context.Background(), &tx), []ledger.Command{f.Transfer(t, a, b, 10)}); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if tx.Began.Before(before) || tx.Committing.Before(tx.Began) || tx.Committed.Before(tx.Committing) || tx.Committed.After(after) {
		t.Fatalf("began %v, COMMIT sent %v, answered %v: want them in that order between %v and %v", tx.Began, tx.Committing, tx.Committed, before, after)
	}
}
