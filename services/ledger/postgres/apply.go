package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/services/ledger"
)

// Exactly once, layer by layer. A client request passes six layers on its
// way to its effects, outermost first (ledger.Layers); every duplicate one
// of them catches is counted under that layer's name:
//
//  1. Idempotency-Key (ledger.LayerIdempotencyKey): the API answers a
//     repeated request with its stored response (services/api; the write
//     stage stores the first response, queueResponses).
//  2. Msg-Id (LayerMsgID): the route and ledger streams' Nats-Msg-Id
//     duplicate window drops a repeated publish (JetStream; the ledger
//     streams' window is set by jetstream.EnsureStreams).
//  3. Recent cache (LayerRecentCache): pkg/dedup's Cache, asked by
//     dedup.Log.SettledWithoutTable in Apply before any transaction, and by
//     the claim; Apply fills it after COMMIT (dedup.Log.Committed).
//  4. Consume-log table (LayerConsumeLog): pkg/dedup's dedup_log row of
//     every message key, claimed in this transaction (claim, through
//     dedup.Log.QueueClaimForTx).
//  5. Business key (LayerBusinessKey): the transfer a client's idempotency
//     key made and the credit of a transfer, read by claim and matched by
//     classify; the unique constraints of transfers and credits back them.
//  6. State CAS (LayerStateCAS): the transfer state machine (ledger.Next,
//     in ledger.Batch.Plan, run by plan) and the compare-and-set on
//     (status, version) (advanceTransfersSQL, queued by write).
//
// A saga step meets layers 2 to 6: a credit's business key is its transfer,
// and a confirm or refuse is settled by the state CAS.

// Apply applies a batch of valid commands (Command.Validate passed) in ONE
// transaction of four round trips (BEGIN, the claim stage's reads, the
// write stage's writes, COMMIT) and returns one result per command, in
// order. The transaction runs in four stages (applyTx):
//
//  1. claim: claim every message key in the consume-log, read the business
//     keys, transfer IDs and credits of the claimed commands, and lock every
//     account the batch touches in sorted ID order (so concurrent batches
//     cannot deadlock), pipelined in one round trip;
//  2. classify: decide each command's fate from what claim read: a
//     duplicate (and the layer that caught it), a conflict, a reused
//     transfer ID (their first claims released), or to apply;
//  3. plan: plan the commands to apply in the domain (exact floor and
//     overflow checks, in message order) and map each outcome to its
//     result;
//  4. write: the transfers, the change-log, one balance update per account
//     guarded by a compare-and-set on its version, and the first responses,
//     in one round trip; then the releases (the claims were written
//     PROCESSED by claim: see dedup.Log.ClaimForTx).
//
// If the connection dies during COMMIT, the consume-log row of a kept claim
// is read back to learn whether the batch committed. The whole transaction
// is retried on serialization failures, deadlocks, lock timeouts and
// unique-key races. It returns an error only when the batch could not be
// applied at all; nothing was then committed, or the outcome is unknown and
// the messages must not be acked.
func (s *Store) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	keys := make([]dedup.Key, len(cmds))
	for i, c := range cmds {
		keys[i] = dedup.Key{ID: s.requestKey(c), Origin: c.CreatedAt, Fingerprint: c.Fingerprint()}
	}
	if claims, ok := s.cfg.Dedup.SettledWithoutTable(Consumer, keys); ok {
		// Every command is a redelivery of a recent commit (layer 3, the
		// recent-commit cache): no transaction at all.
		return resultsOf(cmds, classify(cmds, claims, knownTransfers{}, nil)), nil
	}
	var (
		results []ledger.Result
		kept    []dedup.Claim // the first claims the transaction commits
	)
	committed := func(ctx context.Context) (bool, error) {
		if len(kept) == 0 {
			return false, nil
		}
		return s.cfg.Dedup.IsMine(ctx, s.pool, Consumer, kept[0])
	}
	err := s.transact(ctx, "apply batch", func(tx pgx.Tx) error {
		var err error
		results, kept, err = s.applyTx(ctx, tx, cmds, keys)
		return err
	}, committed)
	if err != nil {
		return nil, err
	}
	// Cache the committed keys, except refusals that are dead-lettered: their
	// redeliveries must reach the table to be dead-lettered again. Count the
	// steps the state machine refused: a saga step out of order, a capture
	// or void of a transfer that is no longer (or never was) an open hold.
	refused := map[string]bool{}
	for i, r := range results {
		if r.DeadLetter {
			refused[keys[i].ID] = true
		}
		if r.Err != nil && (r.Err.Code == ledger.CodeIllegalTransition || r.Err.Code == ledger.CodeTransferNotHeld) {
			s.stats().IllegalTransitions.Add(1)
		}
	}
	cacheable := kept[:0:0]
	for _, c := range kept {
		if !refused[c.Key.ID] {
			cacheable = append(cacheable, c)
		}
	}
	s.cfg.Dedup.Committed(Consumer, cacheable)
	return results, nil
}

