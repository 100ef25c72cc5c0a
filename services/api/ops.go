package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
)

// The operator endpoints act on the dead letters of this API's own region
// (DLQ_<R> and its audit in the region's database); they are never
// forwarded. Each answers with the region it acted in.

// MaxDiscardReason bounds the reason of a discard, kept in the audit.
const MaxDiscardReason = 1000

// DeadLetterBody is one dead letter, as GET /v1/ops/dead-letters lists it.
type DeadLetterBody struct {
	Seq    uint64 `json:"seq"`
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
	// Subject and LedgerSeq are where the command was: its ledger subject
	// and its sequence in LEDGER_<R>.
	Subject    string `json:"subject"`
	LedgerSeq  uint64 `json:"ledger_seq"`
	Deliveries uint64 `json:"deliveries"`
	// DeadLetteredAt is the last delivery, when the ledger gave up.
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// Key is the command's message key; absent for a payload that is not
	// a command.
	Key string `json:"key,omitempty"`
}

// DeadLettersBody is a page of GET /v1/ops/dead-letters.
type DeadLettersBody struct {
	Region      string           `json:"region"`
	DeadLetters []DeadLetterBody `json:"dead_letters"`
	// NextAfter is the after of the next page; absent on the last.
	NextAfter *uint64 `json:"next_after,omitempty"`
}

// DeadLetterDetailBody is GET /v1/ops/dead-letters/{seq}: the letter with
// its first and last delivery, headers and payload.
type DeadLetterDetailBody struct {
	Region string `json:"region"`
	DeadLetterBody
	// FirstDeliveryAt is the original publish; absent when LEDGER_<R> no
	// longer holds it.
	FirstDeliveryAt *time.Time          `json:"first_delivery_at,omitempty"`
	LastDeliveryAt  time.Time           `json:"last_delivery_at"`
	Headers         map[string][]string `json:"headers"`
	// Payload is the message as it was sent (base64 in JSON); Command is
	// the same bytes as a JSON object when they decode as a command, and
	// CommandError says why they do not.
	Payload      []byte          `json:"payload"`
	Command      json.RawMessage `json:"command,omitempty"`
	CommandError string          `json:"command_error,omitempty"`
}

// DeadLetterOutcomeBody is the answer of a replay or a discard
// (dlq.Outcome).
type DeadLetterOutcomeBody struct {
	Region string `json:"region"`
	Seq    uint64 `json:"seq"`
	Key    string `json:"key,omitempty"`
	// Outcome is applied, duplicate, refused or deferred for a replay
	// made now; discarded for a discard; replayed or discarded for a dead
	// letter an operator settled before (Operator, Why and At say who,
	// why and when).
	Outcome string `json:"outcome"`
	// Layer caught a duplicate, or a refusal again.
	Layer string `json:"layer,omitempty"`
	// Reason is a refusal's reason, or the reason of a dead letter settled
	// before.
	Reason        string     `json:"reason,omitempty"`
	Detail        string     `json:"detail,omitempty"`
	LedgerSeq     uint64     `json:"ledger_seq,omitempty"`
	NewDeadLetter uint64     `json:"new_dead_letter,omitempty"`
	RetryAt       *time.Time `json:"retry_at,omitempty"`
	Operator      string     `json:"operator,omitempty"`
	Why           string     `json:"why,omitempty"`
	At            *time.Time `json:"at,omitempty"`
}

// ops serves the operator endpoints (/v1/ops/dead-letters/...).
type ops struct {
	cfg *Config
}

// DiscardRequest is the body of POST /v1/ops/dead-letters/{seq}/discard.
type DiscardRequest struct {
	Reason string `json:"reason"`
}

