package apidb

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// Answers records the API's first response to client requests in the
// ledger's apply transaction: the ledger hands it each batch
// (postgres.Config.Answers), and the response is durable in the same
// transaction as the debit. The zero value is ready.
type Answers struct{}

var _ postgres.Answers = Answers{}

// QueueAnswers queues, in the apply transaction's batch b, the response
// (api.Respond) to every client request of cmds whose idempotency key is
// still in flight, or for a request whose key the API did not claim
// (ledger.Command.KeyExpiresAt) not there yet or expired. It is final (the
// API stores nothing after it) unless it is a 202, which the API replaces
// with the transfer's final state if it sees it in time. Saga steps,
// commands parked or still in progress, and requests awaiting an account
// (dead-lettered unrecorded, so that a replay may still apply them) have
// no answer yet. The rows it answered come back with the answer as stored,
// into results[i].Answer. A key answered before (a retry of the request,
// or the API's own answer when its wait ran out) keeps its answer.
func (Answers) QueueAnswers(b *pgx.Batch, cmds []ledger.Command, results []ledger.Result) {
	var claimed, unclaimed answerRows
	index := map[[2]string]int{} // of the unclaimed keys, the command answered: one row each, or the upsert would touch it twice
	for i, c := range cmds {
		r := results[i]
		if c.IsStep() || r.Kind == ledger.Parked || r.Kind == ledger.AwaitingAccount || (r.Kind == ledger.Duplicate && r.Transfer.ID == "" && r.Action == nil) {
			continue
		}
		if c.KeyExpiresAt.IsZero() {
			claimed.add(i, c, r)
			continue
		}
		k := [2]string{c.ClientID, c.IdempotencyKey}
		if _, dup := index[k]; !dup {
			index[k] = i
			unclaimed.add(i, c, r)
		}
	}
	if len(claimed.idx) > 0 {
		b.Queue(`
			UPDATE idempotency_keys k SET state = 'done', response_status = u.status, response_body = u.body,
			       response_final = u.status <> 202
			FROM unnest($1::int[], $2::text[], $3::text[], $4::int[], $5::bytea[]) AS u(i, client_id, key, status, body)
			WHERE k.client_id = u.client_id AND k.key = u.key AND k.state = 'in_flight'
			RETURNING u.i, k.response_status, k.response_body`,
			claimed.idx, claimed.clients, claimed.keys, claimed.statuses, claimed.bodies).Query(answered(results))
	}
	if len(unclaimed.idx) > 0 {
		fps, tids, created, expires := make([][]byte, len(unclaimed.idx)), make([]string, len(unclaimed.idx)),
			make([]time.Time, len(unclaimed.idx)), make([]time.Time, len(unclaimed.idx))
		for n, i := range unclaimed.idx {
			c := cmds[i]
			fps[n], tids[n], created[n], expires[n] = api.RequestFingerprint(c), c.TransferID, c.CreatedAt, c.KeyExpiresAt
		}
		// The key's row, new; or taking over an in-flight claim of the key
		// (another API process claimed it meanwhile) or an expired one; or
		// replacing a 202 that names a transfer which does not exist and
		// now never will (the key's transfer is this batch's, or an
		// earlier one's): the API's own answer for an attempt whose wait
		// ran out while an earlier attempt of the key, older than the
		// Msg-Id window, was still in the stream. Left as it was, it would
		// give the client a transfer ID that never exists.
		b.Queue(`
			INSERT INTO idempotency_keys AS k (client_id, key, fingerprint, transfer_id, state, lease_until, created_at, expires_at,
			                                   response_status, response_body, response_final)
			SELECT u.client_id, u.key, u.fingerprint, u.transfer_id, 'done', u.created_at, u.created_at, u.expires_at,
			       u.status, u.body, u.status <> 202
			FROM unnest($1::int[], $2::text[], $3::text[], $4::int[], $5::bytea[], $6::bytea[], $7::text[], $8::timestamptz[], $9::timestamptz[])
			     AS u(i, client_id, key, status, body, fingerprint, transfer_id, created_at, expires_at)
			ON CONFLICT (client_id, key) DO UPDATE SET state = 'done', response_status = excluded.response_status,
			       response_body = excluded.response_body, response_final = excluded.response_final,
			       fingerprint = excluded.fingerprint, transfer_id = excluded.transfer_id,
			       created_at = excluded.created_at, expires_at = excluded.expires_at
			WHERE k.state = 'in_flight' OR k.expires_at < excluded.created_at
			   OR (k.response_status = 202 AND k.transfer_id <> excluded.transfer_id
			       AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.id = k.transfer_id))
			RETURNING k.client_id, k.key, k.response_status, k.response_body`,
			unclaimed.idx, unclaimed.clients, unclaimed.keys, unclaimed.statuses, unclaimed.bodies, fps, tids, created, expires).Query(func(rows pgx.Rows) error {
			var client, key string
			var status int
			var body []byte
			_, err := pgx.ForEachRow(rows, []any{&client, &key, &status, &body}, func() error {
				if i, ok := index[[2]string{client, key}]; ok {
					results[i].Answer = &ledger.Answer{Status: status, Body: body}
				}
				return nil
			})
			return err
		})
	}
}