// requestKey is the command's consume-log key (ConsumeLog.RequestKey).
func (s *Store) requestKey(c ledger.Command) string { return s.cfg.Dedup.RequestKey(c) }

// applyTx is one attempt of the apply transaction: claim → classify → plan
// → write. It returns the results and the first claims it keeps.
func (s *Store) applyTx(ctx context.Context, tx pgx.Tx, cmds []ledger.Command, keys []dedup.Key) ([]ledger.Result, []dedup.Claim, error) {
	rd, err := s.claim(ctx, tx, cmds, keys)
	if err != nil {
		return nil, nil, err
	}
	fates := classify(cmds, rd.claims, rd.known, rd.credited)
	results := resultsOf(cmds, fates)
	for i, c := range cmds {
		// A repeated capture or void is answered with its first record and
		// the hold as it is now (locked by the claim stage), a repeated
		// account action with the account as it is now.
		r := &results[i]
		switch {
		case r.Action == nil || rd.state == nil:
		case c.IsAction():
			r.Transfer = rd.state.Transfers[c.TransferID]
		case c.IsAccountAction():
			if a, ok := rd.state.Accounts[c.From]; ok {
				r.Account = &a
			}
		}
		nameHolder(c, r, rd.state)
	}
	if settledByClaims(cmds, rd.claims) {
		return results, nil, nil
	}
	p := plan(rd.state, cmds, rd.claims, fates, results)
	if err := s.write(ctx, tx, cmds, results, p); err != nil {
		return nil, nil, err
	}
	return results, p.keep, nil
}

// claimed is what the claim stage read.
type claimed struct {
	claims []dedup.Claim
	// known holds the transfers that share a business key or an ID with
	// the claimed requests, credited the transfers whose credit is
	// recorded.
	known    knownTransfers
	credited map[string]bool
	// state holds the locked rows the batch is planned against.
	state *ledger.Batch
}

// claim is the read stage, one round trip: the consume-log claim (layer 4),
// the business keys and credits (layer 5), and the row locks, pipelined.
// The reads cover every command the recent cache did not settle; a command
// the claim then finds to be a duplicate was read and locked for nothing,
// which is cheaper than another round trip.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, cmds []ledger.Command, keys []dedup.Key) (claimed, error) {
	b := &pgx.Batch{}
	pending, err := s.cfg.Dedup.QueueClaimForTx(b, Consumer, keys)
	if err != nil {
		return claimed{}, err
	}
	var open []int
	for i := range cmds {
		if !pending.Settled(i) {
			open = append(open, i)
		}
	}
	reqs, acts := requests(cmds, open), actions(cmds, open)
	keyed := append(slices.Clone(reqs), acts...) // every client request: its key
	var promised func(ledger.Command) bool
	if kl, ok := s.cfg.Answers.(KeyLocker); ok {
		promised = kl.QueueKeyLocks(b, pick(cmds, keyed))
	}
	known := s.queueExistingTransfers(b, cmds, reqs)
	known.actions = s.queueExistingActions(b, cmds, acts)
	refs := queueReferences(b, cmds, reqs)
	credited := queueExistingCredits(b, cmds, open)
	state, err := s.queueLockState(ctx, tx, b, pick(cmds, open))
	if err != nil {
		return claimed{}, err
	}
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return claimed{}, fmt.Errorf("read batch: %w", err)
		}
	}
	claims, err := pending.Finish(ctx, tx)
	if err != nil {
		return claimed{}, err
	}
	state.References = refs
	// The batch is decided now, with its rows locked: a hold that expired
	// while this transaction waited for a lock is expired for it.
	state.Now = s.now()
	if promised != nil {
		known.promised = map[string]bool{}
		for _, i := range keyed {
			if promised(cmds[i]) {
				known.promised[keys[i].ID] = true
			}
		}
	}
	return claimed{claims: claims, known: *known, credited: credited, state: state}, nil
}

// planned is the plan stage's answer.
type planned struct {
	cmds []ledger.Command // the commands planned, in message order
	plan ledger.Plan
	// keep holds the first claims that commit with their effects, release
	// those given back: their commands did not apply.
	keep, release []dedup.Claim
}

