package apidb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

const keyColumns = `client_id, key, fingerprint, transfer_id, state = 'in_flight', lease_until,
	coalesce(response_status, 0), coalesce(response_body, ''), response_final, created_at, expires_at`

// insertArgs are insertKeySQL's $1 to $7.
func insertArgs(c api.KeyClaim) []any {
	return []any{c.Client, c.Key, c.Fingerprint, c.TransferID, c.Now.Add(c.Lease), c.Now, c.Now.Add(c.TTL)}
}

func scanKey(row pgx.CollectableRow) (api.IdempotencyKey, error) {
	var k api.IdempotencyKey
	err := row.Scan(&k.ClientID, &k.Key, &k.Fingerprint, &k.TransferID, &k.InFlight, &k.LeaseUntil,
		&k.Status, &k.Body, &k.Final, &k.CreatedAt, &k.ExpiresAt)
	return k, err
}

// BeginKey claims an idempotency key and says what to do, as ResolveKey,
// but a key never seen costs one statement: ResolveKey runs only when the
// key exists or the insert's outcome is unknown. It returns an error only
// when the database fails.
func (s *Store) BeginKey(ctx context.Context, c api.KeyClaim) (api.IdempotencyKey, api.KeyOutcome, error) {
	rows, err := s.pool.Query(ctx, insertKeySQL+` ON CONFLICT (client_id, key) DO NOTHING RETURNING `+keyColumns, insertArgs(c)...)
	if err == nil {
		var k api.IdempotencyKey
		if k, err = pgx.CollectExactlyOneRow(rows, scanKey); err == nil {
			return k, api.KeyNew, nil
		}
	}
	// The key exists, or the insert's outcome is unknown.
	return s.ResolveKey(ctx, c)
}

// ResolveKey locks the key's row in a transaction and says what to do with
// it. A missing or expired key is claimed with a lease for c.TransferID; an
// in-flight key whose lease expired is taken over (its transfer ID is kept,
// so a repeat submission is deduplicated by the ledger). It finds this
// call's own claim (an insert whose answer was lost) by its transfer ID. It
// returns an error only when the database fails.
func (s *Store) ResolveKey(ctx context.Context, c api.KeyClaim) (api.IdempotencyKey, api.KeyOutcome, error) {
	var k api.IdempotencyKey
	var out api.KeyOutcome
	err := s.transact(ctx, "begin idempotency key", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+keyColumns+` FROM idempotency_keys WHERE client_id = $1 AND key = $2 FOR UPDATE`, c.Client, c.Key)
		if err != nil {
			return err
		}
		k, err = pgx.CollectExactlyOneRow(rows, scanKey)
		found := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		switch {
		case found && k.InFlight && k.TransferID == c.TransferID:
			// This call's own claim, made by an attempt whose answer was
			// lost: transfer IDs are never reused.
			out = api.KeyNew
			return nil
		case found && k.ExpiresAt.Before(c.Now):
			if _, err := tx.Exec(ctx, `DELETE FROM idempotency_keys WHERE client_id = $1 AND key = $2`, c.Client, c.Key); err != nil {
				return err
			}
		case found && !bytes.Equal(k.Fingerprint, c.Fingerprint):
			out = api.KeyMismatch
			return nil
		case found && !k.InFlight:
			out = api.KeyReplay
			return nil
		case found && k.LeaseUntil.After(c.Now):
			out = api.KeyInFlight
			return nil
		case found:
			rows, err := tx.Query(ctx, `UPDATE idempotency_keys SET lease_until = $3 WHERE client_id = $1 AND key = $2 RETURNING `+keyColumns,
				c.Client, c.Key, c.Now.Add(c.Lease))
			if err != nil {
				return err
			}
			k, err = pgx.CollectExactlyOneRow(rows, scanKey)
			out = api.KeyTakenOver
			return err
		}
		rows, err = tx.Query(ctx, insertKeySQL+` RETURNING `+keyColumns, insertArgs(c)...)
		if err != nil {
			return err
		}
		k, err = pgx.CollectExactlyOneRow(rows, scanKey)
		out = api.KeyNew
		return err
	}, func(ctx context.Context) (bool, error) {
		// The COMMIT went unanswered. A new key committed if its row names
		// this call's transfer ID; otherwise the retry sees what is there
		// (after a take-over that did commit: its own lease, a 409).
		if out != api.KeyNew {
			return false, nil
		}
		cur, ok, err := s.Key(ctx, c.Client, c.Key)
		return ok && cur.TransferID == c.TransferID, err
	})
	return k, out, err
}

