package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// Check is one invariant's verdict; Failures names the offending
// transfers, keys or accounts (at most MaxFailures).
type Check struct {
	Name     string   `json:"name"`
	What     string   `json:"what"`
	OK       bool     `json:"ok"`
	Checked  int64    `json:"checked"`
	Failures []string `json:"failures,omitempty"`
}

// MaxFailures bounds the failures a check lists.
const MaxFailures = 20

func (c *Check) fail(format string, args ...any) {
	c.OK = false
	if len(c.Failures) < MaxFailures {
		c.Failures = append(c.Failures, fmt.Sprintf(format, args...))
	}
}

// merge folds the failed checks of a ledger report into c.
func (c *Check) merge(checks []postgres.Check) {
	for _, pc := range checks {
		c.Checked += pc.Checked
		if !pc.OK {
			for _, f := range pc.Failures {
				c.fail("%s: %s", pc.Name, f)
			}
		}
	}
}

// The invariants the checker verifies.
const (
	I1 = "I1"
	I2 = "I2"
	I3 = "I3"
	I4 = "I4"
	I5 = "I5"
	I6 = "I6"
	I7 = "I7"
)

var invariantWhat = map[string]string{
	I1: "the total per currency is constant, in-transit amounts counted",
	I2: "no balance is or was below its floor",
	I3: "every ok op has exactly one effect, an unknown one zero or one, a failed or never sent one none",
	I4: "consume-log rows and applied messages match 1:1",
	I5: "every balance equals the fold of its change-log, and every change has its events once, numbered per account without a gap",
	I6: "replaying each ledger stream from the start adds no rows",
	I7: "holds and refunds: held is the sum of open holds, captured <= held, refunded <= captured, a hold ends one way",
}

// row is a transfer row as the checker reads it.
type row struct {
	region string
	ledger.Transfer
	typ string
}

func (r row) body() Body {
	b := Body{Type: r.typ, From: r.From, To: r.To, Amount: r.Amount, Currency: strings.TrimSpace(r.Currency)}
	if r.typ == ledger.TypeFund {
		b.From = "" // the ledger fills in the issuance account
	}
	return b
}

// verdict is the checker's answer: the invariants, and the keys lost and
// doubled.
type verdict struct {
	checks  []Check
	lost    int
	doubled int
}

// check verifies I1..I5 and I7 over all regions of c against the history, with
// quiescent telling whether the cluster drained (VerifyGlobal's in-transit
// checks assume it did).
func check(ctx context.Context, c *cluster.Cluster, h *History, quiescent bool) (verdict, error) {
	var v verdict
	rep, err := postgres.VerifyGlobal(ctx, c.Stores(), quiescent)
	if err != nil {
		return v, err
	}
	// The ledger's checks, sorted into the invariants by the ends of their
	// names; every one must land in one (see the end of check).
	used := map[string]bool{}
	byName := func(suffixes ...string) []postgres.Check {
		var out []postgres.Check
		for _, ch := range rep.Checks {
			for _, s := range suffixes {
				if strings.HasSuffix(ch.Name, s) {
					out = append(out, ch)
					used[ch.Name] = true
				}
			}
		}
		return out
	}
	var rows []row
	for _, n := range sortedNames(c) {
		rs, err := readRows(ctx, c.Region(n).Ledger.Store, n)
		if err != nil {
			return v, err
		}
		rows = append(rows, rs...)
	}
	ops := h.Ops()

	i1 := newCheck(I1)
	i1.merge(byName("money per currency equals funding", "per currency, transit balances equal the money in transit",
		"after quiescence nothing is left in transit"))
	if err := checkTotals(ctx, c, ops, &i1); err != nil {
		return v, err
	}
	i2 := newCheck(I2)
	if err := checkFloors(ctx, c, &i2); err != nil {
		return v, err
	}
	i3 := newCheck(I3)
	i3.merge(byName("no transfer is credited without its debit", "no transfer is both credited and refunded; refunds answer refusals"))
	v.lost, v.doubled = checkEffects(ops, rows, &i3)
	acts, err := readActions(ctx, c)
	if err != nil {
		return v, err
	}
	v.lost += checkActions(ops, acts, &i3)
	i4 := newCheck(I4)
	i4.merge(byName("consume-log rows match applied messages"))
	i5 := newCheck(I5)
	i5.merge(byName("balance equals the sum of its change-log", "transfers have the change-log rows their status implies",
		"statements agree with the change-log", "each account's events are numbered without a gap", "each transfer has its events once"))
	i7 := newCheck(I7)
	i7.merge(byName("held equals the sum of open holds, within the floor", "captures stay within their holds",
		"no hold is both captured and voided or expired", "refunds stay within what their transfer moved"))
	v.checks = []Check{i1, i2, i3, i4, i5, i7}
	for _, ch := range rep.Checks {
		if !used[ch.Name] { // a ledger check renamed or added: it would pass unseen
			return v, fmt.Errorf("the ledger's check %q belongs to no invariant", ch.Name)
		}
	}
	return v, nil
}