// plan is the domain stage: it plans the commands classify let through
// against the locked rows (ledger.Batch.Plan, where the state machine of
// layer 6 decides the saga steps), fills in their results, and sorts their
// first claims into kept and released, after those classify released.
func plan(state *ledger.Batch, cmds []ledger.Command, claims []dedup.Claim, fates []fate, results []ledger.Result) planned {
	var p planned
	var idx []int
	for i, f := range fates {
		switch {
		case f.kind == fateApply:
			idx = append(idx, i)
		case f.release:
			p.release = append(p.release, claims[i])
		}
	}
	if len(idx) == 0 {
		return p
	}
	p.cmds = pick(cmds, idx)
	p.plan = state.Plan(p.cmds)
	for n, i := range idx {
		o := p.plan.Outcomes[n]
		r := ledger.Result{Kind: o.Result, Transfer: o.Transfer, Err: o.Err, Credit: o.Credit, Action: o.Action, Account: o.Account,
			Outbox: o.Outbox}
		switch o.Result {
		case ledger.Applied, ledger.Rejected:
			p.keep = append(p.keep, claims[i])
		case ledger.AwaitingAccount:
			// Nothing is recorded, so that a replay after the account is
			// created applies the request: its claim is given back.
			p.release = append(p.release, claims[i])
			r.DeadLetter = true
		case ledger.Duplicate: // the transfer already took this step
			p.release = append(p.release, claims[i])
			r.Layer = ledger.LayerStateCAS
		case ledger.Parked:
			p.release = append(p.release, claims[i])
		case ledger.Invalid:
			p.release = append(p.release, claims[i])
			r.DeadLetter = true
		}
		results[i] = r
	}
	return p
}

// write is the write stage, one round trip: the plan's writes and the first
// responses; then the released claims are deleted, the transaction's last statement.
func (s *Store) write(ctx context.Context, tx pgx.Tx, cmds []ledger.Command, results []ledger.Result, p planned) error {
	b := &pgx.Batch{}
	if len(p.cmds) > 0 {
		s.queuePlan(b, p.cmds, p.plan)
	}
	// The first responses go in the same round trip as the writes.
	s.queueResponses(b, cmds, results)
	if b.Len() > 0 {
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("write batch: %w", err)
		}
	}
	return s.cfg.Dedup.Release(ctx, tx, Consumer, p.release)
}

// pick returns the commands at idx.
func pick(cmds []ledger.Command, idx []int) []ledger.Command {
	out := make([]ledger.Command, len(idx))
	for n, i := range idx {
		out[n] = cmds[i]
	}
	return out
}

// requests filters idx down to the client requests that make a transfer
// (transfer, fund, refund).
func requests(cmds []ledger.Command, idx []int) []int {
	var out []int
	for _, i := range idx {
		if !cmds[i].IsStep() && !cmds[i].IsKeyedAction() {
			out = append(out, i)
		}
	}
	return out
}

// actions filters idx down to captures, voids and account actions.
func actions(cmds []ledger.Command, idx []int) []int {
	var out []int
	for _, i := range idx {
		if cmds[i].IsKeyedAction() {
			out = append(out, i)
		}
	}
	return out
}

// queueExistingActions queues the lookup of the captures, voids and account
// actions recorded under the keys of the actions at idx (their business
// key), by request key; the map is filled in when the batch runs.
func (s *Store) queueExistingActions(b *pgx.Batch, cmds []ledger.Command, idx []int) map[string]ledger.Action {
	out := map[string]ledger.Action{}
	if len(idx) == 0 {
		return out
	}
	clients, ikeys := make([]string, len(idx)), make([]string, len(idx))
	for n, i := range idx {
		clients[n], ikeys[n] = cmds[i].ClientID, cmds[i].IdempotencyKey
	}
	b.Queue(`
		SELECT `+actionColumns+`
		FROM unnest($1::text[], $2::text[]) AS k(client_id, idempotency_key)
		JOIN actions a USING (client_id, idempotency_key)`, clients, ikeys).Query(func(rows pgx.Rows) error {
		var a ledger.Action
		_, err := pgx.ForEachRow(rows, actionFields(&a), func() error {
			out[s.requestKey(ledger.Command{Type: a.Type, TransferID: a.TransferID, ClientID: a.ClientID, IdempotencyKey: a.IdempotencyKey})] = a
			return nil
		})
		if err != nil {
			return fmt.Errorf("read actions: %w", err)
		}
		return nil
	})
	return out
}

// queueExistingTransfers queues the lookup of transfers sharing a business
// key or an ID with the commands at idx; the result is filled in when the
// batch runs. A transfer is known by its request's key (ConsumeLog.RequestKey),
// the key the consume-log claims.
func (s *Store) queueExistingTransfers(b *pgx.Batch, cmds []ledger.Command, idx []int) *knownTransfers {
	k := &knownTransfers{byKey: map[string]ledger.Transfer{}, byID: map[string]bool{}}
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
			k.byKey[s.requestKey(requestOf(t))] = t
			k.byID[t.ID] = true
		}
		return nil
	})
	return k
}

// requestOf is the request that made t, as far as its key goes (a fund
// request is keyed as a transfer is).
func requestOf(t ledger.Transfer) ledger.Command {
	return ledger.Command{Type: ledger.TypeTransfer, TransferID: t.ID, ClientID: t.ClientID, IdempotencyKey: t.IdempotencyKey}
}

