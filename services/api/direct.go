package api

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// Applying a transfer here.
//
// Every transfer request the API runs is homed in its own region (do
// forwards the others), so the API can apply it itself: the region's
// ledger transaction (ledger/postgres.Store.Apply: the consume-log claim,
// the business key, the row locks, the postings, the key's first answer),
// run by this process for a group of concurrent requests at once, with
// one commit for all of them. That saves the publish to the ledger stream
// and its PubAck, the ledger's fetch, ack and notification, and the
// stream's own storage: about 40 % of a transfer's CPU (docs/BENCHMARKS.md).
//
// Nothing is lost and nothing is applied twice:
//   - the request is answered from the answer the transaction stored with
//     the debit, so a 201 (or a refusal) is durable before it is sent;
//   - when the group's transaction fails, when the queue is full, or when
//     the transaction stores no answer (a request the ledger must
//     dead-letter, or a repeat of a key applied elsewhere), the request is
//     submitted to the ledger stream as before, with the same Msg-Id and
//     consume-log key: the ledger applies it once, or finds it applied;
//   - when the wait runs out first, the request is submitted too before it
//     is answered 202, since the group's transaction may still roll back;
//     whichever of the two transactions commits first wins, and the other
//     is a duplicate at the consume-log;
//   - a request whose context has ended (its client gone, or its handler
//     returned) before its group's transaction began is left out of it:
//     it was answered from the ledger stream, or not at all, and applying
//     it here later would only make an effect appear after its client
//     stopped waiting (a retry under its key applies it once).

// The direct path's bounds.
const (
	directBatch = 256  // most commands in one transaction, as the ledger's batch
	directQueue = 4096 // requests waiting for a transaction; beyond, they are submitted
)

// applied is one command's outcome in a group's transaction.
type applied struct {
	res ledger.Result
	err error
}

// directReq is a command waiting for its group.
type directReq struct {
	// ctx is the request's: its trace, and whether it still waits when
	// its group begins (a group outlives a request).
	ctx context.Context
	cmd ledger.Command
	out chan applied // buffered: the group never waits for the request
}

// directGroup gathers the commands of concurrent requests into
// transactions of up to directBatch, one at a time: the requests that
// arrive while one commits make the next batch, and no two of this
// process's transactions wait for each other's row locks (two at a time
// cost 10-25 % more Postgres CPU per transfer at 64 in flight). One at a
// time is also what lets the server give Apply a single connection, whose
// backend tells this process's key locks from others'. It counts,
// as the ledger's consumer counts its own, a failed transaction and the
// commands its transactions applied or refused (each a delivery too);
// every other command is handed to the ledger stream, and the ledger
// counts it when it gets it.
type directGroup struct {
	apply  ledgerstream.Applier // the region's ledger store, as the ledger's consumer applies with
	stats  *ledger.Stats
	region string
	in     chan directReq
	stop   chan struct{}
	wg     sync.WaitGroup
	// pending counts the commands queued or in the running transaction.
	pending atomic.Int64
	// mu orders submit against close: once close holds it, nothing more
	// is queued, so the worker's drain sees every queued request.
	mu     sync.RWMutex
	closed bool
}

func newDirectGroup(a ledgerstream.Applier, stats *ledger.Stats, region string) *directGroup {
	g := &directGroup{apply: a, stats: stats, region: region, in: make(chan directReq, directQueue), stop: make(chan struct{})}
	g.wg.Go(g.run)
	return g
}

// close stops the worker once the requests already queued are applied.
func (g *directGroup) close() {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.stop)
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// submit queues cmd for the next group; false when the queue is full or
// the group is closing (the request then goes through the ledger stream).
func (g *directGroup) submit(ctx context.Context, cmd ledger.Command) (<-chan applied, bool) {
	r := directReq{ctx: ctx, cmd: cmd, out: make(chan applied, 1)}
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return nil, false
	}
	g.pending.Add(1)
	select {
	case g.in <- r:
		return r.out, true
	default:
		g.pending.Add(-1)
		return nil, false
	}
}

// queued returns how many commands are queued or in the running
// transaction: work this process may still commit.
func (g *directGroup) queued() int64 { return g.pending.Load() }

func (g *directGroup) run() {
	for {
		var first directReq
		select {
		case first = <-g.in:
		case <-g.stop:
			for { // apply what is queued, then stop
				select {
				case first = <-g.in:
					g.applyGroup(g.gather(first))
				default:
					return
				}
			}
		}
		g.applyGroup(g.gather(first))
	}
}

// gather takes what is queued behind first, up to directBatch, leaving
// out (and answering) the requests no longer waiting.
func (g *directGroup) gather(first directReq) []directReq {
	batch := make([]directReq, 0, 1)
	take := func(r directReq) {
		if err := r.ctx.Err(); err != nil {
			g.done(r, applied{err: err})
			return
		}
		batch = append(batch, r)
	}
	take(first)
	for len(batch) < directBatch {
		select {
		case r := <-g.in:
			take(r)
		default:
			return batch
		}
	}
	return batch
}

// done hands r its outcome; r is no longer pending.
func (g *directGroup) done(r directReq, a applied) {
	r.out <- a
	g.pending.Add(-1)
}

// applyGroup runs one transaction for batch, in a span linked to each
// request's, and hands each request its result. Each request's own span
// (the HTTP server's) records, as a ledger delivery's does, the region and
// the dedup outcome: the layer that caught a duplicate.
func (g *directGroup) applyGroup(batch []directReq) {
	if len(batch) == 0 {
		return
	}
	cmds := make([]ledger.Command, len(batch))
	links := make([]trace.Link, len(batch))
	for i, r := range batch {
		cmds[i] = r.cmd
		// A member of the group, not an earlier attempt of the same work.
		links[i] = trace.Link{SpanContext: trace.SpanContextFromContext(r.ctx),
			Attributes: []attribute.KeyValue{attribute.String("paymesh.link", "batch_member")}}
	}
	// Not the request's context: the group's transaction is every
	// request's, and one client going away must not roll it back.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx, span := otel.Tracer("paymesh/api").Start(ctx, "apply batch here", trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("paymesh.batch.size", len(cmds)), attribute.String("paymesh.region", g.region)))
	defer span.End()
	results, err := g.apply.Apply(ctx, cmds)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		g.stats.ApplyFailed.Add(1)
	}
	for i, r := range batch {
		if err != nil {
			g.done(r, applied{err: err})
			continue
		}
		if k := results[i].Kind; k == ledger.Applied || k == ledger.Rejected {
			g.stats.Delivered(cmds[i].Topic())
			g.stats.Record(cmds[i].Topic(), results[i])
		}
		ledgerstream.RecordOutcome(trace.SpanFromContext(r.ctx), g.region, results[i])
		g.done(r, applied{res: results[i]})
	}
}
