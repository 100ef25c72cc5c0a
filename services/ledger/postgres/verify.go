package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// Check is one invariant's verdict. Failures names the offending rows (at
// most MaxFailures of them).
type Check struct {
	Name     string
	OK       bool
	Checked  int64
	Failures []string
}

// MaxFailures bounds the rows a failed check lists.
const MaxFailures = 20

// Report is the verdict on a region's database.
type Report struct {
	Region string
	Checks []Check
}

// OK reports whether every check passed.
func (r Report) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// String renders one PASS/FAIL line per check, with the failures under it.
func (r Report) String() string {
	var b strings.Builder
	for _, c := range r.Checks {
		verdict := "PASS"
		if !c.OK {
			verdict = "FAIL"
		}
		fmt.Fprintf(&b, "%s  [%s] %s (%d checked)\n", verdict, r.Region, c.Name, c.Checked)
		for _, f := range c.Failures {
			fmt.Fprintf(&b, "        %s\n", f)
		}
	}
	return b.String()
}

// Verify checks the ledger invariants on this database in one REPEATABLE
// READ snapshot:
//   - every balance equals the sum of its change-log, every account version
//     equals its number of postings, numbered 1..n without gaps, and every
//     posting names an existing account;
//   - per currency, customer money equals the money funded, and all
//     balances sum to zero (double entry);
//   - every transfer has exactly the change-log legs its status implies,
//     with the right accounts and amounts, and no posting is orphaned;
//   - consume-log rows and applied messages match one-to-one within the
//     consume-log window, and no claim is stuck PROCESSING past its lease.
//
// It returns an error only when the database cannot be read.
func (s *Store) Verify(ctx context.Context) (Report, error) {
	rep := Report{Region: s.cfg.Region}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		for _, c := range []struct {
			name, count, failures string
			args                  []any
		}{
			{"balance equals the sum of its change-log", `SELECT count(*) FROM accounts`, balanceSQL, nil},
			{"money per currency equals funding", `SELECT count(DISTINCT currency) FROM accounts`, moneySQL, nil},
			{"transfers have the change-log rows their status implies", `SELECT count(*) FROM transfers`, legsSQL(), nil},
			{"consume-log rows match applied messages", `SELECT count(*) FROM transfers`, dedupSQL, []any{Consumer, s.cfg.Dedup.Horizon()}},
		} {
			chk := Check{Name: c.name}
			if err := tx.QueryRow(ctx, c.count).Scan(&chk.Checked); err != nil {
				return fmt.Errorf("verify %s: %w", c.name, err)
			}
			rows, err := tx.Query(ctx, c.failures+fmt.Sprintf(" LIMIT %d", MaxFailures), c.args...)
			if err != nil {
				return fmt.Errorf("verify %s: %w", c.name, err)
			}
			chk.Failures, err = pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return fmt.Errorf("verify %s: %w", c.name, err)
			}
			chk.OK = len(chk.Failures) == 0
			rep.Checks = append(rep.Checks, chk)
		}
		return nil
	})
	return rep, err
}

const balanceSQL = `
	SELECT format('account %s: balance %s, change-log sums to %s; version %s, %s postings numbered %s..%s',
	              a.id, a.balance, coalesce(p.total, 0), a.version, coalesce(p.n, 0), p.lo, p.hi)
	FROM accounts a
	LEFT JOIN (SELECT account_id, sum(amount) AS total, count(*) AS n,
	                  min(account_version) AS lo, max(account_version) AS hi
	           FROM postings GROUP BY account_id) p
	       ON p.account_id = a.id
	WHERE a.balance <> coalesce(p.total, 0) OR a.version <> coalesce(p.n, 0) OR a.balance < a.floor
	   OR (p.n > 0 AND (p.lo <> 1 OR p.hi <> p.n))
	UNION ALL
	SELECT format('posting %s/%s names account %s, which does not exist', p.transfer_id, p.leg, p.account_id)
	FROM postings p LEFT JOIN accounts a ON a.id = p.account_id WHERE a.id IS NULL`

