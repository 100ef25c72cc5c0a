package demo

import (
	"fmt"
	"io"

	"github.com/paymesh/paymesh/services/ledger"
)

// Each duplicate the demo makes has the cause paymesh must attribute it
// to, whatever layer catches it: the attribution check compares them.
const (
	injectedClientRetry = "client retry (same key, any region)"
	injectedHTTPRetry   = "HTTP retry (same Idempotency-Key, any region)"
	injectedRepublish   = "router re-publish (same Nats-Msg-Id)"
	injectedStepResend  = "re-send of a saga step, by its ledger or relay (same Nats-Msg-Id)"
)

// injectedCause is the cause of each kind of injected duplicate.
var injectedCause = map[string]ledger.Cause{
	injectedClientRetry: ledger.CauseClientRetry,
	injectedHTTPRetry:   ledger.CauseClientRetry,
	injectedRepublish:   ledger.CauseRepublish,
	injectedStepResend:  ledger.CauseSagaResend,
	injectedRedelivery:  ledger.CauseRedelivery,
}

// repeatCause is the cause of each kind of repeat nobody injected
// (repeats.go): a ledger's redelivery, a router's forward or a saga step
// sent again, a client's request sent again (the demo's submit, an HTTP
// request, an API's request handed on to its ledger after its own
// transaction applied it: a new request of the key, to the ledger).
var repeatCause = map[string]ledger.Cause{
	repeatLedger:  ledger.CauseRedelivery,
	repeatForward: ledger.CauseRepublish,
	repeatRelay:   ledger.CauseSagaResend,
	repeatSubmit:  ledger.CauseClientRetry,
	repeatHanded:  ledger.CauseClientRetry,
	repeatHTTP:    ledger.CauseClientRetry,
}

// attributionSlack is the share by which a cause's count may miss its
// bounds: the attribution is checked within ±5 %.
const attributionSlack = 0.05

// CauseBounds is what a cause's attributed count must lie within: its
// injected duplicates, up to those plus the repeats nobody injected that
// have that cause (each may be caught once, or not at all), widened by
// attributionSlack.
type CauseBounds struct {
	Injected, Repeats, Attributed int64
}

// OK reports whether the attributed count lies within the bounds.
func (b CauseBounds) OK() bool {
	lo := float64(b.Injected) * (1 - attributionSlack)
	hi := float64(b.Injected+b.Repeats) * (1 + attributionSlack)
	return float64(b.Attributed) >= lo && float64(b.Attributed) <= hi
}

// Attribution returns each cause's bounds and its attributed count.
func (r Report) Attribution() map[ledger.Cause]CauseBounds {
	out := map[ledger.Cause]CauseBounds{}
	for _, c := range ledger.Causes {
		out[c] = CauseBounds{Attributed: r.Attributed[c]}
	}
	add := func(c ledger.Cause, injected, repeats int64) {
		b := out[c]
		b.Injected += injected
		b.Repeats += repeats
		out[c] = b
	}
	for k, n := range r.Injected {
		add(injectedCause[k], n, 0)
	}
	add(ledger.CauseRedelivery, 0, r.unpromptedRedeliveries())
	for k, n := range r.Repeats {
		add(repeatCause[k], 0, n)
	}
	// The holds phase sends some captures again (each replayed), and its
	// late voids and captures are refused, not caught: client retries
	// nobody counted as injected.
	add(ledger.CauseClientRetry, 0, r.Flows.Replayed)
	return out
}

// attributionOK reports whether every cause's count lies within its
// bounds. Faults blur it as they blur the count by layer (duplicatesOK).
func (r Report) attributionOK() bool {
	for _, b := range r.Attribution() {
		if !b.OK() {
			return false
		}
	}
	return true
}

// printAttribution prints the duplicates by cause, against what was
// injected, and a PASS line when the run had no faults.
func (r Report) printAttribution(w io.Writer, line func(bool, string, ...any)) {
	fmt.Fprintln(w, "duplicates caught, by cause (injected, repeats nobody injected, attributed):")
	a := r.Attribution()
	for _, c := range ledger.Causes {
		b := a[c]
		fmt.Fprintf(w, "  %-14s injected %6d  repeats %6d  attributed %6d\n", c, b.Injected, b.Repeats, b.Attributed)
	}
	if len(r.Faults) == 0 && !r.Interrupted {
		line(r.attributionOK(), "every duplicate attributed to its cause (within ±%.0f %% of what was injected, the repeats nobody injected allowed)",
			attributionSlack*100)
	}
}
