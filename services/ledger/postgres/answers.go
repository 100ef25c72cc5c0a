package postgres

import (
	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/services/ledger"
)

// Answers records, in the apply transaction, the first answer to the client
// requests a batch settled, so that the answer is durable with the debit and
// a repeat of the request gets it back unchanged. The API implements it
// (services/api/apidb: it renders the HTTP response and stores it with
// the request's idempotency key); the ledger only hands it the batch.
type Answers interface {
	// QueueAnswers queues its statements in b, the apply transaction's
	// write batch, for the commands cmds whose outcomes are results
	// (results[i] is cmds[i]'s). It must not send anything itself: its
	// statements' errors abort the transaction. Once b has run, each
	// results[i].Answer is the answer it stored for cmds[i] (nil: none),
	// which the ledger's consumer sends the waiting API after COMMIT.
	QueueAnswers(b *pgx.Batch, cmds []ledger.Command, results []ledger.Result)
}

// KeyLocker is an Answers that also locks the requests' keys for the whole
// transaction: the store queues QueueKeyLocks in the claim stage's batch
// b, after the consume-log claims, so that whoever answers a key outside
// the ledger can tell that a transaction deciding it is running. It also
// reads, under those locks, which requests' keys already hold an answer
// naming another transfer: once b has run, promised reports them, and the
// store applies none of them (a Duplicate caught at the idempotency key,
// its claim given back), since that other transfer is the key's.
type KeyLocker interface {
	QueueKeyLocks(b *pgx.Batch, cmds []ledger.Command) (promised func(ledger.Command) bool)
}

// queueResponses queues the first answers to the batch's client requests
// (see Answers); without Answers nothing is recorded.
func (s *Store) queueResponses(b *pgx.Batch, cmds []ledger.Command, results []ledger.Result) {
	if s.cfg.Answers != nil {
		s.cfg.Answers.QueueAnswers(b, cmds, results)
	}
}
