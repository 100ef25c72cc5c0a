package api

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/ledger"
)

// Every account and transfer has a home region, named by its ID. An
// endpoint reads its request wherever it arrives and then runs one
// operation in the home region of what it touches: here, or forwarded to
// that region's API over NATS request-reply, which runs it against its own
// database and sends back the reply. The call carries everything the
// operation needs, its client and its Idempotency-Key included, so a
// repeat meets the first request's key in the same region wherever it
// arrives.

// Call is one operation's input, run in the home region of what it
// touches. It travels between regions as JSON on ForwardSubject: the wire
// form of a forwarded call, which a peer region's API sends (and a tool or
// a test that speaks to a region's API as a peer would).
type Call struct {
	Op     string          `json:"op"`
	Client string          `json:"client"`
	ID     string          `json:"id,omitempty"`
	Key    string          `json:"key,omitempty"`
	After  int64           `json:"after,omitempty"`
	Limit  int             `json:"limit,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	// Target is, for a refund, the accounts of the transfer it refunds.
	Target *RefundTarget `json:"target,omitempty"`
	// At is the instant of an account's balance as of then; From and To
	// the period of a statement.
	At   *time.Time `json:"at,omitempty"`
	From *time.Time `json:"from,omitempty"`
	To   *time.Time `json:"to,omitempty"`
	// List is what a list selects (list_transfers, list_accounts).
	List *ListQuery `json:"list,omitempty"`
	// Region is, for an account opened under an Idempotency-Key, the
	// region it opens in when its body names none: the region the
	// request was sent to.
	Region string `json:"region,omitempty"`
	// transfer is Body decoded, when the call runs in the process that
	// decoded it (a forwarded call decodes its body again).
	transfer *TransferRequest
}

// operation is one thing an endpoint asks of a home region: run runs it
// there, name (the call's op) tells the receiving region which one a
// forwarded call is, and takes what such a call must carry.
type operation struct {
	name  string
	run   func(context.Context, Call) reply
	takes shape
}

// forwarder runs operations in their home region, and serves the ones
// other regions forward to this one.
type forwarder struct {
	cfg   *Config
	stats *Stats
	ops   map[string]operation // by name: what other regions may ask of this one
	// reader reads each forwarded call: the forwarder itself, or
	// Config.WrapForwardReader's decorator of it.
	reader ForwardReader
}

// A ForwardReader reads the calls other regions forward to this one: it
// decodes a call and checks it against the operation it names
// (forwardcheck.go). A call it refuses comes back with the reason, and
// the problem to answer with; one it could decode (every reason but
// RefusedMalformed) comes back decoded too.
type ForwardReader interface {
	ReadForwarded(data []byte) (Call, Refusal, error)
}

// register makes ops available to other regions.
func (f *forwarder) register(ops ...operation) {
	f.ops = make(map[string]operation, len(ops))
	for _, op := range ops {
		f.ops[op.name] = op
	}
}

// home returns the home region of an account or transfer ID.
func (f *forwarder) home(id string) (string, error) {
	r, err := f.cfg.Regions.HomeRegion(id)
	if err != nil {
		return "", ledger.Errorf(ledger.CodeNotFound, "no such object %q", id)
	}
	return r, nil
}

// do runs op with c in region home: here, or over NATS in the home region.
func (f *forwarder) do(ctx context.Context, home string, op operation, c Call) reply {
	c.Op = op.name
	if home == f.cfg.Region {
		return op.run(ctx, c)
	}
	req, _ := json.Marshal(c)
	ctx, cancel := context.WithTimeout(ctx, f.cfg.Wait+5*time.Second)
	defer cancel()
	out := nats.NewMsg(ForwardSubject(home))
	out.Data = req
	natstrace.Inject(ctx, out)
	msg, err := f.cfg.NATS.RequestMsgWithContext(ctx, out)
	if err != nil {
		return errReply(ledger.Errorf(CodeRegionUnavailable, "region %s did not answer: %v", home, err))
	}
	var rep reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return errReply(fmt.Errorf("reply from %s: %w", home, err))
	}
	return rep
}

// ForwardSubject is where region's API takes the calls forwarded from other
// regions; only API users may publish or subscribe to it (platform/natsauth).
func ForwardSubject(region string) string { return subjects.API(region) }

// maxForwarded bounds the calls from other regions served at once.
const maxForwarded = 256

// listen serves the calls other regions forward to this one.
func (f *forwarder) listen() (*nats.Subscription, error) {
	// A subscription's callback runs one message at a time, and a transfer
	// may wait for its final state: each call gets a goroutine of its own,
	// up to maxForwarded at once.
	slots := make(chan struct{}, maxForwarded)
	sub, err := f.cfg.NATS.QueueSubscribe(ForwardSubject(f.cfg.Region), "api", func(m *nats.Msg) {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			b, _ := json.Marshal(f.guarded(m))
			_ = m.Respond(b)
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("api listen: %w", err)
	}
	return sub, nil
}

// guarded serves a forwarded call, and answers a panic in it with the
// internal-error problem (recover.go): the process serves on.
func (f *forwarder) guarded(m *nats.Msg) (rep reply) {
	defer func() {
		if p := recover(); p != nil {
			rep = recovered(f.cfg.Log, f.stats, PanicForwarded, p, "subject", m.Subject)
		}
	}()
	return f.serve(m)
}

// serve runs a forwarded call, in the trace of the region that sent it,
// once it passed the checks the HTTP edge of the sending region made
// (check). A refused call is answered with its problem, counted and
// logged.
func (f *forwarder) serve(m *nats.Msg) reply {
	c, why, err := f.reader.ReadForwarded(m.Data)
	op, ok := f.ops[c.Op]
	if err == nil && !ok { // a decorator let a call through that no operation here takes
		why, err = RefusedOp, unknownOp(c.Op)
	}
	if err != nil {
		f.stats.refused[why].Add(1)
		f.cfg.Log.Warn("forwarded call refused", "region", f.cfg.Region, "reason", why.String(), "err", err)
		return errReply(err)
	}
	ctx, cancel := context.WithTimeout(natstrace.Extract(context.Background(), m.Header), f.cfg.Wait+4*time.Second)
	defer cancel()
	return op.run(ctx, c)
}

// ReadForwarded decodes a forwarded call and checks it against its
// operation, or says why it is refused (see ForwardReader).
func (f *forwarder) ReadForwarded(data []byte) (Call, Refusal, error) {
	var c Call
	if err := json.Unmarshal(data, &c); err != nil {
		return c, RefusedMalformed, ledger.Errorf(ledger.CodeInvalidRequest, "malformed forwarded call")
	}
	op, ok := f.ops[c.Op]
	if !ok {
		return c, RefusedOp, unknownOp(c.Op)
	}
	why, err := f.check(c, op.takes)
	return c, why, err
}

// unknownOp is the refusal of a call of an operation this region does not
// serve.
func unknownOp(op string) error {
	return ledger.Errorf(ledger.CodeInvalidRequest, "unknown operation %.64q", op)
}
