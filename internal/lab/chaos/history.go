// Package chaos is paymesh's fault-injection suite, in the style of
// Jepsen: a seeded workload sends transfers through the routers and the
// HTTP APIs of a three-region cluster while a scenario injects its fault,
// records every operation with its outcome (ok, fail or unknown), and a
// checker then verifies the ledger's invariants over all regions against
// that history, naming the transfers where one does not hold. `paymesh
// chaos` and `make chaos` run it; docs/RELIABILITY.md describes the
// scenarios.
package chaos

import (
	"fmt"
	"sync"
	"time"

	"github.com/paymesh/paymesh/services/ledger"
)

// Outcome is what the client learned about an operation.
type Outcome string

// Outcomes of an operation.
const (
	// OK: the system acknowledged it (a router's Submit returned nil, or the
	// API answered 200, 201 or 202). It must have exactly one effect.
	OK Outcome = "ok"
	// Fail: it was refused before anything was stored (a 4xx answer). It
	// must have no effect.
	Fail Outcome = "fail"
	// Unknown: a timeout, a lost connection or a 5xx. Zero or one effect.
	Unknown Outcome = "unknown"
)

// Body is what a request asks for; requests under one idempotency key
// with another body are conflicts.
type Body struct {
	Type     string `json:"type"`
	From     string `json:"from,omitempty"`
	To       string `json:"to"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func (b Body) String() string {
	return fmt.Sprintf("%s %s→%s %d %s", b.Type, b.From, b.To, b.Amount, b.Currency)
}

// Op is one invocation of a request and its completion.
type Op struct {
	Index    int       `json:"index"`
	Client   string    `json:"client"`
	Key      string    `json:"key"`
	Body     Body      `json:"body"`
	Path     string    `json:"path"` // "router" or "api"
	Via      string    `json:"via"`  // the region it was sent to
	Purpose  string    `json:"purpose"`
	Outcome  Outcome   `json:"outcome"`
	Detail   string    `json:"detail,omitempty"`
	Transfer string    `json:"transfer,omitempty"` // the transfer ID, when the op carried or learned it
	Invoke   time.Time `json:"invoke"`
	Complete time.Time `json:"complete"`
	// cmd is the command a router op sent (for scenarios that publish it
	// again); apiPath and payload are what an API op posted (for those
	// that send it again).
	cmd     ledger.Command
	apiPath string
	payload []byte
}

// Purposes of an op: why the workload sent it.
const (
	PurposeFirst    = "first"
	PurposeRetry    = "retry"    // the client retries after an unknown outcome
	PurposeResubmit = "resubmit" // the same key and body again
	PurposeConflict = "conflict" // the same key with another body
	PurposeBurst    = "burst"    // one of several concurrent sends of one key
	PurposeFund     = "fund"
	PurposeLate     = "late-retry" // submitted again after the Msg-Id window expired
)

// History is the record of every operation. It is safe for concurrent use.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Invoke records an operation's invocation and returns its index.
func (h *History) Invoke(op Op) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Index, op.Invoke = len(h.ops), time.Now()
	h.ops = append(h.ops, op)
	return op.Index
}

// Complete records an operation's outcome; transfer is the transfer ID it
// learned ("" for none).
func (h *History) Complete(i int, o Outcome, detail, transfer string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op := &h.ops[i]
	op.Outcome, op.Detail, op.Complete = o, detail, time.Now()
	if transfer != "" {
		op.Transfer = transfer
	}
}

// Ops returns a copy of the history.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Counts returns how many completed ops had each outcome.
func (h *History) Counts() map[Outcome]int {
	out := map[Outcome]int{}
	for _, op := range h.Ops() {
		if op.Outcome != "" {
			out[op.Outcome]++
		}
	}
	return out
}
