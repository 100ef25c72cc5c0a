package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/ledgertest"
	"github.com/paymesh/paymesh/services/ledger"
)

// listed is a transfer as the lists' filters see it, read straight from
// the table.
type listed struct {
	id, from, to, status, reference string
	metadata                        map[string]string
	at                              time.Time
}

// TestTransfersPageFilters pages through every combination of the
// transfer list's filters (account, status, reference, metadata and a
// created_at range), three at a time under the cursor, and compares each
// with the client's transfers filtered here from a plain read of the
// table: the statement built for a combination selects what it says and
// orders it newest first, ties by ID.
func TestTransfersPageFilters(t *testing.T) {
	f := ledgertest.New(t)
	ctx := context.Background()
	accts := []string{f.Account(t, "EUR", 1000), f.Account(t, "EUR", 1000), f.Account(t, "EUR", 0)}
	base := f.Clock.Now().Truncate(time.Microsecond) // Postgres's precision, as the API rounds instants
	for i := range 40 {
		c := f.Transfer(t, accts[i%3], accts[(i+1+i/3)%3], int64(1+i%7))
		if i%5 == 3 {
			c.Amount = 5000 // refused: REJECTED, no change-log rows
		}
		if i%4 == 0 {
			c.Reference = fmt.Sprintf("r-%d", i%3) // taken once, then refused unless REJECTED
		}
		if i%3 == 0 {
			c.Metadata = map[string]string{"k": fmt.Sprintf("v%d", i%2), "n": fmt.Sprint(i)}
		}
		c.CreatedAt = base.Add(time.Duration(i/2) * time.Second) // pairs share an instant: the ID breaks the tie
		f.Apply(t, c)
	}
	rows, err := f.Store.Pool().Query(ctx, `SELECT id, from_account, to_account, status, coalesce(reference, ''), metadata, created_at
		FROM transfers WHERE client_id = 'c1'`)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (l listed, err error) {
		err = r.Scan(&l.id, &l.from, &l.to, &l.status, &l.reference, &l.metadata, &l.at)
		return l, err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(all, func(a, b listed) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return -compareStrings(a.id, b.id)
	})
	from, to := base.Add(5*time.Second), base.Add(15*time.Second)
	combos := 0
	for _, account := range []string{"", accts[0], accts[2]} {
		for _, status := range []ledger.Status{"", ledger.StatusCompleted, ledger.StatusRejected} {
			for _, ref := range []string{"", "r-1"} {
				for _, md := range []map[string]string{nil, {"k": "v0"}, {"k": "v1", "n": "3"}} {
					for _, span := range [][2]*time.Time{{}, {&from, nil}, {nil, &to}, {&from, &to}} {
						flt := ledger.TransferFilter{ClientID: "c1", Account: account, Status: status, Reference: ref, Metadata: md,
							CreatedFrom: span[0], CreatedTo: span[1]}
						var want []string
						for _, l := range all {
							if (account == "" || l.from == account || l.to == account) && (status == "" || l.status == string(status)) &&
								(ref == "" || l.reference == ref) && contains(l.metadata, md) &&
								(span[0] == nil || !l.at.Before(*span[0])) && (span[1] == nil || l.at.Before(*span[1])) {
								want = append(want, l.id)
							}
						}
						if got := pageAll(t, f, flt); !slices.Equal(got, want) {
							t.Errorf("%+v: pages list %v, want %v", flt, got, want)
						}
						combos++
					}
				}
			}
		}
	}
	if len(all) != 42 || combos != 216 { // the 40 and the two fundings
		t.Fatalf("%d transfers, %d combinations", len(all), combos)
	}
}

// pageAll reads every page of a list, three at a time.
func pageAll(t *testing.T, f *ledgertest.Fixture, flt ledger.TransferFilter) []string {
	t.Helper()
	var ids []string
	for range 50 {
		page, err := f.Store.TransfersPage(context.Background(), flt, 3)
		if err != nil {
			t.Fatalf("%+v: %v", flt, err)
		}
		for _, tr := range page {
			ids = append(ids, tr.ID)
		}
		if len(page) < 3 {
			return ids
		}
		last := page[len(page)-1]
		flt.After = &ledger.ListCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	t.Fatalf("%+v: more than 50 pages", flt)
	return nil
}

func contains(have, want map[string]string) bool {
	for k, v := range want {
		if w, ok := have[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// compareStrings compares bytewise, as the "C" collation of the IDs does.
func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
