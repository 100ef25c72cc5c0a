package ledgerstream

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/services/ledger"
)

// HeaderAnswerTo names, on a client request, the core NATS subject of the
// API process that submitted it (subjects.Answers). The router's Submit
// sets it and its forward keeps it; after the batch that settled the
// request commits, the ledger's consumer publishes the request's key there
// (AnsweredKeys), with the answer the batch stored for it, so that the
// waiting API answers at once instead of at its next poll, and without
// reading the answer back.
const HeaderAnswerTo = "Paymesh-Answer-To"

// AnsweredKey names one client request a committed batch settled: its
// client and idempotency key, and when the batch stored the request's first
// answer (ledger.Result.Answer), that answer as stored. Without one (a
// duplicate whose answer was stored before) the API reads the stored
// answer.
type AnsweredKey struct {
	Client string `json:"c"`
	Key    string `json:"k"`
	// TransferID is the request's transfer (the one its answer is for).
	TransferID string `json:"t,omitempty"`
	Status     int    `json:"s,omitempty"`
	Body       []byte `json:"b,omitempty"`
}

// AnsweredKeys is the payload of one notification: the keys of the
// requests, submitted by one API process, that one committed batch
// settled. An answer it carries is the one the batch committed, byte for
// byte, so the API sends what a repeat of the request will get.
type AnsweredKeys struct {
	Keys []AnsweredKey `json:"keys"`
}

// DecodeAnsweredKeys decodes a notification; it returns an error for a
// payload that is not one.
func DecodeAnsweredKeys(b []byte) (AnsweredKeys, error) {
	var a AnsweredKeys
	if err := json.Unmarshal(b, &a); err != nil {
		return AnsweredKeys{}, fmt.Errorf("answered keys: %w", err)
	}
	return a, nil
}

// notifyAnswered publishes, for each API process that submitted client
// requests of a committed batch, one core NATS message listing the keys it
// settled (not those parked or dead-lettered, which have no answer yet).
// A lost notification costs the waiting request its API's poll interval,
// nothing else: publish errors are logged, not retried.
func (c *Consumer) notifyAnswered(msgs []jetstream.Msg, cmds []ledger.Command, results []ledger.Result) {
	var order []string
	var by map[string]*AnsweredKeys // made for the first request with a subject: none in a batch of saga steps or direct publishes
	for i, m := range msgs {
		if cmds[i].IsStep() || results[i].DeadLetter || results[i].Kind == ledger.Parked {
			continue
		}
		to := m.Headers().Get(HeaderAnswerTo)
		if to == "" {
			continue
		}
		if by == nil {
			by = map[string]*AnsweredKeys{}
		}
		a := by[to]
		if a == nil {
			a = &AnsweredKeys{}
			by[to] = a
			order = append(order, to)
		}
		k := AnsweredKey{Client: cmds[i].ClientID, Key: cmds[i].IdempotencyKey, TransferID: cmds[i].TransferID}
		if an := results[i].Answer; an != nil {
			k.Status, k.Body = an.Status, an.Body
		}
		a.Keys = append(a.Keys, k)
	}
	if len(order) == 0 {
		return
	}
	nc := c.js.Conn()
	for _, to := range order {
		b, _ := json.Marshal(by[to])
		if err := nc.PublishMsg(&nats.Msg{Subject: to, Data: b}); err != nil {
			c.cfg.Log.Warn("answer notification", "subject", to, "err", err)
		}
	}
}
