package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// HeaderReplayOf marks a replayed command with the dead-letter sequence it
// was replayed from (the ledger's consumer reads it: a replay's duplicate
// is a ledger.CauseDLQReplay).
const HeaderReplayOf = ledgerstream.HeaderReplayOf

// Kind is what came of an operation on a dead letter.
type Kind string

// The outcomes of Replay and Discard.
const (
	// Applied: the ledger applied the replayed command (it had not before).
	Applied Kind = "applied"
	// Duplicate: the command was processed before; Outcome.Layer caught it.
	Duplicate Kind = "duplicate"
	// Refused: the ledger refused the command again and dead-lettered it
	// again (Outcome.NewSeq), with Outcome.Reason.
	Refused Kind = "refused"
	// Deferred: nothing reached the ledger. The ledger stream's Msg-Id
	// window still remembers the original publish, the one that was
	// dead-lettered, so it dropped the replay; replay after Outcome.RetryAt.
	Deferred Kind = "deferred"
	// Discarded: the dead letter was discarded (now or before).
	Discarded Kind = "discarded"
	// Replayed: the dead letter is gone because an earlier replay settled it.
	Replayed Kind = "replayed"
)

// Outcome is the result of one operation on a dead letter.
type Outcome struct {
	Seq    uint64 // the dead letter
	Key    string // the command's message key
	Kind   Kind
	Layer  ledger.Layer // the layer that caught a duplicate or refused again
	Reason string       // the refusal's reason (Refused)
	Detail string
	// LedgerSeq is the replay's sequence in LEDGER_<R>; NewSeq the new
	// dead letter of a refusal.
	LedgerSeq, NewSeq uint64
	RetryAt           time.Time // Deferred: when a replay can reach the ledger
	// Operator, Why and At are the audit record (Discard, or an earlier
	// operation on a dead letter that is gone).
	Operator, Why string
	At            time.Time
}

func (o Outcome) String() string {
	s := fmt.Sprintf("%d %s %s", o.Seq, o.Key, o.Kind)
	if o.Layer != "" {
		s += " layer=" + string(o.Layer)
	}
	if o.Reason != "" {
		s += " reason=" + o.Reason
	}
	if o.NewSeq != 0 {
		s += fmt.Sprintf(" new_dead_letter=%d", o.NewSeq)
	}
	if !o.RetryAt.IsZero() {
		s += " retry_after=" + o.RetryAt.UTC().Format(time.RFC3339)
	}
	if o.Operator != "" {
		s += fmt.Sprintf(" by=%s at=%s", o.Operator, o.At.UTC().Format(time.RFC3339))
	}
	if o.Why != "" {
		s += fmt.Sprintf(" why=%q", o.Why)
	}
	if o.Detail != "" {
		s += fmt.Sprintf(" (%s)", o.Detail)
	}
	return s
}

// prior is what the region's database knew of a command before a replay.
type prior struct {
	logged   bool          // a PROCESSED consume-log row (layer 4)
	transfer ledger.Status // the request's transfer, "" when none (layer 5)
	reason   string
}

// Replay republishes dead letter seq's command with its original key to
// its original ledger subject, waits for the ledger's outcome and records
// it in the audit. The outcome is read, not guessed: a refusal is the new
// dead letter of the replay's ledger sequence; otherwise the consume-log
// row and the transfer read before the publish tell a duplicate (and its
// layer) from a first apply. The dead letter is deleted once its outcome
// is known (a refusal's new dead letter takes its place). It returns an
// ErrNotCommand for a payload that is not a command, ErrNotFound for a
// sequence nobody knows, and ErrUnsettled when the ledger does not settle
// the replay within Ops.Wait (the replay is then in the stream, and a
// second Replay is safe).
func (o *Ops) Replay(ctx context.Context, seq uint64, operator string) (Outcome, error) {
	if operator == "" {
		return Outcome{}, errors.New("dlq: replay needs an operator")
	}
	var out Outcome
	err := o.locked(ctx, seq, func(conn *pgx.Conn) error {
		l, err := o.get(ctx, seq)
		if errors.Is(err, ErrNotFound) {
			if out, err = o.lastAction(ctx, conn, seq); err == nil {
				return nil
			}
			return err
		}
		if err != nil {
			return err
		}
		if l.CommandErr != nil {
			return fmt.Errorf("%w: dead letter %d cannot be replayed (%v); discard it", ErrNotCommand, seq, l.CommandErr)
		}
		if l.Reason == ledgerstream.ReasonWrongClass {
			return fmt.Errorf("%w: dead letter %d (%s) cannot be replayed; discard it", ErrWrongClass, seq, l.Detail)
		}
		out, err = o.replay(ctx, conn, l)
		if err != nil {
			return err
		}
		if out.Kind == Deferred {
			return nil
		}
		if err := audit(ctx, conn, seq, "replay", operator, "", l, out); err != nil {
			return err
		}
		return o.deleteLetter(ctx, seq)
	})
	return out, err
}

// replaySubject is where a dead letter of region, first sent on original,
// is replayed: the operator's class of the region, on the original's
// shard (0 when original names none), so the command keeps its place in
// its account's order and only the operator's user may send it.
func replaySubject(region, original string) string {
	shard := 0
	if a, err := subjects.ParseLedger(original); err == nil {
		shard = a.Shard
	}
	return subjects.LedgerSubject(region, shard, subjects.ClassOps, region)
}

