package postgres

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// Events. Every change a client can see (ledger.AppendEvents) is recorded as an
// event in the transaction that makes it: the apply's write stage queues
// one set-based insert for the batch's events (newEvents.queue), and the
// opening of an account one of its own. The events table is the events'
// outbox: the feed reads it and webhook delivery relays it, so an event
// exists exactly when its change committed. Config.NoEvents turns them off.

// DefaultEventRetention is how long an event is kept: the feed reads back
// 30 days, ten times webhook delivery's longest retry.
const DefaultEventRetention = 30 * 24 * time.Hour

// newEvents collects the columns of the events a batch emits.
type newEvents struct {
	account, client, typ, object, status []string
	reason                               []*string
	version, captured                    []int64
}

func (n *newEvents) add(e ledger.Emitted) {
	n.account, n.client, n.typ, n.object = append(n.account, e.Account), append(n.client, e.Client), append(n.typ, string(e.Type)), append(n.object, e.Object)
	n.status, n.reason = append(n.status, e.Status), append(n.reason, optional(e.Reason))
	n.version, n.captured = append(n.version, e.Version), append(n.captured, e.Captured)
}

// insertEventsSQL records a batch's events, numbering each account's in
// the order given after the account's last sequence, each in the feed of
// the account's owner (a funding is the funded client's news, not the
// operator's), so that a client sees every sequence of its accounts. The counter's upsert
// locks its rows in account order and holds them to COMMIT, so a
// concurrent batch numbering the same account waits: the sequences of an
// account commit in order and leave no gap.
const insertEventsSQL = `
	WITH ev AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[])
		     WITH ORDINALITY AS u(account_id, client_id, type, object_id, status, reason, version, captured_amount, ord)
	), n AS (
		SELECT account_id, count(*) AS c FROM ev GROUP BY account_id
	), seq AS (
		INSERT INTO event_sequences AS s (account_id, last)
		SELECT account_id, c FROM n ORDER BY account_id
		ON CONFLICT (account_id) DO UPDATE SET last = s.last + excluded.last
		RETURNING account_id, last
	)
	INSERT INTO events (account_id, sequence, client_id, type, object_id, status, reason, version, captured_amount)
	SELECT ev.account_id, seq.last - n.c + row_number() OVER (PARTITION BY ev.account_id ORDER BY ev.ord),
	       coalesce(acc.client_id, ev.client_id), ev.type, ev.object_id, ev.status, ev.reason, ev.version, ev.captured_amount
	FROM ev JOIN n USING (account_id) JOIN seq USING (account_id) LEFT JOIN accounts acc ON acc.id = ev.account_id`

// queue queues the insert of the events, if any.
func (n *newEvents) queue(b *pgx.Batch) {
	if len(n.account) == 0 {
		return
	}
	b.Queue(insertEventsSQL, n.account, n.client, n.typ, n.object, n.status, n.reason, n.version, n.captured)
}

// eventRowSQL selects an event (e) with its object's row (scanEvent).
const eventRowSQL = `
	SELECT e.account_id, e.sequence, e.client_id, e.type, e.object_id, e.status, coalesce(e.reason, ''), e.version,
	       e.captured_amount, e.tx::text::bigint, e.created_at,
	       t.from_account, t.to_account, t.amount, t.currency, t.created_at, t.expires_at, coalesce(t.refund_of, ''),
	       coalesce(t.reference, ''), t.metadata,
	       a.currency, a.created_at, coalesce(a.reference, ''), a.metadata`

// eventJoinsSQL joins an event's object: a transfer, or an account (an
// endpoint's event carries its snapshot alone).
const eventJoinsSQL = `
	LEFT JOIN transfers t ON t.id = e.object_id AND (e.type LIKE 'transfer.%' OR e.type LIKE 'refund.%')
	LEFT JOIN accounts a ON a.id = e.object_id AND e.type LIKE 'account.%'`

