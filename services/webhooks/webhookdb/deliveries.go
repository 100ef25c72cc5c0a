package webhookdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
	"github.com/paymesh/paymesh/services/webhooks"
)

// enqueueSQL queues, for every enabled endpoint, up to $1 of its client's
// events after the endpoint's position, below the feed's horizon (so no
// event can commit later behind the position), and moves the position to
// the last event read. The events an endpoint does not take are read and
// passed; an endpoint another enqueue holds is skipped.
const enqueueSQL = `
	WITH h AS (` + postgres.FeedHorizonSQL + `),
	ep AS (
		SELECT id, client_id, types, feed_tx, feed_account, feed_sequence FROM webhook_endpoints
		WHERE status = 'enabled' ORDER BY id FOR UPDATE SKIP LOCKED
	), scan AS (
		SELECT ep.id AS endpoint_id, ep.types, e.account_id, e.sequence, e.type, e.tx
		FROM ep, h, LATERAL (
			SELECT e.account_id, e.sequence, e.type, e.tx FROM events e
			WHERE e.client_id = ep.client_id AND e.tx < h.horizon
			  AND (e.tx, e.account_id COLLATE "C", e.sequence) > (ep.feed_tx, ep.feed_account COLLATE "C", ep.feed_sequence)
			ORDER BY e.tx, e.account_id COLLATE "C", e.sequence
			LIMIT $1) e
	), queued AS (
		INSERT INTO webhook_deliveries (endpoint_id, account_id, sequence)
		SELECT endpoint_id, account_id, sequence FROM scan WHERE cardinality(types) = 0 OR type = ANY(types)
		ON CONFLICT DO NOTHING
		RETURNING endpoint_id, account_id
	), pairs AS (
		SELECT DISTINCT endpoint_id, account_id FROM queued
	), last AS (
		SELECT DISTINCT ON (endpoint_id) endpoint_id, tx, account_id, sequence FROM scan
		ORDER BY endpoint_id, tx DESC, account_id COLLATE "C" DESC, sequence DESC
	), moved AS (
		UPDATE webhook_endpoints w SET feed_tx = last.tx, feed_account = last.account_id, feed_sequence = last.sequence
		FROM last WHERE w.id = last.endpoint_id
		RETURNING 1
	)
	SELECT (SELECT count(*) FROM queued), (SELECT count(*) FROM scan), (SELECT count(*) FROM moved),
	       (SELECT coalesce(array_agg(endpoint_id), '{}') FROM pairs), (SELECT coalesce(array_agg(account_id), '{}') FROM pairs)`

// refreshHeadsSQL marks, for each (endpoint $1[i], account $2[i]), its
// pending delivery of the lowest sequence as the head and no other. Each
// writer of pending deliveries runs it in its transaction after its
// writes, with the endpoint's row locked (FOR UPDATE) by an earlier
// statement: its snapshot then holds every write of the others, which the
// lock orders, so no pending delivery is left without a head. A
// redelivery may put an account's head behind one already in flight: that
// one finishes, as before the marks.
const refreshHeadsSQL = `
	WITH p AS (
		SELECT DISTINCT endpoint_id, account_id FROM unnest($1::text[], $2::text[]) AS u(endpoint_id, account_id)
	), m AS (
		SELECT p.endpoint_id, p.account_id, (SELECT min(d.sequence) FROM webhook_deliveries d
		    WHERE d.endpoint_id = p.endpoint_id AND d.account_id = p.account_id AND d.status = 'pending') AS sequence
		FROM p
	), cleared AS (
		UPDATE webhook_deliveries d SET head = false
		FROM m WHERE d.endpoint_id = m.endpoint_id AND d.account_id = m.account_id
		  AND d.status = 'pending' AND d.head AND d.sequence IS DISTINCT FROM m.sequence
		RETURNING 1
	), marked AS (
		UPDATE webhook_deliveries d SET head = true
		FROM m WHERE d.endpoint_id = m.endpoint_id AND d.account_id = m.account_id AND d.sequence = m.sequence
		  AND NOT d.head
		RETURNING 1
	)
	SELECT (SELECT count(*) FROM cleared) + (SELECT count(*) FROM marked)`

// lockEndpointsSQL takes the row locks that order the writers of one
// endpoint's pending deliveries.
const lockEndpointsSQL = `SELECT id FROM webhook_endpoints WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`

// refreshHeads runs refreshHeadsSQL in tx for the pairs given.
func refreshHeads(ctx context.Context, tx pgx.Tx, endpoints, accounts []string) error {
	if len(endpoints) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, refreshHeadsSQL, endpoints, accounts)
	return err
}