func (o *Ops) replay(ctx context.Context, conn *pgx.Conn, l Letter) (Outcome, error) {
	c := l.Command
	out := Outcome{Seq: l.Seq, Key: c.MsgKey()}
	p, err := readPrior(ctx, conn, c)
	if err != nil {
		return Outcome{}, err
	}
	dlqInfo, err := o.streamInfo(ctx, subjects.DLQStream(o.Region))
	if err != nil {
		return Outcome{}, err
	}
	m := nats.NewMsg(replaySubject(o.Region, l.Subject))
	m.Data = l.Data
	m.Header.Set(jetstream.MsgIDHeader, c.MsgKey())
	m.Header.Set(HeaderReplayOf, strconv.FormatUint(l.Seq, 10))
	ack, err := o.JS.PublishMsg(ctx, m, jetstream.WithExpectStream(subjects.LedgerStream(o.Region)))
	if err != nil {
		return Outcome{}, fmt.Errorf("dlq: replay %d to %s: %w", l.Seq, l.Subject, err)
	}
	out.LedgerSeq = ack.Sequence
	if ack.Duplicate {
		// Layer 2 dropped it, but the publish it remembers is the one that
		// was dead-lettered: this is no duplicate of an applied command.
		li, err := o.streamInfo(ctx, subjects.LedgerStream(o.Region))
		if err != nil {
			return Outcome{}, err
		}
		out.Kind, out.Layer, out.LedgerSeq = Deferred, ledger.LayerMsgID, 0
		out.RetryAt = l.At.Add(li.Config.Duplicates)
		out.Detail = "the ledger stream's Msg-Id window still holds the dead-lettered publish"
		return out, nil
	}
	if err := o.settled(ctx, m.Subject, ack.Sequence); err != nil {
		return Outcome{}, err
	}
	if nl, ok, err := o.deadLetterOf(ctx, dlqInfo.State.LastSeq, ack.Sequence); err != nil {
		return Outcome{}, err
	} else if ok {
		out.Kind, out.Reason, out.Detail, out.NewSeq = Refused, nl.Reason, nl.Detail, nl.Seq
		if p.logged {
			out.Layer = ledger.LayerConsumeLog
		}
		return out, nil
	}
	switch {
	case p.logged:
		out.Kind, out.Layer = Duplicate, ledger.LayerConsumeLog
	case p.transfer != "":
		out.Kind, out.Layer = Duplicate, ledger.LayerBusinessKey
	default:
		out.Kind = Applied
		if now, err := readPrior(ctx, conn, c); err == nil && now.transfer != "" {
			out.Detail = "transfer " + c.TransferID + " " + string(now.transfer)
		}
	}
	if out.Kind == Duplicate && p.transfer != "" {
		out.Detail = "transfer " + c.TransferID + " " + string(p.transfer)
		if p.reason != "" {
			out.Detail += " " + p.reason
		}
	}
	return out, nil
}

func readPrior(ctx context.Context, conn *pgx.Conn, c ledger.Command) (prior, error) {
	var p prior
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dedup_log WHERE consumer = $1 AND msg_key = $2 AND status = 'PROCESSED')`,
		postgres.Consumer, c.MsgKey()).Scan(&p.logged)
	if err != nil {
		return prior{}, fmt.Errorf("dlq: read consume-log: %w", err)
	}
	if c.IsStep() {
		return p, nil
	}
	var reason *string
	err = conn.QueryRow(ctx, `SELECT status, reason FROM transfers WHERE client_id = $1 AND idempotency_key = $2`,
		c.ClientID, c.IdempotencyKey).Scan(&p.transfer, &reason)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return prior{}, fmt.Errorf("dlq: read transfer: %w", err)
	}
	if reason != nil {
		p.reason = *reason
	}
	return p, nil
}

func (o *Ops) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	s, err := o.JS.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %s: %w", name, err)
	}
	return info, nil
}

// settled waits until the shard's ledger consumer has acked or terminated
// every message up to seq.
func (o *Ops) settled(ctx context.Context, subject string, seq uint64) error {
	addr, err := subjects.ParseLedger(subject)
	if err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	shard := addr.Shard
	wait := o.Wait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		c, err := o.JS.Consumer(ctx, subjects.LedgerStream(o.Region), ledgerstream.ShardDurable(shard))
		if err == nil {
			info, err := c.Info(ctx)
			if err == nil && info.AckFloor.Stream >= seq {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w (%s sequence %d) within %s; is the ledger running? Replaying again is safe",
				ErrUnsettled, subjects.LedgerStream(o.Region), seq, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// deadLetterOf finds the dead letter, after DLQ sequence after, of ledger
// sequence seq.
func (o *Ops) deadLetterOf(ctx context.Context, after, seq uint64) (Letter, bool, error) {
	want := strconv.FormatUint(seq, 10)
	for f := (Filter{After: after}); ; {
		p, err := o.List(ctx, Filter{After: f.After, Limit: 256})
		if err != nil {
			return Letter{}, false, err
		}
		for _, l := range p.Letters {
			if l.Header.Get(ledgerstream.HeaderDLQSequence) == want {
				return l, true, nil
			}
		}
		if p.Next == 0 {
			return Letter{}, false, nil
		}
		f.After = p.Next
	}
}

func (o *Ops) deleteLetter(ctx context.Context, seq uint64) error {
	s, err := o.dlqStream(ctx)
	if err != nil {
		return err
	}
	if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !strings.Contains(err.Error(), "no message found") {
		return fmt.Errorf("dlq: delete %d: %w", seq, err)
	}
	return nil
}
