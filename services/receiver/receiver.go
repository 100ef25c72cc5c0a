// Package receiver is paymesh's reference webhook consumer, for clients to
// copy: it turns paymesh's at-least-once deliveries into exactly-once
// effects in the client's own Postgres database. A delivery goes through
// four stages (ServeHTTP):
//
//	verify   the signature over the event's ID, the timestamp and the body,
//	         with the endpoint's secrets (pkg/webhook); a timestamp more than
//	         webhook.Tolerance from now is refused, so a captured delivery
//	         cannot be replayed later: 401
//	decode   the event, checked as input from outside (decode.go): its ID is
//	         its account and sequence, its type one paymesh sends, its object
//	         the type's: 400
//	deliver  one transaction (inbox.go): the account's row locked, then the
//	         event's ID looked up. Recorded already: a duplicate, counted by
//	         cause, nothing applied. Next in the account's sequence: its
//	         effect applied (Effects) and its ID recorded, then every parked
//	         event that now follows. Later than the next: parked, its body
//	         kept, until the gap fills (gaps.go reports a gap that does not)
//	answer   2xx only after the COMMIT; an error before it is a 5xx, and
//	         paymesh tries again, so nothing the receiver was sent is lost
//
// The event's ID is the dedup key: paymesh sends the same ID on every
// attempt and redelivery of an event, and no other event has it. The
// effect and the record of its ID commit in one transaction, so a crash at
// any point leaves both or neither, and the retry that follows a lost 2xx
// finds the ID and applies nothing.
package receiver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/paymesh/paymesh/pkg/webhook"
)

// DB is the receiver's database (a *pgxpool.Pool): a transaction per
// delivery, and queries for the gap report and the totals.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Effects applies an event to the client's own state, in the transaction
// that records the event's ID. Orders is the reference's toy shop; a
// client's effects are its own.
type Effects interface {
	Apply(ctx context.Context, tx pgx.Tx, e Event) error
}

// Config configures a receiver.
type Config struct {
	DB DB
	// Secrets verify the deliveries: the endpoint's signing secret, and
	// while it is rotated the one before (either may sign).
	Secrets []string
	Effects Effects
	// MaxBody bounds a delivery's body (default 1 MiB).
	MaxBody int64
	Stats   *Stats
	Log     *slog.Logger
}

// Receiver is an http.Handler of webhook deliveries.
type Receiver struct {
	cfg Config
}

// New returns a receiver, or an error if a secret is not a signing secret
// or the database or effects are missing.
func New(cfg Config) (*Receiver, error) {
	if cfg.DB == nil || cfg.Effects == nil {
		return nil, errors.New("receiver: a database and effects are required")
	}
	if err := CheckSecrets(cfg.Secrets); err != nil {
		return nil, err
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.Stats == nil {
		cfg.Stats = &Stats{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Receiver{cfg: cfg}, nil
}

// CheckSecrets refuses an empty list, or one with a string that is not a
// signing secret.
func CheckSecrets(secrets []string) error {
	if len(secrets) == 0 {
		return errors.New("receiver: at least one signing secret is required")
	}
	for _, s := range secrets {
		if err := webhook.CheckSecret(s); err != nil {
			return fmt.Errorf("receiver: %w", err)
		}
	}
	return nil
}

// Stats returns the receiver's counts.
func (r *Receiver) Stats() *Stats { return r.cfg.Stats }

// ServeHTTP takes one delivery: verify, decode, deliver, answer.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "deliveries are POSTed", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		status := http.StatusBadRequest
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		r.refuse(w, RefusedBody, status, fmt.Errorf("the body: %w", err))
		return
	}
	id, err := webhook.Verify(req.Header, body, r.cfg.Secrets...)
	if err != nil {
		reason := RefusedSignature
		if errors.Is(err, webhook.ErrTimestamp) {
			reason = RefusedTimestamp
		}
		r.refuse(w, reason, http.StatusUnauthorized, err)
		return
	}
	d, err := decode(id, body)
	if err != nil {
		r.refuse(w, RefusedBody, http.StatusBadRequest, err)
		return
	}
	d.Attempt, d.Redelivery = hint(req.Header, webhook.HeaderAttempt), hint(req.Header, webhook.HeaderRedelivery)
	res, err := r.deliver(req.Context(), d)
	if err != nil {
		// Not committed (or not known to be): paymesh tries again, and the
		// retry finds the ID if the COMMIT did happen.
		r.cfg.Log.Warn("webhook delivery not applied", "event", d.Event.ID, "err", err)
		http.Error(w, "not applied, try again", http.StatusServiceUnavailable)
		return
	}
	r.cfg.Stats.count(res)
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, "{\"event\":%q,\"outcome\":%q}\n", d.Event.ID, res.Outcome)
}

// refuse answers a delivery that is not paymesh's or not well formed; it
// is counted, and nothing is applied.
func (r *Receiver) refuse(w http.ResponseWriter, reason Refusal, status int, err error) {
	r.cfg.Stats.refused(reason)
	r.cfg.Log.Warn("webhook delivery refused", "reason", reason, "err", err)
	http.Error(w, err.Error(), status)
}

// hint reads one of the unsigned attempt headers: 0 when absent or not a
// small positive number (the headers only name causes, so a wrong one
// costs a count, never an effect).
func hint(h http.Header, name string) int {
	n, err := strconv.Atoi(h.Get(name))
	if err != nil || n < 0 || n > 1<<20 {
		return 0
	}
	return n
}