// DefaultEnqueueBatch is how many events Enqueue reads per endpoint.
const DefaultEnqueueBatch = 1000

// Enqueue queues the new events of every enabled endpoint, up to batch per
// endpoint, and returns how many deliveries it queued and how many events
// it read (read = batch × endpoints: call again).
//
// The endpoints it queues for stay locked to its COMMIT (enqueueSQL's FOR
// UPDATE), and the heads of the accounts it queued for are marked by a
// second statement, whose snapshot holds what any other writer committed
// before the lock.
func (s *Store) Enqueue(ctx context.Context, batch int) (queued, read int64, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var moved int64
		var endpoints, accounts []string
		if err := tx.QueryRow(ctx, enqueueSQL, batch).Scan(&queued, &read, &moved, &endpoints, &accounts); err != nil {
			return err
		}
		return refreshHeads(ctx, tx, endpoints, accounts)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("enqueue webhook deliveries: %w", err)
	}
	return queued, read, nil
}

// Enabled returns the enabled endpoints this region delivers to.
func (s *Store) Enabled(ctx context.Context) ([]webhooks.Endpoint, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+endpointColumns+` FROM webhook_endpoints WHERE status = 'enabled' ORDER BY id`)
	out, err := pgx.CollectRows(rows, scanEndpoint)
	if err != nil {
		return nil, fmt.Errorf("enabled webhook endpoints: %w", err)
	}
	return out, nil
}

// Claim is one delivery leased to a sender: its event, the attempt's
// number, how many times the delivery was asked for again (Redeliver), and
// when the delivery was queued.
type Claim struct {
	Event        ledger.EventRef
	Attempt      int
	Redeliveries int
	Queued       time.Time
}

// pendingRow: the UPDATEs of claimSQL and finishSQL name a pending row as
// "not delivered and not failed" (the same rows: the status's CHECK has
// three values), not "status = 'pending'". The latter matches the partial
// index webhook_deliveries_pending, whose row estimate is stale after a
// burst of deliveries (a few hundred rows for tens of thousands): the
// planner then hashes every pending delivery to update 32 of them
// (200 ms at 40,000 pending, measured), where the primary key finds each
// in a probe (1.4 ms).
//
// claimSQL leases, of one endpoint's pending deliveries, the head (lowest
// sequence) of each account that is due and not leased, up to $2 of them,
// oldest due first, until now + $3. A claim that lost the row to another
// sender meanwhile (the lease re-read after the row lock) takes nothing.
const claimSQL = `
	WITH due AS (
		SELECT account_id, sequence FROM webhook_deliveries
		WHERE endpoint_id = $1 AND status = 'pending' AND head
		  AND next_at <= now() AND (leased_until IS NULL OR leased_until <= now())
		ORDER BY next_at LIMIT $2
	)
	UPDATE webhook_deliveries d SET attempts = d.attempts + 1, leased_until = now() + $3::bigint * interval '1 microsecond'
	FROM due
	WHERE d.endpoint_id = $1 AND d.account_id = due.account_id AND d.sequence = due.sequence
	  AND d.status NOT IN ('delivered', 'failed') AND (d.leased_until IS NULL OR d.leased_until <= now())
	RETURNING d.account_id, d.sequence, d.attempts, d.redeliveries, d.created_at`

// Claim leases up to n of an endpoint's due deliveries, one per account,
// for lease.
func (s *Store) Claim(ctx context.Context, endpoint string, n int, lease time.Duration) ([]Claim, error) {
	rows, _ := s.pool.Query(ctx, claimSQL, endpoint, n, lease.Microseconds())
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Claim, error) {
		var c Claim
		err := row.Scan(&c.Event.Account, &c.Event.Sequence, &c.Attempt, &c.Redeliveries, &c.Queued)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim webhook deliveries of %s: %w", endpoint, err)
	}
	return out, nil
}

// Result is one attempt's outcome, to record: when it was sent, how long
// it took, the status that came back (0: none) and the error, if any. A
// delivery with Next zero has ended: delivered when Err is empty, failed
// otherwise; with Next set it is tried again then.
type Result struct {
	Claim
	At         time.Time
	Duration   time.Duration
	StatusCode int
	Err        string
	Next       time.Time
}