// list serves GET /v1/ops/dead-letters.
func (o *ops) list(ctx context.Context, r *http.Request, _ RegisteredClient) reply {
	f, err := deadLetterFilter(r)
	if err != nil {
		return errReply(err)
	}
	p, err := o.cfg.DeadLetters.List(ctx, f)
	if err != nil {
		return o.opsErr(err)
	}
	page := DeadLettersBody{Region: o.cfg.Region, DeadLetters: []DeadLetterBody{}}
	for _, l := range p.Letters {
		page.DeadLetters = append(page.DeadLetters, letterBody(l))
	}
	if p.Next != 0 {
		page.NextAfter = &p.Next
	}
	return jsonReply(http.StatusOK, page)
}

// deadLetterFilter reads the list's query: reason, older_than, limit
// (1-500, default 50) and after. Unknown and repeated parameters are
// refused.
func deadLetterFilter(r *http.Request) (dlq.Filter, error) {
	f := dlq.Filter{Limit: 50}
	for k, vs := range r.URL.Query() {
		if !slices.Contains([]string{"reason", "older_than", "limit", "after"}, k) {
			return f, ledger.Errorf(ledger.CodeInvalidRequest, "unknown query parameter %q (reason, older_than, limit, after)", k)
		}
		if len(vs) > 1 {
			return f, ledger.Errorf(ledger.CodeInvalidRequest, "query parameter %q given %d times", k, len(vs))
		}
		v := vs[0]
		switch k {
		case "reason":
			if !slices.Contains(dlq.Reasons(), v) {
				return f, ledger.Errorf(ledger.CodeInvalidRequest, "reason=%q is not a dead-letter reason (one of %s)", v, strings.Join(dlq.Reasons(), ", "))
			}
			f.Reason = v
		case "older_than":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return f, ledger.Errorf(ledger.CodeInvalidRequest, "older_than=%q is not a positive duration such as 90s, 15m or 1h", v)
			}
			f.OlderThan = d
		case "limit":
			n, err := parseLimit(v)
			if err != nil {
				return f, err
			}
			f.Limit = n
		case "after":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return f, ledger.Errorf(ledger.CodeInvalidRequest, "after=%q is not a dead-letter sequence (next_after of the previous page)", v)
			}
			f.After = n
		}
	}
	return f, nil
}

// show serves GET /v1/ops/dead-letters/{seq}.
func (o *ops) show(ctx context.Context, r *http.Request, _ RegisteredClient) reply {
	seq, err := deadLetterSeq(r)
	if err != nil {
		return errReply(err)
	}
	l, err := o.cfg.DeadLetters.Show(ctx, seq)
	if err != nil {
		return o.opsErr(err)
	}
	b := DeadLetterDetailBody{Region: o.cfg.Region, DeadLetterBody: letterBody(l), LastDeliveryAt: l.At,
		Headers: map[string][]string(l.Header), Payload: l.Data}
	if b.Headers == nil {
		b.Headers = map[string][]string{}
	}
	if !l.FirstAt.IsZero() {
		b.FirstDeliveryAt = &l.FirstAt
	}
	if l.CommandErr != nil {
		b.CommandError = l.CommandErr.Error()
	} else {
		b.Command = l.Data
	}
	return jsonReply(http.StatusOK, b)
}

// replay serves POST /v1/ops/dead-letters/{seq}/replay.
func (o *ops) replay(ctx context.Context, r *http.Request, op RegisteredClient) reply {
	seq, err := deadLetterSeq(r)
	if err != nil {
		return errReply(err)
	}
	body, err := readBody(r)
	if err != nil {
		return errReply(err)
	}
	if len(body) > 0 {
		if err := decodeStrict(body, &struct{}{}); err != nil {
			return errReply(err)
		}
	}
	out, err := o.cfg.DeadLetters.Replay(ctx, seq, op.ID)
	if err != nil {
		return o.opsErr(err)
	}
	if out.Operator == "" && out.Kind != dlq.Deferred {
		out.Operator = op.ID // the audit records this replay under it
	}
	rep := jsonReply(http.StatusOK, o.outcomeBody(out))
	if out.Kind == dlq.Deferred {
		wait := max(time.Until(out.RetryAt), 0)
		rep.Header = map[string]string{"Retry-After": strconv.Itoa(int(wait.Round(time.Second).Seconds()) + 1)}
	}
	return rep
}