// queueReferences queues the lookup of the transfers, not refused, that
// hold the references of the requests at idx (the client's business key):
// by ledger.ReferenceKey, filled in when the batch runs.
func queueReferences(b *pgx.Batch, cmds []ledger.Command, idx []int) map[string]string {
	out := map[string]string{}
	var clients, refs []string
	for _, i := range idx {
		if cmds[i].Reference != "" {
			clients, refs = append(clients, cmds[i].ClientID), append(refs, cmds[i].Reference)
		}
	}
	if len(refs) == 0 {
		return out
	}
	b.Queue(`
		SELECT k.client_id, k.reference, t.id FROM unnest($1::text[], $2::text[]) AS k(client_id, reference)
		CROSS JOIN LATERAL (
		    SELECT id FROM transfers
		    WHERE client_id = k.client_id AND reference = k.reference AND status <> 'REJECTED') t`, clients, refs).Query(func(rows pgx.Rows) error {
		var client, ref, id string
		_, err := pgx.ForEachRow(rows, []any{&client, &ref, &id}, func() error {
			out[ledger.ReferenceKey(client, ref)] = id
			return nil
		})
		if err != nil {
			return fmt.Errorf("read references: %w", err)
		}
		return nil
	})
	return out
}

// nameHolder gives a repeat of a request refused for its reference the
// transfer that holds the reference, as its first answer named it.
func nameHolder(c ledger.Command, r *ledger.Result, state *ledger.Batch) {
	t := r.Transfer
	if r.Kind != ledger.Duplicate || t.Status != ledger.StatusRejected || t.Reason != ledger.CodeReferenceInUse || state == nil {
		return
	}
	if holder, ok := state.References[ledger.ReferenceKey(c.ClientID, c.Reference)]; ok {
		r.Err = ledger.Errorf(ledger.CodeReferenceInUse, "reference %q is transfer %s's", c.Reference, holder)
		r.Err.Existing = holder
	}
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
		Accounts: map[string]ledger.Account{}}
	if len(cmds) == 0 {
		return st, nil
	}
	var currencies, settle, credits []string
	for _, c := range cmds {
		if c.IsAccountAction() {
			continue // it names an account and no currency
		}
		if !slices.Contains(currencies, c.Currency) {
			currencies = append(currencies, c.Currency)
		}
		switch c.Type {
		case ledger.TypeConfirm, ledger.TypeRefuse, ledger.TypeCapture, ledger.TypeVoid, ledger.TypeExpire:
			settle = append(settle, c.TransferID)
		}
		switch {
		case c.RefundOf == "" || c.Type == ledger.TypeCredit || c.Type == ledger.TypeConfirm:
		case c.Type == ledger.TypeRefund && s.here(c.RefundOf):
			settle = append(settle, c.RefundOf) // the refunded transfer's row keeps its refunded amount
		default: // a refund of another region's transfer, a refused refund: the credit's row keeps it
			credits = append(credits, c.RefundOf)
		}
	}
	if err := s.systemAccounts(ctx, tx, currencies, st.Issuance, st.Transit); err != nil {
		return nil, err
	}
	st.Transfers = map[string]ledger.Transfer{}
	queueLocked(b, "transfers", `SELECT `+transferColumns+` FROM transfers WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`,
		settle, scanTransfer, func(t ledger.Transfer) { st.Transfers[t.ID] = t })
	st.Credits = map[string]ledger.Credit{}
	queueLocked(b, "credits", `SELECT `+creditColumns+` FROM credits WHERE transfer_id = ANY($1::text[]) ORDER BY transfer_id FOR UPDATE`,
		credits, scanCredit, func(cr ledger.Credit) { st.Credits[cr.TransferID] = cr })
	ids := make([]string, 0, 2*len(cmds))
	for _, c := range cmds {
		switch c.Type {
		case ledger.TypeFund:
			ids = append(ids, st.Issuance[c.Currency], c.To)
		case ledger.TypeTransfer, ledger.TypeRefund, ledger.TypeCapture:
			// Only a cross-region transfer touches the transit account: a
			// lock on it would serialise every batch of the currency. A
			// hold moves nothing until its capture.
			switch to, _ := s.cfg.Regions.HomeRegion(c.To); {
			case to == s.cfg.Region:
				ids = append(ids, c.From, c.To)
			case c.Hold:
				ids = append(ids, c.From)
			default:
				ids = append(ids, c.From, st.Transit[c.Currency])
			}
		case ledger.TypeVoid, ledger.TypeExpire, ledger.TypeClose, ledger.TypeFreeze, ledger.TypeUnfreeze:
			ids = append(ids, c.From)
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
	queueInFlight(b, cmds, st)
	return st, nil
}

// queueInFlight queues, when a batch closes accounts, the count of each
// one's transfers on their way to another region (DEBITED) into
// st.InFlight. It is queued after the account locks: a debit that
// committed before them is counted.
func queueInFlight(b *pgx.Batch, cmds []ledger.Command, st *ledger.Batch) {
	var closing []string
	for _, c := range cmds {
		if c.Type == ledger.TypeClose {
			closing = append(closing, c.From)
		}
	}
	if len(closing) == 0 {
		return
	}
	st.InFlight = map[string]int{}
	b.Queue(`SELECT from_account, count(*) FROM transfers WHERE from_account = ANY($1::text[]) AND status = 'DEBITED' GROUP BY from_account`,
		closing).Query(func(rows pgx.Rows) error {
		var id string
		var n int
		_, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error {
			st.InFlight[id] = n
			return nil
		})
		if err != nil {
			return fmt.Errorf("read transfers in flight: %w", err)
		}
		return nil
	})
}

