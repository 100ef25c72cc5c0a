package jetstream

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
// (AnsweredKeys), so that the waiting API reads its stored answer at once
// instead of at its next poll.
const HeaderAnswerTo = "Paymesh-Answer-To"

// AnsweredKey names one client request a committed batch settled: its
// client and idempotency key.
type AnsweredKey struct {
	Client string `json:"c"`
	Key    string `json:"k"`
}

// AnsweredKeys is the payload of one notification: the keys of the
// requests, submitted by one API process, that one committed batch
// settled. It carries no answer: the answer is the one stored in the
// database, which the API reads (so a notification can wake a wait early,
// never change what it returns).
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
		a.Keys = append(a.Keys, AnsweredKey{Client: cmds[i].ClientID, Key: cmds[i].IdempotencyKey})
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
