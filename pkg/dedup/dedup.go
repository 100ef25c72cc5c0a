// Package dedup is the consume-log that turns at-least-once delivery into
// exactly-once effects. A consumer claims each message key inside the same
// Postgres transaction as the message's effects (ClaimForTx, or
// QueueClaimForTx to ride in the caller's pipelined batch), so the claim and
// the effects commit or vanish together. The row is written PROCESSED at
// once: nobody can see it before COMMIT anyway, and a concurrent claim of
// the same key waits on the unique index, then sees PROCESSED (a Duplicate,
// or a Conflict when the content differs) or nothing if the first
// transaction rolled back. Release gives back the claims of messages a later
// check found to be duplicates; IsMine reads a claim back when a COMMIT got
// no answer.
//
// Two of paymesh's dedup layers live here (Layer): the table, which is the
// source of truth, and the optional Cache of recently committed keys, an
// early-out for known duplicates that a miss always sends to the table.
//
// Work whose effects cannot share the database transaction needs a
// PROCESSING row with a lease and takeover instead; paymesh keeps that
// technique where it has such work, in the API's idempotency keys
// (services/ledger/postgres, in_flight and lease_until).
package dedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the consume-log needs of the caller's transaction. A
// pgx.Tx satisfies it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Beginner starts transactions; a *pgxpool.Pool satisfies it. IsMine uses
// it to wait for a transaction still finishing on the server.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Outcome is the answer to a claim.
type Outcome int

const (
	// First means this claimer owns the key: apply the message.
	First Outcome = iota + 1
	// Duplicate means the key is already PROCESSED (or claimed earlier in the
	// same batch): skip the message and ack it.
	Duplicate
	// Conflict means the key was processed for a message with a different
	// fingerprint: the same key was reused for other content.
	Conflict
)