// discard serves POST /v1/ops/dead-letters/{seq}/discard.
func (o *ops) discard(ctx context.Context, r *http.Request, op RegisteredClient) reply {
	seq, err := deadLetterSeq(r)
	if err != nil {
		return errReply(err)
	}
	body, err := readBody(r)
	if err != nil {
		return errReply(err)
	}
	var req DiscardRequest
	if err := decodeStrict(body, &req, "reason"); err != nil {
		return errReply(err)
	}
	switch why := strings.TrimSpace(req.Reason); {
	case why == "":
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, `a discard needs a reason: {"reason": "why it is discarded"}, kept in the audit`))
	case len(req.Reason) > MaxDiscardReason:
		return errReply(ledger.Errorf(ledger.CodeInvalidRequest, "the reason is %d bytes, over the %d-byte limit", len(req.Reason), MaxDiscardReason))
	}
	out, err := o.cfg.DeadLetters.Discard(ctx, seq, op.ID, req.Reason)
	if err != nil {
		return o.opsErr(err)
	}
	return jsonReply(http.StatusOK, o.outcomeBody(out))
}

// opsDisabled answers the operator endpoints of an API started without
// the region's operator NATS user.
var opsDisabled = ledger.Errorf(CodeOperatorAPIDisabled,
	"this API was started without the region's operator NATS user (--ops-nats-user, PAYMESH_OPS_NATS_USER): it cannot reach the dead letters")

// deadLetterSeq reads the {seq} of the path: a positive integer.
func deadLetterSeq(r *http.Request) (uint64, error) {
	v := r.PathValue("seq")
	seq, err := strconv.ParseUint(v, 10, 64)
	if err != nil || seq == 0 {
		return 0, ledger.Errorf(ledger.CodeInvalidRequest, "%q is not a dead-letter sequence (a positive integer)", v)
	}
	return seq, nil
}

// opsErr answers a failed dead-letter operation: the errors the operator
// can act on with their codes, any other as internal (and logged).
func (o *ops) opsErr(err error) reply {
	var code ledger.Code
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		code = CodeDeadLetterNotFound
	case errors.Is(err, dlq.ErrNotCommand):
		code = CodeDeadLetterNotCommand
	case errors.Is(err, dlq.ErrUnsettled):
		code = CodeReplayUnsettled
	default:
		o.cfg.Log.Error("dead-letter operation failed", "region", o.cfg.Region, "stream", subjects.DLQStream(o.cfg.Region), "err", err)
		return errReply(err)
	}
	msg := strings.TrimPrefix(err.Error(), "dlq: ")
	return errReply(ledger.Errorf(code, "%s", msg))
}

func letterBody(l dlq.Letter) DeadLetterBody {
	return DeadLetterBody{Seq: l.Seq, Reason: l.Reason, Detail: l.Detail, Subject: l.Subject, LedgerSeq: l.OrigSeq,
		Deliveries: l.Deliveries, DeadLetteredAt: l.At, Key: l.Key()}
}

func (o *ops) outcomeBody(out dlq.Outcome) DeadLetterOutcomeBody {
	b := DeadLetterOutcomeBody{Region: o.cfg.Region, Seq: out.Seq, Key: out.Key, Outcome: string(out.Kind), Layer: string(out.Layer),
		Reason: out.Reason, Detail: out.Detail, LedgerSeq: out.LedgerSeq, NewDeadLetter: out.NewSeq, Operator: out.Operator, Why: out.Why}
	if !out.RetryAt.IsZero() {
		b.RetryAt = &out.RetryAt
	}
	if !out.At.IsZero() {
		b.At = &out.At
	}
	return b
}