// queueLocked queues, when there are ids, the statement sql that reads and
// locks the rows of ids (sorted and deduplicated, so that concurrent
// batches lock in one order) and hands each to put.
func queueLocked[T any](b *pgx.Batch, what, sql string, ids []string, scan pgx.RowToFunc[T], put func(T)) {
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	b.Queue(sql, ids).Query(func(rows pgx.Rows) error {
		xs, err := pgx.CollectRows(rows, scan)
		if err != nil {
			return fmt.Errorf("lock %s: %w", what, err)
		}
		for _, x := range xs {
			put(x)
		}
		return nil
	})
}

// queuePlan queues the writes of a planned batch as set-based statements,
// sent in one round trip: new transfers, compare-and-set updates of settled
// transfers, credits, the change-log, one compare-and-set balance update
// per account, the outbox rows of the next saga steps, and the events.
func (s *Store) queuePlan(b *pgx.Batch, cmds []ledger.Command, p ledger.Plan) {
	var w planWrites
	if s.cfg.StepHandoff > 0 {
		w.outbox.handoff = time.Now().Add(s.cfg.StepHandoff)
	}
	var evs []ledger.Emitted
	for i, o := range p.Outcomes {
		w.add(cmds[i], o)
		if !s.cfg.NoEvents {
			evs = ledger.AppendEvents(evs[:0], cmds[i], o)
			for _, e := range evs {
				w.events.add(e)
			}
		}
	}
	w.transfers.queue(b)
	w.actions.queue(b)
	w.accountActions.queue(b)
	w.states.queue(b)
	s.queueAdvanced(b, w.advanced)
	w.credits.queue(b)
	s.queueRefunded(b, p.Refunded)
	w.postings.queue(b)
	queueBalances(b, p.Accounts)
	w.outbox.queue(b)
	queueCancelTimers(b, w.cancelTimers)
	w.events.queue(b)
}

// planWrites collects, column by column, the rows a planned batch writes.
type planWrites struct {
	transfers newTransfers
	actions   newActions
	// accountActions and states are the account actions' records and the
	// accounts they closed, froze or unfroze.
	accountActions newAccountActions
	states         accountStates
	advanced       advancedTransfers
	credits        newCredits
	postings       newPostings
	outbox         newOutbox
	events         newEvents
	// cancelTimers holds the outbox keys of the expiry steps of holds
	// captured or voided.
	cancelTimers []string
}

// add collects the writes of command c's outcome o.
func (w *planWrites) add(c ledger.Command, o ledger.Outcome) {
	switch {
	case o.Action != nil && c.IsAccountAction():
		w.accountActions.add(o.Action)
	case o.Action != nil:
		w.actions.add(o.Action)
	}
	if o.Account != nil && o.Result == ledger.Applied {
		w.states.add(o.Account)
	}
	switch {
	case c.IsAccountAction():
	case !c.IsStep() && !c.IsAction() && (o.Result == ledger.Applied || o.Result == ledger.Rejected):
		w.transfers.add(c, o.Transfer)
	case o.Credit != nil:
		w.credits.add(o.Credit)
	case o.Result == ledger.Applied: // a transfer moved on: settled, captured, voided, expired
		w.advanced.add(o)
	}
	if o.CancelTimer != "" {
		w.cancelTimers = append(w.cancelTimers, ledger.Command{Type: ledger.TypeExpire, TransferID: o.CancelTimer}.MsgKey())
	}
	for _, ps := range o.Postings {
		w.postings.add(ps)
	}
	for _, m := range o.Outbox {
		w.outbox.add(m, c.Trace)
	}
}