// eventsPageSQL reads a client's events after a position, up to the
// horizon (FeedHorizonSQL). Each event comes with its object's row.
const eventsPageSQL = `
	WITH h AS (` + FeedHorizonSQL + `)` + eventRowSQL + `
	FROM h, events e` + eventJoinsSQL + `
	WHERE e.client_id = @client AND e.tx < h.horizon
	  AND (e.tx, e.account_id COLLATE "C", e.sequence) > (@tx::text::xid8, @account::text COLLATE "C", @seq::bigint)
	  AND (@types::text[] IS NULL OR e.type = ANY(@types::text[]))
	ORDER BY e.tx, e.account_id COLLATE "C", e.sequence
	LIMIT @limit`

// eventsAtSQL reads the events named by their accounts and sequences.
const eventsAtSQL = eventRowSQL + `
	FROM unnest($1::text[], $2::bigint[]) AS r(account_id, sequence)
	JOIN events e ON e.account_id = r.account_id AND e.sequence = r.sequence` + eventJoinsSQL

// FeedHorizonSQL is the feed's horizon (one row, horizon xid8) in the statement's snapshot: the
// oldest transaction still running that may write to this database, below
// which every one that did has ended, so no event can later appear before a
// position a reader reached. The in-progress transactions of the snapshot
// are the cluster's, so those that pg_stat_activity shows running in
// another database are left out: they write no event here. One it cannot
// place (ended since, or a prepared transaction) counts, which only holds
// the feed back. Without any, the horizon is the snapshot's xmax. Webhook
// delivery (services/webhooks/webhookdb) queues events up to it too.
const FeedHorizonSQL = `
	SELECT coalesce(min(x), pg_snapshot_xmax(pg_current_snapshot())) AS horizon
	FROM pg_snapshot_xip(pg_current_snapshot()) x
	WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a
	                  WHERE a.backend_xid = xid(x) AND a.datname IS NOT NULL AND a.datname <> current_database())`

