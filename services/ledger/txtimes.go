package ledger

import (
	"context"
	"time"
)

// TxTimes is when the stages of one apply transaction happened: its
// BEGIN, the end of its statements (COMMIT sent) and COMMIT's answer. A
// store fills it in for whoever put it in the transaction's context
// (WithTxTimes), as net/http/httptrace's ClientTrace rides a request's
// context: the consumer that applies a batch reads it to tell the time its
// statements took from the time COMMIT and its fsync took. A retried
// transaction leaves the times of its last attempt.
type TxTimes struct {
	Began, Committing, Committed time.Time
}

type txTimesKey struct{}

// WithTxTimes returns ctx carrying t, for the store to fill in.
func WithTxTimes(ctx context.Context, t *TxTimes) context.Context {
	return context.WithValue(ctx, txTimesKey{}, t)
}

// TxTimesFrom returns the TxTimes ctx carries, or nil when it carries none.
func TxTimesFrom(ctx context.Context) *TxTimes {
	t, _ := ctx.Value(txTimesKey{}).(*TxTimes)
	return t
}
