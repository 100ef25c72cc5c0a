package postgres

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/services/ledger"
)

// regionSaga is what one region contributes to the global checks.
type regionSaga struct {
	transfers map[string]ledger.Transfer // cross-region transfers sourced here
	credits   map[string]ledger.Credit   // credits applied or refused here
	transit   map[string]int64           // transit balance per currency
	unsent    int64                      // outbox rows not relayed yet
}

// regionSagas holds what each region, by name, contributes to the global
// checks.
type regionSagas map[string]regionSaga

// VerifyGlobal runs every region's own checks and then the checks that need
// all regions (each region is read in one snapshot of its own):
//   - per currency, the transit balances of all regions sum to the money in
//     transit: debited cross-region transfers whose credit is not applied;
//   - no transfer is credited without its debit, and the credit matches it;
//   - no transfer is both credited and refunded, and every refund answers a
//     refused credit; every completed cross-region transfer was credited;
//   - with quiescent set: nothing is left in transit, no transfer is still
//     DEBITED and no outbox row is unsent.
//
// It returns an error only when a database cannot be read.
func VerifyGlobal(ctx context.Context, stores []*Store, quiescent bool) (Report, error) {
	rep := Report{Region: "global"}
	sagas := regionSagas{}
	for _, s := range stores {
		r, err := s.Verify(ctx)
		if err != nil {
			return rep, err
		}
		rep.Checks = append(rep.Checks, prefixed(r)...)
		if sagas[s.cfg.Region], err = s.sagaState(ctx); err != nil {
			return rep, err
		}
	}
	var ids *idgen.Regions
	if len(stores) > 0 {
		ids = stores[0].cfg.Regions
	}
	rep.Checks = append(rep.Checks, globalChecks(sagas, ids, quiescent)...)
	return rep, nil
}

func prefixed(r Report) []Check {
	out := make([]Check, len(r.Checks))
	for i, c := range r.Checks {
		c.Name = r.Region + ": " + c.Name
		out[i] = c
	}
	return out
}

// globalChecks runs the checks that need all regions' saga state; ids
// names the home region of every id.
func globalChecks(sagas regionSagas, ids *idgen.Regions, quiescent bool) []Check {
	settled, inTransit := sagas.checkSettled(ids)
	checks := []Check{checkTransit(sagas.transitBalances(), inTransit), sagas.checkCredited(ids), settled}
	if quiescent {
		checks = append(checks, sagas.checkQuiescent(inTransit))
	}
	return checks
}

// checkSettled checks each cross-region transfer against its credit: a
// refunded transfer was refused, a completed one credited. It also returns
// the money in transit per currency: debited transfers whose credit is not
// applied.
func (sagas regionSagas) checkSettled(ids *idgen.Regions) (Check, map[string]int64) {
	settled := Check{Name: "no transfer is both credited and refunded; refunds answer refusals", OK: true}
	inTransit := map[string]int64{}
	for _, s := range sagas {
		for _, t := range s.transfers {
			c, ok := sagas.creditOf(t, ids)
			applied := ok && c.Status == ledger.CreditApplied
			settled.Checked++
			switch {
			case t.Status == ledger.StatusDebited && !applied:
				inTransit[t.Currency] += t.Moved()
			case t.Status == ledger.StatusRefunded && applied:
				settled.fail("transfer %s is REFUNDED but was credited", t.ID)
			case t.Status == ledger.StatusRefunded && !ok:
				settled.fail("transfer %s is REFUNDED without a refused credit", t.ID)
			case t.Status == ledger.StatusCompleted && !applied:
				settled.fail("transfer %s is COMPLETED but was not credited", t.ID)
			}
		}
	}
	return settled, inTransit
}

// creditOf returns the credit of the cross-region transfer t in its
// destination's region, if there is one.
func (sagas regionSagas) creditOf(t ledger.Transfer, ids *idgen.Regions) (ledger.Credit, bool) {
	dest, err := ids.HomeRegion(t.To)
	if err != nil {
		return ledger.Credit{}, false
	}
	c, ok := sagas[dest].credits[t.ID]
	return c, ok
}

// transitBalances sums the regions' transit balances per currency.
func (sagas regionSagas) transitBalances() map[string]int64 {
	transit := map[string]int64{}
	for _, s := range sagas {
		for cur, b := range s.transit {
			transit[cur] += b
		}
	}
	return transit
}

