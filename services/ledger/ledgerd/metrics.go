package ledgerd

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/dlq"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// The ledger's instruments. The domain (services/ledger) counts in
// ledger.Stats and links no OpenTelemetry; the functions here read those
// counters, the store and the streams for /metrics.

// ObserveLedger exports a region ledger's counters. Deliveries and
// duplicates carry a topic label (ledger.Topic: the command kind a message
// carried), so the duplicate rate of a region and topic is
// paymesh_duplicates_total / paymesh_deliveries_total summed by region and
// topic.
func ObserveLedger(m *telemetry.Metrics, region, stream string, st *ledger.Stats) error {
	return observeStats(m, region, stream, "ledger", st)
}

// ObserveApplied exports the counters of the transfers an API process
// applies itself (services/api, direct.go) under the ledger's names, with
// consumer="api" and no stream: summed by region, they count with the
// ledger's.
func ObserveApplied(m *telemetry.Metrics, region string, st *ledger.Stats) error {
	return observeStats(m, region, "", "api", st)
}

func observeStats(m *telemetry.Metrics, region, stream, consumer string, st *ledger.Stats) error {
	base := []attribute.KeyValue{attribute.String("region", region), attribute.String("stream", stream), attribute.String("consumer", consumer)}
	set := metric.WithAttributes(base...)
	simple := func(name, help string, v func() int64) telemetry.Counter { return telemetry.Single(name, help, v, set) }
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append(append(make([]attribute.KeyValue, 0, len(base)+len(kv)), base...), kv...)...)
	}
	return m.ObserveCounters("paymesh/ledger",
		telemetry.Counter{Name: "paymesh.deliveries", Help: "Messages delivered to the ledger, redeliveries included, by topic.",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				for t, n := range st.DeliveriesByTopic() {
					o.ObserveInt64(c, n, with(attribute.String("topic", t.String())))
				}
			}},
		simple("paymesh.redeliveries", "Deliveries after the first of the same message.", st.Redeliveries.Load),
		simple("paymesh.transfers.applied", "Commands applied (transfers, funds, saga steps).", st.Applied.Load),
		simple("paymesh.transfers.rejected", "Transfers recorded as refused.", st.Rejected.Load),
		simple("paymesh.dead.letters", "Messages sent to the dead-letter stream.", st.DeadLettered.Load),
		simple("paymesh.apply.retries", "Apply transactions retried (serialization, deadlock, lock timeout, races).", st.Retries.Load),
		simple("paymesh.apply.fenced", "Late commits refused because their claims were fenced off.", st.Fenced.Load),
		simple("paymesh.apply.gave.up", "Transactions given up on a retryable error: the retry budget spent.", st.GaveUp.Load),
		simple("paymesh.apply.commits.unanswered", "COMMITs the server never answered; the consume-log was read back to learn the outcome.", st.CommitsUnanswered.Load),
		simple("paymesh.saga.steps.sent", "Saga steps the ledger published itself right after the COMMIT that wrote them, acked by their destination streams.", st.StepsSent.Load),
		simple("paymesh.saga.steps.left", "Saga steps the ledger left to the relay: not published, not acked in time, or beyond its queue.", st.StepsLeft.Load),
		simple("paymesh.outbox.pruned", "Sent outbox rows deleted after their retention.", st.OutboxPruned.Load),
		simple("paymesh.events.pruned", "Events deleted after their retention.", st.EventsPruned.Load),
		simple("paymesh.transfers.awaiting.account", "Requests naming an account that does not exist: dead-lettered, unrecorded, applied by a replay once it exists.", st.AwaitingAccount.Load),
		simple("paymesh.saga.parked", "Saga steps that arrived before the state they need.", st.Parked.Load),
		simple("paymesh.state.illegal.transitions", "State machine steps refused as illegal.", st.IllegalTransitions.Load),
		simple("paymesh.state.stale.versions", "Compare-and-set refused on a stale version.", st.StaleVersions.Load),
		telemetry.Counter{Name: "paymesh.duplicates", Help: "Duplicates caught, by the layer that caught them, the topic they arrived on and why they were sent (cause).",
			Read: func(o metric.Observer, c metric.Int64ObservableCounter) {
				dups := st.DuplicatesByKey()
				for _, l := range ledger.Layers {
					for _, t := range ledger.Topics {
						if t == ledger.TopicUnknown {
							continue // a message that does not decode is dead-lettered, never a duplicate
						}
						for _, cause := range ledger.Causes {
							o.ObserveInt64(c, dups[ledger.DuplicateKey{Layer: l, Topic: t, Cause: cause}],
								with(attribute.String("layer", string(l)), attribute.String("topic", t.String()), attribute.String("cause", string(cause))))
						}
					}
				}
			}},
	)
}