func (o Outcome) String() string {
	switch o {
	case First:
		return "first"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Key identifies one message to a consumer group.
type Key struct {
	// ID is the message's business key, the same on every delivery and every
	// producer retry.
	ID string
	// Origin is when the message was first produced. It is carried unchanged
	// by every redelivery and picks the day partition.
	Origin time.Time
	// Fingerprint optionally hashes the message content; a processed key seen
	// again with another fingerprint is a Conflict.
	Fingerprint []byte
}

// Claim is the answer for one key.
type Claim struct {
	Key     Key
	Outcome Outcome
	// Layer says which layer answered a Duplicate or Conflict.
	Layer Layer
	// First is, for a Duplicate, when the key's first claim was made: the
	// row's claim time, the recent cache's entry's, or this claim's own
	// for a repeat within the batch. The duplicate's age is measured from
	// it.
	First time.Time

	day time.Time
	at  time.Time // claimed_at, which with the holder names this claim
}

// Config tunes a Log. The zero value is usable: a seven-day window, two
// days created ahead, the wall clock.
type Config struct {
	// Holder names this claimer (process or worker) on the rows it claims;
	// IsMine tells its claims from another holder's by it.
	Holder string
	// WindowDays is how many days of partitions are kept, today included.
	WindowDays int
	// AheadDays is how many future days of partitions are created.
	AheadDays int
	// Now is the clock; tests step it.
	Now func() time.Time
	// Cache, if set, is consulted before the table and filled by Committed.
	Cache *Cache
}

// Log is the consume-log. It is safe for concurrent use.
type Log struct {
	cfg Config
}

// Errors returned by the consume-log.
var (
	// ErrLost is returned by a claim when a conflicting row vanished between
	// the insert and the read (a concurrent retention drop). Retry.
	ErrLost = errors.New("dedup: claimed row vanished; retry")
	// ErrInvalidKey is returned for an empty key ID or a zero origin.
	ErrInvalidKey = errors.New("dedup: invalid key")
)

// New returns a Log with defaults filled in.
func New(cfg Config) *Log {
	if cfg.WindowDays <= 0 {
		cfg.WindowDays = 7
	}
	if cfg.AheadDays <= 0 {
		cfg.AheadDays = 2
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Holder == "" {
		cfg.Holder = "anonymous"
	}
	return &Log{cfg: cfg}
}

// Window returns how long after its origin a key is surely still known:
// the window's days but today's, which a key may have begun at its end
// (a day's partition is dropped whole). A duplicate later than that may
// find its key's partition gone.
func (l *Log) Window() time.Duration {
	return time.Duration(l.cfg.WindowDays-1) * 24 * time.Hour
}

// ClaimForTx claims keys for a consumer in the caller's transaction, whose
// effects commit in this same transaction, with one multi-row insert, and
// answers each key in order. A key repeated within the batch is a Duplicate
// of its first occurrence. Keys are inserted in sorted order so concurrent
// batches cannot deadlock on each other's claims. It returns ErrInvalidKey
// for an empty ID or zero origin, and any database error, after which the
// transaction must be rolled back.
func (l *Log) ClaimForTx(ctx context.Context, tx Querier, consumer string, keys []Key) ([]Claim, error) {
	p, err := l.prepare(consumer, keys)
	if err != nil {
		return nil, err
	}
	if len(p.ask) > 0 {
		rows, err := tx.Query(ctx, claimSQL, p.insertArgs()...)
		if err != nil {
			return nil, fmt.Errorf("dedup: claim: %w", err)
		}
		if err := p.read(rows); err != nil {
			return nil, err
		}
	}
	return p.Finish(ctx, tx)
}

// statusProcessed is the status of every row a claim writes. The schema
// also allows PROCESSING, with a fence and a lease, for work outside the
// transaction; no claim writes it any more (see the package doc).
const statusProcessed = "PROCESSED"

// PendingClaim is a claim whose insert rides in the caller's pipelined
// batch (QueueClaimForTx), so that it costs no round trip of its own.
type PendingClaim struct {
	l        *Log
	consumer string
	now      time.Time
	keys     []Key
	claims   []Claim
	firstIdx map[string]int // key ID -> first index still to ask the table
	ask      []int          // indexes to insert, in key order
	inserted []string
	err      error
}

// QueueClaimForTx is ClaimForTx in two halves: it queues the claim's insert
// on b (the caller sends b in its transaction, with its own statements),
// and Finish, called once b has run, returns the claims. Keys the recent
// cache or an earlier copy in the batch settles are known at once
// (Settled), so the caller need not read anything for them.
func (l *Log) QueueClaimForTx(b *pgx.Batch, consumer string, keys []Key) (*PendingClaim, error) {
	p, err := l.prepare(consumer, keys)
	if err != nil {
		return nil, err
	}
	if len(p.ask) > 0 {
		b.Queue(claimSQL, p.insertArgs()...).Query(func(rows pgx.Rows) error {
			p.err = p.read(rows)
			return p.err
		})
	}
	return p, nil
}

// SettledWithoutTable returns the claims of keys when the recent cache and
// repeats within keys settle every one of them (ok), so that the caller
// needs no transaction at all: a batch of redeliveries of recent commits.
func (l *Log) SettledWithoutTable(consumer string, keys []Key) (claims []Claim, ok bool) {
	if l.cfg.Cache == nil || len(keys) == 0 {
		return nil, false
	}
	// The first key is never a repeat: unless the cache knows it, the batch
	// needs the table, and the full pass is not worth making (a batch of
	// first deliveries, the common case, stops here).
	if e, ok := l.cfg.Cache.get(consumer, keys[0].ID); !ok || !sameFingerprint(e.fp, keys[0].Fingerprint) {
		return nil, false
	}
	p, err := l.prepare(consumer, keys)
	if err != nil || len(p.ask) > 0 {
		return nil, false
	}
	return p.claims, true
}

// Settled reports whether key i's outcome is known without the table: a
// recent-cache hit or a repeat within the batch.
func (p *PendingClaim) Settled(i int) bool {
	return p.claims[i].Outcome != 0 || p.firstIdx[p.claims[i].Key.ID] != i
}

// claimSQL inserts the claims. The fence (1), holder and lease_until
// columns are those of the schema's PROCESSING rows; a PROCESSED claim
// writes its lease as its claim time.
const claimSQL = `
	INSERT INTO dedup_log (consumer, msg_key, origin_day, status, fence, holder, lease_until, fingerprint, claimed_at, processed_at)
	SELECT $1, k.id, k.day, $8, 1, $2, $3, k.fp, $4, CASE WHEN $8 = 'PROCESSED' THEN $4::timestamptz END
	FROM unnest($5::text[], $6::date[], $7::bytea[]) WITH ORDINALITY AS k(id, day, fp, n)
	ORDER BY k.n
	ON CONFLICT DO NOTHING
	RETURNING msg_key`

// prepare settles what needs no table (invalid keys, repeats in the batch,
// recent-cache hits) and lists, in key order, the keys to insert.
func (l *Log) prepare(consumer string, keys []Key) (*PendingClaim, error) {
	now := l.cfg.Now().UTC().Truncate(time.Microsecond) // as Postgres stores it
	p := &PendingClaim{l: l, consumer: consumer, now: now, keys: keys,
		claims: make([]Claim, len(keys)), firstIdx: make(map[string]int, len(keys))}
	for i, k := range keys {
		if k.ID == "" || k.Origin.IsZero() {
			return nil, fmt.Errorf("%w: id %q origin %v", ErrInvalidKey, k.ID, k.Origin)
		}
		p.claims[i] = Claim{Key: k, day: l.dayFor(k.Origin, now), at: now}
		if j, seen := p.firstIdx[k.ID]; seen {
			p.claims[i].Outcome, p.claims[i].Layer, p.claims[i].First = Duplicate, LayerTable, now
			if !sameFingerprint(keys[j].Fingerprint, k.Fingerprint) {
				p.claims[i].Outcome = Conflict
			}
			continue
		}
		if l.cfg.Cache != nil {
			if e, ok := l.cfg.Cache.get(consumer, k.ID); ok && sameFingerprint(e.fp, k.Fingerprint) {
				p.claims[i].Outcome, p.claims[i].Layer, p.claims[i].First = Duplicate, LayerCache, e.at
				p.firstIdx[k.ID] = i
				continue
			}
		}
		p.firstIdx[k.ID] = i
	}
	for _, i := range p.firstIdx {
		if p.claims[i].Outcome == 0 {
			p.ask = append(p.ask, i)
		}
	}
	slices.SortFunc(p.ask, func(a, b int) int { return strings.Compare(keys[a].ID, keys[b].ID) })
	return p, nil
}

func (p *PendingClaim) insertArgs() []any {
	ids := make([]string, len(p.ask))
	days := make([]time.Time, len(p.ask))
	fps := make([][]byte, len(p.ask))
	for n, i := range p.ask {
		ids[n], days[n], fps[n] = p.keys[i].ID, p.claims[i].day, p.keys[i].Fingerprint
	}
	return []any{p.consumer, p.l.cfg.Holder, p.now, p.now, ids, days, fps, statusProcessed}
}

func (p *PendingClaim) read(rows pgx.Rows) error {
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("dedup: claim: %w", err)
	}
	p.inserted = inserted
	return nil
}

// Finish returns the claims once the insert has run: a key the insert
// skipped is resolved against the row already there (a duplicate, or a
// conflict when its fingerprint differs), which costs one more statement
// only when some key was already known. It returns ErrLost when such a row
// vanished meanwhile.
func (p *PendingClaim) Finish(ctx context.Context, tx Querier) ([]Claim, error) {
	if p.err != nil {
		return nil, p.err
	}
	if len(p.ask) == 0 {
		return p.claims, nil
	}
	won := make(map[string]bool, len(p.inserted))
	for _, id := range p.inserted {
		won[id] = true
		p.claims[p.firstIdx[id]].Outcome = First
	}
	if len(won) != len(p.ask) {
		if err := resolveExisting(ctx, tx, p.consumer, p.claims, p.ask, won); err != nil {
			return nil, err
		}
	}
	p.l.settleRepeats(p.claims, p.firstIdx)
	return p.claims, nil
}

// resolveExisting answers the keys whose insert conflicted with a committed
// row: a duplicate, or a conflict when the fingerprints differ.
func resolveExisting(ctx context.Context, tx Querier, consumer string, claims []Claim, ask []int, won map[string]bool) error {
	var ids []string
	var days []time.Time
	for _, i := range ask {
		if !won[claims[i].Key.ID] {
			ids, days = append(ids, claims[i].Key.ID), append(days, claims[i].day)
		}
	}
	rows, err := tx.Query(ctx, `
		SELECT d.msg_key, d.status, d.fingerprint, d.claimed_at
		FROM dedup_log d
		JOIN unnest($2::text[], $3::date[]) AS k(id, day) ON d.msg_key = k.id AND d.origin_day = k.day
		WHERE d.consumer = $1`, consumer, ids, days)
	if err != nil {
		return fmt.Errorf("dedup: read claims: %w", err)
	}
	type existing struct {
		status string
		fp     []byte
		at     time.Time
	}
	found := map[string]existing{}
	var id string
	var e existing
	if _, err := pgx.ForEachRow(rows, []any{&id, &e.status, &e.fp, &e.at}, func() error {
		found[id] = e
		return nil
	}); err != nil {
		return fmt.Errorf("dedup: read claims: %w", err)
	}
	for _, i := range ask {
		id := claims[i].Key.ID
		if won[id] {
			continue
		}
		e, ok := found[id]
		switch {
		case !ok:
			return fmt.Errorf("%w: %s", ErrLost, id)
		case e.status != statusProcessed:
			return fmt.Errorf("dedup: key %s has a %s row, which no claim writes", id, e.status)
		case !sameFingerprint(e.fp, claims[i].Key.Fingerprint):
			claims[i].Outcome, claims[i].Layer = Conflict, LayerTable
		default:
			claims[i].Outcome, claims[i].Layer, claims[i].First = Duplicate, LayerTable, e.at
		}
	}
	return nil
}

// settleRepeats makes a key repeated in the batch follow its first
// occurrence: if the first was itself a duplicate, so are the repeats.
func (l *Log) settleRepeats(claims []Claim, firstIdx map[string]int) {
	for i := range claims {
		j := firstIdx[claims[i].Key.ID]
		if j == i || claims[i].Outcome == Conflict {
			continue
		}
		if claims[j].Outcome == Duplicate {
			claims[i].Layer, claims[i].First = claims[j].Layer, claims[j].First
		}
	}
}

// Release deletes First claims in the caller's transaction, for messages a
// later layer (a business unique key) found to be duplicates, so that
// consume-log rows and applied messages stay one-to-one.
func (l *Log) Release(ctx context.Context, tx Querier, consumer string, claims []Claim) error {
	ids, days, fences := firstClaims(claims)
	if len(ids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `
		DELETE FROM dedup_log d
		USING unnest($2::text[], $3::date[], $4::bigint[]) AS k(id, day, fence)
		WHERE d.consumer = $1 AND d.msg_key = k.id AND d.origin_day = k.day AND d.fence = k.fence`,
		consumer, ids, days, fences)
	if err != nil {
		return fmt.Errorf("dedup: release: %w", err)
	}
	return nil
}

// Committed records the First claims of a committed transaction in the cache.
// Call it only after COMMIT succeeded.
func (l *Log) Committed(consumer string, claims []Claim) {
	if l.cfg.Cache == nil {
		return
	}
	for _, c := range claims {
		if c.Outcome == First {
			l.cfg.Cache.put(consumer, c.Key.ID, c.Key.Fingerprint, c.at)
		}
	}
}

// IsMine reports whether claim c committed: its row is PROCESSED and still
// carries this holder and c's claim time. It is how a caller
// resolves a COMMIT whose outcome it could not see; another holder's
// commit of the same key does not count.
//
// The transaction whose COMMIT was cut off may still be finishing on the
// server (its client went away, its backend did not), so a plain read could
// miss a row about to commit. When q can begin a transaction, IsMine first
// tries to insert the same key, which waits for any transaction still
// holding it, then reads, and rolls its own insert back.
func (l *Log) IsMine(ctx context.Context, q Querier, consumer string, c Claim) (bool, error) {
	const mine = `
		SELECT count(*) FROM dedup_log
		WHERE consumer = $1 AND msg_key = $2 AND origin_day = $3
		  AND status = 'PROCESSED' AND holder = $4 AND fence = $5 AND claimed_at = $6`
	args := []any{consumer, c.Key.ID, c.day, l.cfg.Holder, claimFence, c.at}
	read := func(q Querier) (bool, error) {
		rows, err := q.Query(ctx, mine, args...)
		if err != nil {
			return false, fmt.Errorf("dedup: is mine: %w", err)
		}
		n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
		if err != nil {
			return false, fmt.Errorf("dedup: is mine: %w", err)
		}
		return n == 1, nil
	}
	b, ok := q.(Beginner)
	if !ok {
		return read(q)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("dedup: is mine: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the probe is always rolled back
	if _, err := tx.Exec(ctx, `
		INSERT INTO dedup_log (consumer, msg_key, origin_day, status, fence, holder, lease_until, claimed_at)
		VALUES ($1, $2, $3, 'PROCESSING', 1, 'is-mine probe', now(), now())
		ON CONFLICT DO NOTHING`, consumer, c.Key.ID, c.day); err != nil {
		return false, fmt.Errorf("dedup: is mine: %w", err)
	}
	return read(tx)
}

// dayFor maps an origin to its partition day, clamped into the live window so
// that a message older than the retention window (or from a clock far ahead)
// still lands in an existing partition. Such a message may then be caught
// only by a business unique key, which is why the window must be longer than
// any plausible redelivery delay.
func (l *Log) dayFor(origin, now time.Time) time.Time {
	d := day(origin)
	if lo := l.horizon(now); d.Before(lo) {
		return lo
	}
	if hi := day(now).AddDate(0, 0, l.cfg.AheadDays); d.After(hi) {
		return hi
	}
	return d
}

// Horizon returns the oldest day the consume-log keeps (UTC midnight):
// every key whose origin is on or after it has a row until it expires.
func (l *Log) Horizon() time.Time { return l.horizon(l.cfg.Now()) }

// horizon is the oldest day kept.
func (l *Log) horizon(now time.Time) time.Time {
	return day(now).AddDate(0, 0, -(l.cfg.WindowDays - 1))
}

func day(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// claimFence is the fence column of every row a claim writes.
const claimFence = 1

func firstClaims(claims []Claim) (ids []string, days []time.Time, fences []int64) {
	for _, c := range claims {
		if c.Outcome == First {
			ids, days, fences = append(ids, c.Key.ID), append(days, c.day), append(fences, claimFence)
		}
	}
	return ids, days, fences
}

// sameFingerprint treats a missing fingerprint as matching anything.
func sameFingerprint(a, b []byte) bool {
	return len(a) == 0 || len(b) == 0 || bytes.Equal(a, b)
}
