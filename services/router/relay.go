package router

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/pkg/natstrace"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// Outbox is what the relay needs of a region's ledger database; the Postgres
// store implements it.
type Outbox interface {
	PendingOutbox(ctx context.Context, limit int, skip ...string) ([]postgres.OutboxRow, error)
	MarkSent(ctx context.Context, ids []int64) error
	MarkFailed(ctx context.Context, ids []int64) error
}

var _ Outbox = (*postgres.Store)(nil)

// Relay tunables.
const (
	relayBatch = 256
	relayIdle  = 20 * time.Millisecond
)

// RunRelay relays the region's outbox until ctx ends: each unsent saga step
// is published to the ledger stream of the region that applies it, with the
// step's Nats-Msg-Id, and marked sent only after the PubAck. A region that
// fails is skipped for a growing delay, so that it cannot hold up steps for
// the others. A crash between the PubAck and the mark makes the step go out
// again, which the destination's Msg-Id window and consume-log absorb.
func (r *Router) RunRelay(ctx context.Context, outbox Outbox, log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	type backoffState struct {
		until    time.Time
		failures uint64
	}
	down := map[string]*backoffState{}
	for ctx.Err() == nil {
		var skip []string
		for region, b := range down {
			if time.Now().Before(b.until) {
				skip = append(skip, region)
			}
		}
		rows, err := outbox.PendingOutbox(ctx, relayBatch, skip...)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("relay: read outbox", "err", err)
			}
			sleep(ctx, time.Second)
			continue
		}
		if len(rows) == 0 {
			sleep(ctx, relayIdle)
			continue
		}
		futures := make([][]jetstream.PubAckFuture, len(rows))
		spans := make([]trace.Span, len(rows))
		for i, row := range rows {
			m := nats.NewMsg(r.topo(row.Region).Subject(row.Account))
			m.Data = row.Payload
			m.Header.Set(jetstream.MsgIDHeader, row.MsgID)
			sctx, span := tracer.Start(natstrace.WithTraceParent(ctx, row.TraceParent), "relay "+m.Subject,
				trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(messaging(r.cfg.Region, m.Subject, row.MsgID, "send")...))
			if row.Attempts > 0 {
				span.AddEvent("retry", trace.WithAttributes(attribute.Int64("paymesh.attempt", int64(row.Attempts+1))))
			}
			natstrace.Inject(sctx, m)
			spans[i] = span
			futures[i] = r.publish(m)
		}
		wctx, cancel := context.WithTimeout(ctx, r.publishTimeout())
		var sent, failed []int64
		failedRegions := map[string]bool{}
		for i, row := range rows {
			ok, dup := wait(wctx, futures[i])
			endPublish(spans[i], ok, dup)
			if !ok {
				failed = append(failed, row.ID)
				failedRegions[row.Region] = true
				continue
			}
			sent = append(sent, row.ID)
			r.cfg.Stats.RelayDuplicates.Add(dup)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err := outbox.MarkSent(ctx, sent); err != nil {
			log.Warn("relay: mark sent (the steps go out again)", "err", err)
		} else {
			r.cfg.Stats.Relayed.Add(int64(len(sent)))
		}
		if len(failed) > 0 {
			r.cfg.Stats.RelayRetries.Add(int64(len(failed)))
			_ = outbox.MarkFailed(ctx, failed)
		}
		for _, row := range rows {
			if failedRegions[row.Region] {
				b := down[row.Region]
				if b == nil {
					b = &backoffState{}
					down[row.Region] = b
				}
				if time.Now().After(b.until) {
					b.failures++
					b.until = time.Now().Add(retryDelay(b.failures))
				}
			} else {
				delete(down, row.Region)
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
