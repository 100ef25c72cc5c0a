package postgres_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// foldAt is the independent computation of an account's balance at an
// instant: the sum of its change-log amounts written at or before at.
func foldAt(t *testing.T, f *ledgertest.Fixture, account string, at time.Time, strict bool) int64 {
	t.Helper()
	op := "<="
	if strict {
		op = "<"
	}
	var n int64
	if err := f.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(amount), 0) FROM postings WHERE account_id = $1 AND created_at `+op+` $2`,
		account, at).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBalanceAtAndStatement applies transfers in several batches, some
// concurrently on one account, noting the time between them; at every
// noted instant the balance equals the fold of the change-log up to it,
// and a statement over any two of them opens and closes at those
// balances, holds exactly the rows written in between in version order,
// and its rows' balance_after run from the opening to the closing; the
// pages of a long statement join into the whole.
func TestBalanceAtAndStatement(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	a, b := f.Account(t, "EUR", 1000), f.Account(t, "EUR", 0)
	instants := []time.Time{time.Now()}
	for round := range 5 {
		var cmds []ledger.Command
		for i := range round + 1 {
			cmds = append(cmds, f.Transfer(t, a, b, int64(10*(i+1))))
		}
		f.Apply(t, cmds...)
		// Two batches at once on the same accounts.
		done := make(chan struct{})
		go func() { f.Apply(t, f.Transfer(t, b, a, 1)); close(done) }()
		f.Apply(t, f.Transfer(t, a, b, 2))
		<-done
		time.Sleep(5 * time.Millisecond) // an instant between rounds, not only at their rows
		instants = append(instants, time.Now())
	}
	for _, acct := range []string{a, b} {
		for _, at := range instants {
			got, err := f.Store.BalanceAt(ctx, acct, at)
			if err != nil {
				t.Fatal(err)
			}
			if want := foldAt(t, f, acct, at, false); got.Balance != want {
				t.Fatalf("%s at %s: balance %d (version %d), the fold of its change-log is %d", acct, at.Format(time.StampMicro), got.Balance, got.Version, want)
			}
		}
		now, _ := f.Store.BalanceAt(ctx, acct, time.Now())
		if cur := f.Balance(t, acct); now.Balance != cur {
			t.Fatalf("%s now: %d, its balance %d", acct, now, cur)
		}
		for i, from := range instants {
			for _, to := range instants[i:] {
				st, err := f.Store.Statement(ctx, acct, from, to, 0, 1000)
				if err != nil {
					t.Fatal(err)
				}
				if st.Opening != foldAt(t, f, acct, from, true) || st.Closing != foldAt(t, f, acct, to, true) {
					t.Fatalf("%s [%s, %s): opening %d closing %d, folds %d and %d", acct, from.Format(time.StampMicro), to.Format(time.StampMicro),
						st.Opening, st.Closing, foldAt(t, f, acct, from, true), foldAt(t, f, acct, to, true))
				}
				running := st.Opening
				for j, e := range st.Entries {
					running += e.Amount
					if e.BalanceAfter != running || e.CreatedAt.Before(from) || !e.CreatedAt.Before(to) || (j > 0 && e.AccountVersion != st.Entries[j-1].AccountVersion+1) {
						t.Fatalf("%s statement row %d: %+v, want balance_after %d within the period, versions in a row", acct, j, e, running)
					}
				}
				if running != st.Closing {
					t.Fatalf("%s statement: opening %d plus its rows is %d, closing %d", acct, st.Opening, running, st.Closing)
				}
			}
		}
		// A page at a time: the pages join into the whole statement.
		whole, err := f.Store.Statement(ctx, acct, instants[0], instants[len(instants)-1], 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var paged []ledger.Posting
		for after := int64(0); ; {
			page, err := f.Store.Statement(ctx, acct, instants[0], instants[len(instants)-1], after, 3)
			if err != nil {
				t.Fatal(err)
			}
			paged = append(paged, page.Entries...)
			if len(page.Entries) < 3 {
				break
			}
			after = page.Entries[len(page.Entries)-1].AccountVersion
		}
		if len(paged) != len(whole.Entries) || len(paged) == 0 {
			t.Fatalf("%s: %d rows in pages of 3, %d in one", acct, len(paged), len(whole.Entries))
		}
	}
	// Before the account's first row: nothing.
	if got, err := f.Store.BalanceAt(ctx, b, instants[0].Add(-time.Hour)); err != nil || got != (ledger.Balance{}) {
		t.Fatalf("before any row: %+v %v, want zero", got, err)
	}
	f.MustVerify(t)
}

// TestVerifyStatements: a change-log row whose balance_after is not the
// running sum, or whose time is before its previous version's, fails the
// statements check, named.
func TestVerifyStatements(t *testing.T) {
	ctx := context.Background()
	for name, tamper := range map[string]string{
		"BalanceAfter":  `UPDATE postings SET balance_after = balance_after + 1 WHERE account_id = '{a}' AND account_version = 2`,
		"TimeBackwards": `UPDATE postings SET created_at = created_at - interval '1 hour' WHERE account_id = '{a}' AND account_version = 3`,
	} {
		t.Run(name, func(t *testing.T) {
			f := ledgertest.New(t)
			a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
			for range 3 {
				f.MustApply(t, f.Transfer(t, a, b, 5))
			}
			f.MustVerify(t)
			if _, err := f.Pool.Exec(ctx, strings.ReplaceAll(tamper, "{a}", a)); err != nil {
				t.Fatal(err)
			}
			rep, err := f.Store.Verify(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range rep.Checks {
				if c.Name == "statements agree with the change-log" {
					if c.OK || len(c.Failures) == 0 || !strings.Contains(c.Failures[0], a) {
						t.Fatalf("tampered %s: %+v, want a failure naming %s", name, c, a)
					}
					return
				}
			}
			t.Fatalf("no statements check in:\n%s", rep)
		})
	}
}

// TestPostingTimesMigration: rows written before migration 00009 with
// now() may be out of version order; the migration moves each up to its
// account's latest time before it, so the statements check passes on an
// upgraded ledger.
func TestPostingTimesMigration(t *testing.T) {
	ctx := context.Background()
	f := ledgertest.New(t)
	a, b := f.Account(t, "EUR", 100), f.Account(t, "EUR", 0)
	for range 3 {
		f.MustApply(t, f.Transfer(t, a, b, 5))
	}
	// Back to the schema before 00009, with what now() could leave:
	// version 3 stamped before version 2.
	downTo(t, f, 8)
	if _, err := f.Pool.Exec(ctx, `
		ALTER TABLE postings ALTER COLUMN created_at SET DEFAULT now();
		UPDATE postings SET created_at = created_at - interval '1 second' WHERE account_id = '`+a+`' AND account_version = 3`); err != nil {
		t.Fatal(err)
	}
	// The schema is older than verify's other checks: the statements check alone.
	if n := f.Count(t, `SELECT count(*) FROM (`+postgres.StatementSQL+`) failures`); n == 0 {
		t.Fatal("before the migration: the statements check passes, want it to fail")
	}
	if err := pgdb.Migrate(ctx, f.Pool, postgres.Migrations()...); err != nil {
		t.Fatal(err)
	}
	f.MustVerify(t)
	var v2, v3 time.Time
	if err := f.Pool.QueryRow(ctx, `SELECT (SELECT created_at FROM postings WHERE account_id = $1 AND account_version = 2),
		(SELECT created_at FROM postings WHERE account_id = $1 AND account_version = 3)`, a).Scan(&v2, &v3); err != nil || !v3.Equal(v2) {
		t.Fatalf("after the migration: version 2 at %s, version 3 at %s (%v), want 3 moved up to 2's time", v2, v3, err)
	}
}

// downTo migrates the fixture's ledger schema down to version, by the
// migrations' own Down sections.
func downTo(tb testing.TB, f *ledgertest.Fixture, version int64) {
	tb.Helper()
	sub, err := fs.Sub(postgres.MigrationFiles(), "migrations")
	if err != nil {
		tb.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(f.Pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithTableName("ledger_schema_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := p.DownTo(context.Background(), version); err != nil {
		tb.Fatalf("down to %d: %v", version, err)
	}
}
