package postgres

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
)

// Apply applies a batch of valid commands (Command.Validate passed) in ONE
// transaction of four round trips (BEGIN, steps 1-3 pipelined, step 5,
// COMMIT) and returns one result per command, in order:
//
//  1. claim every message key in the consume-log (one multi-row insert);
//  2. look up the business keys (client, idempotency key) and transfer IDs
//     of the claimed commands: a hit is a duplicate the consume-log no longer
//     knew, or a reused key, and its claim is released;
//  3. lock every account the batch touches, in sorted ID order, so
//     concurrent batches cannot deadlock;
//  4. plan the batch in the domain (exact floor and overflow checks, in
//     message order);
//  5. write the transfers, the change-log and one balance update per
//     account, guarded by a compare-and-set on the account version (the
//     claims were written PROCESSED in step 1: see dedup.ClaimForTx);
//  6. commit. If the connection dies during COMMIT, the consume-log row of
//     a claimed key is read back to learn whether the batch committed.
//
// The whole transaction is retried on serialization failures, deadlocks,
// lock timeouts and unique-key races. It returns an error only when the
// batch could not be applied at all; nothing was then committed, or the
// outcome is unknown and the messages must not be acked.
func (s *Store) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	keys := make([]dedup.Key, len(cmds))
	for i, c := range cmds {
		keys[i] = dedup.Key{ID: c.MsgKey(), Origin: c.CreatedAt, Fingerprint: c.Fingerprint()}
		if s.cfg.Bugs.DedupByTransferID && !c.IsStep() { // deliberate bug, tests only
			keys[i].ID += "#" + c.TransferID
		}
	}
	if claims, ok := s.cfg.Dedup.SettledWithoutTable(Consumer, keys); ok {
		// Every command is a redelivery of a recent commit (layer 3, the
		// recent-commit cache): no transaction at all.
		results := make([]ledger.Result, len(cmds))
		for i, c := range claims {
			results[i] = claimResult(cmds[i], c)
		}
		return results, nil
	}
	var (
		results []ledger.Result
		applied []dedup.Claim
	)
	committed := func(ctx context.Context) (bool, error) {
		if len(applied) == 0 {
			return false, nil
		}
		return s.cfg.Dedup.IsMine(ctx, s.pool, Consumer, applied[0])
	}
	err := s.transact(ctx, "apply batch", func(tx pgx.Tx) error {
		var err error
		results, applied, err = s.applyTx(ctx, tx, cmds, keys)
		return err
	}, committed)
	if err != nil {
		return nil, err
	}
	// Cache the committed keys, except refusals that are dead-lettered: their
	// redeliveries must reach the table to be dead-lettered again.
	refused := map[string]bool{}
	for i, r := range results {
		if r.DeadLetter {
			refused[keys[i].ID] = true
		}
	}
	cacheable := applied[:0:0]
	for _, c := range applied {
		if !refused[c.Key.ID] {
			cacheable = append(cacheable, c)
		}
	}
	s.cfg.Dedup.Committed(Consumer, cacheable)
	return results, nil
}

