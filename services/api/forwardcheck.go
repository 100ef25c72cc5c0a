package api

import (
	"bytes"
	"slices"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// A call forwarded from another region is checked on receipt as strictly
// as the HTTP edge of the region that sent it checked the request, with
// the edge's own rules (ledger.ValidClientID, validKey, checkLimit,
// checkAfter, checkBodySize, the ID's home region), and against what its
// operation takes (shape): a peer that is buggy, or lies, gets a 4xx
// problem and a count in the metrics, and the operation never runs on
// input the edge would have refused. An ID must be homed here: a call sent
// to the wrong region is refused, not run against this region's database.

// shape is what a call of an operation carries; a forwarded call is
// refused unless it has its operation's shape (forwarder.check).
type shape struct {
	id     idRule   // the call's ID
	key    keyRule  // the call's Idempotency-Key
	body   bodyRule // the call's body
	page   bool     // after and limit of a page (none otherwise)
	target bool     // a refund's target, its payee's account here (none otherwise)
	region bool     // the region a new account opens in when its body names none (none otherwise)
	at     bool     // an instant of a balance, optional (none otherwise)
	period bool     // a statement's from and to, required (none otherwise)
	list   bool     // what a list selects, required (none otherwise)
}

// keyRule is whether an operation's call carries an Idempotency-Key.
type keyRule uint8

const (
	noKey       keyRule = iota
	optionalKey         // opening an account: a key makes it safe to retry
	requiredKey
)

// idRule is where the ID of an operation's call is homed.
type idRule uint8

const (
	noID   idRule = iota
	idHere        // in this region: the call runs where its object lives
	idAny         // any region (a refund names the transfer it refunds, which may live elsewhere)
)

// bodyRule is whether an operation's call carries a body.
type bodyRule uint8

const (
	noBody bodyRule = iota
	optionalBody
	requiredBody
)

// Refusal is why a forwarded call was refused before it ran: a small
// closed set, the label of the refused forwarded calls metric.
type Refusal uint8

// Why a forwarded call is refused.
const (
	// RefusedMalformed: not a call (malformed JSON).
	RefusedMalformed Refusal = iota
	// RefusedOp: an operation this region does not serve.
	RefusedOp
	// RefusedClient: not a well-formed client ID.
	RefusedClient
	// RefusedID: an ID missing, malformed, homed in another region, or
	// given to an operation that takes none.
	RefusedID
	// RefusedKey: an Idempotency-Key missing, badly spelled, or given to
	// an operation that takes none.
	RefusedKey
	// RefusedPage: a limit or after out of range, or given to an
	// operation that takes no page.
	RefusedPage
	// RefusedBody: a body missing, over MaxBodyBytes, or given to an
	// operation that takes none.
	RefusedBody
	// RefusedTarget: a refund's target missing or malformed, its payee's
	// account homed in another region, or a target given to an operation
	// that takes none.
	RefusedTarget
	// RefusedRegion: a new account's region missing, unknown, or given
	// to an operation that takes none.
	RefusedRegion
	// RefusedTime: an instant or a period missing, in the future, empty,
	// or given to an operation that takes none.
	RefusedTime
	// RefusedList: a list's selection missing or malformed (a status,
	// currency, account or cursor that is none, an empty period, an
	// account homed elsewhere), or given to an operation that takes none.
	RefusedList
	numRefusals
)

// Refusals lists every refusal reason.
var Refusals = []Refusal{RefusedMalformed, RefusedOp, RefusedClient, RefusedID, RefusedKey, RefusedPage, RefusedBody, RefusedTarget, RefusedRegion, RefusedTime, RefusedList}

// String returns the refusal's label value.
func (r Refusal) String() string {
	if r >= numRefusals {
		return "unknown"
	}
	return [...]string{"malformed", "op", "client", "id", "key", "page", "body", "target", "region", "time", "list"}[r]
}

// check refuses a forwarded call that the HTTP edge would not have let
// through, or that belongs in another region, and says why.
func (f *forwarder) check(c Call, s shape) (Refusal, error) {
	for _, r := range []struct {
		why Refusal
		err error
	}{
		{RefusedClient, ledger.ValidClientID(c.Client)},
		{RefusedID, f.checkID(c, s.id)},
		{RefusedKey, checkCallKey(c, s.key)},
		{RefusedPage, checkCallPage(c, s.page)},
		{RefusedBody, checkCallBody(c, s.body)},
		{RefusedTarget, f.checkTarget(c, s.target)},
		{RefusedRegion, f.checkRegion(c, s.region)},
		{RefusedTime, checkCallTime(c, s, time.Now().Add(MaxClockSkew))},
		{RefusedList, f.checkCallList(c, s.list, time.Now())},
	} {
		if r.err != nil {
			return r.why, r.err
		}
	}
	return 0, nil
}

func (f *forwarder) checkID(c Call, rule idRule) error {
	switch {
	case rule == noID && c.ID != "":
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no id", c.Op)
	case rule == noID:
		return nil
	case c.ID == "":
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s needs an id", c.Op)
	}
	if rule == idAny {
		_, err := f.homeOf("id", c.ID)
		return err
	}
	return f.here(c.Op, "id", c.ID)
}

// homeOf returns the home region of id, the call's field named what.
func (f *forwarder) homeOf(what, id string) (string, error) {
	home, err := f.cfg.Regions.HomeRegion(id)
	if err != nil {
		return "", ledger.Errorf(ledger.CodeInvalidRequest, "%s %.64q is not a paymesh ID", what, id)
	}
	return home, nil
}

// here refuses an op whose field what names id, unless id is homed in
// this region.
func (f *forwarder) here(op, what, id string) error {
	home, err := f.homeOf(what, id)
	if err == nil && home != f.cfg.Region {
		err = ledger.Errorf(ledger.CodeInvalidRequest, "%s of %s %s runs in its home region %s, not %s: the call was sent to the wrong region",
			op, what, id, home, f.cfg.Region)
	}
	return err
}

func checkCallKey(c Call, rule keyRule) error {
	switch {
	case rule == noKey && c.Key != "":
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no Idempotency-Key", c.Op)
	case rule == noKey, rule == optionalKey && c.Key == "":
		return nil
	case c.Key == "":
		return ledger.Errorf(CodeIdempotencyKeyMissing, "%s requires an Idempotency-Key", c.Op)
	}
	return validKey(c.Key)
}

// checkRegion checks a call's region. An operation that takes one (an
// account key's claim, an account's creation) takes it with an
// Idempotency-Key, and then needs it: the region the key's first request
// chose, one of the table's. Any other call carries none.
func (f *forwarder) checkRegion(c Call, takes bool) error {
	switch {
	case !takes && c.Region != "":
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no region", c.Op)
	case !takes, c.Region == "" && c.Key == "":
		return nil
	case c.Key == "":
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes a region only with an Idempotency-Key", c.Op)
	case c.Region == "":
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s with an Idempotency-Key needs the region the account opens in", c.Op)
	}
	if _, ok := f.cfg.Regions.Code(c.Region); !ok {
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s: unknown region %.16q", c.Op, c.Region)
	}
	return nil
}

func checkCallPage(c Call, page bool) error {
	if !page {
		if c.After != 0 || c.Limit != 0 {
			return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no page (after, limit)", c.Op)
		}
		return nil
	}
	if err := checkLimit(c.Limit); err != nil {
		return err
	}
	return checkAfter(c.After)
}

func checkCallBody(c Call, rule bodyRule) error {
	if err := checkBodySize(len(c.Body)); err != nil {
		return err
	}
	switch {
	case rule == noBody && len(c.Body) > 0:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no body", c.Op)
	case rule == requiredBody && len(bytes.TrimSpace(c.Body)) == 0:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s needs a body", c.Op)
	}
	return nil
}

func (f *forwarder) checkTarget(c Call, needed bool) error {
	t := c.Target
	switch {
	case !needed && t != nil:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no target", c.Op)
	case !needed:
		return nil
	case t == nil:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s needs the accounts of the transfer it refunds (target)", c.Op)
	case !ledger.ValidCurrency(t.Currency):
		return ledger.Errorf(ledger.CodeInvalidRequest, "target currency %.8q is not an ISO 4217 currency code", t.Currency)
	}
	if _, err := f.homeOf("target from", t.From); err != nil {
		return err
	}
	// A refund debits the payee's account: it runs in the payee's region.
	return f.here(c.Op, "target to", t.To)
}

// MaxClockSkew is how far the sending region's clock may be ahead of this
// one's: a statement's default end is the sending edge's now, which must
// not be refused as in the future here.
const MaxClockSkew = 5 * time.Second

// checkCallTime checks a call's instant and period: an instant, where the
// operation takes one, not after now; a period, where it needs one, with
// both ends, from before to, to not after now; neither elsewhere.
func checkCallTime(c Call, s shape, now time.Time) error {
	switch {
	case !s.at && c.At != nil:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no instant (at)", c.Op)
	case !s.period && (c.From != nil || c.To != nil):
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no period (from, to)", c.Op)
	case c.At != nil:
		return checkInstant("at", *c.At, now)
	case !s.period:
		return nil
	case c.From == nil || c.To == nil:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s needs a period (from and to)", c.Op)
	}
	return checkPeriod(*c.From, *c.To, now)
}

// checkPeriod refuses a statement's period that is empty or ends in the
// future.
func checkPeriod(from, to, now time.Time) error {
	if !from.Before(to) {
		return ledger.Errorf(ledger.CodeInvalidRequest, "from=%s is not before to=%s", from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano))
	}
	return checkInstant("to", to, now)
}