// LockingAnswers is Answers for the transactions an API process runs
// itself (api.Config.Apply): they also hold, from their first round trip
// to their end, a lock on each request's key (keyLock), so that another
// process answering the key meanwhile (AnswerUnclaimed, when its wait ran
// out) learns that it is in flight instead of storing a 202 for a
// transfer that will never exist. The ledger stream's Msg-Id window tells
// other processes the same of a submitted request; a request applied
// here never passes through it.
type LockingAnswers struct{ Answers }

var _ postgres.KeyLocker = LockingAnswers{}

// QueueKeyLocks queues the key locks of cmds' unclaimed requests, in one
// order in every transaction, and then the read of those keys that already
// hold an answer, unexpired, naming another transfer than the request's:
// an earlier attempt answered (202) and still waiting in the ledger
// stream, whose transfer is the key's.
func (LockingAnswers) QueueKeyLocks(b *pgx.Batch, cmds []ledger.Command) func(ledger.Command) bool {
	var clients, keys, tids []string
	var created []time.Time
	for _, c := range cmds {
		if !c.IsStep() && !c.KeyExpiresAt.IsZero() {
			clients, keys = append(clients, c.ClientID), append(keys, c.IdempotencyKey)
			tids, created = append(tids, c.TransferID), append(created, c.CreatedAt)
		}
	}
	if len(keys) == 0 {
		return func(ledger.Command) bool { return false }
	}
	b.Queue(`SELECT count(pg_advisory_xact_lock(h)) FROM (
			SELECT DISTINCT `+keyLock("u.client_id", "u.key")+` AS h FROM unnest($1::text[], $2::text[]) AS u(client_id, key) ORDER BY h) l`,
		clients, keys)
	promised := map[[2]string]bool{}
	b.Queue(`SELECT k.client_id, k.key FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[]) AS u(client_id, key, transfer_id, created_at)
			JOIN idempotency_keys k ON k.client_id = u.client_id AND k.key = u.key
			WHERE k.state = 'done' AND k.expires_at >= u.created_at AND k.transfer_id <> u.transfer_id`,
		clients, keys, tids, created).Query(func(rows pgx.Rows) error {
		var client, key string
		_, err := pgx.ForEachRow(rows, []any{&client, &key}, func() error {
			promised[[2]string{client, key}] = true
			return nil
		})
		return err
	})
	return func(c ledger.Command) bool { return promised[[2]string{c.ClientID, c.IdempotencyKey}] }
}

// keyLock is the SQL of a key's lock: an advisory lock on a hash of the
// client and the key (a collision only makes two keys wait for each
// other).
func keyLock(client, key string) string {
	return `hashtextextended(` + client + ` || '/' || ` + key + `, 0)`
}

// answerRows are the answers of one statement, by column.
type answerRows struct {
	idx           []int
	clients, keys []string
	statuses      []int32
	bodies        [][]byte
}

func (a *answerRows) add(i int, c ledger.Command, r ledger.Result) {
	status, body := api.RespondTo(c, r)
	a.idx, a.clients, a.keys = append(a.idx, i), append(a.clients, c.ClientID), append(a.keys, c.IdempotencyKey)
	a.statuses, a.bodies = append(a.statuses, int32(status)), append(a.bodies, body)
}

// answered returns the reader of a statement's RETURNING rows (the
// command's index, the answer as stored) into results.
func answered(results []ledger.Result) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var i, status int
		var body []byte
		_, err := pgx.ForEachRow(rows, []any{&i, &status, &body}, func() error {
			if i >= 0 && i < len(results) {
				results[i].Answer = &ledger.Answer{Status: status, Body: body}
			}
			return nil
		})
		return err
	}
}