// checkTransit checks, per currency, that the transit balances equal the
// money in transit.
func checkTransit(transit, inTransit map[string]int64) Check {
	money := Check{Name: "per currency, transit balances equal the money in transit", OK: true}
	for _, cur := range sortedCurrencies(transit, inTransit) {
		money.Checked++
		if transit[cur] != inTransit[cur] {
			money.fail("%s: transit accounts hold %d, transfers in transit amount to %d", cur, transit[cur], inTransit[cur])
		}
	}
	return money
}

// checkCredited checks each credit against its transfer in the source
// region: the transfer exists, is in a status the credit allows, and moves
// the same money between the same accounts.
func (sagas regionSagas) checkCredited(ids *idgen.Regions) Check {
	credited := Check{Name: "no transfer is credited without its debit", OK: true}
	for region, s := range sagas {
		for _, c := range s.credits {
			credited.Checked++
			source, err := ids.HomeRegion(c.TransferID)
			t, ok := sagas[source].transfers[c.TransferID]
			switch {
			case err != nil || !ok:
				credited.fail("%s: credit of %s has no debit in region %s", region, c.TransferID, source)
			case c.Status == ledger.CreditApplied && t.Status != ledger.StatusDebited && t.Status != ledger.StatusCompleted:
				credited.fail("%s: credit of %s applied but the transfer is %s", region, c.TransferID, t.Status)
			case c.Status == ledger.CreditRefused && t.Status != ledger.StatusDebited && t.Status != ledger.StatusRefunded:
				credited.fail("%s: credit of %s refused but the transfer is %s", region, c.TransferID, t.Status)
			case c.Amount != t.Moved() || c.Currency != t.Currency || c.From != t.From || c.To != t.To:
				credited.fail("%s: credit of %s does not match its transfer", region, c.TransferID)
			}
		}
	}
	return credited
}

// checkQuiescent checks that, once all work is done, no money is in
// transit, no transfer is still DEBITED and no outbox row is unsent.
func (sagas regionSagas) checkQuiescent(inTransit map[string]int64) Check {
	q := Check{Name: "after quiescence nothing is left in transit", OK: true}
	for cur, n := range inTransit {
		q.Checked++
		if n != 0 {
			q.fail("%s: %d still in transit", cur, n)
		}
	}
	for region, s := range sagas {
		q.Checked++
		if s.unsent != 0 {
			q.fail("%s: %d outbox rows not relayed", region, s.unsent)
		}
		for _, t := range s.transfers {
			if t.Status == ledger.StatusDebited {
				q.fail("%s: transfer %s is still DEBITED", region, t.ID)
			}
		}
	}
	return q
}

// fail records a failure of the check, listing at most MaxFailures.
func (c *Check) fail(format string, args ...any) {
	if len(c.Failures) < MaxFailures {
		c.Failures = append(c.Failures, fmt.Sprintf(format, args...))
	}
	c.OK = false
}

func sortedCurrencies(ms ...map[string]int64) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		for c := range m {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	sort.Strings(out)
	return out
}

// sagaState reads this region's cross-region transfers, credits, transit
// balances and unsent outbox rows in one snapshot.
func (s *Store) sagaState(ctx context.Context) (regionSaga, error) {
	st := regionSaga{transfers: map[string]ledger.Transfer{}, credits: map[string]ledger.Credit{}, transit: map[string]int64{}}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+transferColumns+` FROM transfers
			WHERE type IN ('transfer', 'refund') AND split_part(to_account, '-', 1) <> $1`, s.cfg.Region)
		if err != nil {
			return err
		}
		ts, err := pgx.CollectRows(rows, scanTransfer)
		if err != nil {
			return err
		}
		for _, t := range ts {
			st.transfers[t.ID] = t
		}
		rows, err = tx.Query(ctx, `SELECT `+creditColumns+` FROM credits`)
		if err != nil {
			return err
		}
		cs, err := pgx.CollectRows(rows, scanCredit)
		if err != nil {
			return err
		}
		for _, c := range cs {
			st.credits[c.TransferID] = c
		}
		rows, err = tx.Query(ctx, `SELECT currency, balance FROM accounts WHERE kind = 'transit'`)
		if err != nil {
			return err
		}
		var cur string
		var bal int64
		if _, err := pgx.ForEachRow(rows, []any{&cur, &bal}, func() error { st.transit[strings.TrimSpace(cur)] += bal; return nil }); err != nil {
			return err
		}
		// A hold's expiry step due later is not waiting to be relayed.
		return tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL AND (due_at IS NULL OR due_at <= now())`).Scan(&st.unsent)
	})
	if err != nil {
		return st, fmt.Errorf("read saga state of %s: %w", s.cfg.Region, err)
	}
	return st, nil
}