// LookupKey says what c's key is without claiming it (see api.Store): one
// read.
func (s *Store) LookupKey(ctx context.Context, c api.KeyClaim) (api.IdempotencyKey, api.KeyOutcome, error) {
	k, found, err := s.Key(ctx, c.Client, c.Key)
	switch {
	case err != nil:
		return api.IdempotencyKey{}, 0, err
	case !found || k.ExpiresAt.Before(c.Now):
		return k, api.KeyNew, nil
	case !bytes.Equal(k.Fingerprint, c.Fingerprint):
		return k, api.KeyMismatch, nil
	case k.InFlight:
		return k, api.KeyInFlight, nil
	}
	return k, api.KeyReplay, nil
}

// StartKey is the first step of a transfer request, in one round trip: it
// reads the source account, claims the key as new (as BeginKey would) only
// if the source is a customer account of the client and a destination in
// this region (c.Destination) exists, and reads the
// transfer the client's key already made. The reads of the ledger's tables
// are the ledger adapter's (postgres.QueueAccount, QueueTransferByKey).
//
// Concurrent calls share one round trip and one commit (see claimGroup):
// a new key's claim costs a share of a commit, not a commit of its own. It
// returns an error only when the database fails, for every call of the
// group; the claim's outcome is then unknown (ResolveKey finds it).
func (s *Store) StartKey(ctx context.Context, c api.KeyClaim, source string) (api.KeyStart, error) {
	return s.start(ctx, &startReq{claim: c, source: source, claims: true, done: make(chan struct{})})
}

// CheckAccounts is StartKey without the claim and the business-key read:
// it reads the source account and whether a destination in this region
// (c.Destination) exists, for a request submitted unclaimed. It shares
// StartKey's groups (a round trip for many calls) and writes nothing.
func (s *Store) CheckAccounts(ctx context.Context, c api.KeyClaim, source string) (api.KeyStart, error) {
	return s.start(ctx, &startReq{claim: c, source: source, done: make(chan struct{})})
}

func (s *Store) start(ctx context.Context, r *startReq) (api.KeyStart, error) {
	s.claims.add(s, r)
	select {
	case <-r.done:
		return r.st, r.err
	case <-ctx.Done():
		return api.KeyStart{}, fmt.Errorf("start idempotency key: %w", ctx.Err())
	}
}

// startReq is one StartKey or CheckAccounts call waiting for its group.
type startReq struct {
	claim  api.KeyClaim
	source string
	claims bool // StartKey: claim the key and read its transfer
	st     api.KeyStart
	err    error
	done   chan struct{}
}

// claimGroup commits the key claims of concurrent StartKey calls together.
// While one group's round trip runs, the calls that arrive wait; the next
// group takes them all (up to maxClaimGroup), so a lone call is never held
// back, and under load N claims cost one commit and three statements
// (queueStarts). A group is one pipelined batch, which Postgres runs as one
// implicit transaction: every claim of it commits, or none does. Claims of one key in one group see each other
// (the second finds the key taken, as if it came after).
type claimGroup struct {
	mu      sync.Mutex
	pending []*startReq
	running bool
}

// maxClaimGroup bounds the calls in one group.
const maxClaimGroup = 128

// claimTimeout bounds one group's round trip.
const claimTimeout = 10 * time.Second

func (g *claimGroup) add(s *Store, r *startReq) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending = append(g.pending, r)
	if !g.running {
		g.running = true
		go g.run(s)
	}
}

// run sends groups until no call waits.
func (g *claimGroup) run(s *Store) {
	for {
		g.mu.Lock()
		n := min(len(g.pending), maxClaimGroup)
		if n == 0 {
			g.running = false
			g.pending = nil
			g.mu.Unlock()
			return
		}
		group := g.pending[:n:n]
		g.pending = g.pending[n:]
		g.mu.Unlock()
		b := &pgx.Batch{}
		read := queueStarts(b, group)
		ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
		err := s.pool.SendBatch(ctx, b).Close()
		cancel()
		for _, r := range group {
			if err != nil {
				r.st, r.err = api.KeyStart{}, fmt.Errorf("start idempotency key: %w", err)
			} else {
				read.fill(r)
			}
			close(r.done)
		}
	}
}

// groupRead is what a group's statements read, filled in when its batch
// closes.
type groupRead struct {
	accounts map[string]ledger.Account              // the sources and destinations that exist
	claimed  map[string]api.IdempotencyKey          // the keys claimed, by transfer ID
	prior    map[postgres.ClientKey]ledger.Transfer // the transfers the keys already made
}

