package routerd

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/router"
)

// The router's topics: the stream or hop its messages travel on. Route is
// the region's route stream (a submit), forward the hop of a command to its
// home region's ledger stream, relay the hop of a saga step from the
// outbox to the region that applies it.
const (
	TopicRoute   = "route"
	TopicForward = "forward"
	TopicRelay   = "relay"
)

// StageTopic returns the topic of a router's stage: the hop its publishes
// travel on.
func StageTopic(s router.Stage) string {
	switch s {
	case router.StageSubmit:
		return TopicRoute
	case router.StageForward:
		return TopicForward
	}
	return TopicRelay
}

// ObserveRouter exports a region router's counters; its duplicates are the
// ones JetStream's Nats-Msg-Id window caught, by stage, topic and cause. The
// duplicate rate of a router topic is paymesh_router_duplicates_total over
// the topic's publishes acked (paymesh_router_submitted_total,
// _forwarded_total, _relayed_total, each labelled with its topic).
func ObserveRouter(m *telemetry.Metrics, region string, st *router.Stats) error {
	at := func(stage, topic string, kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append([]attribute.KeyValue{attribute.String("region", region), attribute.String("stage", stage),
			attribute.String("topic", topic)}, kv...)...)
	}
	msgID := attribute.String("layer", string(ledger.LayerMsgID))
	topic := func(t string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("region", region), attribute.String("topic", t))
	}
	return m.ObserveCounters("paymesh/router",
		telemetry.Single("paymesh.router.submitted", "Commands submitted in this region, duplicates included: stored in the route stream, or in the ledger stream for accounts homed here.",
			st.Submitted.Load, topic(TopicRoute)),
		telemetry.Single("paymesh.router.forwarded", "Commands acked by their home region.", st.Forwarded.Load, topic(TopicForward)),
		telemetry.Counter{Name: "paymesh.router.retries", Help: "Forwards and relays that failed and will be retried.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				o.ObserveInt64(c, st.ForwardRetries.Load(), at("forward", TopicForward))
				o.ObserveInt64(c, st.RelayRetries.Load(), at("relay", TopicRelay))
			}},
		telemetry.Single("paymesh.router.relayed", "Saga steps acked by the region that applies them.", st.Relayed.Load, topic(TopicRelay)),
		telemetry.Single("paymesh.router.refused", "Route-stream messages not forwarded: no client command (a fund or saga step someone put there), or no route subject.",
			st.Refused.Load, topic(TopicForward)),
		telemetry.Counter{Name: "paymesh.router.duplicates", Help: "Duplicates JetStream's Nats-Msg-Id window caught, by stage, topic and why they were sent (cause).",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				dups := st.DuplicatesByCause()
				for _, stage := range router.Stages {
					for _, cause := range ledger.Causes {
						o.ObserveInt64(c, dups[router.StageCause{Stage: stage, Cause: cause}],
							at(string(stage), StageTopic(stage), msgID, attribute.String("cause", string(cause))))
					}
				}
			}},
	)
}

// Pending returns the backlog of a region's route stream, for
// telemetry.ObserveBacklog: a work queue, so every message still in it is
// not forwarded yet.
func Pending(js jetstream.JetStream, region string) telemetry.Pending {
	return func(ctx context.Context) (int64, error) {
		s, err := js.Stream(ctx, router.Stream(region))
		if err != nil {
			return 0, fmt.Errorf("route backlog %s: %w", router.Stream(region), err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("route backlog %s: %w", router.Stream(region), err)
		}
		return int64(info.State.Msgs), nil
	}
}
