package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/internal/testbed/jsfault"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// region is the region every single-region run uses.
const region = "eu"

// Client is the API client named on the bench's commands.
const Client = "bench"

// fundAmount is what each account starts with: no transfer of the run can
// take an account below its floor.
const fundAmount = 1_000_000_000

// ledgerRig is one region ledger on a database of its own, consuming the
// embedded nats-server's ledger stream, with its accounts opened and funded.
type ledgerRig struct {
	e        *env
	db       string
	batch    int
	srv      *ledgerd.Server
	accounts []string
	// track receives every committed batch (the after-commit hook).
	track atomic.Pointer[tracker]
	// Batch statistics of the current phase (the ledger's Observer.Batch hook).
	batches, batchMsgs, batchNanos atomic.Int64
	stop                           context.CancelFunc
	done                           chan error
	// hooks is the webhooks scenario's delivery worker (nil otherwise).
	hooks *hookRig
	// unscrape stops the bench's scrapes of its /metrics.
	unscrape func()
}

// openLedger creates database e.prefix+name, starts a ledger on it with the
// given batch size, and opens and funds the accounts.
func (e *env) openLedger(ctx context.Context, name string, batch, accounts int) (*ledgerRig, error) {
	r := &ledgerRig{e: e, db: e.cfg.DatabasePrefix + strings.ReplaceAll(name, "-", "_"), batch: batch}
	url, err := e.createDB(ctx, r.db)
	if err != nil {
		return nil, err
	}
	if err := e.resetStreams(ctx); err != nil {
		return nil, err
	}
	r.srv, err = ledgerd.Open(ctx, ledgerd.Config{
		Region: region, Regions: e.regions, Node: 1, PostgresURL: url, NATSURL: e.nats.url,
		NATSUser: e.nats.user, NATSPassword: e.nats.password, StreamReplicas: e.nats.replicas,
		Workers: e.cfg.Workers, BatchSize: batch, Shards: e.cfg.Shards, CacheSize: e.cfg.CacheSize,
		NoEvents:      name == NoEvents,
		MetricsListen: e.metricsListen(),
		WrapJetStream: func(js jetstream.JetStream) jetstream.JetStream { return jsfault.Wrap(js, nil, r.tracked) },
		Observe: ledgerstream.Observer{Batch: func(_ context.Context, b ledgerstream.Batch) {
			r.batches.Add(1)
			r.batchMsgs.Add(int64(len(b.Msgs)))
			r.batchNanos.Add(int64(b.Took()))
			if t := r.track.Load(); t != nil && t.stamps != nil {
				t.batch(b)
			}
		}},
	})
	if err != nil {
		return nil, err
	}
	if name == Webhooks {
		if r.hooks, err = openHooks(ctx, r.srv.Store); err != nil {
			r.srv.Close()
			return nil, err
		}
	}
	if r.accounts, err = openAccounts(ctx, e, r.srv.Store, region, accounts); err != nil {
		if r.hooks != nil {
			r.hooks.close()
		}
		r.srv.Close()
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stop, r.done = stop, make(chan error, 1)
	r.unscrape = e.scrape(r.srv.MetricsURL())
	go func() { r.done <- r.srv.Run(runCtx) }()
	return r, nil
}

// tracked returns m whose ack tells the current phase's tracker that m
// committed: the consumer acks a message right after its batch's COMMIT.
func (r *ledgerRig) tracked(m jetstream.Msg) jetstream.Msg {
	if t := r.track.Load(); t != nil && t.stamps != nil {
		t.delivered(m.Headers().Get(jetstream.MsgIDHeader), time.Now().UnixNano())
	}
	return committedAck{Msg: m, r: r}
}

type committedAck struct {
	jetstream.Msg
	r *ledgerRig
}

func (m committedAck) Ack() error {
	if t := m.r.track.Load(); t != nil {
		t.hit(m.Headers().Get(jetstream.MsgIDHeader), time.Now().UnixNano())
	}
	return m.Msg.Ack()
}

// close stops the ledger and drops its database unless --keep.
func (r *ledgerRig) close(ctx context.Context) {
	if r.hooks != nil {
		r.hooks.close()
	}
	r.stop()
	<-r.done
	r.unscrape()
	r.srv.Close()
	r.e.dropDB(ctx, r.db)
}

// workload is a run's transfers: account indexes, amounts and transfer IDs,
// kept compact so that a replay can send the same commands again.
type workload struct {
	tag     string // unique per workload, part of every idempotency key
	from    []int32
	to      []int32
	amount  []int32
	id      []idgen.ID
	created []int64 // the commands' CreatedAt, set at their first publish
}

// newWorkload draws n transfers between distinct random accounts. With
// hot >= 0, half of them credit account hot (a merchant).
func (e *env) newWorkload(tag string, n, accounts, hot int) (*workload, error) {
	w := &workload{tag: tag, from: make([]int32, n), to: make([]int32, n), amount: make([]int32, n),
		id: make([]idgen.ID, n), created: make([]int64, n)}
	for i := range n {
		from := e.rng.IntN(accounts)
		to := e.rng.IntN(accounts - 1)
		if hot >= 0 && e.rng.IntN(2) == 0 {
			for from == hot {
				from = e.rng.IntN(accounts)
			}
			to = hot
		} else if to >= from {
			to++ // uniform over the other accounts
		}
		id, err := e.gens[i%len(e.gens)].Next()
		if err != nil {
			return nil, err
		}
		w.from[i], w.to[i], w.amount[i], w.id[i] = int32(from), int32(to), int32(1+e.rng.IntN(100)), id
	}
	return w, nil
}

// key is transfer i's idempotency key: a pseudo-random prefix, as client
// keys are, so that consume-log keys spread over the whole index, then the
// tag and i, which the after-commit hook reads back.
func (w *workload) key(i int) string {
	h := splitmix(uint64(i) ^ uint64(len(w.tag))<<56 ^ hashString(w.tag))
	return fmt.Sprintf("%016x-%s-%d", h>>1, w.tag, i)
}

func (w *workload) command(e *env, accounts []string, i int) ledger.Command {
	return ledger.Command{Type: ledger.TypeTransfer, TransferID: e.regions.MustFormat(w.id[i]), ClientID: Client,
		IdempotencyKey: w.key(i), From: accounts[w.from[i]], To: accounts[w.to[i]], Amount: int64(w.amount[i]),
		Currency: "EUR", CreatedAt: time.Unix(0, w.created[i])}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func hashString(s string) uint64 {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

// replaySuffix marks the Nats-Msg-Id of a replayed command: a new id, so
// that JetStream's duplicate window lets it through to the ledger.
const replaySuffix = "#replay"

// tracker follows one phase: when each message was published and when its
// batch committed, and the in-flight window between the two.
type tracker struct {
	tag       string
	published []int64 // unix ns of the publish
	committed []int64 // unix ns after COMMIT, 0 until then
	done      atomic.Int64
	last      atomic.Int64
	window    chan struct{}
	// stamps, when set, records each message's stages (phase.stages).
	stamps *stamps
}

// timings fills in run's rate, latency percentiles and process CPU per
// message from the tracker of its first sent messages, published from
// first on, and the process CPU they took.
func (t *tracker) timings(run *LedgerRun, first time.Time, sent int, cpu time.Duration) {
	elapsed := time.Duration(t.last.Load() - first.UnixNano())
	run.Seconds = elapsed.Seconds()
	if elapsed > 0 {
		run.Rate = float64(run.Committed) / elapsed.Seconds()
	}
	lat := latencies(t.published[:sent], t.committed[:sent])
	run.P50Ms, run.P99Ms, run.MaxMs = ms(percentile(lat, 0.50)), ms(percentile(lat, 0.99)), ms(percentile(lat, 1))
	run.CPUPerTransferUs = float64(cpu.Microseconds()) / float64(max(run.Committed, 1))
}

func newTracker(tag string, n, window int) *tracker {
	return &tracker{tag: tag, published: make([]int64, n), committed: make([]int64, n), window: make(chan struct{}, window)}
}

// index returns the index in this phase of the message with Nats-Msg-Id
// msgID; ok is false for another phase's.
func (t *tracker) index(msgID string) (i int, ok bool) {
	msgID = strings.TrimSuffix(msgID, replaySuffix)
	j := strings.LastIndexByte(msgID, '-')
	if j < 0 || !strings.HasSuffix(msgID[:j], "-"+t.tag) {
		return 0, false
	}
	i, err := strconv.Atoi(msgID[j+1:])
	if err != nil || i < 0 || i >= len(t.committed) {
		return 0, false
	}
	return i, true
}

// hit records the commit of the message with Nats-Msg-Id msgID, once.
func (t *tracker) hit(msgID string, now int64) {
	i, ok := t.index(msgID)
	if !ok {
		return // not this phase's
	}
	if atomic.CompareAndSwapInt64(&t.committed[i], 0, now) {
		t.done.Add(1)
		for {
			last := t.last.Load()
			if now <= last || t.last.CompareAndSwap(last, now) {
				break
			}
		}
		select {
		case <-t.window:
		default:
		}
	}
}

// phase is one measured stretch of publishing against a running ledger.
type phase struct {
	scenario string
	w        *workload
	replay   bool          // send w's commands again with new Nats-Msg-Ids
	rate     float64       // publishes per second; 0: as fast as the window allows
	limit    time.Duration // stop publishing after this long
	profile  string        // CPU profile file, if any
	stages   bool          // break the latency down by stage (LedgerRun.Stages)
}

// drive publishes a phase's commands asynchronously, at most Window of them
// published but not yet committed, while the ledger consumes, and measures
// it from the first publish to the last commit.
func (r *ledgerRig) drive(ctx context.Context, p phase) (LedgerRun, error) {
	e := r.e
	n := len(p.w.from)
	t := newTracker(p.w.tag, n, r.window())
	if p.stages {
		t.stamps = newStamps(n)
	}
	r.track.Store(t)
	defer r.track.Store(nil)
	r.batches.Store(0)
	r.batchMsgs.Store(0)
	r.batchNanos.Store(0)
	stats0 := r.srv.Stats.Duplicates()
	topo := ledgerstream.Topology{Region: region, Shards: e.cfg.Shards}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	futures := make(chan jetstream.PubAckFuture, r.window())
	var checker sync.WaitGroup
	var pubAcked func(string, int64)
	if t.stamps != nil {
		pubAcked = t.pubAcked
	}
	checker.Go(func() { e.checkAcks(ctx, futures, cancel, pubAcked) })
	progress := e.progress(p.scenario, func() (int64, int64) { return t.done.Load(), int64(n) })
	defer progress()

	if p.profile != "" {
		f, err := os.Create(p.profile)
		if err != nil {
			return LedgerRun{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return LedgerRun{}, err
		}
	}
	pg0 := pgBackends(ctx, r.srv.Store.Pool(), r.db)
	cpu0 := cpuTime()
	first := time.Now()
	sent, capped := 0, false
publish:
	for sent < n {
		due := n
		if p.rate > 0 {
			due = min(n, int(time.Since(first).Seconds()*p.rate)+1)
			if due <= sent {
				time.Sleep(500 * time.Microsecond)
				continue
			}
		}
		for ; sent < due; sent++ {
			if p.limit > 0 && sent%256 == 0 && time.Since(first) > p.limit {
				capped = true
				break publish
			}
			select {
			case t.window <- struct{}{}:
			case <-ctx.Done():
				break publish
			}
			f, err := r.publish(p, t, topo, sent)
			if err != nil {
				cancel(err)
				break publish
			}
			futures <- f
		}
	}
	close(futures)
	checker.Wait()
	if err := r.waitCommitted(ctx, t, int64(sent)); err != nil {
		return LedgerRun{}, err
	}
	if p.profile != "" {
		pprof.StopCPUProfile()
	}
	cpu := cpuTime() - cpu0
	pgCPU, pgOK := pgCPUDelta(pg0, pgBackends(ctx, r.srv.Store.Pool(), r.db))

	run := LedgerRun{Scenario: p.scenario, Database: r.db, Workers: e.cfg.Workers, Shards: e.cfg.Shards,
		Published: sent, Committed: t.done.Load(), Capped: capped, PeakRSSMB: float64(peakRSS()) / (1 << 20)}
	t.timings(&run, first, sent, cpu)
	run.PGCPUPerTransferUs = -1
	if pgOK {
		run.PGCPUPerTransferUs = float64(pgCPU.Microseconds()) / float64(max(run.Committed, 1))
	}
	if b := r.batches.Load(); b > 0 {
		run.MeanBatch = float64(r.batchMsgs.Load()) / float64(b)
		run.MeanBatchMs = float64(r.batchNanos.Load()) / float64(b) / 1e6
	}
	if p.replay {
		run.Layers = map[string]int64{}
		for k, v := range r.srv.Stats.Duplicates() {
			if d := v - stats0[k]; d > 0 {
				run.Layers[k] = d
			}
		}
	}
	if p.rate > 0 {
		run.PacedRate = p.rate
	}
	if t.stamps != nil {
		run.Stages, run.StageBatch = t.stages(sent)
	}
	return run, nil
}

// window is how many of a phase's messages may be published but not yet
// committed: Window, or less when that is plenty for the consumers. Each
// shard's consumer holds at most 4×batch unacked messages, so 2×that per
// shard keeps them all busy; more would only queue in the stream (and, with
// batch 1, take many seconds to drain).
func (r *ledgerRig) window() int {
	return min(r.e.cfg.Window, max(256, 8*r.batch*r.e.cfg.Shards))
}

// publish sends command i of the phase without waiting for its ack.
func (r *ledgerRig) publish(p phase, t *tracker, topo ledgerstream.Topology, i int) (jetstream.PubAckFuture, error) {
	now := time.Now().UnixNano()
	if !p.replay {
		p.w.created[i] = now
	}
	t.published[i] = now
	cmd := p.w.command(r.e, r.accounts, i)
	m := nats.NewMsg(topo.CommandSubject(cmd, topo.Region))
	m.Data = cmd.Encode()
	id := cmd.MsgKey()
	if p.replay {
		id += replaySuffix
	}
	m.Header.Set(jetstream.MsgIDHeader, id)
	f, err := r.e.nats.js.PublishMsgAsync(m, jetstream.WithExpectStream(topo.Stream()))
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", id, err)
	}
	return f, nil
}

// checkAcks waits for each publish's ack; a publish that failed is sent
// again synchronously with the same Nats-Msg-Id (a duplicate the stream
// would drop), and the phase fails when that fails too.
func (e *env) checkAcks(ctx context.Context, futures <-chan jetstream.PubAckFuture, fail context.CancelCauseFunc, acked func(msgID string, now int64)) {
	for f := range futures {
		select {
		case <-f.Ok():
			if acked != nil {
				acked(f.Msg().Header.Get(jetstream.MsgIDHeader), time.Now().UnixNano())
			}
			continue
		case err := <-f.Err():
			m := f.Msg()
			again := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: m.Header}
			var perr error
			for range 5 {
				pctx, c := context.WithTimeout(ctx, 5*time.Second)
				_, perr = e.nats.js.PublishMsg(pctx, again)
				c()
				if perr == nil {
					break
				}
			}
			if perr != nil {
				fail(fmt.Errorf("publish %s: %v, then %w", m.Header.Get(jetstream.MsgIDHeader), err, perr))
			}
		case <-ctx.Done():
		}
	}
}

// waitCommitted waits until n messages of the phase committed. A ledger
// that stops making progress for a minute fails the phase.
func (r *ledgerRig) waitCommitted(ctx context.Context, t *tracker, n int64) error {
	last, since := t.done.Load(), time.Now()
	for t.done.Load() < n {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		if d := t.done.Load(); d != last {
			last, since = d, time.Now()
		} else if time.Since(since) > time.Minute {
			return fmt.Errorf("the ledger committed nothing for a minute (%d of %d committed)", d, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// verify runs the ledger's invariant checks on the rig's database and
// checks that every transfer of the phase was recorded once.
func (r *ledgerRig) verify(ctx context.Context, run *LedgerRun, transfers int64) error {
	rep, err := r.srv.Store.Verify(ctx)
	if err != nil {
		return err
	}
	var recorded int64
	if err := r.srv.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM transfers WHERE type = 'transfer' AND status = 'COMPLETED'`).Scan(&recorded); err != nil {
		return err
	}
	run.Verified = rep.OK() && recorded == transfers
	if !run.Verified {
		run.VerifyReport = fmt.Sprintf("%d completed transfers recorded, want %d\n%s", recorded, transfers, rep)
	}
	return nil
}

// uniformRun measures scenario name on a fresh ledger: accounts funded, then
// transfers between random accounts (half of them to one merchant when
// hot), with the dedup table pre-filled with fill rows first.
func (e *env) uniformRun(ctx context.Context, name string, batch int, hot bool, fill int64, limit time.Duration, profile string) (LedgerRun, *ledgerRig, *workload, error) {
	rig, err := e.openLedger(ctx, name, batch, e.cfg.Accounts)
	if err != nil {
		return LedgerRun{}, nil, nil, err
	}
	fail := func(err error) (LedgerRun, *ledgerRig, *workload, error) {
		rig.close(ctx)
		return LedgerRun{}, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	merchant := -1
	if hot {
		merchant = 0
	}
	w, err := e.newWorkload(name+strconv.FormatInt(e.seq.Add(1), 10), e.cfg.Transfers, len(rig.accounts), merchant)
	if err != nil {
		return fail(err)
	}
	if fill > 0 {
		if err := e.fillDedup(ctx, rig, fill); err != nil {
			return fail(err)
		}
	}
	e.checkpoint(ctx)
	began := time.Now()
	run, err := rig.drive(ctx, phase{scenario: name, w: w, limit: limit, profile: profile})
	if err != nil {
		return fail(err)
	}
	run.BatchSize, run.DedupRows = batch, fill
	if rig.hooks != nil {
		hr, err := rig.hooks.drain(ctx, rig.srv.Store, run, began, e.cfg.Limit)
		if err != nil {
			return fail(err)
		}
		run.Webhooks = &hr
	}
	if fill > 0 {
		if err := e.unfillDedup(ctx, rig); err != nil {
			return fail(err)
		}
	}
	if err := rig.verify(ctx, &run, int64(run.Published)); err != nil {
		return fail(err)
	}
	return run, rig, w, nil
}

// resetStreams deletes the region's ledger and dead-letter streams, so
// that a run starts on empty streams: nothing left from the previous one.
func (e *env) resetStreams(ctx context.Context) error {
	admin := e.nats.admin
	if admin == nil {
		admin = e.nats.js
	}
	for _, s := range []string{ledgerstream.Topology{Region: region}.Stream(), ledgerstream.Topology{Region: region}.DLQStream()} {
		if err := admin.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete stream %s: %w", s, err)
		}
	}
	return nil
}

// randSource seeds the workloads.
func randSource(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x70617962656e6368)) }

// createDB creates a database (dropping an older one of that name) and
// remembers it for the final clean-up.
func (e *env) createDB(ctx context.Context, name string) (string, error) {
	url, err := pgdb.Create(ctx, e.cfg.PostgresURL, name, true)
	if err != nil {
		return "", err
	}
	e.mu.Lock()
	e.dbs[name] = true
	e.mu.Unlock()
	return url, nil
}

// dropDB drops a database of the run unless --keep.
func (e *env) dropDB(ctx context.Context, name string) {
	if e.cfg.Keep {
		return
	}
	if err := pgdb.Drop(context.WithoutCancel(ctx), e.cfg.PostgresURL, name); err != nil {
		fmt.Fprintf(e.out, "drop database %s: %v\n", name, err)
		return
	}
	e.mu.Lock()
	delete(e.dbs, name)
	e.mu.Unlock()
}
