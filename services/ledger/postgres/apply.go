package postgres

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
)

// Apply applies a batch of valid commands (Command.Validate passed) in ONE
// transaction and returns one result per command, in order:
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
	claims, err := s.cfg.Dedup.ClaimForTx(ctx, tx, Consumer, keys)
	if err != nil {
		return nil, nil, err
	}
	var first, dups []int
	for i, c := range claims {
		switch c.Outcome {
		case dedup.First:
			first = append(first, i)
		case dedup.Duplicate:
			results[i] = ledger.Result{Kind: ledger.Duplicate, Layer: string(c.Layer)}
			if c.Layer == dedup.LayerTable {
				dups = append(dups, i)
			}
		case dedup.InProgress:
			results[i] = ledger.Result{Kind: ledger.InProgress}
		case dedup.Conflict:
			results[i] = conflict(cmds[i], c.Layer)
		}
	}
	if len(first)+len(dups) == 0 {
		return results, nil, nil
	}

	// Layer 5: business keys, and the stored outcome of the duplicates the
	// consume-log caught (a replay answers with the first outcome).
	known, err := existingTransfers(ctx, tx, cmds, append(first, dups...))
	if err != nil {
		return nil, nil, err
	}
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
	var release, keep []dedup.Claim
	var apply []int
	batchIDs := map[string]bool{}
	for _, i := range first {
		c := cmds[i]
		if batchIDs[c.TransferID] {
			// The same transfer ID under another key earlier in this batch.
			release = append(release, claims[i])
			results[i] = ledger.Result{Kind: ledger.Invalid, DeadLetter: true,
				Err: ledger.Errorf(ledger.CodeTransferIDReused, "transfer id %s already belongs to another request in this batch", c.TransferID)}
			continue
		}
		batchIDs[c.TransferID] = true
		if t, ok := known.byKey[[2]string{c.ClientID, c.IdempotencyKey}]; ok {
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
		keep = append(keep, claims[i])
		apply = append(apply, i)
	}
	if err := s.cfg.Dedup.Release(ctx, tx, Consumer, release); err != nil {
		return nil, nil, err
	}
	if len(apply) == 0 {
		return results, nil, nil
	}

	batch := make([]ledger.Command, len(apply))
	for n, i := range apply {
		batch[n] = cmds[i]
	}
	if err := resolveIssuance(ctx, tx, batch); err != nil {
		return nil, nil, err
	}
	accounts, err := lockAccounts(ctx, tx, batch)
	if err != nil {
		return nil, nil, err
	}
	plan := ledger.PlanBatch(accounts, batch)
	if err := writePlan(ctx, tx, batch, plan); err != nil {
		return nil, nil, err
	}
	for n, i := range apply {
		o := plan.Outcomes[n]
		if o.Rejected() {
			results[i] = ledger.Result{Kind: ledger.Rejected, Transfer: o.Transfer,
				Err:        o.Err,
				DeadLetter: deadLetterReason(o.Transfer.Reason)}
		} else {
			results[i] = ledger.Result{Kind: ledger.Applied, Transfer: o.Transfer}
		}
	}
	if s.cfg.BeforeCommit != nil {
		if err := s.cfg.BeforeCommit(ctx); err != nil {
			return nil, nil, err
		}
	}
	return results, keep, nil
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

// existingTransfers finds transfers sharing a business key or an ID with the
// commands at idx.
func existingTransfers(ctx context.Context, tx pgx.Tx, cmds []ledger.Command, idx []int) (knownTransfers, error) {
	clients, ikeys, ids := make([]string, len(idx)), make([]string, len(idx)), make([]string, len(idx))
	for n, i := range idx {
		clients[n], ikeys[n], ids[n] = cmds[i].ClientID, cmds[i].IdempotencyKey, cmds[i].TransferID
	}
	rows, err := tx.Query(ctx, `
		SELECT t.* FROM unnest($1::text[], $2::text[]) AS k(client_id, idempotency_key)
		CROSS JOIN LATERAL (
		    -- LIMIT 1 keeps this a per-key index lookup whatever the plan.
		    SELECT `+transferColumns+` FROM transfers
		    WHERE client_id = k.client_id AND idempotency_key = k.idempotency_key LIMIT 1) t
		UNION
		SELECT `+transferColumns+` FROM transfers WHERE id = ANY($3::text[])`, clients, ikeys, ids)
	if err != nil {
		return knownTransfers{}, fmt.Errorf("read business keys: %w", err)
	}
	ts, err := pgx.CollectRows(rows, scanTransfer)
	if err != nil {
		return knownTransfers{}, fmt.Errorf("read business keys: %w", err)
	}
	k := knownTransfers{byKey: map[[2]string]ledger.Transfer{}, byID: map[string]bool{}}
	for _, t := range ts {
		k.byKey[[2]string{t.ClientID, t.IdempotencyKey}] = t
		k.byID[t.ID] = true
	}
	return k, nil
}

// resolveIssuance points each fund command's From at the region's issuance
// account of its currency. A currency without one leaves From empty, and the
// plan rejects the command as account_not_found.
func resolveIssuance(ctx context.Context, tx pgx.Tx, cmds []ledger.Command) error {
	var currencies []string
	for _, c := range cmds {
		if c.Type == ledger.TypeFund && !slices.Contains(currencies, c.Currency) {
			currencies = append(currencies, c.Currency)
		}
	}
	if len(currencies) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT currency, id FROM accounts WHERE kind = 'issuance' AND currency = ANY($1::text[])`, currencies)
	if err != nil {
		return fmt.Errorf("read issuance accounts: %w", err)
	}
	mint := map[string]string{}
	var cur, id string
	_, err = pgx.ForEachRow(rows, []any{&cur, &id}, func() error { mint[cur] = id; return nil })
	if err != nil {
		return fmt.Errorf("read issuance accounts: %w", err)
	}
	for i := range cmds {
		if cmds[i].Type == ledger.TypeFund {
			cmds[i].From = mint[cmds[i].Currency]
		}
	}
	return nil
}

// lockAccounts reads and row-locks every account the commands name, in
// sorted ID order.
func lockAccounts(ctx context.Context, tx pgx.Tx, cmds []ledger.Command) (map[string]ledger.Account, error) {
	ids := make([]string, 0, 2*len(cmds))
	for _, c := range cmds {
		if c.From != "" {
			ids = append(ids, c.From)
		}
		ids = append(ids, c.To)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rows, err := tx.Query(ctx, `SELECT `+accountColumns+` FROM accounts WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`, ids)
	if err != nil {
		return nil, fmt.Errorf("lock accounts: %w", err)
	}
	as, err := pgx.CollectRows(rows, scanAccount)
	if err != nil {
		return nil, fmt.Errorf("lock accounts: %w", err)
	}
	m := make(map[string]ledger.Account, len(as))
	for _, a := range as {
		m[a.ID] = a
	}
	return m, nil
}

// writePlan writes a planned batch with set-based statements, sent in one
// round trip: the transfers, the change-log rows and one compare-and-set
// balance update per account.
func writePlan(ctx context.Context, tx pgx.Tx, cmds []ledger.Command, p ledger.Plan) error {
	n := len(p.Outcomes)
	var (
		tID, tClient, tKey, tType, tFrom, tTo, tCur, tStatus = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		tReason                                              = make([]*string, n)
		tFP                                                  = make([][]byte, n)
		tAmount, tVersion                                    = make([]int64, n), make([]int64, n)
		tCreated                                             = make([]any, n)
		pTransfer, pLeg, pAccount                            []string
		pAmount, pAfter, pVersion                            []int64
	)
	for i, o := range p.Outcomes {
		t := o.Transfer
		tID[i], tClient[i], tKey[i], tType[i] = t.ID, t.ClientID, t.IdempotencyKey, cmds[i].Type
		tFrom[i], tTo[i], tCur[i], tStatus[i] = t.From, t.To, t.Currency, string(t.Status)
		if t.Reason != "" {
			r := string(t.Reason)
			tReason[i] = &r
		}
		tFP[i], tAmount[i], tVersion[i], tCreated[i] = t.Fingerprint, t.Amount, t.Version, t.CreatedAt
		for _, ps := range o.Postings {
			pTransfer, pLeg, pAccount = append(pTransfer, ps.TransferID), append(pLeg, string(ps.Leg)), append(pAccount, ps.AccountID)
			pAmount, pAfter, pVersion = append(pAmount, ps.Amount), append(pAfter, ps.BalanceAfter), append(pVersion, ps.AccountVersion)
		}
	}
	aID := make([]string, len(p.Accounts))
	aFrom, aTo, aBal := make([]int64, len(p.Accounts)), make([]int64, len(p.Accounts)), make([]int64, len(p.Accounts))
	for i, a := range p.Accounts {
		aID[i], aFrom[i], aTo[i], aBal[i] = a.ID, a.FromVersion, a.ToVersion, a.ToBalance
	}

	b := &pgx.Batch{}
	b.Queue(`
		INSERT INTO transfers (id, client_id, idempotency_key, type, from_account, to_account, currency, status, reason,
		                       fingerprint, amount, version, created_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
		                     $9::text[], $10::bytea[], $11::bigint[], $12::bigint[], $13::timestamptz[])`,
		tID, tClient, tKey, tType, tFrom, tTo, tCur, tStatus, tReason, tFP, tAmount, tVersion, tCreated)
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
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	return nil
}

// updateBalancesSQL sets each account's balance and version only where the
// version is still the one the batch read.
const updateBalancesSQL = `
	UPDATE accounts a SET balance = u.balance, version = u.to_version
	FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(id, from_version, to_version, balance)
	WHERE a.id = u.id AND a.version = u.from_version`