func (s *Store) applyTx(ctx context.Context, tx pgx.Tx, cmds []ledger.Command, keys []dedup.Key) ([]ledger.Result, []dedup.Claim, error) {
	results := make([]ledger.Result, len(cmds))
	// One round trip for every read: the consume-log claim, the business
	// keys, the credits and the row locks, pipelined. The reads cover every
	// command the recent cache did not settle; a command the claim then
	// finds to be a duplicate was read and locked for nothing, which is
	// cheaper than another round trip.
	b := &pgx.Batch{}
	pending, err := s.cfg.Dedup.QueueClaimForTx(b, Consumer, keys)
	if err != nil {
		return nil, nil, err
	}
	var open []int
	for i := range cmds {
		if !pending.Settled(i) {
			open = append(open, i)
		}
	}
	known := queueExistingTransfers(b, cmds, requests(cmds, open))
	credited := queueExistingCredits(b, cmds, open)
	state, err := s.queueLockState(ctx, tx, b, pick(cmds, open))
	if err != nil {
		return nil, nil, err
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, nil, fmt.Errorf("read batch: %w", err)
		}
	}
	claims, err := pending.Finish(ctx, tx)
	if err != nil {
		return nil, nil, err
	}
	if s.cfg.Bugs.SeenBeforeCommit { // deliberate bug, tests only: the first claims cached before COMMIT
		s.cfg.Dedup.Committed(Consumer, claims)
	}
	var first, dups []int
	for i, c := range claims {
		switch c.Outcome {
		case dedup.First:
			first = append(first, i)
		case dedup.Duplicate:
			if c.Layer == dedup.LayerTable && !cmds[i].IsStep() {
				dups = append(dups, i)
			}
		}
		results[i] = claimResult(cmds[i], c)
	}
	if len(first)+len(dups) == 0 {
		return results, nil, nil
	}

	// Layer 5: business keys, and the stored outcome of the duplicates the
	// consume-log caught (a replay answers with the first outcome).
	for _, i := range dups {
		if t, ok := known.byKey[[2]string{cmds[i].ClientID, cmds[i].IdempotencyKey}]; ok {
			results[i].Transfer = t
			// A refusal that must be dead-lettered is dead-lettered on every
			// delivery, in case an earlier dead-letter publish failed (the
			// dead-letter stream drops the repeats).
			results[i].DeadLetter = deadLetterReason(t.Reason)
			if results[i].DeadLetter {
				results[i].Err = ledger.Errorf(t.Reason, "transfer %s was refused: %s", t.ID, t.Reason)
			}
		}
	}
	var release []dedup.Claim
	var apply []int
	batchIDs := map[string]bool{}
	for _, i := range first {
		c := cmds[i]
		if c.Type == ledger.TypeCredit {
			if _, ok := credited[c.TransferID]; ok {
				release = append(release, claims[i])
				results[i] = ledger.Result{Kind: ledger.Duplicate, Layer: string(dedup.LayerBusinessKey)}
				continue
			}
			apply = append(apply, i)
			continue
		}
		if c.IsStep() { // confirm, refuse: the state machine decides
			apply = append(apply, i)
			continue
		}
		if batchIDs[c.TransferID] {
			// The same transfer ID under another key earlier in this batch.
			release = append(release, claims[i])
			results[i] = ledger.Result{Kind: ledger.Invalid, DeadLetter: true,
				Err: ledger.Errorf(ledger.CodeTransferIDReused, "transfer id %s already belongs to another request in this batch", c.TransferID)}
			continue
		}
		batchIDs[c.TransferID] = true
		if t, ok := known.byKey[[2]string{c.ClientID, c.IdempotencyKey}]; ok && !s.cfg.Bugs.DedupByTransferID { // deliberate bug, tests only
			release = append(release, claims[i])
			if bytes.Equal(t.Fingerprint, c.Fingerprint()) {
				results[i] = ledger.Result{Kind: ledger.Duplicate, Layer: string(dedup.LayerBusinessKey), Transfer: t}
			} else {
				results[i] = conflict(c, dedup.LayerBusinessKey)
			}
			continue
		}
		if _, ok := known.byID[c.TransferID]; ok {
			release = append(release, claims[i])
			results[i] = ledger.Result{Kind: ledger.Invalid, DeadLetter: true,
				Err: ledger.Errorf(ledger.CodeTransferIDReused, "transfer id %s already belongs to another request", c.TransferID)}
			continue
		}
		apply = append(apply, i)
	}

	var keep []dedup.Claim
	b = &pgx.Batch{}
	if len(apply) > 0 {
		batch := pick(cmds, apply)
		plan := state.Plan(batch)
		for n, i := range apply {
			o := plan.Outcomes[n]
			r := ledger.Result{Kind: o.Result, Transfer: o.Transfer, Err: o.Err, Credit: o.Credit}
			switch o.Result {
			case ledger.Applied, ledger.Rejected:
				keep = append(keep, claims[i])
				r.DeadLetter = o.Result == ledger.Rejected && deadLetterReason(o.Transfer.Reason)
			case ledger.Duplicate: // the transfer already took this step
				release = append(release, claims[i])
				r.Layer = string(dedup.LayerStateCAS)
			case ledger.Parked:
				release = append(release, claims[i])
			case ledger.Invalid:
				release = append(release, claims[i])
				r.DeadLetter = true
			}
			results[i] = r
		}
		s.queuePlan(b, batch, plan)
	}
	// The first responses go in the same round trip as the writes.
	s.queueResponses(b, cmds, results)
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, nil, fmt.Errorf("write batch: %w", err)
		}
	}
	if err := s.cfg.Dedup.Release(ctx, tx, Consumer, release); err != nil {
		return nil, nil, err
	}
	if s.cfg.BeforeCommit != nil {
		if err := s.cfg.BeforeCommit(ctx); err != nil {
			return nil, nil, err
		}
	}
	return results, keep, nil
}