// EventsPage returns up to limit of a client's events after f.After,
// oldest first (by writing transaction, then account and sequence).
func (s *Store) EventsPage(ctx context.Context, f ledger.EventFilter, limit int) ([]ledger.RecordedEvent, error) {
	at := ledger.EventPosition{}
	if f.After != nil {
		at = *f.After
	}
	var types []string
	for _, t := range f.Types {
		types = append(types, string(t))
	}
	rows, err := s.pool.Query(ctx, eventsPageSQL, pgx.NamedArgs{"client": f.Client, "tx": strconv.FormatUint(at.Tx, 10), "account": at.Account,
		"seq": at.Sequence, "types": types, "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return evs, nil
}

// EventsAt returns the events refs name that this region holds (an event
// pruned, or never recorded, is left out), in no particular order.
func (s *Store) EventsAt(ctx context.Context, refs []ledger.EventRef) ([]ledger.RecordedEvent, error) {
	accounts, seqs := make([]string, len(refs)), make([]int64, len(refs))
	for i, r := range refs {
		accounts[i], seqs[i] = r.Account, r.Sequence
	}
	rows, err := s.pool.Query(ctx, eventsAtSQL, accounts, seqs)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, scanEvent)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return evs, nil
}

func scanEvent(row pgx.CollectableRow) (ledger.RecordedEvent, error) {
	var (
		e                       ledger.RecordedEvent
		typ                     string
		from, to, cur, acur     *string
		amount                  *int64
		tCreated, aCreated, exp *time.Time
		refundOf, tRef, aRef    string
		tMeta, aMeta            map[string]string
	)
	err := row.Scan(&e.Account, &e.Sequence, &e.Client, &typ, &e.Object, &e.Status, &e.Reason, &e.Version, &e.Captured,
		&e.Position.Tx, &e.CreatedAt, &from, &to, &amount, &cur, &tCreated, &exp, &refundOf, &tRef, &tMeta,
		&acur, &aCreated, &aRef, &aMeta)
	if err != nil {
		return e, err
	}
	e.Type = ledger.EventType(typ)
	e.Position.Account, e.Position.Sequence = e.Account, e.Sequence
	switch {
	case e.Type.IsEndpoint():
	case e.Type.IsAccount() && acur != nil:
		e.Opened = ledger.Account{ID: e.Object, ClientID: e.Client, Kind: ledger.KindCustomer, Currency: *acur, CreatedAt: *aCreated,
			Closed: e.Status == ledger.AccountIsClosed, Frozen: e.Status == ledger.AccountIsFrozen, Reference: aRef, Metadata: aMeta}
	case e.Type.IsTransfer() && from != nil:
		e.Transfer = ledger.Transfer{ID: e.Object, ClientID: e.Client, From: *from, To: *to, Amount: *amount, Currency: *cur,
			Status: ledger.Status(e.Status), Reason: e.Reason, Version: e.Version, CreatedAt: *tCreated, CapturedAmount: e.Captured,
			RefundOf: refundOf, Reference: tRef, Metadata: tMeta}
		if exp != nil {
			e.Transfer.ExpiresAt = *exp
		}
	default:
		return e, fmt.Errorf("event %s.%d: its %s %s is not here", e.Account, e.Sequence, e.Type, e.Object)
	}
	return e, nil
}

// recordOpened records, in an account's opening transaction, its
// account.opened event, unless events are off.
func (s *Store) recordOpened(ctx context.Context, tx pgx.Tx, a ledger.Account) error {
	return s.RecordEvents(ctx, tx, ledger.OpenedEvent(a))
}

// RecordEndpointDisabled records in tx, the transaction that writes
// webhook endpoint id disabled at its home region, the endpoint's
// webhook_endpoint.disabled event, unless it has one (an endpoint is
// disabled once; its events' counter, never pruned, is the record) or
// events are off. The endpoint's row lock, held by tx, orders two writes
// of one endpoint.
func (s *Store) RecordEndpointDisabled(ctx context.Context, tx pgx.Tx, id, client, reason string) error {
	if s.cfg.NoEvents {
		return nil
	}
	var recorded bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM event_sequences WHERE account_id = $1)`, id).Scan(&recorded); err != nil {
		return fmt.Errorf("record endpoint %s disabled: %w", id, err)
	}
	if recorded {
		return nil
	}
	return s.RecordEvents(ctx, tx, ledger.EndpointDisabledEvent(id, client, reason))
}

// RecordEvents records evs in tx, the transaction of the change they tell
// (as the apply's write stage records a batch's), unless events are off.
func (s *Store) RecordEvents(ctx context.Context, tx pgx.Tx, evs ...ledger.Emitted) error {
	if s.cfg.NoEvents || len(evs) == 0 {
		return nil
	}
	var n newEvents
	for _, e := range evs {
		n.add(e)
	}
	if _, err := tx.Exec(ctx, insertEventsSQL, n.account, n.client, n.typ, n.object, n.status, n.reason, n.version, n.captured); err != nil {
		return fmt.Errorf("record events: %w", err)
	}
	return nil
}

// pruneEventsSQL deletes up to $2 events recorded before $1.
const pruneEventsSQL = `
	DELETE FROM events WHERE ctid IN (
		SELECT ctid FROM events WHERE created_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)`

// PruneEvents deletes the events older than retention, batch rows per
// statement (DefaultPruneBatch when batch is not positive), and returns
// how many it deleted. The accounts' counters stay: a sequence never
// starts again.
func (s *Store) PruneEvents(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	if retention <= 0 {
		return 0, fmt.Errorf("prune events: retention %v is not positive", retention)
	}
	if batch <= 0 {
		batch = DefaultPruneBatch
	}
	before := time.Now().Add(-retention)
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, pruneEventsSQL, before, batch)
		if err != nil {
			return total, fmt.Errorf("prune events: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) || ctx.Err() != nil {
			return total, ctx.Err()
		}
	}
}