const moneySQL = `
	WITH bal AS (
	    SELECT currency,
	           coalesce(sum(balance) FILTER (WHERE kind = 'customer'), 0) AS customer,
	           coalesce(sum(balance) FILTER (WHERE kind = 'issuance'), 0) AS issuance
	    FROM accounts GROUP BY currency),
	funded AS (
	    SELECT currency, sum(amount) AS total FROM transfers
	    WHERE type = 'fund' AND status = 'COMPLETED' GROUP BY currency)
	SELECT format('%s: customer balances %s, funded %s, issuance %s (sum of all balances must be 0)',
	              b.currency, b.customer, coalesce(f.total, 0), b.issuance)
	FROM bal b LEFT JOIN funded f USING (currency)
	WHERE b.customer <> coalesce(f.total, 0) OR b.customer + b.issuance <> 0
	ORDER BY b.currency`

// legsSQL derives the expected legs of each status from the domain's Legs.
func legsSQL() string {
	var cases strings.Builder
	for _, st := range []ledger.Status{ledger.StatusPending, ledger.StatusDebited, ledger.StatusCompleted, ledger.StatusRefunded, ledger.StatusRejected} {
		var legs []string
		for _, l := range ledger.Legs(st) {
			legs = append(legs, string(l))
		}
		// string_agg below orders legs alphabetically.
		slices.Sort(legs)
		fmt.Fprintf(&cases, " WHEN '%s' THEN '%s'", st, strings.Join(legs, ","))
	}
	return `
	WITH t AS (
	    SELECT t.id, t.status, coalesce(string_agg(p.leg, ',' ORDER BY p.leg), '') AS legs,
	           bool_and(p.leg IS NULL
	                 OR (p.leg = 'debit'  AND p.amount = -t.amount AND p.account_id = t.from_account)
	                 OR (p.leg = 'credit' AND p.amount =  t.amount AND p.account_id = t.to_account)
	                 OR (p.leg = 'refund' AND p.amount =  t.amount AND p.account_id = t.from_account)) AS amounts_ok
	    FROM transfers t LEFT JOIN postings p ON p.transfer_id = t.id
	    GROUP BY t.id)
	SELECT format('transfer %s is %s with legs [%s]%s', id, status, legs,
	              CASE WHEN amounts_ok THEN '' ELSE ' of wrong accounts or amounts' END)
	FROM t WHERE legs <> CASE status` + cases.String() + ` END OR NOT amounts_ok
	UNION ALL
	SELECT format('posting %s/%s has no transfer', p.transfer_id, p.leg)
	FROM postings p LEFT JOIN transfers t ON t.id = p.transfer_id WHERE t.id IS NULL`
}

// dedupSQL pairs each ledger consume-log row with the transfer its message
// produced (the key is Command.MsgKey: 'xfer/<client>/<idempotency key>').
const dedupSQL = `
	WITH d AS (
	    SELECT msg_key, status, lease_until FROM dedup_log WHERE consumer = $1),
	t AS (
	    SELECT id, 'xfer/' || client_id || '/' || idempotency_key AS msg_key, created_at FROM transfers)
	SELECT format('consume-log row %s has no transfer', d.msg_key)
	FROM d LEFT JOIN t USING (msg_key) WHERE d.status = 'PROCESSED' AND t.id IS NULL
	UNION ALL
	SELECT format('consume-log row %s is stuck PROCESSING (lease ended %s)', d.msg_key, d.lease_until)
	FROM d WHERE d.status = 'PROCESSING' AND d.lease_until < now()
	UNION ALL
	SELECT format('transfer %s has %s consume-log rows, want 1', t.id, count(d.msg_key))
	FROM t LEFT JOIN d USING (msg_key) WHERE t.created_at >= $2
	GROUP BY t.id HAVING count(d.msg_key) <> 1`