// queueStarts queues the statements of a group of StartKey calls in b:
// three for the whole group, whatever its size. The accounts it names
// (postgres.QueueAccounts), the claims of the new keys (each conditional on
// its source being a customer account of its client and its destination
// here existing; of two claims of one key, the earlier call's is taken,
// the later one finds the key taken), and the transfers the keys already
// made (postgres.QueueTransfersByKey).
func queueStarts(b *pgx.Batch, group []*startReq) *groupRead {
	read := &groupRead{accounts: map[string]ledger.Account{}, claimed: map[string]api.IdempotencyKey{},
		prior: map[postgres.ClientKey]ledger.Transfer{}}
	ids := make([]string, 0, 2*len(group))
	var clients, keys, tids, sources, dests []string
	var fps [][]byte
	var leases, created, expires []time.Time
	for _, r := range group {
		c := r.claim
		ids = append(ids, r.source)
		if c.Destination != "" {
			ids = append(ids, c.Destination)
		}
		if !r.claims {
			continue
		}
		clients, keys, fps, tids = append(clients, c.Client), append(keys, c.Key), append(fps, c.Fingerprint), append(tids, c.TransferID)
		leases, created, expires = append(leases, c.Now.Add(c.Lease)), append(created, c.Now), append(expires, c.Now.Add(c.TTL))
		sources, dests = append(sources, r.source), append(dests, c.Destination)
	}
	postgres.QueueAccounts(b, ids, read.accounts)
	if len(clients) == 0 {
		return read
	}
	b.Queue(`
		INSERT INTO idempotency_keys (client_id, key, fingerprint, transfer_id, state, lease_until, created_at, expires_at)
		SELECT u.client_id, u.key, u.fingerprint, u.transfer_id, 'in_flight', u.lease_until, u.created_at, u.expires_at
		FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::timestamptz[], $6::timestamptz[], $7::timestamptz[],
		            $8::text[], $9::text[])
		     WITH ORDINALITY AS u(client_id, key, fingerprint, transfer_id, lease_until, created_at, expires_at, source, destination, n)
		WHERE `+postgres.CustomerOfSQL("u.source", "u.client_id")+`
		  AND (u.destination = '' OR EXISTS (SELECT 1 FROM accounts WHERE id = u.destination AND kind = 'customer'))
		ORDER BY u.n
		ON CONFLICT (client_id, key) DO NOTHING RETURNING `+keyColumns,
		clients, keys, fps, tids, leases, created, expires, sources, dests).Query(func(rows pgx.Rows) error {
		ks, err := pgx.CollectRows(rows, scanKey)
		for _, k := range ks {
			read.claimed[k.TransferID] = k
		}
		return err
	})
	postgres.QueueTransfersByKey(b, clients, keys, read.prior)
	return read
}

// fill sets r's outcome from what its group read.
func (g *groupRead) fill(r *startReq) {
	c, st := r.claim, &r.st
	st.Source, st.SourceFound = g.accounts[r.source]
	if c.Destination != "" {
		dest, found := g.accounts[c.Destination]
		st.DestinationMissing = !found
		st.DestinationSystem = found && dest.Kind != ledger.KindCustomer
	}
	if !r.claims {
		return
	}
	st.Key, st.Claimed = g.claimed[c.TransferID]
	st.Prior = g.prior[postgres.ClientKey{Client: c.Client, Key: c.Key}]
}

// TransferByKey returns the transfer a client's idempotency key made, or
// false (the ledger adapter's read, on its own).
func (s *Store) TransferByKey(ctx context.Context, client, key string) (ledger.Transfer, bool, error) {
	var t ledger.Transfer
	var found bool
	b := &pgx.Batch{}
	postgres.QueueTransferByKey(b, client, key, &t, &found)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return ledger.Transfer{}, false, fmt.Errorf("read transfer: %w", err)
	}
	return t, found, nil
}

// AnsweredKeys returns, of the keys clients[i]/keys[i], those that are
// answered (no longer in flight).
func (s *Store) AnsweredKeys(ctx context.Context, clients, keys []string) ([]api.IdempotencyKey, error) {
	// One index lookup per key: as (client_id, key) IN (SELECT unnest ...)
	// the planner hashed the keys and scanned the whole table, 2 ms a read
	// at 20,000 keys and growing with them.
	rows, err := s.pool.Query(ctx, `
		SELECT k.* FROM unnest($1::text[], $2::text[]) AS u(client_id, key)
		CROSS JOIN LATERAL (
			SELECT `+keyColumns+` FROM idempotency_keys
			WHERE client_id = u.client_id AND key = u.key AND state = 'done'
		) k`, clients, keys)
	if err != nil {
		return nil, fmt.Errorf("read idempotency keys: %w", err)
	}
	ks, err := pgx.CollectRows(rows, scanKey)
	if err != nil {
		return nil, fmt.Errorf("read idempotency keys: %w", err)
	}
	return ks, nil
}

// insertKeySQL claims a new key, in flight with a lease (a SELECT, so that
// StartKey can make it conditional); its arguments are insertArgs'.
const insertKeySQL = `
	INSERT INTO idempotency_keys (client_id, key, fingerprint, transfer_id, state, lease_until, created_at, expires_at)
	SELECT $1, $2, $3, $4, 'in_flight', $5::timestamptz, $6::timestamptz, $7::timestamptz`