// queue queues the insert of the transfers, if any.
func (n *newTransfers) queue(b *pgx.Batch) {
	if len(n.id) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO transfers (id, client_id, idempotency_key, type, from_account, to_account, currency, status, reason,
		                       fingerprint, amount, version, created_at, expires_at, refund_of, reference, metadata, held_at)
		SELECT *, CASE WHEN u.status = 'HELD' THEN statement_timestamp() END
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
		            $9::text[], $10::bytea[], $11::bigint[], $12::bigint[], $13::timestamptz[], $14::timestamptz[], $15::text[],
		            $16::text[], $17::jsonb[])
		     AS u(id, client_id, idempotency_key, type, from_account, to_account, currency, status, reason,
		          fingerprint, amount, version, created_at, expires_at, refund_of, reference, metadata)`,
		n.id, n.client, n.key, n.typ, n.from, n.to, n.cur, n.status, n.reason, n.fp, n.amount, n.version, n.created,
		n.expires, n.refundOf, n.reference, n.metadata)
}

// queue queues the insert of the captures and voids, if any.
func (n *newActions) queue(b *pgx.Batch) {
	if len(n.transfer) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO transfer_actions (client_id, idempotency_key, fingerprint, transfer_id, type, amount, status, reason, created_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::timestamptz[])`,
		n.client, n.key, n.fp, n.transfer, n.typ, n.amount, n.status, n.reason, n.created)
}

// newAccountActions collects the columns of the account actions a batch
// records.
type newAccountActions struct {
	client, key, account, typ, status []string
	reason                            []*string
	fp                                [][]byte
	created                           []time.Time
}

func (n *newAccountActions) add(a *ledger.Action) {
	n.client, n.key, n.account, n.typ = append(n.client, a.ClientID), append(n.key, a.IdempotencyKey), append(n.account, a.AccountID), append(n.typ, a.Type)
	n.status, n.reason, n.fp, n.created = append(n.status, string(a.Status)), append(n.reason, optional(a.Reason)), append(n.fp, a.Fingerprint), append(n.created, a.CreatedAt)
}

// queue queues the insert of the account actions, if any.
func (n *newAccountActions) queue(b *pgx.Batch) {
	if len(n.account) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO account_actions (client_id, idempotency_key, fingerprint, account_id, type, status, reason, created_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[])`,
		n.client, n.key, n.fp, n.account, n.typ, n.status, n.reason, n.created)
}

// accountStates collects the closed and frozen flags of the accounts a
// batch's account actions changed: the last state of each (one batch may
// freeze and unfreeze an account).
type accountStates struct {
	at             map[string]int
	id             []string
	closed, frozen []bool
}

func (u *accountStates) add(a *ledger.Account) {
	if i, ok := u.at[a.ID]; ok {
		u.closed[i], u.frozen[i] = a.Closed, a.Frozen
		return
	}
	if u.at == nil {
		u.at = map[string]int{}
	}
	u.at[a.ID] = len(u.id)
	u.id, u.closed, u.frozen = append(u.id, a.ID), append(u.closed, a.Closed), append(u.frozen, a.Frozen)
}

// queue queues the update of the accounts' flags, if any (their rows are
// locked by the claim stage).
func (u *accountStates) queue(b *pgx.Batch) {
	if len(u.id) == 0 {
		return
	}
	b.Queue(`UPDATE accounts a SET closed = u.closed, frozen = u.frozen
		FROM unnest($1::text[], $2::bool[], $3::bool[]) AS u(id, closed, frozen) WHERE a.id = u.id`, u.id, u.closed, u.frozen)
}

// advancedTransfers collects the columns of the transfers a batch moves to
// their next status.
type advancedTransfers struct {
	id, from, to, reason []string
	fromV, toV, captured []int64
}

func (u *advancedTransfers) add(o ledger.Outcome) {
	t := o.Transfer
	u.id, u.from, u.to, u.reason = append(u.id, t.ID), append(u.from, string(o.FromStatus)), append(u.to, string(t.Status)), append(u.reason, string(t.Reason))
	u.fromV, u.toV, u.captured = append(u.fromV, o.FromVersion), append(u.toV, t.Version), append(u.captured, t.CapturedAmount)
}

// queueAdvanced queues the compare-and-set of the advanced transfers, if
// any; it fails the batch unless every transfer is still in the status and
// version the batch read.
func (s *Store) queueAdvanced(b *pgx.Batch, u advancedTransfers) {
	if len(u.id) == 0 {
		return
	}
	b.Queue(advanceTransfersSQL, u.id, u.from, u.fromV, u.to, u.toV, u.reason, u.captured).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != int64(len(u.id)) {
			s.stats().StaleVersions.Add(1)
			return ledger.Errorf(ledger.CodeStaleVersion, "transfer compare-and-set matched %d of %d transfers", tag.RowsAffected(), len(u.id))
		}
		return nil
	})
}

// newCredits collects the columns of the credits a batch records.
type newCredits struct {
	id, from, to, cur, status []string
	reason, refundOf          []*string
	amount                    []int64
	created                   []time.Time
}

func (n *newCredits) add(cr *ledger.Credit) {
	n.id, n.from, n.to, n.cur, n.status = append(n.id, cr.TransferID), append(n.from, cr.From), append(n.to, cr.To), append(n.cur, cr.Currency), append(n.status, string(cr.Status))
	n.reason, n.amount, n.created = append(n.reason, optional(cr.Reason)), append(n.amount, cr.Amount), append(n.created, cr.CreatedAt)
	n.refundOf = append(n.refundOf, optional(ledger.Code(cr.RefundOf)))
}

// queue queues the insert of the credits, if any.
func (n *newCredits) queue(b *pgx.Batch) {
	if len(n.id) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO credits (transfer_id, from_account, to_account, currency, status, reason, amount, created_at, refund_of)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[], $9::text[])`,
		n.id, n.from, n.to, n.cur, n.status, n.reason, n.amount, n.created, n.refundOf)
}

