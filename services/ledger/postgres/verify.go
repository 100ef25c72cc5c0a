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
//   - per currency, the issuance account holds minus the money funded, and
//     customer, issuance and transit balances sum to zero (double entry; the
//     transit balance is this region's share of the money in transit);
//   - every transfer and every credit has exactly the change-log legs its
//     status implies, with the right accounts and amounts, and no posting
//     is orphaned;
//   - consume-log rows and applied messages match one-to-one within the
//     consume-log window, and no claim is stuck PROCESSING past its lease;
//   - an account's held equals the sum of its open holds, and what is
//     available stays above its floor; a hold was held from its recording
//     until it left HELD (held_at, released_at: the held amount at an
//     instant reads them), and a refused hold never was;
//   - a capture moves at most what its hold held, and only a captured hold
//     has a captured amount;
//   - no hold is both captured and voided or expired: its status, its
//     postings and its one applied capture or void agree;
//   - the refunds of a transfer never exceed what it moved, and the
//     refunded amount kept with it (its row here, or its credit's) is the
//     sum of its refunds here that moved money;
//   - each account's events are numbered without a gap up to its
//     counter, and each transfer with events has its created event and
//     the event of its status once, and no event twice (with events off,
//     only that none was recorded);
//   - statements agree with the change-log: each row's balance_after is
//     the running sum of its account's amounts in version order, and an
//     account's rows carry times in the order of their versions (a balance
//     at an instant, and a statement's opening and closing, read them).
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
			{"transfers have the change-log rows their status implies", `SELECT (SELECT count(*) FROM transfers) + (SELECT count(*) FROM credits)`, legsSQL(), []any{s.cfg.Region}},
			{"consume-log rows match applied messages", `SELECT count(*) FROM dedup_log WHERE consumer = 'ledger'`, dedupSQL, []any{Consumer, s.cfg.Dedup.Horizon(), s.cfg.Region}},
			{"held equals the sum of open holds, within the floor", `SELECT count(*) FROM accounts`, heldSQL, nil},
			{"captures stay within their holds", `SELECT count(*) FROM transfers WHERE expires_at IS NOT NULL`, capturedSQL, nil},
			{"no hold is both captured and voided or expired", `SELECT count(*) FROM transfers WHERE expires_at IS NOT NULL`, closedOnceSQL, nil},
			{"refunds stay within what their transfer moved", `SELECT (SELECT count(*) FROM transfers WHERE type <> 'refund') + (SELECT count(*) FROM credits)`, refundedSQL, []any{s.cfg.Region}},
			{"statements agree with the change-log", `SELECT count(*) FROM postings`, statementSQL, nil},
			{"each account's events are numbered without a gap", `SELECT count(*) FROM event_sequences`, eventSequenceSQL, nil},
			{"each transfer has its events once", `SELECT count(*) FROM transfers`, s.transferEventsSQL(), nil},
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

