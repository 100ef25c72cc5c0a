package postgres

import (
	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
	ledgerpg "github.com/paymesh/paymesh/services/ledger/postgres"
)

// Answers records the API's first response to client requests in the
// ledger's apply transaction: the ledger hands it each batch
// (ledgerpg.Config.Answers), and the response is durable in the same
// transaction as the debit. The zero value is ready.
type Answers struct{}

var _ ledgerpg.Answers = Answers{}

// QueueAnswers queues, in the apply transaction's batch b, the response
// (api.Respond) to every client request of cmds whose idempotency key is
// still in flight. It is final (the API stores nothing after it) unless it
// is a 202, which the API replaces with the transfer's final state if it
// sees it in time. Saga steps, commands parked or still in progress, and
// requests awaiting an account (dead-lettered unrecorded, so that a replay
// may still apply them) have no answer yet. The rows it answered come back
// with the answer as stored, into results[i].Answer.
func (Answers) QueueAnswers(b *pgx.Batch, cmds []ledger.Command, results []ledger.Result) {
	var clients, keys []string
	var statuses []int32
	var bodies [][]byte
	var idx []int
	for i, c := range cmds {
		r := results[i]
		if c.IsStep() || r.Kind == ledger.Parked || r.Kind == ledger.AwaitingAccount || (r.Kind == ledger.Duplicate && r.Transfer.ID == "") {
			continue
		}
		status, body := api.Respond(r)
		clients, keys = append(clients, c.ClientID), append(keys, c.IdempotencyKey)
		statuses, bodies = append(statuses, int32(status)), append(bodies, body)
		idx = append(idx, i)
	}
	if len(clients) == 0 {
		return
	}
	b.Queue(`
		UPDATE idempotency_keys k SET state = 'done', response_status = u.status, response_body = u.body,
		       response_final = u.status <> 202
		FROM unnest($1::int[], $2::text[], $3::text[], $4::int[], $5::bytea[]) AS u(i, client_id, key, status, body)
		WHERE k.client_id = u.client_id AND k.key = u.key AND k.state = 'in_flight'
		RETURNING u.i, k.response_status, k.response_body`,
		idx, clients, keys, statuses, bodies).Query(func(rows pgx.Rows) error {
		var i, status int
		var body []byte
		_, err := pgx.ForEachRow(rows, []any{&i, &status, &body}, func() error {
			if i >= 0 && i < len(results) {
				results[i].Answer = &ledger.Answer{Status: status, Body: body}
			}
			return nil
		})
		return err
	})
}
