package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// The event feed: GET /v1/events?after=&type=&limit=, a client's events,
// oldest first, across regions. An event lives in the region of the
// account that orders it, so the feed asks every region for its events
// after that region's position (limit+1, in parallel) and takes the first
// limit of them, oldest first, a prefix of each region's. The cursor holds
// each region's position, so a page never repeats an event nor skips one
// (a region's feed never gains an event behind its position: see
// services/ledger/postgres's EventsPage). The last page gives a cursor too:
// the feed is followed, so the next call with it returns what came since.

// EventList is a page of GET /v1/events.
type EventList struct {
	Events []EventBody `json:"events"`
	// NextCursor continues the feed after this page, on the last page too.
	NextCursor string `json:"next_cursor"`
	// HasMore says whether events past this page were there already.
	HasMore bool `json:"has_more"`
}

// EventBody is the JSON form of an event.
type EventBody struct {
	// ID is the account's ID and the event's sequence: "<account>.<n>".
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	// Account orders the event; Sequence is its place among that
	// account's events (1, 2, … with no gap).
	Account  string    `json:"account"`
	Sequence int64     `json:"sequence"`
	Data     EventData `json:"data"`
	// position is where the event is in its region's feed (not sent).
	position ledger.EventPosition
}

// EventData is the event's object as it was after the change: a transfer
// (or a refund), an account, or a webhook endpoint.
type EventData struct {
	Transfer        *TransferBody      `json:"transfer,omitempty"`
	Account         *EventAccountBody  `json:"account,omitempty"`
	WebhookEndpoint *EventEndpointBody `json:"webhook_endpoint,omitempty"`
}

// EventEndpointBody is a webhook endpoint in an event: its state and why
// (the rest: GET /v1/webhook_endpoints/{id}).
type EventEndpointBody struct {
	ID             string `json:"id"`
	Status         string `json:"status"`
	DisabledReason string `json:"disabled_reason,omitempty"`
}

