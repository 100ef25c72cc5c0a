package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// floorRun is what NATS alone costs to deliver the replay's messages: the
// same commands, with the same headers and new Nats-Msg-Ids, published
// with the same window into a stream configured as the ledger's stream
// (same server, storage, replicas and duplicate window, under subjects of
// its own), and taken by one consumer per shard, configured as the
// ledger's shard consumers, that only acks each message. It is the limit
// a duplicate's cost can approach: the replay's rate over this one.
func (r *ledgerRig) floorRun(ctx context.Context, w *workload) (LedgerRun, error) {
	e := r.e
	topo := ledgerstream.Topology{Region: region, Shards: e.cfg.Shards}
	ledger, err := e.nats.js.Stream(ctx, topo.Stream())
	if err != nil {
		return LedgerRun{}, err
	}
	tag := "floor" + strconv.FormatInt(e.seq.Add(1), 10)
	prefix := "paymesh_" + tag + "."
	sc := ledger.CachedInfo().Config
	sc.Name, sc.Subjects = "PAYMESH_"+tag, []string{prefix + ">"}
	stream, err := e.nats.js.CreateStream(ctx, sc)
	if err != nil {
		return LedgerRun{}, fmt.Errorf("floor stream: %w", err)
	}
	defer func() { _ = e.nats.js.DeleteStream(context.WithoutCancel(ctx), sc.Name) }()

	n := len(w.from)
	t := newTracker(w.tag, n, r.window())
	var consumers []jetstream.ConsumeContext
	defer func() {
		for _, c := range consumers {
			c.Stop()
		}
	}()
	prefetch := max(2*r.batch/e.cfg.Shards, 8)
	for shard := range e.cfg.Shards {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("floor-%d", shard), AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
			MaxDeliver: -1, FilterSubject: prefix + topo.ShardSubjects(shard), MaxAckPending: 4 * r.batch,
		})
		if err != nil {
			return LedgerRun{}, fmt.Errorf("floor consumer: %w", err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			if m.Ack() == nil { // hit frees a place in the window
				t.hit(m.Headers().Get(jetstream.MsgIDHeader), time.Now().UnixNano())
			}
		}, jetstream.PullMaxMessages(prefetch))
		if err != nil {
			return LedgerRun{}, fmt.Errorf("floor consumer: %w", err)
		}
		consumers = append(consumers, cc)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	futures := make(chan jetstream.PubAckFuture, r.window())
	done := make(chan struct{})
	go func() { e.checkAcks(ctx, futures, cancel, nil); close(done) }()
	progress := e.progress(Floor, func() (int64, int64) { return t.done.Load(), int64(n) })
	defer progress()
	cpu0 := cpuTime()
	first := time.Now()
	sent := 0
publish:
	for ; sent < n; sent++ {
		select {
		case t.window <- struct{}{}:
		case <-ctx.Done():
			break publish
		}
		t.published[sent] = time.Now().UnixNano()
		cmd := w.command(e, r.accounts, sent)
		m := nats.NewMsg(prefix + topo.CommandSubject(cmd, topo.Region))
		m.Data = cmd.Encode()
		m.Header.Set(jetstream.MsgIDHeader, cmd.MsgKey()+replaySuffix)
		f, err := e.nats.js.PublishMsgAsync(m, jetstream.WithExpectStream(sc.Name))
		if err != nil {
			cancel(err)
			break
		}
		futures <- f
	}
	close(futures)
	<-done
	if err := r.waitCommitted(ctx, t, int64(sent)); err != nil {
		return LedgerRun{}, err
	}
	cpu := cpuTime() - cpu0
	run := LedgerRun{Scenario: Floor, Database: r.db, Workers: e.cfg.Workers, Shards: e.cfg.Shards, BatchSize: e.cfg.BatchSize,
		Published: sent, Committed: t.done.Load(), PeakRSSMB: float64(peakRSS()) / (1 << 20), PGCPUPerTransferUs: -1, Verified: t.done.Load() == int64(sent)}
	t.timings(&run, first, sent, cpu)
	return run, nil
}