// newPostings collects the columns of the change-log rows a batch records.
type newPostings struct {
	transfer, leg, account []string
	amount, after, version []int64
}

func (n *newPostings) add(ps ledger.Posting) {
	n.transfer, n.leg, n.account = append(n.transfer, ps.TransferID), append(n.leg, string(ps.Leg)), append(n.account, ps.AccountID)
	n.amount, n.after, n.version = append(n.amount, ps.Amount), append(n.after, ps.BalanceAfter), append(n.version, ps.AccountVersion)
}

// queue queues the insert of the postings, if any.
func (n *newPostings) queue(b *pgx.Batch) {
	if len(n.transfer) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO postings (transfer_id, leg, account_id, amount, balance_after, account_version)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])`,
		n.transfer, n.leg, n.account, n.amount, n.after, n.version)
}

// queueBalances queues one compare-and-set balance update per changed
// account, if any; it fails the batch unless every account is still in the
// version and held amount the batch read.
func queueBalances(b *pgx.Batch, accounts []ledger.AccountChange) {
	if len(accounts) == 0 {
		return
	}
	id := make([]string, len(accounts))
	from, to, bal := make([]int64, len(accounts)), make([]int64, len(accounts)), make([]int64, len(accounts))
	fromHeld, held := make([]int64, len(accounts)), make([]int64, len(accounts))
	for i, a := range accounts {
		id[i], from[i], to[i], bal[i] = a.ID, a.FromVersion, a.ToVersion, a.ToBalance
		fromHeld[i], held[i] = a.FromHeld, a.ToHeld
	}
	b.Queue(updateBalancesSQL, id, from, to, bal, fromHeld, held).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != int64(len(id)) {
			return ledger.Errorf(ledger.CodeStaleVersion, "balance compare-and-set matched %d of %d accounts", tag.RowsAffected(), len(id))
		}
		return nil
	})
}

// newOutbox collects the columns of the outbox rows a batch queues: the
// saga steps it causes, each with the trace of the delivery that caused it.
type newOutbox struct {
	msg, region, account, trace []string
	payload                     [][]byte
	due                         []*time.Time
	// handoff, when set, is when the relay may take the steps due now:
	// until then they are the caller's to publish (Config.StepHandoff).
	handoff time.Time
}

func (n *newOutbox) add(m ledger.OutboxMessage, trace string) {
	n.msg, n.region, n.account = append(n.msg, m.Command.MsgKey()), append(n.region, m.Region), append(n.account, m.Account)
	n.trace = append(n.trace, trace)
	n.payload = append(n.payload, m.Command.Encode())
	var due *time.Time
	switch {
	case !m.DueAt.IsZero():
		due = &m.DueAt
	case !n.handoff.IsZero():
		due = &n.handoff
	}
	n.due = append(n.due, due)
}

// queue queues the insert of the outbox rows, if any, and, when one of
// them is due now, a notification on OutboxChannel, which Postgres
// delivers when the transaction commits (and never if it does not): the
// relay that listens reads the outbox at once (WatchOutbox).
func (n *newOutbox) queue(b *pgx.Batch) {
	if len(n.msg) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO outbox (msg_id, region, account, payload, trace_parent, due_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::timestamptz[])`,
		n.msg, n.region, n.account, n.payload, n.trace, n.due)
	if slices.Contains(n.due, nil) {
		b.Queue(notifyOutboxSQL)
	}
}

// queueCancelTimers queues the delete of the unsent outbox rows msgIDs, if
// any: a hold captured or voided, its expiry step is not due any more. One
// already relayed finds the hold settled (a duplicate).
func queueCancelTimers(b *pgx.Batch, msgIDs []string) {
	if len(msgIDs) == 0 {
		return
	}
	b.Queue(`DELETE FROM outbox WHERE msg_id = ANY($1::text[]) AND sent_at IS NULL`, msgIDs)
}