// statementSQL names each change-log row whose balance_after is not the
// running sum of its account's amounts, or whose time is before the time
// of its account's previous version.
const statementSQL = `
	SELECT format('account %s: version %s (%s/%s) has balance_after %s, the running sum is %s; written at %s, version %s at %s',
	              account_id, account_version, transfer_id, leg, balance_after, running, created_at, account_version - 1, before)
	FROM (SELECT account_id, account_version, transfer_id, leg, balance_after, created_at,
	             sum(amount) OVER w AS running, lag(created_at) OVER w AS before
	      FROM postings WINDOW w AS (PARTITION BY account_id ORDER BY account_version)) p
	WHERE balance_after <> running OR created_at < before`

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
	           coalesce(sum(balance) FILTER (WHERE kind = 'issuance'), 0) AS issuance,
	           coalesce(sum(balance) FILTER (WHERE kind = 'transit'), 0) AS transit
	    FROM accounts GROUP BY currency),
	funded AS (
	    SELECT currency, sum(amount) AS total FROM transfers
	    WHERE type = 'fund' AND status = 'COMPLETED' GROUP BY currency)
	SELECT format('%s: customer balances %s, funded %s, issuance %s, transit %s (want issuance = -funded and a zero sum)',
	              b.currency, b.customer, coalesce(f.total, 0), b.issuance, b.transit)
	FROM bal b LEFT JOIN funded f USING (currency)
	WHERE b.issuance <> -coalesce(f.total, 0) OR b.customer + b.issuance + b.transit <> 0
	ORDER BY b.currency`

// legsSQL derives the expected legs of each status from the domain's Legs.
func legsSQL() string {
	legs := func(ls []ledger.Leg) string {
		var out []string
		for _, l := range ls {
			out = append(out, string(l))
		}
		slices.Sort(out) // string_agg below orders legs alphabetically
		return strings.Join(out, ",")
	}
	var cases strings.Builder
	for _, st := range ledger.Statuses() {
		for _, cross := range []bool{false, true} {
			fmt.Fprintf(&cases, " WHEN 'transfer/%s/%t' THEN '%s'", st, cross, legs(ledger.Legs(st, cross)))
		}
	}
	for _, st := range []ledger.CreditStatus{ledger.CreditApplied, ledger.CreditRefused} {
		fmt.Fprintf(&cases, " WHEN 'credit/%s/false' THEN '%s'", st, legs(ledger.CreditLegs(st)))
	}
	return `
	WITH x AS (
	    SELECT 'transfer' AS kind, id, from_account AS src, to_account AS dst, coalesce(captured_amount, amount) AS amount, status,
	           split_part(to_account, '-', 1) <> $1 AS cross
	    FROM transfers
	    UNION ALL
	    SELECT 'credit', transfer_id, from_account, to_account, amount, status, false FROM credits),
	l AS (
	    SELECT x.kind, x.id, x.status, x.kind || '/' || x.status || '/' || x.cross AS shape,
	           coalesce(string_agg(p.leg, ',' ORDER BY p.leg), '') AS legs,
	           bool_and(p.leg IS NULL
	                 OR (p.leg = 'debit'  AND p.amount = -x.amount AND p.account_id = x.src)
	                 OR (p.leg = 'credit' AND p.amount =  x.amount AND p.account_id = x.dst)
	                 OR (p.leg = 'refund' AND p.amount =  x.amount AND p.account_id = x.src)
	                 OR (p.leg = 'hold'   AND p.amount =  x.amount AND a.kind = 'transit')
	                 OR (p.leg IN ('release', 'unhold') AND p.amount = -x.amount AND a.kind = 'transit')) AS amounts_ok
	    FROM x LEFT JOIN postings p ON p.transfer_id = x.id
	    LEFT JOIN accounts a ON a.id = p.account_id
	    GROUP BY x.kind, x.id, x.status, x.cross)
	SELECT format('%s %s is %s with legs [%s]%s', kind, id, status, legs,
	              CASE WHEN amounts_ok THEN '' ELSE ' of wrong accounts or amounts' END)
	FROM l WHERE legs <> CASE shape` + cases.String() + ` END OR NOT amounts_ok
	UNION ALL
	SELECT format('posting %s/%s has no transfer or credit', p.transfer_id, p.leg)
	FROM postings p WHERE NOT EXISTS (SELECT FROM transfers t WHERE t.id = p.transfer_id)
	                  AND NOT EXISTS (SELECT FROM credits c WHERE c.transfer_id = p.transfer_id)`
}

// dedupSQL pairs each ledger consume-log row with what its message produced
// (the keys are Command.MsgKey): a client request 'xfer/<client>/<key>' its
// transfer; a credit step 'step/<transfer>/credit' its credit; a confirm or
// refuse step the transfer it completed or refunded.
const dedupSQL = `
	WITH d AS (
	    SELECT msg_key, status, lease_until FROM dedup_log WHERE consumer = $1),
	m AS (
	    SELECT 'xfer/' || client_id || '/' || idempotency_key AS msg_key, id, created_at FROM transfers
	    UNION ALL
	    SELECT 'step/' || transfer_id || '/credit', transfer_id, created_at FROM credits
	    UNION ALL
	    SELECT 'step/' || id || '/' || CASE status WHEN 'COMPLETED' THEN 'confirm' ELSE 'refuse' END, id, created_at
	    FROM transfers WHERE status IN ('COMPLETED', 'REFUNDED') AND split_part(to_account, '-', 1) <> $3
	    UNION ALL
	    SELECT 'xfer/' || client_id || '/' || idempotency_key, transfer_id, created_at FROM transfer_actions
	    UNION ALL
	    SELECT 'xfer/' || client_id || '/' || idempotency_key, account_id, created_at FROM account_actions
	    UNION ALL
	    SELECT 'step/' || id || '/expire', id, created_at FROM transfers WHERE status = 'EXPIRED')
	SELECT format('consume-log row %s has nothing it applied', d.msg_key)
	FROM d LEFT JOIN m USING (msg_key) WHERE d.status = 'PROCESSED' AND m.id IS NULL
	UNION ALL
	SELECT format('consume-log row %s is stuck PROCESSING (lease ended %s)', d.msg_key, d.lease_until)
	FROM d WHERE d.status = 'PROCESSING' AND d.lease_until < now()
	UNION ALL
	SELECT format('%s has %s consume-log rows, want 1', m.msg_key, count(d.msg_key))
	FROM m LEFT JOIN d USING (msg_key) WHERE m.created_at >= $2
	GROUP BY m.msg_key HAVING count(d.msg_key) <> 1`

// heldSQL: every account's held is what its open holds reserve, a debit
// could never have used more than was available above the floor, and each
// hold's times agree with its status.
const heldSQL = `
	SELECT format('account %s: held %s, its open holds sum to %s', a.id, a.held, coalesce(h.total, 0))
	FROM accounts a
	LEFT JOIN (SELECT from_account, sum(amount) AS total FROM transfers WHERE status = 'HELD' GROUP BY from_account) h
	       ON h.from_account = a.id
	WHERE a.held <> coalesce(h.total, 0)
	UNION ALL
	SELECT format('account %s: balance %s less held %s is below its floor %s', id, balance, held, floor)
	FROM accounts WHERE balance::numeric - held < floor
	UNION ALL
	SELECT format('account %s is closed with balance %s and held %s', id, balance, held)
	FROM accounts WHERE closed AND (balance <> 0 OR held <> 0)
	UNION ALL
	SELECT format('transfer %s is %s, held from %s to %s', id, status, coalesce(held_at::text, 'never'), coalesce(released_at::text, 'now'))
	FROM transfers
	WHERE (held_at IS NULL) <> (expires_at IS NULL OR status = 'REJECTED')
	   OR (held_at IS NOT NULL AND (released_at IS NULL) <> (status = 'HELD'))
	   OR released_at < held_at`

// capturedSQL: a captured amount belongs to a captured hold, within what
// it held, and every captured hold has one.
const capturedSQL = `
	SELECT format('transfer %s is %s with captured amount %s of %s held', id, status, coalesce(captured_amount::text, 'none'), amount)
	FROM transfers
	WHERE (captured_amount IS NOT NULL AND (expires_at IS NULL OR captured_amount <= 0 OR captured_amount > amount))
	   OR (expires_at IS NOT NULL AND status IN ('COMPLETED', 'DEBITED', 'REFUNDED') AND captured_amount IS NULL)`

// closedOnceSQL: a hold ends one way. A voided or expired hold moved
// nothing; the one capture or void that applied to a hold is the way it
// ended (an expired or open hold has none), and no applied action names a
// transfer that is not a hold.
const closedOnceSQL = `
	WITH applied AS (
	    SELECT transfer_id, count(*) AS n, min(type) AS type FROM transfer_actions WHERE status = 'APPLIED' GROUP BY transfer_id)
	SELECT format('hold %s is %s with %s applied action(s) (%s), captured %s, %s posting(s)', t.id, t.status,
	              coalesce(a.n, 0), coalesce(a.type, 'none'), coalesce(t.captured_amount::text, 'none'),
	              (SELECT count(*) FROM postings p WHERE p.transfer_id = t.id))
	FROM transfers t LEFT JOIN applied a ON a.transfer_id = t.id
	WHERE t.expires_at IS NOT NULL AND (
	      coalesce(a.n, 0) > 1
	   OR (t.status IN ('VOIDED', 'EXPIRED') AND (t.captured_amount IS NOT NULL OR EXISTS (SELECT 1 FROM postings p WHERE p.transfer_id = t.id)))
	   OR (t.status = 'VOIDED' AND a.type IS DISTINCT FROM 'void')
	   OR (t.status IN ('EXPIRED', 'HELD', 'REJECTED') AND a.n IS NOT NULL)
	   OR (t.status IN ('COMPLETED', 'DEBITED', 'REFUNDED') AND a.type IS DISTINCT FROM 'capture'))
	UNION ALL
	SELECT format('%s %s applied to %s, which is not a hold here', a.type, a.idempotency_key, a.transfer_id)
	FROM transfer_actions a LEFT JOIN transfers t ON t.id = a.transfer_id
	WHERE a.status = 'APPLIED' AND (t.id IS NULL OR t.expires_at IS NULL)`

// refundedSQL: the refunded amount kept with a transfer (its row, for a
// transfer made here; its credit's, for one credited here from another
// region) is the sum of its refunds decided here that moved money (those
// not refused), and never more than the transfer moved.
const refundedSQL = `
	WITH r AS (
	    SELECT refund_of, sum(amount) AS total FROM transfers
	    WHERE type = 'refund' AND status IN ('COMPLETED', 'DEBITED') GROUP BY refund_of),
	kept AS (
	    SELECT 'transfer' AS kind, id, coalesce(captured_amount, amount) AS moved, refunded_amount FROM transfers
	    WHERE type <> 'refund' AND split_part(to_account, '-', 1) = $1
	    UNION ALL
	    SELECT 'credit', transfer_id, amount, refunded_amount FROM credits WHERE refund_of IS NULL)
	SELECT format('%s %s moved %s: refunded amount %s, its refunds here sum to %s', k.kind, k.id, k.moved, k.refunded_amount, coalesce(r.total, 0))
	FROM kept k LEFT JOIN r ON r.refund_of = k.id
	WHERE k.refunded_amount <> coalesce(r.total, 0) OR coalesce(r.total, 0) > k.moved OR k.refunded_amount > k.moved
	UNION ALL
	SELECT format('refund %s names %s, which it cannot refund here', t.id, t.refund_of)
	FROM transfers t
	WHERE t.type = 'refund' AND t.status IN ('COMPLETED', 'DEBITED')
	  AND NOT EXISTS (SELECT 1 FROM transfers p WHERE p.id = t.refund_of AND p.type <> 'refund' AND p.status = 'COMPLETED')
	  AND NOT EXISTS (SELECT 1 FROM credits c WHERE c.transfer_id = t.refund_of AND c.refund_of IS NULL AND c.status = 'CREDITED')`

// eventSequenceSQL names each account whose events leave a gap, or whose
// last event is not its counter's. Retention deletes an account's oldest
// first (created_at follows the sequence), so the kept ones run unbroken.
const eventSequenceSQL = `
	SELECT format('account %s: events %s..%s are %s rows, its counter is at %s', coalesce(e.account_id, s.account_id), e.lo, e.hi, e.n, s.last)
	FROM (SELECT account_id, min(sequence) AS lo, max(sequence) AS hi, count(*) AS n FROM events GROUP BY account_id) e
	FULL JOIN event_sequences s USING (account_id)
	WHERE e.hi - e.lo + 1 <> e.n OR e.hi IS DISTINCT FROM s.last AND e.n IS NOT NULL`

// transferEventsSQL names each transfer with events that lacks its
// created event or the event of its status, or has an event twice; with
// events off, any event at all. A transfer with no event left (retention,
// or recorded before events) is not checked: a lost event leaves a gap in
// its account's sequence, or its counter above it, which
// eventSequenceSQL names. The status events come from the domain's
// StatusEvent.
func (s *Store) transferEventsSQL() string {
	if s.cfg.NoEvents {
		return `SELECT format('event %s.%s (%s) recorded with events off', account_id, sequence, type) FROM events`
	}
	var cases strings.Builder
	for _, refund := range []bool{false, true} {
		for _, st := range ledger.Statuses() {
			if t, ok := ledger.StatusEvent(refund, st); ok {
				fmt.Fprintf(&cases, " WHEN '%t/%s' THEN '%s'", refund, st, t)
			}
		}
	}
	return `
	WITH ev AS (
	    SELECT object_id, type, count(*) AS n FROM events WHERE type LIKE 'transfer.%' OR type LIKE 'refund.%' GROUP BY object_id, type),
	want AS (
	    SELECT t.id, t.status, w.type
	    FROM transfers t,
	         LATERAL (VALUES (CASE WHEN t.type = 'refund' THEN 'refund.created' ELSE 'transfer.created' END),
	                         (CASE (t.type = 'refund')::text || '/' || t.status` + cases.String() + ` END)) w(type)
	    WHERE w.type IS NOT NULL AND EXISTS (SELECT 1 FROM ev WHERE ev.object_id = t.id))
	SELECT format('transfer %s (%s): %s %s events, want 1', w.id, w.status, coalesce(ev.n, 0), w.type)
	FROM want w LEFT JOIN ev ON ev.object_id = w.id AND ev.type = w.type
	WHERE coalesce(ev.n, 0) <> 1
	UNION ALL
	SELECT format('transfer %s: %s %s events', object_id, n, type) FROM ev WHERE n > 1`
}