func newCheck(name string) Check { return Check{Name: name, What: invariantWhat[name], OK: true} }

func sortedNames(c *cluster.Cluster) []string {
	n := c.Names()
	sort.Strings(n)
	return n
}

func readRows(ctx context.Context, s *postgres.Store, region string) ([]row, error) {
	rows, err := s.Pool().Query(ctx, `SELECT id, client_id, idempotency_key, CASE WHEN expires_at IS NULL THEN type ELSE 'hold' END,
		coalesce(from_account, ''), to_account, amount, currency, status FROM transfers`)
	if err != nil {
		return nil, fmt.Errorf("read transfers of %s: %w", region, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		x := row{region: region}
		err := r.Scan(&x.ID, &x.ClientID, &x.IdempotencyKey, &x.typ, &x.From, &x.To, &x.Amount, &x.Currency, &x.Status)
		return x, err
	})
}

// checkTotals: per currency, every balance of every region (customer,
// issuance and transit accounts) sums to zero, and the customer balances
// sum to the funding the history acknowledged.
func checkTotals(ctx context.Context, c *cluster.Cluster, ops []Op, chk *Check) error {
	total, customer := map[string]int64{}, map[string]int64{}
	for _, n := range sortedNames(c) {
		rows, err := c.Region(n).Ledger.Store.Pool().Query(ctx, `SELECT currency, kind, sum(balance)::bigint FROM accounts GROUP BY currency, kind`)
		if err != nil {
			return err
		}
		var cur, kind string
		var sum int64
		if _, err := pgx.ForEachRow(rows, []any{&cur, &kind, &sum}, func() error {
			cur = strings.TrimSpace(cur)
			total[cur] += sum
			if kind == "customer" {
				customer[cur] += sum
			}
			return nil
		}); err != nil {
			return err
		}
	}
	funded := map[string]int64{}
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Purpose == PurposeFund && op.Outcome == OK && !seen[op.Key] {
			seen[op.Key] = true
			funded[op.Body.Currency] += op.Body.Amount
		}
	}
	for _, cur := range currencies(total, funded) {
		chk.Checked++
		if total[cur] != 0 {
			chk.fail("%s: the balances of all regions sum to %d, want 0", cur, total[cur])
		}
		if customer[cur] != funded[cur] {
			chk.fail("%s: customer balances sum to %d, the acknowledged funding to %d", cur, customer[cur], funded[cur])
		}
	}
	return nil
}