// claimResult is the result a claim settles on its own: a duplicate (with
// the layer that caught it), a key another holder has in progress, or a key
// reused for another request. A first claim is decided later (zero Result).
func claimResult(cmd ledger.Command, c dedup.Claim) ledger.Result {
	switch c.Outcome {
	case dedup.Duplicate:
		return ledger.Result{Kind: ledger.Duplicate, Layer: string(c.Layer)}
	case dedup.InProgress:
		return ledger.Result{Kind: ledger.InProgress}
	case dedup.Conflict:
		return conflict(cmd, c.Layer)
	}
	return ledger.Result{}
}

// pick returns the commands at idx.
func pick(cmds []ledger.Command, idx []int) []ledger.Command {
	out := make([]ledger.Command, len(idx))
	for n, i := range idx {
		out[n] = cmds[i]
	}
	return out
}

// requests filters idx down to client requests (transfer, fund).
func requests(cmds []ledger.Command, idx []int) []int {
	var out []int
	for _, i := range idx {
		if !cmds[i].IsStep() {
			out = append(out, i)
		}
	}
	return out
}

// deadLetterReason reports whether a refusal means the command can never
// apply as sent (it names an account that does not exist), so it also goes
// to the dead-letter stream.
func deadLetterReason(c ledger.Code) bool { return c == ledger.CodeAccountNotFound }

// conflict answers a reuse of an idempotency key for another request. It can
// never apply as sent, so it is dead-lettered.
func conflict(c ledger.Command, layer dedup.Layer) ledger.Result {
	return ledger.Result{Kind: ledger.Conflict, Layer: string(layer), DeadLetter: true,
		Err: ledger.Errorf(ledger.CodeIdempotencyKeyReused, "idempotency key %q of client %q was used for a different request", c.IdempotencyKey, c.ClientID)}
}

type knownTransfers struct {
	byKey map[[2]string]ledger.Transfer
	byID  map[string]bool
}

// queueExistingTransfers queues the lookup of transfers sharing a business
// key or an ID with the commands at idx; the result is filled in when the
// batch runs.
func queueExistingTransfers(b *pgx.Batch, cmds []ledger.Command, idx []int) *knownTransfers {
	k := &knownTransfers{byKey: map[[2]string]ledger.Transfer{}, byID: map[string]bool{}}
	if len(idx) == 0 {
		return k
	}
	clients, ikeys, ids := make([]string, len(idx)), make([]string, len(idx)), make([]string, len(idx))
	for n, i := range idx {
		clients[n], ikeys[n], ids[n] = cmds[i].ClientID, cmds[i].IdempotencyKey, cmds[i].TransferID
	}
	b.Queue(`
		SELECT t.* FROM unnest($1::text[], $2::text[]) AS k(client_id, idempotency_key)
		CROSS JOIN LATERAL (
		    -- LIMIT 1 keeps this a per-key index lookup whatever the plan.
		    SELECT `+transferColumns+` FROM transfers
		    WHERE client_id = k.client_id AND idempotency_key = k.idempotency_key LIMIT 1) t
		UNION
		SELECT `+transferColumns+` FROM transfers WHERE id = ANY($3::text[])`, clients, ikeys, ids).Query(func(rows pgx.Rows) error {
		ts, err := pgx.CollectRows(rows, scanTransfer)
		if err != nil {
			return fmt.Errorf("read business keys: %w", err)
		}
		for _, t := range ts {
			k.byKey[[2]string{t.ClientID, t.IdempotencyKey}] = t
			k.byID[t.ID] = true
		}
		return nil
	})
	return k
}