// checkCallList checks a list's selection where the operation takes one.
func (f *forwarder) checkCallList(c Call, takes bool, now time.Time) error {
	switch {
	case !takes && c.List != nil:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s takes no list", c.Op)
	case !takes:
		return nil
	case c.List == nil:
		return ledger.Errorf(ledger.CodeInvalidRequest, "%s needs what it lists (list)", c.Op)
	}
	return f.checkList(*c.List, now)
}

// checkList refuses a list selection the edge would not make: an unknown
// status or currency, an account or cursor that is no paymesh ID, a
// period that is empty.
func (f *forwarder) checkList(q ListQuery, now time.Time) error {
	if q.Status != "" && !slices.Contains(ledger.Statuses(), ledger.Status(q.Status)) {
		return ledger.Errorf(ledger.CodeInvalidRequest, "status=%.16q is none of %v", q.Status, ledger.Statuses())
	}
	if q.Currency != "" && !ledger.ValidCurrency(q.Currency) {
		return ledger.Errorf(ledger.CodeInvalidCurrency, "currency=%.8q is not an ISO 4217 currency code", q.Currency)
	}
	if q.Account != "" {
		if _, err := f.homeOf("account", q.Account); err != nil {
			return err
		}
	}
	if q.After != nil {
		if _, err := f.homeOf("cursor", q.After.ID); err != nil {
			return err
		}
	}
	if err := ledger.ValidLabels(q.Reference, q.Metadata); err != nil {
		return err
	}
	if err := checkEventTypes(q.Types); err != nil {
		return err
	}
	if q.EventsAfter != nil {
		if err := f.checkEventPosition(*q.EventsAfter); err != nil {
			return err
		}
	}
	if q.CreatedFrom != nil && q.CreatedTo != nil && !q.CreatedFrom.Before(*q.CreatedTo) {
		return ledger.Errorf(ledger.CodeInvalidRequest, "created_gte=%s is not before created_lt=%s", q.CreatedFrom.Format(time.RFC3339Nano), q.CreatedTo.Format(time.RFC3339Nano))
	}
	return nil
}