// EventAccountBody is an account in an event: what the event changed, and
// what never changes (balances are not events: read the account).
type EventAccountBody struct {
	ID        string            `json:"id"`
	Currency  string            `json:"currency"`
	Closed    bool              `json:"closed"`
	Frozen    bool              `json:"frozen"`
	CreatedAt time.Time         `json:"created_at"`
	Reference string            `json:"reference,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
}

// EventID is the ID of an account's event number seq.
func EventID(account string, seq int64) string {
	return ledger.EventRef{Account: account, Sequence: seq}.ID()
}

func eventBody(e ledger.RecordedEvent) EventBody {
	b := EventBody{ID: EventID(e.Account, e.Sequence), Type: string(e.Type), CreatedAt: e.CreatedAt.UTC(), Account: e.Account,
		Sequence: e.Sequence, position: e.Position}
	switch {
	case e.Type.IsEndpoint():
		b.Data.WebhookEndpoint = &EventEndpointBody{ID: e.Object, Status: e.Status, DisabledReason: string(e.Reason)}
	case e.Type.IsAccount():
		a := e.Opened
		b.Data.Account = &EventAccountBody{ID: a.ID, Currency: a.Currency, Closed: a.Closed, Frozen: a.Frozen, CreatedAt: a.CreatedAt.UTC(),
			Reference: a.Reference, Metadata: a.Metadata}
	default:
		t := transferBody(e.Transfer)
		b.Data.Transfer = &t
	}
	return b
}

// EventBodies renders a region's events as the feed and webhook
// deliveries carry them (EventBody's JSON): the delivery worker's
// services/webhooks/delivery.Bodies.
type EventBodies struct {
	Ledger Ledger
}

// Render returns the JSON body of each event refs name that the region
// holds.
func (b EventBodies) Render(ctx context.Context, refs []ledger.EventRef) (map[ledger.EventRef][]byte, error) {
	evs, err := b.Ledger.EventsAt(ctx, refs)
	if err != nil {
		return nil, err
	}
	out := make(map[ledger.EventRef][]byte, len(evs))
	for _, e := range evs {
		body, err := json.Marshal(eventBody(e))
		if err != nil {
			return nil, fmt.Errorf("event %s.%d: %w", e.Account, e.Sequence, err)
		}
		out[ledger.EventRef{Account: e.Account, Sequence: e.Sequence}] = body
	}
	return out, nil
}

// regionEvents is one region's page of the feed, as the region answers a
// forwarded list_events: the events, and each one's position.
type regionEvents struct {
	Events    []EventBody            `json:"events"`
	Positions []ledger.EventPosition `json:"positions"`
}

// getEvents serves GET /v1/events?after=&type=&limit=.
func (l *lists) getEvents(ctx context.Context, r *http.Request, client string) reply {
	after, types, limit, err := l.readEventQuery(r.URL.RawQuery)
	if err != nil {
		return errReply(err)
	}
	regions := l.cfg.Regions.Names()
	replies := make([]reply, len(regions))
	done := make(chan struct{}, len(regions))
	for i, region := range regions {
		q := ListQuery{Types: types}
		if p, ok := after[region]; ok {
			q.EventsAfter = &p
		}
		go func() {
			replies[i] = l.fwd.do(ctx, region, l.events, Call{Client: client, Limit: limit, List: &q})
			done <- struct{}{}
		}()
	}
	for range regions {
		<-done
	}
	return l.mergeEvents(regions, replies, after, limit)
}

// mergeEvents takes the first limit events of the regions' pages, oldest
// first by (created_at, region's order), each region's in its own order,
// and the cursor after them. A page that does not decode, or holds an
// event of an account homed elsewhere, is an internal error.
func (l *lists) mergeEvents(regions []string, replies []reply, after map[string]ledger.EventPosition, limit int) reply {
	pages := make([]regionEvents, len(regions))
	for i, rep := range replies {
		if rep.Status != http.StatusOK {
			return rep
		}
		err := json.Unmarshal(rep.Body, &pages[i])
		if err == nil && len(pages[i].Positions) != len(pages[i].Events) {
			err = fmt.Errorf("%d positions for %d events", len(pages[i].Positions), len(pages[i].Events))
		}
		for j, e := range pages[i].Events {
			if home, herr := l.fwd.homeOf("account", e.Account); err == nil && (herr != nil || home != regions[i] || pages[i].Positions[j].Account != e.Account) {
				err = fmt.Errorf("event %s is not homed there", e.ID)
			}
		}
		if err != nil {
			return errReply(fmt.Errorf("events: region %s answered a page that is not its own: %w", regions[i], err))
		}
	}
	next := maps.Clone(after)
	if next == nil {
		next = map[string]ledger.EventPosition{}
	}
	out := EventList{Events: []EventBody{}}
	heads := make([]int, len(regions))
	for len(out.Events) < limit {
		best := -1
		for i, p := range pages {
			if heads[i] < len(p.Events) && (best < 0 || p.Events[heads[i]].CreatedAt.Before(pages[best].Events[heads[best]].CreatedAt)) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out.Events = append(out.Events, pages[best].Events[heads[best]])
		next[regions[best]] = pages[best].Positions[heads[best]]
		heads[best]++
	}
	for i, p := range pages {
		out.HasMore = out.HasMore || heads[i] < len(p.Events)
	}
	out.NextCursor = encodeEventCursor(next)
	return jsonReply(http.StatusOK, out)
}

// eventsHere answers this region's page of the client's events after the
// call's position: limit+1 of them (the one more tells the merge there is
// more), with their positions.
func (l *lists) eventsHere(ctx context.Context, c Call) reply {
	f := ledger.EventFilter{Client: c.Client, After: c.List.EventsAfter}
	for _, t := range c.List.Types {
		f.Types = append(f.Types, ledger.EventType(t))
	}
	if f.After != nil {
		if err := l.fwd.here(c.Op, "cursor", f.After.Account); err != nil {
			return errReply(err)
		}
	}
	evs, err := l.cfg.Ledger.EventsPage(ctx, f, min(max(c.Limit, 1), MaxPageLimit)+1)
	if err != nil {
		return errReply(err)
	}
	page := regionEvents{Events: make([]EventBody, 0, len(evs)), Positions: make([]ledger.EventPosition, 0, len(evs))}
	for _, e := range evs {
		page.Events = append(page.Events, eventBody(e))
		page.Positions = append(page.Positions, e.Position)
	}
	return jsonReply(http.StatusOK, page)
}

// readEventQuery reads the feed's query: after (a cursor the feed gave),
// type (event types, comma-separated) and limit; anything else is refused.
func (l *lists) readEventQuery(raw string) (map[string]ledger.EventPosition, []string, int, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return nil, nil, 0, ledger.Errorf(ledger.CodeInvalidRequest, "the query does not parse: %v", err)
	}
	var (
		after map[string]ledger.EventPosition
		types []string
		limit = defaultListLimit
	)
	for name, vals := range v {
		if len(vals) != 1 {
			return nil, nil, 0, ledger.Errorf(ledger.CodeInvalidRequest, "give %s once", name)
		}
		switch name {
		case "limit":
			limit, err = parseLimit(vals[0])
		case "after":
			after, err = l.decodeEventCursor(vals[0])
		case "type":
			types = strings.Split(vals[0], ",")
			err = checkEventTypes(types)
		default:
			err = ledger.Errorf(ledger.CodeInvalidRequest, "unknown query parameter %.32q (the feed takes after, type, limit)", name)
		}
		if err != nil {
			return nil, nil, 0, err
		}
	}
	return after, types, limit, nil
}

// checkEventTypes refuses a type that is no event's, or one given twice.
func checkEventTypes(types []string) error {
	ts := make([]ledger.EventType, len(types))
	for i, t := range types {
		ts[i] = ledger.EventType(t)
	}
	return ledger.CheckEventTypes(ts)
}

// checkEventPosition refuses a position no feed gives: an account that is
// no paymesh ID, a sequence or transaction that is not positive.
func (f *forwarder) checkEventPosition(p ledger.EventPosition) error {
	if _, err := f.homeOf("cursor", p.Account); err != nil {
		return err
	}
	if p.Sequence < 1 || p.Tx < 1 {
		return ledger.Errorf(ledger.CodeInvalidRequest, "cursor position %s.%d in transaction %d is none a feed gives", p.Account, p.Sequence, p.Tx)
	}
	return nil
}

// encodeEventCursor makes the opaque cursor of the feed at the regions'
// positions.
func encodeEventCursor(at map[string]ledger.EventPosition) string {
	b, _ := json.Marshal(at) // cannot fail: strings and numbers
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeEventCursor reads a cursor encodeEventCursor made; anything else,
// tampered or made up, is an invalid request: a region that is not one, a
// position whose account is homed in another region or is malformed.
func (l *lists) decodeEventCursor(v string) (map[string]ledger.EventPosition, error) {
	bad := func(why string) error {
		return ledger.Errorf(ledger.CodeInvalidRequest, "after=%.40q is not a cursor the feed gave (%s)", v, why)
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil, bad("not base64url")
	}
	var at map[string]ledger.EventPosition
	if err := json.Unmarshal(b, &at); err != nil {
		return nil, bad("not a feed position")
	}
	for region, p := range at {
		if err := l.fwd.checkEventPosition(p); err != nil {
			return nil, bad(err.Error())
		}
		if home, _ := l.fwd.homeOf("cursor", p.Account); home != region {
			return nil, bad(fmt.Sprintf("region %.16q holds no account %s", region, p.Account))
		}
	}
	return at, nil
}