// queueExistingCredits queues the lookup of the credits already recorded
// for the credit steps at idx (the business key of a credit is its
// transfer); the set is filled in when the batch runs.
func queueExistingCredits(b *pgx.Batch, cmds []ledger.Command, idx []int) map[string]bool {
	out := map[string]bool{}
	var ids []string
	for _, i := range idx {
		if cmds[i].Type == ledger.TypeCredit {
			ids = append(ids, cmds[i].TransferID)
		}
	}
	if len(ids) == 0 {
		return out
	}
	b.Queue(`SELECT transfer_id FROM credits WHERE transfer_id = ANY($1::text[])`, ids).Query(func(rows pgx.Rows) error {
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("read credits: %w", err)
		}
		for _, id := range got {
			out[id] = true
		}
		return nil
	})
	return out
}

// systemAccounts fills in the issuance and transit account IDs of the
// currencies. They never change once created, so they are cached; only a
// currency not seen before costs a query.
func (s *Store) systemAccounts(ctx context.Context, tx pgx.Tx, currencies []string, issuance, transit map[string]string) error {
	var missing []string
	for _, c := range currencies {
		if ids, ok := s.system.Load(c); ok {
			issuance[c], transit[c] = ids.([2]string)[0], ids.([2]string)[1]
		} else {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT currency, kind, id FROM accounts WHERE kind IN ('issuance', 'transit') AND currency = ANY($1::text[])`, missing)
	if err != nil {
		return fmt.Errorf("read system accounts: %w", err)
	}
	var cur, kind, id string
	_, err = pgx.ForEachRow(rows, []any{&cur, &kind, &id}, func() error {
		map[string]map[string]string{"issuance": issuance, "transit": transit}[kind][cur] = id
		return nil
	})
	if err != nil {
		return fmt.Errorf("read system accounts: %w", err)
	}
	for _, c := range missing {
		if issuance[c] != "" && transit[c] != "" {
			s.system.Store(c, [2]string{issuance[c], transit[c]})
		}
	}
	return nil
}

// queueLockState queues the reads and row locks of what cmds touch, always
// in the same order so that concurrent batches cannot deadlock: first the
// transfers that confirm and refuse steps settle (sorted), then every
// account (sorted), including the region's issuance and transit accounts of
// the currencies involved. The returned state is filled in when the batch
// runs. Only a currency never seen before costs a query of its own, for its
// system accounts.
func (s *Store) queueLockState(ctx context.Context, tx pgx.Tx, b *pgx.Batch, cmds []ledger.Command) (*ledger.Batch, error) {
	st := &ledger.Batch{Home: s.cfg.Region, Regions: s.cfg.Regions, Issuance: map[string]string{}, Transit: map[string]string{},
		Accounts: map[string]ledger.Account{}, Bugs: s.cfg.Bugs}
	if len(cmds) == 0 {
		return st, nil
	}
	var currencies, settle []string
	for _, c := range cmds {
		if !slices.Contains(currencies, c.Currency) {
			currencies = append(currencies, c.Currency)
		}
		if c.Type == ledger.TypeConfirm || c.Type == ledger.TypeRefuse {
			settle = append(settle, c.TransferID)
		}
	}
	if err := s.systemAccounts(ctx, tx, currencies, st.Issuance, st.Transit); err != nil {
		return nil, err
	}
	if len(settle) > 0 {
		slices.Sort(settle)
		settle = slices.Compact(settle)
		b.Queue(`SELECT `+transferColumns+` FROM transfers WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`, settle).Query(func(rows pgx.Rows) error {
			ts, err := pgx.CollectRows(rows, scanTransfer)
			if err != nil {
				return fmt.Errorf("lock transfers: %w", err)
			}
			st.Transfers = make(map[string]ledger.Transfer, len(ts))
			for _, t := range ts {
				st.Transfers[t.ID] = t
			}
			return nil
		})
	}
	ids := make([]string, 0, 2*len(cmds))
	for _, c := range cmds {
		switch c.Type {
		case ledger.TypeFund:
			ids = append(ids, st.Issuance[c.Currency], c.To)
		case ledger.TypeTransfer:
			// Only a cross-region transfer touches the transit account: a
			// lock on it would serialise every batch of the currency.
			if to, _ := s.cfg.Regions.HomeRegion(c.To); to == s.cfg.Region {
				ids = append(ids, c.From, c.To)
			} else {
				ids = append(ids, c.From, st.Transit[c.Currency])
			}
		case ledger.TypeCredit:
			ids = append(ids, c.To, st.Transit[c.Currency])
		case ledger.TypeRefuse:
			ids = append(ids, c.From, st.Transit[c.Currency])
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) > 0 && ids[0] == "" {
		ids = ids[1:]
	}
	if len(ids) > 0 {
		b.Queue(`SELECT `+accountColumns+` FROM accounts WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`, ids).Query(func(rows pgx.Rows) error {
			as, err := pgx.CollectRows(rows, scanAccount)
			if err != nil {
				return fmt.Errorf("lock accounts: %w", err)
			}
			for _, a := range as {
				st.Accounts[a.ID] = a
			}
			return nil
		})
	}
	return st, nil
}

// queuePlan queues the writes of a planned batch as set-based statements,
// sent in one round trip: new transfers, compare-and-set updates of settled
// transfers, credits, the change-log, one compare-and-set balance update
// per account, and the outbox rows of the next saga steps.
func (s *Store) queuePlan(b *pgx.Batch, cmds []ledger.Command, p ledger.Plan) {
	var (
		nt                              newTransfers
		uID, uFrom, uTo, uReason        []string
		uFromV, uToV                    []int64
		cID, cFrom, cTo, cCur, cStatus  []string
		cReason                         []*string
		cAmount                         []int64
		cCreated                        []time.Time
		pTransfer, pLeg, pAccount       []string
		pAmount, pAfter, pVersion       []int64
		oMsg, oRegion, oAccount, oTrace []string
		oPayload                        [][]byte
	)
	for i, o := range p.Outcomes {
		c := cmds[i]
		switch {
		case !c.IsStep() && (o.Result == ledger.Applied || o.Result == ledger.Rejected):
			nt.add(c, o.Transfer)
		case o.Credit != nil:
			cr := o.Credit
			cID, cFrom, cTo, cCur, cStatus = append(cID, cr.TransferID), append(cFrom, cr.From), append(cTo, cr.To), append(cCur, cr.Currency), append(cStatus, string(cr.Status))
			cReason, cAmount, cCreated = append(cReason, optional(cr.Reason)), append(cAmount, cr.Amount), append(cCreated, cr.CreatedAt)
		case o.Result == ledger.Applied: // a settled transfer
			t := o.Transfer
			uID, uFrom, uTo, uReason = append(uID, t.ID), append(uFrom, string(o.FromStatus)), append(uTo, string(t.Status)), append(uReason, string(t.Reason))
			uFromV, uToV = append(uFromV, o.FromVersion), append(uToV, t.Version)
		}
		for _, ps := range o.Postings {
			pTransfer, pLeg, pAccount = append(pTransfer, ps.TransferID), append(pLeg, string(ps.Leg)), append(pAccount, ps.AccountID)
			pAmount, pAfter, pVersion = append(pAmount, ps.Amount), append(pAfter, ps.BalanceAfter), append(pVersion, ps.AccountVersion)
		}
		for _, m := range o.Outbox {
			oMsg, oRegion, oAccount = append(oMsg, m.Command.MsgKey()), append(oRegion, m.Region), append(oAccount, m.Account)
			oTrace = append(oTrace, c.Trace)
			oPayload = append(oPayload, m.Command.Encode())
		}
	}
	aID := make([]string, len(p.Accounts))
	aFrom, aTo, aBal := make([]int64, len(p.Accounts)), make([]int64, len(p.Accounts)), make([]int64, len(p.Accounts))
	for i, a := range p.Accounts {
		aID[i], aFrom[i], aTo[i], aBal[i] = a.ID, a.FromVersion, a.ToVersion, a.ToBalance
	}

	if len(nt.id) > 0 {
		b.Queue(`
			INSERT INTO transfers (id, client_id, idempotency_key, type, from_account, to_account, currency, status, reason,
			                       fingerprint, amount, version, created_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
			                     $9::text[], $10::bytea[], $11::bigint[], $12::bigint[], $13::timestamptz[])`,
			nt.id, nt.client, nt.key, nt.typ, nt.from, nt.to, nt.cur, nt.status, nt.reason, nt.fp, nt.amount, nt.version, nt.created)
	}
	if len(uID) > 0 {
		advance := advanceTransfersSQL
		if s.cfg.Bugs.DropStateCAS { // deliberate bug, tests only
			advance = advanceTransfersNoCAS
		}
		b.Queue(advance, uID, uFrom, uFromV, uTo, uToV, uReason).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != int64(len(uID)) {
				s.stats().StaleVersions.Add(1)
				return ledger.Errorf(ledger.CodeStaleVersion, "transfer compare-and-set matched %d of %d transfers", tag.RowsAffected(), len(uID))
			}
			return nil
		})
	}
	if len(cID) > 0 {
		b.Queue(`
			INSERT INTO credits (transfer_id, from_account, to_account, currency, status, reason, amount, created_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[])`,
			cID, cFrom, cTo, cCur, cStatus, cReason, cAmount, cCreated)
	}
	if len(pTransfer) > 0 {
		b.Queue(`
			INSERT INTO postings (transfer_id, leg, account_id, amount, balance_after, account_version)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])`,
			pTransfer, pLeg, pAccount, pAmount, pAfter, pVersion)
	}
	if len(aID) > 0 {
		b.Queue(updateBalancesSQL, aID, aFrom, aTo, aBal).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != int64(len(aID)) {
				return ledger.Errorf(ledger.CodeStaleVersion, "balance compare-and-set matched %d of %d accounts", tag.RowsAffected(), len(aID))
			}
			return nil
		})
	}
	if len(oMsg) > 0 {
		b.Queue(`
			INSERT INTO outbox (msg_id, region, account, payload, trace_parent)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[])`,
			oMsg, oRegion, oAccount, oPayload, oTrace)
	}
}

// newTransfers collects the columns of the transfers a batch records.
type newTransfers struct {
	id, client, key, typ, from, to, cur, status []string
	reason                                      []*string
	fp                                          [][]byte
	amount, version                             []int64
	created                                     []time.Time
}

func (n *newTransfers) add(c ledger.Command, t ledger.Transfer) {
	n.id, n.client, n.key, n.typ = append(n.id, t.ID), append(n.client, t.ClientID), append(n.key, t.IdempotencyKey), append(n.typ, c.Type)
	n.from, n.to, n.cur, n.status = append(n.from, t.From), append(n.to, t.To), append(n.cur, t.Currency), append(n.status, string(t.Status))
	n.reason, n.fp = append(n.reason, optional(t.Reason)), append(n.fp, t.Fingerprint)
	n.amount, n.version, n.created = append(n.amount, t.Amount), append(n.version, t.Version), append(n.created, t.CreatedAt)
}

func optional(c ledger.Code) *string {
	if c == "" {
		return nil
	}
	s := string(c)
	return &s
}

// advanceTransfersSQL moves each transfer to its next status where it is
// still in the status and version the batch read: the state machine's
// compare-and-set. advanceTransfersNoCAS, without it, is the DropStateCAS
// bug.
const (
	advanceTransfersNoCAS = `
	UPDATE transfers t SET status = u.status, version = u.to_version, reason = nullif(u.reason, ''), settled_at = now()
	FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[])
	     AS u(id, from_status, from_version, status, to_version, reason)
	WHERE t.id = u.id`
	advanceTransfersSQL = advanceTransfersNoCAS + ` AND t.status = u.from_status AND t.version = u.from_version`
)

// updateBalancesSQL sets each account's balance and version only where the
// version is still the one the batch read.
const updateBalancesSQL = `
	UPDATE accounts a SET balance = u.balance, version = u.to_version
	FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(id, from_version, to_version, balance)
	WHERE a.id = u.id AND a.version = u.from_version`