// Key reads an idempotency key; false when there is none.
func (s *Store) Key(ctx context.Context, client, key string) (api.IdempotencyKey, bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM idempotency_keys WHERE client_id = $1 AND key = $2`, client, key)
	if err != nil {
		return api.IdempotencyKey{}, false, fmt.Errorf("read idempotency key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.IdempotencyKey{}, false, nil
	}
	if err != nil {
		return api.IdempotencyKey{}, false, fmt.Errorf("read idempotency key: %w", err)
	}
	return k, true, nil
}

// Answer stores the response the caller is about to send, unless one is
// already stored, and returns the key as stored: send what it holds. With
// replace set, a stored response that is not final yet (the ledger's
// provisional 202 of a cross-region transfer) is replaced. Either way the
// stored response becomes final.
func (s *Store) Answer(ctx context.Context, client, key string, status int, body []byte, replace bool) (api.IdempotencyKey, error) {
	rows, err := s.pool.Query(ctx, `
		UPDATE idempotency_keys SET state = 'done', response_final = true,
		       response_status = CASE WHEN state = 'in_flight' OR ($5 AND NOT response_final) THEN $3 ELSE response_status END,
		       response_body   = CASE WHEN state = 'in_flight' OR ($5 AND NOT response_final) THEN $4 ELSE response_body END
		WHERE client_id = $1 AND key = $2
		RETURNING `+keyColumns, client, key, status, body, replace)
	if err != nil {
		return api.IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanKey)
	if err != nil {
		return api.IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	return k, nil
}

// AnswerUnclaimed stores the response the caller is about to send for a
// request whose key it did not claim (the ledger stores the key's row with
// its answer, ledger.Command.KeyExpiresAt): the key's row is made, from c,
// when there is none or it expired; a row there already is returned as it
// is, answered (send what it holds, or 422 for another body) or in flight
// under another request's claim (409), never taken over.
func (s *Store) AnswerUnclaimed(ctx context.Context, c api.KeyClaim, status int, body []byte) (api.IdempotencyKey, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return api.IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A transaction deciding the key holds its lock (LockingAnswers): the
	// key is in flight there, unless that transaction is the caller's own.
	var free, own bool
	if err := tx.QueryRow(ctx, `
		WITH h AS (SELECT `+keyLock("$1::text", "$2::text")+` AS v), t AS (SELECT pg_try_advisory_xact_lock(v) AS free FROM h)
		SELECT t.free, NOT t.free AND $3::int8 <> 0 AND EXISTS (
			SELECT 1 FROM pg_locks l, h WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = $3::int8
			   AND l.classid::int8 = (h.v >> 32) & 4294967295 AND l.objid::int8 = h.v & 4294967295)
		FROM t`, c.Client, c.Key, int64(c.ApplyPID)).Scan(&free, &own); err != nil {
		return api.IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	if !free && !own {
		return api.IdempotencyKey{ClientID: c.Client, Key: c.Key, InFlight: true}, nil
	}
	rows, err := tx.Query(ctx, `
		WITH made AS (
			INSERT INTO idempotency_keys AS k (client_id, key, fingerprint, transfer_id, state, lease_until, created_at, expires_at,
			                                   response_status, response_body, response_final)
			VALUES ($1, $2, $3, $4, 'done', $5, $5, $6, $7, $8, true)
			ON CONFLICT (client_id, key) DO UPDATE SET state = 'done', response_final = true,
			       response_status = $7, response_body = $8, fingerprint = $3, transfer_id = $4,
			       lease_until = $5, created_at = $5, expires_at = $6
			WHERE k.expires_at < $5
			RETURNING `+keyColumns+`)
		SELECT * FROM made
		UNION ALL
		SELECT `+keyColumns+` FROM idempotency_keys WHERE client_id = $1 AND key = $2 AND NOT EXISTS (SELECT 1 FROM made)`,
		c.Client, c.Key, c.Fingerprint, c.TransferID, c.Now, c.Now.Add(c.TTL), status, body)
	if err != nil {
		return api.IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanKey)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// The row was committed by another transaction while this
		// statement ran (the conflict waited for it; its snapshot is
		// older): read it.
		_ = tx.Rollback(ctx)
		var found bool
		if k, found, err = s.Key(ctx, c.Client, c.Key); err == nil && !found {
			err = errors.New("the key's row vanished")
		}
	}
	if err != nil {
		return api.IdempotencyKey{}, fmt.Errorf("answer idempotency key: %w", err)
	}
	return k, nil
}

// DeleteExpiredKeys removes idempotency keys whose retention ended before
// now, and returns how many.
func (s *Store) DeleteExpiredKeys(ctx context.Context, now time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE expires_at < $1`, now)
	if err != nil {
		return 0, fmt.Errorf("delete expired idempotency keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