// finishSQL records a batch's attempts, and ends or reschedules each
// delivery that the attempt's claim still holds (the attempt number
// fences out a sender whose lease ran out and was claimed again).
const finishSQL = `
	WITH r AS (
		SELECT * FROM unnest($2::text[], $3::bigint[], $4::int[], $5::timestamptz[], $6::bigint[], $7::int[], $8::text[], $9::timestamptz[])
		    AS u(account_id, sequence, attempt, at, duration_us, status_code, error, next_at)
	), logged AS (
		INSERT INTO webhook_attempts (endpoint_id, account_id, sequence, attempt, at, duration_us, status_code, error)
		SELECT $1, account_id, sequence, attempt, at, duration_us, status_code, nullif(error, '') FROM r
		ON CONFLICT DO NOTHING
	)
	UPDATE webhook_deliveries d SET
	    status = CASE WHEN r.next_at IS NOT NULL THEN 'pending' WHEN r.error = '' THEN 'delivered' ELSE 'failed' END,
	    next_at = coalesce(r.next_at, d.next_at), leased_until = NULL,
	    ended_at = CASE WHEN r.next_at IS NULL THEN r.at + r.duration_us * interval '1 microsecond' END,
	    last_error = nullif(r.error, '')
	FROM r
	WHERE d.endpoint_id = $1 AND d.account_id = r.account_id AND d.sequence = r.sequence
	  AND d.attempts = r.attempt AND d.status NOT IN ('delivered', 'failed')`

// Finish records the attempts of a batch to one endpoint, in one statement.
func (s *Store) Finish(ctx context.Context, endpoint string, rs []Result) error {
	n := len(rs)
	var (
		acct, errs = make([]string, n), make([]string, n)
		seq, dur   = make([]int64, n), make([]int64, n)
		att, code  = make([]int32, n), make([]int32, n)
		at         = make([]time.Time, n)
		next       = make([]*time.Time, n)
	)
	for i, r := range rs {
		acct[i], seq[i], att[i], at[i] = r.Event.Account, r.Event.Sequence, int32(r.Attempt), r.At
		dur[i], code[i], errs[i] = r.Duration.Microseconds(), int32(r.StatusCode), r.Err
		if !r.Next.IsZero() {
			next[i] = &rs[i].Next
		}
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockEndpointsSQL, []string{endpoint}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, finishSQL, endpoint, acct, seq, att, at, dur, code, errs, next); err != nil {
			return err
		}
		eps := make([]string, n)
		for i := range eps {
			eps[i] = endpoint
		}
		return refreshHeads(ctx, tx, eps, acct)
	})
	if err != nil {
		return fmt.Errorf("record webhook attempts of %s: %w", endpoint, err)
	}
	return nil
}

// Attempt is one recorded attempt of a delivery.
type Attempt struct {
	Endpoint   string
	Event      ledger.EventRef
	Attempt    int
	At         time.Time
	Duration   time.Duration
	StatusCode int
	Err        string
}

// AttemptCursor is where a page of attempts, newest first, continues: below
// this attempt.
type AttemptCursor struct {
	At      time.Time       `json:"at"`
	Event   ledger.EventRef `json:"event"`
	Attempt int             `json:"attempt"`
}

// Attempts returns up to limit of an endpoint's attempts in this region,
// newest first, below after (nil: from the newest), of one event only when
// event is set.
func (s *Store) Attempts(ctx context.Context, endpoint string, event *ledger.EventRef, after *AttemptCursor, limit int) ([]Attempt, error) {
	args := pgx.NamedArgs{"endpoint": endpoint, "limit": limit, "account": nil, "seq": nil, "at": nil, "a_account": "", "a_seq": 0, "a_attempt": 0}
	if event != nil {
		args["account"], args["seq"] = event.Account, event.Sequence
	}
	if after != nil {
		args["at"], args["a_account"], args["a_seq"], args["a_attempt"] = after.At, after.Event.Account, after.Event.Sequence, after.Attempt
	}
	rows, _ := s.pool.Query(ctx, `
		SELECT account_id, sequence, attempt, at, duration_us, status_code, coalesce(error, '') FROM webhook_attempts
		WHERE endpoint_id = @endpoint
		  AND (@account::text IS NULL OR (account_id = @account AND sequence = @seq::bigint))
		  AND (@at::timestamptz IS NULL OR (at, account_id COLLATE "C", sequence, attempt) < (@at, @a_account::text COLLATE "C", @a_seq::bigint, @a_attempt::int))
		ORDER BY at DESC, account_id COLLATE "C" DESC, sequence DESC, attempt DESC LIMIT @limit`, args)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		a := Attempt{Endpoint: endpoint}
		var us int64
		err := row.Scan(&a.Event.Account, &a.Event.Sequence, &a.Attempt, &a.At, &us, &a.StatusCode, &a.Err)
		a.Duration = time.Duration(us) * time.Microsecond
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("list webhook attempts of %s: %w", endpoint, err)
	}
	return out, nil
}