// queueRefunded queues the refunded amounts a batch's refunds changed, each
// with a compare-and-set on the amount the batch read (the rows are locked
// as well): the cap on a transfer's refunds.
func (s *Store) queueRefunded(b *pgx.Batch, changes []ledger.RefundedChange) {
	var tID, cID []string
	var tFrom, tTo, cFrom, cTo []int64
	for _, c := range changes {
		if c.Credit {
			cID, cFrom, cTo = append(cID, c.ID), append(cFrom, c.From), append(cTo, c.To)
		} else {
			tID, tFrom, tTo = append(tID, c.ID), append(tFrom, c.From), append(tTo, c.To)
		}
	}
	for _, q := range []struct {
		table, key string
		id         []string
		from, to   []int64
	}{{"transfers", "id", tID, tFrom, tTo}, {"credits", "transfer_id", cID, cFrom, cTo}} {
		if len(q.id) == 0 {
			continue
		}
		n := len(q.id)
		b.Queue(`UPDATE `+q.table+` t SET refunded_amount = u.to_amount
			FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(id, from_amount, to_amount)
			WHERE t.`+q.key+` = u.id AND t.refunded_amount = u.from_amount`, q.id, q.from, q.to).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() != int64(n) {
				s.stats().StaleVersions.Add(1)
				return ledger.Errorf(ledger.CodeStaleVersion, "refunded compare-and-set matched %d of %d rows", tag.RowsAffected(), n)
			}
			return nil
		})
	}
}

// newActions collects the columns of the captures and voids a batch records.
type newActions struct {
	client, key, transfer, typ, status []string
	reason                             []*string
	fp                                 [][]byte
	amount                             []int64
	created                            []time.Time
}

func (n *newActions) add(a *ledger.Action) {
	n.client, n.key, n.transfer, n.typ = append(n.client, a.ClientID), append(n.key, a.IdempotencyKey), append(n.transfer, a.TransferID), append(n.typ, a.Type)
	n.status, n.reason, n.fp = append(n.status, string(a.Status)), append(n.reason, optional(a.Reason)), append(n.fp, a.Fingerprint)
	n.amount, n.created = append(n.amount, a.Amount), append(n.created, a.CreatedAt)
}

// newTransfers collects the columns of the transfers a batch records.
type newTransfers struct {
	id, client, key, typ, from, to, cur, status []string
	reason, refundOf                            []*string
	fp                                          [][]byte
	amount, version                             []int64
	created                                     []time.Time
	expires                                     []*time.Time
	// reference and metadata are NULL arrays while no transfer of the
	// batch has any (the common case costs no per-row values).
	reference, metadata []*string
}

func (n *newTransfers) add(c ledger.Command, t ledger.Transfer) {
	n.id, n.client, n.key, n.typ = append(n.id, t.ID), append(n.client, t.ClientID), append(n.key, t.IdempotencyKey), append(n.typ, c.Type)
	n.from, n.to, n.cur, n.status = append(n.from, t.From), append(n.to, t.To), append(n.cur, t.Currency), append(n.status, string(t.Status))
	n.reason, n.fp = append(n.reason, optional(t.Reason)), append(n.fp, t.Fingerprint)
	n.amount, n.version, n.created = append(n.amount, t.Amount), append(n.version, t.Version), append(n.created, t.CreatedAt)
	var expires *time.Time
	if t.IsHold() {
		expires = &t.ExpiresAt
	}
	n.expires, n.refundOf = append(n.expires, expires), append(n.refundOf, optional(ledger.Code(t.RefundOf)))
	if t.Reference == "" && t.Metadata == nil && n.reference == nil {
		return
	}
	if n.reference == nil {
		n.reference, n.metadata = make([]*string, len(n.id)-1, len(n.id)), make([]*string, len(n.id)-1, len(n.id))
	}
	n.reference, n.metadata = append(n.reference, optional(ledger.Code(t.Reference))), append(n.metadata, metadataJSON(t.Metadata))
}

// metadataJSON is metadata as a jsonb parameter, nil for none.
func metadataJSON(m map[string]string) *string {
	if m == nil {
		return nil
	}
	b, _ := json.Marshal(m) // cannot fail: strings only
	s := string(b)
	return &s
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
// compare-and-set (layer 6). A hold leaving HELD stops reserving its
// amount then (released_at).
const advanceTransfersSQL = `
	UPDATE transfers t SET status = u.status, version = u.to_version, reason = nullif(u.reason, ''),
	       captured_amount = nullif(u.captured, 0), settled_at = CASE WHEN u.status = 'DEBITED' THEN NULL ELSE now() END,
	       released_at = CASE WHEN u.from_status = 'HELD' THEN statement_timestamp() ELSE t.released_at END
	FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::bigint[])
	     AS u(id, from_status, from_version, status, to_version, reason, captured)
	WHERE t.id = u.id AND t.status = u.from_status AND t.version = u.from_version`

// updateBalancesSQL sets each account's balance and version only where the
// version is still the one the batch read.
const updateBalancesSQL = `
	UPDATE accounts a SET balance = u.balance, version = u.to_version, held = u.held
	FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[])
	     AS u(id, from_version, to_version, balance, from_held, held)
	WHERE a.id = u.id AND a.version = u.from_version AND a.held = u.from_held`
