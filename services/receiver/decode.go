package receiver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger"
)

// Event is an event as paymesh delivers it (the feed's JSON).
type Event = api.EventBody

// Delivery is one verified delivery: the event, and the attempt hints that
// came with it (0 when not said).
type Delivery struct {
	Event Event
	// Body is the event as it was signed, kept while it is parked.
	Body                []byte
	Attempt, Redelivery int
}

// decode reads a verified body, whose signed ID is id, and checks it as
// input from outside: a signature says who sent it, not that it is well
// formed. Unknown fields are allowed (paymesh may add some); a missing or
// inconsistent one is an error.
func decode(id string, body []byte) (Delivery, error) {
	var e Event
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&e); err != nil {
		return Delivery{}, fmt.Errorf("the event is not JSON: %w", err)
	}
	if dec.More() {
		return Delivery{}, errors.New("the body holds more than one JSON value")
	}
	if err := check(id, e); err != nil {
		return Delivery{}, err
	}
	return Delivery{Event: e, Body: body}, nil
}

// check refuses an event whose fields do not agree with each other or with
// the signed ID.
func check(id string, e Event) error {
	ref, err := ledger.ParseEventID(e.ID)
	switch {
	case err != nil:
		return fmt.Errorf("event id %.80q: %w", e.ID, err)
	case e.ID != id:
		return fmt.Errorf("the body's event %.80q is not the signed %.80q", e.ID, id)
	case ref.Account != e.Account || ref.Sequence != e.Sequence:
		return fmt.Errorf("event %.80q is not account %.40q's number %d", e.ID, e.Account, e.Sequence)
	case !ledger.EventType(e.Type).Valid():
		return fmt.Errorf("event type %.40q is not one paymesh sends", e.Type)
	case e.CreatedAt.IsZero():
		return errors.New("the event has no created_at")
	}
	t, a, w := e.Data.Transfer, e.Data.Account, e.Data.WebhookEndpoint
	switch typ := ledger.EventType(e.Type); {
	case typ.IsEndpoint():
		if w == nil || t != nil || a != nil || w.ID != e.Account {
			return fmt.Errorf("a %s event carries its webhook endpoint (%.40q) and nothing else", e.Type, e.Account)
		}
		return nil
	case typ.IsAccount():
		if a == nil || t != nil || w != nil || a.ID != e.Account {
			return fmt.Errorf("a %s event carries its account (%.40q) and nothing else", e.Type, e.Account)
		}
		return nil
	}
	switch {
	case t == nil || a != nil || w != nil || t.ID == "":
		return fmt.Errorf("a %s event carries a transfer and nothing else", e.Type)
	case t.Amount < 0:
		return fmt.Errorf("transfer %.40q has a negative amount", t.ID)
	case strings.HasPrefix(e.Type, "refund.") && t.RefundOf == "":
		return fmt.Errorf("the refund %.40q names no transfer it refunds", t.ID)
	}
	return nil
}
