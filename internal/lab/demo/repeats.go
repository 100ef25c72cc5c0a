package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/router"
)

// Repeats nobody injected. On a loaded machine a message or a request is
// sent again when its answer comes late: JetStream redelivers what was not
// acked within AckWait, a router publishes a forward or a saga step again
// when its PubAck did not come in time, an API whose own transaction did
// not answer within its wait hands the request to the ledger stream as
// well, and the demo's clients send a request again after a timeout or a
// 409 while it is in flight. A repeat of
// something already stored is caught like an injected duplicate, once; a
// repeat of something that was not stored is stored, and caught by nobody.
const (
	repeatLedger  = "ledger redelivery (AckWait expired)"
	repeatForward = "router forward delivered again (late answer)"
	repeatRelay   = "saga step sent again (late PubAck)"
	repeatSubmit  = "demo submit sent again (late PubAck)"
	repeatHanded  = "API request handed on to its ledger"
	repeatHTTP    = "HTTP request sent again by its client"
)

// repeats counts the repeats nobody injected that the routers and the
// demo's clients made (the ledgers' are Report.Redeliveries beyond the
// dropped acks). A route stream it cannot read counts none: the check
// then allows fewer extra catches, not more.
func (d *driver) repeats(ctx context.Context) map[string]int64 {
	out := map[string]int64{repeatSubmit: d.resubmits.Load(), repeatHTTP: d.retries.n.Load()}
	for _, n := range d.names {
		r := d.c.Region(n)
		// A step the ledger left (its PubAck late) may have been stored
		// before the relay sends it again, as a relay's retry may.
		out[repeatRelay] += r.Router.Stats().RelayRetries.Load() + r.Ledger.Stats.StepsLeft.Load()
		// Every request the API tried in its own transaction and then
		// handed on: more than those it had applied too (a full queue, a
		// failed transaction hand on what nobody applied).
		out[repeatHanded] += r.API.Stats.Handed.Load()
		if again, err := redelivered(ctx, r.RouterJetStream(), router.Stream(n)); err == nil {
			out[repeatForward] += again
		}
	}
	return out
}

// redelivered counts the deliveries of a stream's messages beyond the
// first: each consumer's delivery sequence counts every delivery, and the
// stream's last sequence every message stored. It is exact for a route
// stream once it is drained: each message has one consumer (the forwarder
// of its home region), and the stream starts with the demo.
func redelivered(ctx context.Context, js jetstream.JetStream, name string) (int64, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	var deliveries uint64
	consumers := s.ListConsumers(ctx)
	for c := range consumers.Info() {
		deliveries += c.Delivered.Consumer
	}
	if err := consumers.Err(); err != nil {
		return 0, err
	}
	return max(int64(deliveries)-int64(info.State.LastSeq), 0), nil
}

// retryCounter is the demo's HTTP transport: it counts the answers after
// which api.Client sends its request again.
type retryCounter struct{ n atomic.Int64 }

// RoundTrip sends req and counts the answer if the client tries again.
func (c *retryCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		c.n.Add(1)
		return nil, err
	}
	switch {
	case res.StatusCode == http.StatusTooManyRequests, res.StatusCode >= 500:
		c.n.Add(1)
	case res.StatusCode == http.StatusConflict:
		// Other conflicts (a hold no longer held) are answers, not retried.
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		res.Body = io.NopCloser(bytes.NewReader(b))
		var p api.Problem
		if err != nil || json.Unmarshal(b, &p) != nil || p.Code == api.CodeIdempotencyKeyInFlight {
			c.n.Add(1)
		}
	}
	return res, nil
}

// apiClient is a client of region's API that retries as the demo's clients
// do, its retries counted.
func (d *driver) apiClient(region string) *api.Client {
	return &api.Client{BaseURL: d.c.Region(region).APIURL, APIKey: d.apiKey, Attempts: httpAttempts, HTTP: &http.Client{Transport: &d.retries}}
}