// NewObserver returns the hooks that record a region ledger's applied
// batches (size, transaction time, COMMIT's time, the first message's wait
// from the stream to the transaction), saga stages (time since the
// transfer's creation) and duplicates (their age, telemetry.DuplicateAges). Each records with the context the consumer passes,
// so a sampled span there becomes the measurement's trace exemplar.
func NewObserver(m *telemetry.Metrics, region, stream string) (ledgerstream.Observer, error) {
	meter := m.Meter("paymesh/ledger")
	size, err := meter.Int64Histogram("paymesh.apply.batch.size", metric.WithDescription("Commands per applied batch."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("ledger metrics: %w", err)
	}
	latency, err := meter.Float64Histogram("paymesh.apply.duration.seconds", metric.WithDescription("Time to apply one batch in one transaction."),
		metric.WithExplicitBucketBoundaries(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("ledger metrics: %w", err)
	}
	commit, err := meter.Float64Histogram("paymesh.apply.commit.duration.seconds",
		metric.WithDescription("Time COMMIT took in an apply transaction: the WAL flush and, with a synchronous standby, its confirmation."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("ledger metrics: %w", err)
	}
	wait, err := meter.Float64Histogram("paymesh.apply.wait.seconds",
		metric.WithDescription("Time a batch's first message waited between the stream storing it and its transaction's start: the queue in front of the ledger."),
		metric.WithExplicitBucketBoundaries(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 30, 300))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("ledger metrics: %w", err)
	}
	stages, err := meter.Float64Histogram("paymesh.saga.stage.duration.seconds",
		metric.WithDescription("Time from a cross-region transfer's creation until a saga stage ended here: credit (destination region), settle or refund (source region)."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("ledger metrics: %w", err)
	}
	ages, err := telemetry.NewDuplicateAges(m, region, "ledger")
	if err != nil {
		return ledgerstream.Observer{}, fmt.Errorf("ledger metrics: %w", err)
	}
	set := metric.WithAttributes(attribute.String("region", region), attribute.String("stream", stream))
	return ledgerstream.Observer{
		Duplicate: func(ctx context.Context, c ledger.Caught) {
			ages.Record(ctx, c.Topic.String(), string(c.Layer), string(c.Cause), c.Age)
		},
		Batch: func(ctx context.Context, b ledgerstream.Batch) {
			size.Record(ctx, int64(len(b.Msgs)), set)
			latency.Record(ctx, b.Took().Seconds(), set)
			if d := b.Commit(); d > 0 {
				commit.Record(ctx, d.Seconds(), set)
			}
			if !b.Stored.IsZero() {
				wait.Record(ctx, b.Waited().Seconds(), set)
			}
		},
		Stage: func(ctx context.Context, stage string, since time.Duration) {
			stages.Record(ctx, since.Seconds(), metric.WithAttributes(attribute.String("region", region), attribute.String("stage", stage)))
		},
	}, nil
}

// ObserveStore exports, at each scrape, the region's money in transit (how
// many transfers, their amount and the age of the oldest) and its outbox
// lag: three small queries on the region's database.
func ObserveStore(m *telemetry.Metrics, region string, store *postgres.Store) error {
	meter := m.Meter("paymesh/saga")
	set := metric.WithAttributes(attribute.String("region", region))
	transfers, err := meter.Int64ObservableGauge("paymesh.saga.in.transit", metric.WithDescription("Cross-region transfers debited here and not settled yet."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	amount, err := meter.Int64ObservableGauge("paymesh.saga.in.transit.amount", metric.WithDescription("Their amount, in minor units."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	unsent, err := meter.Int64ObservableGauge("paymesh.outbox.unsent", metric.WithDescription("Saga steps in the outbox not relayed yet."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	age, err := meter.Float64ObservableGauge("paymesh.outbox.lag.seconds", metric.WithDescription("Age of the oldest unsent outbox row."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	oldest, err := meter.Float64ObservableGauge("paymesh.saga.in.transit.oldest.seconds",
		metric.WithDescription("Age, since its creation, of the oldest cross-region transfer debited here and not settled yet (0: none)."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if n, a, err := store.InTransit(ctx); err == nil {
			o.ObserveInt64(transfers, n, set)
			o.ObserveInt64(amount, a, set)
		}
		if a, err := store.InTransitOldest(ctx); err == nil {
			o.ObserveFloat64(oldest, a.Seconds(), set)
		}
		if n, lag, err := store.OutboxLag(ctx); err == nil {
			o.ObserveInt64(unsent, n, set)
			o.ObserveFloat64(age, lag.Seconds(), set)
		}
		return nil
	}, transfers, amount, oldest, unsent, age)
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	return nil
}

// ObserveDatabase exports, at each scrape, the replication state of the
// server the ledger writes to (store.Replication, one small query): which
// server it is (paymesh_postgres_primary{server}, 1), its timeline (one
// more at each failover), how many standbys stream from it and how many of
// them are synchronous, how far the furthest lags (bytes, seconds), and
// expected, the synchronous standbys the region's database is meant to have
// (paymesh_postgres_standbys_expected): PaymeshPostgresWithoutStandby fires
// while fewer are there. It returns an error when the gauges cannot be
// registered.
func ObserveDatabase(m *telemetry.Metrics, region string, store *postgres.Store, expected int) error {
	meter := m.Meter("paymesh/postgres")
	set := metric.WithAttributes(attribute.String("region", region))
	gauge := func(name, help string) (metric.Int64ObservableGauge, error) {
		return meter.Int64ObservableGauge(name, metric.WithDescription(help))
	}
	primary, err := gauge("paymesh.postgres.primary", "The server the ledger writes to (1, by its address as it sees itself).")
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	timeline, err := gauge("paymesh.postgres.timeline", "The primary's WAL timeline: 1 for a database never failed over, one more at each promotion of a standby.")
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	standbys, err := gauge("paymesh.postgres.standbys", "Standbys streaming from the primary.")
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	sync, err := gauge("paymesh.postgres.sync.standbys", "Standbys a COMMIT waits for (synchronous).")
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	want, err := gauge("paymesh.postgres.standbys.expected", "Synchronous standbys the region's database is meant to have (0: a single server).")
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	lagBytes, err := gauge("paymesh.postgres.replication.lag.bytes", "WAL the furthest standby has not replayed yet (0 with no standby).")
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	lagSeconds, err := meter.Float64ObservableGauge("paymesh.postgres.replication.lag.seconds",
		metric.WithDescription("The furthest standby's replay lag, as the primary last measured it (0 with no standby)."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveInt64(want, int64(expected), set)
		r, err := store.Replication(ctx)
		if err != nil {
			return nil // a scrape during a failover: the gauges skip it
		}
		o.ObserveInt64(primary, 1, metric.WithAttributes(attribute.String("region", region), attribute.String("server", r.Server)))
		o.ObserveInt64(timeline, r.Timeline, set)
		o.ObserveInt64(standbys, int64(r.Standbys), set)
		o.ObserveInt64(sync, int64(r.Synchronous), set)
		o.ObserveInt64(lagBytes, r.LagBytes, set)
		o.ObserveFloat64(lagSeconds, r.LagSeconds, set)
		return nil
	}, primary, timeline, standbys, sync, want, lagBytes, lagSeconds)
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	return nil
}

// ObserveDeadLetters exports, at each scrape, a region's dead letters by
// reason as paymesh_dlq_depth{region, reason} and the age of the oldest of
// each reason as paymesh_dlq_oldest_seconds{region, reason}. A reason
// whose dead letters are gone reports a depth of 0 and no age; when the
// dead letters are not known, both are left out. It returns an error when
// the gauges cannot be registered. The census is read, not refreshed: a
// scrape makes no round trip (the caller runs census.Run).
func ObserveDeadLetters(m *telemetry.Metrics, region string, census *dlq.Census) error {
	meter := m.Meter("paymesh/streams")
	depth, err := meter.Int64ObservableGauge("paymesh.dlq.depth",
		metric.WithDescription("Dead letters held in the region's dead-letter stream, by reason."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	oldest, err := meter.Float64ObservableGauge("paymesh.dlq.oldest.seconds",
		metric.WithDescription("Age of the oldest dead letter held, by reason, since it was dead-lettered."))
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ds, ok := census.Depths()
		if !ok {
			return nil
		}
		now := time.Now()
		for _, d := range ds {
			set := metric.WithAttributes(attribute.String("region", region), attribute.String("reason", d.Reason))
			o.ObserveInt64(depth, d.Count, set)
			if d.Count > 0 && !d.Oldest.IsZero() {
				o.ObserveFloat64(oldest, max(now.Sub(d.Oldest).Seconds(), 0), set)
			}
		}
		return nil
	}, depth, oldest)
	if err != nil {
		return fmt.Errorf("ledger metrics: %w", err)
	}
	return nil
}

// Pending returns the backlog of a region's ledger stream over all its
// shard consumers (ledgerstream.Backlog), for telemetry.ObserveBacklog.
func Pending(js jetstream.JetStream, t ledgerstream.Topology) telemetry.Pending {
	return func(ctx context.Context) (int64, error) {
		n, err := ledgerstream.Backlog(ctx, js, t)
		if err != nil {
			return 0, fmt.Errorf("ledger backlog %s: %w", t.Stream(), err)
		}
		return int64(n), nil
	}
}