func currencies(ms ...map[string]int64) []string {
	var out []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// checkFloors: no account is below its floor now, and no change-log row
// ever left one below it.
func checkFloors(ctx context.Context, c *cluster.Cluster, chk *Check) error {
	for _, n := range sortedNames(c) {
		pool := c.Region(n).Ledger.Store.Pool()
		var accounts int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM accounts`).Scan(&accounts); err != nil {
			return err
		}
		chk.Checked += accounts
		rows, err := pool.Query(ctx, `
			SELECT format('%s: account %s has balance %s below its floor %s', $1::text, id, balance, floor)
			FROM accounts WHERE balance < floor
			UNION ALL
			SELECT format('%s: transfer %s (%s) left account %s at %s, below its floor %s', $1::text, p.transfer_id, p.leg, p.account_id, p.balance_after, a.floor)
			FROM postings p JOIN accounts a ON a.id = p.account_id WHERE p.balance_after < a.floor
			LIMIT 20`, n)
		if err != nil {
			return err
		}
		fs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, f := range fs {
			chk.fail("%s", f)
		}
	}
	return nil
}

type clientKey struct{ client, key string }

// checkEffects is I3: per (client, idempotency key), the transfer rows of
// all regions against the history's ops of that key. It returns how many
// keys lost an acknowledged request and how many have more than one row.
func checkEffects(ops []Op, rows []row, chk *Check) (lost, doubled int) {
	byKey := map[clientKey][]Op{}
	var keys []clientKey
	for _, op := range ops {
		if isAction(op) {
			continue // checkActions
		}
		k := clientKey{op.Client, op.Key}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	rowsOf := map[clientKey][]row{}
	for _, r := range rows {
		k := clientKey{r.ClientID, r.IdempotencyKey}
		if _, ok := byKey[k]; !ok {
			chk.fail("transfer %s (%s, key %s/%s, in %s) was made by no request of the history", r.ID, r.body(), r.ClientID, r.IdempotencyKey, r.region)
			continue
		}
		rowsOf[k] = append(rowsOf[k], r)
	}
	for _, k := range keys {
		chk.Checked++
		kops, krows := byKey[k], rowsOf[k]
		okBodies, maybe := map[Body]bool{}, map[Body]bool{}
		ids := map[string]bool{}
		idsKnown := true
		for _, op := range kops {
			switch op.Outcome {
			case OK:
				okBodies[op.Body], maybe[op.Body] = true, true
			case Unknown, "":
				maybe[op.Body] = true
			}
			if op.Outcome != Fail {
				if op.Transfer == "" {
					idsKnown = false
				}
				ids[op.Transfer] = true
			}
		}
		name := k.client + "/" + k.key
		if len(krows) > 1 {
			doubled++
			var ts []string
			for _, r := range krows {
				ts = append(ts, r.ID+" in "+r.region)
			}
			chk.fail("key %s DOUBLED: %d transfers (%s)", name, len(krows), strings.Join(ts, ", "))
			continue
		}
		if len(krows) == 0 {
			if len(okBodies) > 0 {
				lost++
				chk.fail("key %s LOST: acknowledged (%s) but no transfer exists", name, describe(kops))
			}
			continue
		}
		r := krows[0]
		b := r.body()
		switch {
		case len(okBodies) > 1:
			lost++
			chk.fail("key %s: %d different bodies were acknowledged, one transfer %s (%s) can match only one", name, len(okBodies), r.ID, b)
		case len(okBodies) == 1 && !okBodies[b]:
			lost++
			chk.fail("key %s: transfer %s is %s, but the acknowledged request was another (%s)", name, r.ID, b, describe(kops))
		case !maybe[b] && r.Status != ledger.StatusRejected: // a refusal the ledger recorded moved nothing
			chk.fail("key %s: transfer %s (%s) answers only refused requests (%s)", name, r.ID, b, describe(kops))
		case r.Status == ledger.StatusRejected && answeredFinal(kops):
			lost++
			chk.fail("key %s LOST: answered 200/201 (%s) but transfer %s is REJECTED", name, describe(kops), r.ID)
		case idsKnown && len(ids) > 0 && !ids[r.ID]:
			chk.fail("key %s: transfer %s carries an ID no request of the key sent", name, r.ID)
		case !slices.Contains([]ledger.Status{ledger.StatusCompleted, ledger.StatusRefunded, ledger.StatusRejected, ledger.StatusVoided, ledger.StatusExpired}, r.Status):
			chk.fail("key %s: transfer %s is still %s", name, r.ID, r.Status)
		}
	}
	return lost, doubled
}

// checkUnapplied is a scenario's direct check ("applied") that requests
// it recorded as refused had no effect: no region holds a transfer, nor so
// an entry, under any of keys (I3 says the same from the history; this
// reads the rows of those keys alone).
func checkUnapplied(ctx context.Context, c *cluster.Cluster, what string, keys []clientKey) (Check, error) {
	chk := Check{Name: "applied", OK: true, Checked: int64(len(keys))}
	clients, ks := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		clients[i], ks[i] = k.client, k.key
	}
	found := 0
	for _, n := range sortedNames(c) {
		rows, err := c.Region(n).Ledger.Store.Pool().Query(ctx, `
			SELECT format('key %s/%s made transfer %s (%s %s→%s %s, %s entries) in %s', t.client_id, t.idempotency_key, t.id, t.status,
			       coalesce(t.from_account, ''), t.to_account, t.amount, (SELECT count(*) FROM postings p WHERE p.transfer_id = t.id), $3::text)
			FROM transfers t JOIN unnest($1::text[], $2::text[]) AS u(client_id, key) ON t.client_id = u.client_id AND t.idempotency_key = u.key`,
			clients, ks, n)
		if err != nil {
			return chk, fmt.Errorf("read the transfers of refused keys in %s: %w", n, err)
		}
		fs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return chk, fmt.Errorf("read the transfers of refused keys in %s: %w", n, err)
		}
		found += len(fs)
		for _, f := range fs {
			chk.fail("%s", f)
		}
	}
	chk.What = fmt.Sprintf("%s (%d keys, %d transfers)", what, len(keys), found)
	return chk, nil
}

// answeredFinal reports whether an API op of the key was answered 200 or
// 201: a final success, which a REJECTED transfer contradicts (a 202 may
// still end refused; a router's ack only says the command was stored).
func answeredFinal(ops []Op) bool {
	for _, op := range ops {
		if op.Path == "api" && op.Outcome == OK && (op.Detail == "200" || op.Detail == "201") {
			return true
		}
	}
	return false
}

// describe summarises a key's ops: outcome and purpose of each.
func describe(ops []Op) string {
	var parts []string
	for _, op := range ops {
		parts = append(parts, fmt.Sprintf("%s %s via %s %s: %s", op.Purpose, op.Path, op.Via, op.Body, op.Outcome))
	}
	if len(parts) > 4 {
		parts = append(parts[:4], fmt.Sprintf("+%d more", len(parts)-4))
	}
	return strings.Join(parts, "; ")
}