// Redeliver queues an event of this region again to each of endpoints that
// takes its type: a delivery that ended (delivered or failed) is pending
// again, due now; one still pending is left as it is; one never queued
// (the endpoint was made later, or the type filter changed) is queued. It
// returns the endpoints it queued the event for.
func (s *Store) Redeliver(ctx context.Context, event ledger.EventRef, endpoints []string) ([]string, error) {
	var out []string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockEndpointsSQL, endpoints); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, redeliverSQL, event.Account, event.Sequence, endpoints)
		var err error
		if out, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		accounts := make([]string, len(out))
		for i := range accounts {
			accounts[i] = event.Account
		}
		return refreshHeads(ctx, tx, out, accounts)
	})
	if err != nil {
		return nil, fmt.Errorf("redeliver event %s.%d: %w", event.Account, event.Sequence, err)
	}
	return out, nil
}

// redeliverSQL queues event ($1, $2) again for the endpoints $3 that take
// it (Redeliver).
const redeliverSQL = `
		WITH ev AS (
			SELECT e.account_id, e.sequence, w.id AS endpoint_id FROM events e
			JOIN webhook_endpoints w ON w.client_id = e.client_id AND w.status = 'enabled'
			     AND (cardinality(w.types) = 0 OR e.type = ANY(w.types)) AND w.id = ANY($3::text[])
			WHERE e.account_id = $1 AND e.sequence = $2
		)
		INSERT INTO webhook_deliveries AS d (endpoint_id, account_id, sequence)
		SELECT endpoint_id, account_id, sequence FROM ev
		ON CONFLICT (endpoint_id, account_id, sequence) DO UPDATE
		SET status = 'pending', next_at = now(), ended_at = NULL, leased_until = NULL, redeliveries = d.redeliveries + 1
		WHERE d.status <> 'pending'
		RETURNING endpoint_id`

// Prune deletes the deliveries that ended, and the attempts recorded,
// before before, batch rows per statement, and returns how many rows.
func (s *Store) Prune(ctx context.Context, before time.Time, batch int) (int64, error) {
	var total int64
	for _, q := range []string{
		`DELETE FROM webhook_deliveries WHERE ctid IN (SELECT ctid FROM webhook_deliveries WHERE ended_at < $1 LIMIT $2)`,
		`DELETE FROM webhook_attempts WHERE ctid IN (SELECT ctid FROM webhook_attempts WHERE at < $1 LIMIT $2)`,
	} {
		for {
			tag, err := s.pool.Exec(ctx, q, before, batch)
			if err != nil {
				return total, fmt.Errorf("prune webhook deliveries: %w", err)
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batch) || ctx.Err() != nil {
				break
			}
		}
	}
	return total, ctx.Err()
}

// Delivery is one delivery's state, for the tests and the reports.
type Delivery struct {
	Endpoint string
	Event    ledger.EventRef
	Status   string
	Attempts int
	Err      string
}

// Deliveries returns every delivery to an endpoint in this region, by
// account and sequence.
func (s *Store) Deliveries(ctx context.Context, endpoint string) ([]Delivery, error) {
	rows, _ := s.pool.Query(ctx, `SELECT account_id, sequence, status, attempts, coalesce(last_error, '') FROM webhook_deliveries
		WHERE endpoint_id = $1 ORDER BY account_id, sequence`, endpoint)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Delivery, error) {
		d := Delivery{Endpoint: endpoint}
		err := row.Scan(&d.Event.Account, &d.Event.Sequence, &d.Status, &d.Attempts, &d.Err)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list webhook deliveries of %s: %w", endpoint, err)
	}
	return out, nil
}

// Backlog is one endpoint's pending deliveries in this region: how many,
// and how long the oldest has waited.
type Backlog struct {
	Endpoint string
	Pending  int64
	Oldest   time.Duration
}

// Backlogs returns the backlog of each endpoint with pending deliveries.
func (s *Store) Backlogs(ctx context.Context) ([]Backlog, error) {
	rows, _ := s.pool.Query(ctx, `SELECT endpoint_id, count(*), extract(epoch FROM now() - min(created_at))::float8
		FROM webhook_deliveries WHERE status = 'pending' GROUP BY endpoint_id`)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Backlog, error) {
		var (
			b   Backlog
			age float64
		)
		err := row.Scan(&b.Endpoint, &b.Pending, &age)
		b.Oldest = time.Duration(age * float64(time.Second))
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("webhook backlogs: %w", err)
	}
	return out, nil
}
