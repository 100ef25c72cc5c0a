// Package dlq is the operator's side of a region's dead letters, the
// messages the ledger gave up on (stream DLQ_<R>, written by
// services/ledger/ledgerstream with its Paymesh-Dlq-* headers): list and show
// them, replay them to the ledger, or discard them with an audit record in
// the region's database (table dlq_audit, migration set Migrations).
//
// Every operation is safe to run twice or from two terminals. Operations on
// one dead letter take turns on a Postgres advisory lock. A replay sends the
// original command with its original key, so the ledger's dedup layers
// decide it again: a command applied after all is a duplicate (and the
// layer that caught it is reported), a refusal is refused again. A discard
// is recorded once (a unique index) before the dead letter is deleted.
package dlq

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations returns the dead-letter audit's migration set.
func Migrations() pgdb.Migration {
	sub, _ := fs.Sub(migrations, "migrations") // cannot fail: the path is embedded
	return pgdb.Migration{FS: sub, Table: "dlq_audit_schema_version"}
}

// ErrNotFound is returned for a dead-letter sequence that DLQ_<R> does not
// hold and that no operator replayed or discarded.
var ErrNotFound = errors.New("dlq: no such dead letter")

// ErrNotCommand is returned by Replay for a dead letter whose payload is
// not a command (a poison message): it can only be discarded.
var ErrNotCommand = errors.New("dlq: the payload is not a command")

// ErrWrongClass is returned by Replay for a dead letter that came on a
// ledger subject its kind never travels on (ledgerstream.ReasonWrongClass):
// forged, or sent by a service with a bug. The operator's replay would
// apply it with the operator's authority, so it can only be discarded.
var ErrWrongClass = errors.New("dlq: the command came on a subject its kind never travels on")

// ErrUnsettled is returned by Replay when the ledger did not settle the
// replay within Ops.Wait. The replay is in the ledger stream; replaying
// again is safe.
var ErrUnsettled = errors.New("dlq: the ledger did not settle the replay")

// Reasons returns every reason a dead letter can carry: the ledger's
// codes and ledgerstream's reasons for messages that used up their
// deliveries.
func Reasons() []string {
	out := []string{ledgerstream.ReasonMaxDeliveries, ledgerstream.ReasonStepMaxDeliveries, ledgerstream.ReasonStepParked}
	for _, c := range ledger.Codes() {
		out = append(out, string(c))
	}
	return out
}

// Ops runs the dead-letter operations of one region.
type Ops struct {
	Region string
	JS     jetstream.JetStream // the region's JetStream (its local API)
	Pool   *pgxpool.Pool       // the region's ledger database
	// Wait bounds how long a replay waits for the ledger's outcome
	// (default 30 s).
	Wait time.Duration
}

// Letter is one dead letter.
type Letter struct {
	Seq        uint64    // sequence in DLQ_<R>
	At         time.Time // when it was dead-lettered (the last delivery)
	Reason     string    // a ledger.Code, or one of ledgerstream's Reason constants
	Detail     string
	Subject    string    // the original ledger subject
	OrigSeq    uint64    // the original sequence in LEDGER_<R>
	Deliveries uint64    // deliveries before it was dead-lettered
	FirstAt    time.Time // the original publish (the first delivery); zero when unknown
	Header     nats.Header
	Data       []byte
	// Command is the decoded payload; CommandErr says why it is not a
	// command (a poison message).
	Command    ledger.Command
	CommandErr error
}

// Key is the original command's message key (its Nats-Msg-Id and
// consume-log key), or "" for a payload that is not a command.
func (l Letter) Key() string {
	if l.CommandErr != nil {
		return ""
	}
	return l.Command.MsgKey()
}

// Filter selects dead letters. The zero Filter selects all of them.
type Filter struct {
	Reason    string        // only this reason
	OlderThan time.Duration // only those dead-lettered at least this long ago
	After     uint64        // only sequences after this one (paging)
	Limit     int           // at most this many (0: no limit)
}

// Page is one page of List.
type Page struct {
	Letters []Letter
	// Next is the Filter.After of the next page, 0 when there is none.
	Next uint64
}

func (o *Ops) dlqStream(ctx context.Context) (jetstream.Stream, error) {
	s, err := o.JS.Stream(ctx, subjects.DLQStream(o.Region))
	if err != nil {
		return nil, fmt.Errorf("dlq: stream %s: %w", subjects.DLQStream(o.Region), err)
	}
	return s, nil
}

// List returns the dead letters f selects, oldest first.
func (o *Ops) List(ctx context.Context, f Filter) (Page, error) {
	if f.Limit < 0 {
		return Page{}, fmt.Errorf("dlq: limit %d is negative", f.Limit)
	}
	s, err := o.dlqStream(ctx)
	if err != nil {
		return Page{}, err
	}
	var p Page
	cutoff := time.Now().Add(-f.OlderThan)
	for seq := f.After + 1; ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subjects.DLQ(o.Region)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return p, nil
		}
		if err != nil {
			return Page{}, fmt.Errorf("dlq: read %s after %d: %w", subjects.DLQStream(o.Region), seq-1, err)
		}
		seq = m.Sequence + 1
		l := letterOf(m)
		if (f.Reason != "" && l.Reason != f.Reason) || (f.OlderThan > 0 && l.At.After(cutoff)) {
			continue
		}
		if f.Limit > 0 && len(p.Letters) == f.Limit {
			p.Next = p.Letters[len(p.Letters)-1].Seq
			return p, nil
		}
		p.Letters = append(p.Letters, l)
	}
}

// Show returns dead letter seq with its first delivery, or ErrNotFound.
func (o *Ops) Show(ctx context.Context, seq uint64) (Letter, error) {
	l, err := o.get(ctx, seq)
	if err != nil {
		return Letter{}, err
	}
	if !l.FirstAt.IsZero() {
		return l, nil
	}
	// A dead letter of an older version has no stored time: the ledger
	// stream may still hold its original.
	if ls, err := o.JS.Stream(ctx, subjects.LedgerStream(o.Region)); err == nil {
		if m, err := ls.GetMsg(ctx, l.OrigSeq); err == nil && m.Subject == l.Subject {
			l.FirstAt = m.Time
		}
	}
	return l, nil
}

func (o *Ops) get(ctx context.Context, seq uint64) (Letter, error) {
	s, err := o.dlqStream(ctx)
	if err != nil {
		return Letter{}, err
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Letter{}, fmt.Errorf("%w: %s has no sequence %d", ErrNotFound, subjects.DLQStream(o.Region), seq)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("dlq: read %s %d: %w", subjects.DLQStream(o.Region), seq, err)
	}
	return letterOf(m), nil
}

func letterOf(m *jetstream.RawStreamMsg) Letter {
	h := m.Header
	num := func(k string) uint64 { n, _ := strconv.ParseUint(h.Get(k), 10, 64); return n }
	l := Letter{Seq: m.Sequence, At: m.Time, Reason: h.Get(ledgerstream.HeaderDLQReason), Detail: h.Get(ledgerstream.HeaderDLQDetail),
		Subject: h.Get(ledgerstream.HeaderDLQSubject), OrigSeq: num(ledgerstream.HeaderDLQSequence), Deliveries: num(ledgerstream.HeaderDLQDelivery),
		Header: h, Data: m.Data}
	l.FirstAt, _ = time.Parse(time.RFC3339Nano, h.Get(ledgerstream.HeaderDLQStored))
	l.Command, l.CommandErr = ledger.DecodeCommand(m.Data)
	return l
}
