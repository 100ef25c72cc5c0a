package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// CrossRun is the cross-region scenario's result.
type CrossRun struct {
	// RelaySteps: every saga step left to the relay (the cross-relay
	// scenario); otherwise each ledger publishes its steps after COMMIT.
	RelaySteps bool     `json:"relay_steps"`
	Regions    []string `json:"regions"`
	BatchSize  int      `json:"batch_size"`
	Transfers  int      `json:"transfers"`
	CrossShare float64  `json:"cross_share"`
	Completed  int64    `json:"completed"`
	// Seconds runs from the first submit to the last transfer reaching its
	// final state; Rate is Completed over it.
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
	// Submit→final state, from the transfers' created_at and their
	// settled_at (cross-region) or applied_at (same region).
	SameP50Ms  float64 `json:"same_p50_ms"`
	SameP99Ms  float64 `json:"same_p99_ms"`
	CrossP50Ms float64 `json:"cross_p50_ms"`
	CrossP99Ms float64 `json:"cross_p99_ms"`
	// HalfPeak is the same topology paced at half of Rate.
	HalfPeak *CrossHalf `json:"half_peak,omitempty"`
	Verified bool       `json:"verified"`
	// VerifyReport is the global invariant report when it failed.
	VerifyReport string `json:"verify_report,omitempty"`
}

// CrossHalf is the cross-region scenario's second phase: new transfers
// submitted at half the rate the first phase completed, half of them
// crossing regions, each timed from its submit to its final state, and
// the cross-region ones hop by hop.
type CrossHalf struct {
	PacedRate float64 `json:"paced_rate"`
	Transfers int     `json:"transfers"`
	// Submit→final state (as CrossRun's), over this phase's transfers.
	SameP50Ms  float64 `json:"same_p50_ms"`
	SameP99Ms  float64 `json:"same_p99_ms"`
	CrossP50Ms float64 `json:"cross_p50_ms"`
	CrossP99Ms float64 `json:"cross_p99_ms"`
	// Ratio is CrossP50Ms over SameP50Ms.
	Ratio float64 `json:"cross_over_same_p50"`
	// Submit→COMMIT of the final state: the same transfers timed to the
	// instant the ledger's COMMIT of the transaction that applied the
	// transfer (same region) or settled it (cross-region) returned, taken
	// by a decorator of the ledgers' appliers (commitClock). The figures
	// above end at that transaction's start (its now()), so they leave the
	// same-region transfer's one transaction out and count the
	// cross-region one's debit and credit transactions in.
	SameCommitP50Ms  float64 `json:"same_commit_p50_ms"`
	SameCommitP99Ms  float64 `json:"same_commit_p99_ms"`
	CrossCommitP50Ms float64 `json:"cross_commit_p50_ms"`
	CrossCommitP99Ms float64 `json:"cross_commit_p99_ms"`
	// CommitRatio is CrossCommitP50Ms over SameCommitP50Ms (target: at
	// most 3: three transactions in sequence against one, the hops
	// between them costing nothing more).
	CommitRatio float64 `json:"cross_over_same_commit_p50"`
	// Hops break the cross-region transfers' time down, from the times the
	// two regions' databases recorded: each transaction's start (now()) and
	// each outbox row's sent_at, written after the PubAck by the ledger
	// that committed the step or by the relay.
	Hops []Stage `json:"hops"`
}

// crossHalfFor is how long the half-peak phase submits.
const crossHalfFor = 10 * time.Second

func (c CrossRun) line() string {
	name := Cross
	if c.RelaySteps {
		name = CrossRelay
	}
	return fmt.Sprintf("%-13s %8.0f/s  %d of %d completed in %.1fs (%.0f%% cross-region, regions %v)  same-region p50 %.1f ms p99 %.1f ms, cross-region p50 %.1f ms p99 %.1f ms  %s",
		name, c.Rate, c.Completed, c.Transfers, c.Seconds, 100*c.CrossShare, c.Regions, c.SameP50Ms, c.SameP99Ms, c.CrossP50Ms, c.CrossP99Ms, invariants(c.Verified, c.VerifyReport))
}

// crossSubmitters is how many transfers are submitted to the routers at once.
const crossSubmitters = 32

// cross runs two regions in this process (internal/testbed/cluster: ledger, router
// and API per region on an embedded NATS topology), submits transfers to
// the source region's router, half of them to an account of the other
// region (a saga: debit into transit, credit, confirm), and measures until
// every transfer reached its final state. With relaySteps the ledgers leave
// every saga step to the relay (the cross-relay scenario).
func (e *env) cross(ctx context.Context, relaySteps bool) (CrossRun, error) {
	names := []string{"eu", "us"}
	codes := map[string]uint8{}
	for _, n := range names {
		codes[n], _ = e.regions.Code(n)
	}
	res := CrossRun{RelaySteps: relaySteps, Regions: names, BatchSize: e.cfg.BatchSize, Transfers: e.cfg.CrossTransfers, CrossShare: 0.5}
	prefix, scenario := "x_", Cross
	if relaySteps {
		prefix, scenario = "xr_", CrossRelay
	}
	commits := &commitClock{at: map[commitKey]time.Time{}}
	c, stop, err := e.startCluster(ctx, codes, prefix, 0, func(_ string, lc *ledgerd.Config) {
		lc.RelaySteps = relaySteps
		lc.WrapApplier = commits.wrap
	})
	if err != nil {
		return res, err
	}
	defer stop()
	accounts := map[string][]string{}
	for _, n := range names {
		if accounts[n], err = openAccounts(ctx, e, c.Region(n).Ledger.Store, n, max(2, e.cfg.Accounts/len(names))); err != nil {
			return res, err
		}
	}
	cmds, err := e.crossCommands(res.Transfers, names, accounts)
	if err != nil {
		return res, err
	}
	e.checkpoint(ctx)

	settled := func(ctx context.Context) (n int64, last time.Time, err error) {
		for _, s := range c.Stores() {
			var k int64
			var t *time.Time
			if err := s.Pool().QueryRow(ctx, `
				SELECT count(*), max(coalesce(settled_at, applied_at)) FROM transfers
				WHERE type = 'transfer' AND status IN ('COMPLETED', 'REFUNDED', 'REJECTED')`).Scan(&k, &t); err != nil {
				return 0, time.Time{}, err
			}
			n += k
			if t != nil && t.After(last) {
				last = *t
			}
		}
		return n, last, nil
	}
	var done atomic.Int64
	progress := e.progress(scenario, func() (int64, int64) { return done.Load(), int64(res.Transfers) })
	defer progress()
	start := time.Now()
	submitErr := e.submitAll(ctx, c, cmds)
	if submitErr != nil {
		return res, submitErr
	}
	var last time.Time
	lastN, since := int64(-1), time.Now()
	for done.Load() < int64(res.Transfers) {
		n, t, err := settled(ctx)
		if err != nil {
			return res, err
		}
		done.Store(n)
		last = t
		if n != lastN {
			lastN, since = n, time.Now()
		} else if time.Since(since) > time.Minute {
			return res, fmt.Errorf("no transfer settled for a minute (%d of %d)", n, res.Transfers)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.Completed = done.Load()
	res.Seconds = last.Sub(start).Seconds()
	if res.Seconds > 0 {
		res.Rate = float64(res.Completed) / res.Seconds
	}
	var same, crossL []time.Duration
	for _, s := range c.Stores() {
		cs, err := s.Completions(ctx)
		if err != nil {
			return res, err
		}
		for _, x := range cs {
			if x.Cross {
				crossL = append(crossL, x.Duration)
			} else {
				same = append(same, x.Duration)
			}
		}
	}
	slices.Sort(same)
	slices.Sort(crossL)
	res.SameP50Ms, res.SameP99Ms = ms(percentile(same, 0.5)), ms(percentile(same, 0.99))
	res.CrossP50Ms, res.CrossP99Ms = ms(percentile(crossL, 0.5)), ms(percentile(crossL, 0.99))
	if half, err := e.crossHalf(ctx, c, names, accounts, res.Rate/2, commits, func() (int64, error) {
		n, _, err := settled(ctx)
		return n, err
	}); err != nil {
		return res, fmt.Errorf("half peak: %w", err)
	} else {
		res.HalfPeak = &half
	}
	rep, err := quietReport(ctx, c)
	if err != nil {
		return res, err
	}
	res.Verified = rep.OK()
	if !res.Verified {
		res.VerifyReport = rep.String()
	}
	return res, nil
}

// startCluster runs regions (name → code) in this process on an embedded
// NATS topology, each on a database named after prefix, with adjust (if
// not nil) changing each region's ledger configuration; stop shuts them
// down and drops the databases.
func (e *env) startCluster(ctx context.Context, codes map[string]uint8, prefix string, apiWait time.Duration,
	adjust func(string, *ledgerd.Config)) (c *cluster.Cluster, stop func(), err error) {
	dir, err := os.MkdirTemp("", "paymesh-bench-topology-")
	if err != nil {
		return nil, nil, err
	}
	names := slices.Sorted(maps.Keys(codes))
	topo, err := natsembed.StartTopology(natsembed.TopologyOptions{Regions: names, Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	prefix = e.cfg.DatabasePrefix + prefix
	e.mu.Lock()
	for _, n := range names {
		e.dbs[prefix+n] = true
	}
	e.mu.Unlock()
	c, err = cluster.Start(ctx, cluster.Config{Regions: codes, Topology: topo, PostgresURL: e.cfg.PostgresURL,
		DatabasePrefix: prefix, Shards: e.cfg.Shards, BatchSize: e.cfg.BatchSize, AckWait: 30 * time.Second, APIWait: apiWait, Ledger: adjust})
	if err != nil {
		topo.Shutdown()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	var urls []string
	for _, n := range names {
		r := c.Region(n)
		urls = append(urls, r.LedgerMetricsURL, r.RouterMetricsURL, r.APIMetricsURL)
	}
	unscrape := e.scrape(urls...)
	return c, func() {
		unscrape()
		c.Stop()
		for _, n := range names {
			e.dropDB(ctx, prefix+n)
		}
		topo.Shutdown()
		os.RemoveAll(dir)
	}, nil
}

// quietReport waits, up to a minute, until c has drained, and checks the
// global invariants.
func quietReport(ctx context.Context, c *cluster.Cluster) (postgres.Report, error) {
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.WaitQuiet(qctx); err != nil {
		return postgres.Report{}, err
	}
	return postgres.VerifyGlobal(ctx, c.Stores(), true)
}

// submitAll hands the commands to their source region's router,
// crossSubmitters at a time; CreatedAt is set at the submit.
func (e *env) submitAll(ctx context.Context, c *cluster.Cluster, cmds []ledger.Command) error {
	work := make(chan ledger.Command)
	errs := make(chan error, crossSubmitters)
	var wg sync.WaitGroup
	for range crossSubmitters {
		wg.Go(func() {
			for cmd := range work {
				src, _ := e.regions.HomeRegion(cmd.From)
				cmd.CreatedAt = time.Now()
				if err := c.Submit(ctx, src, cmd); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for _, cmd := range cmds {
		select {
		case work <- cmd:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// crossCommands returns n transfers from a random account of a random
// region of names, half of them to an account of the next region.
func (e *env) crossCommands(n int, names []string, accounts map[string][]string) ([]ledger.Command, error) {
	cmds := make([]ledger.Command, n)
	for i := range cmds {
		src := names[e.rng.IntN(len(names))]
		dst := src
		if e.rng.IntN(2) == 0 {
			dst = names[(slices.Index(names, src)+1)%len(names)]
		}
		from := accounts[src][e.rng.IntN(len(accounts[src]))]
		to := from
		for to == from {
			to = accounts[dst][e.rng.IntN(len(accounts[dst]))]
		}
		id, err := e.nextID(src)
		if err != nil {
			return nil, err
		}
		cmds[i] = ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: Client,
			IdempotencyKey: fmt.Sprintf("x%d-%d", e.seq.Add(1), i), From: from, To: to,
			Amount: int64(1 + e.rng.IntN(100)), Currency: "EUR"}
	}
	return cmds, nil
}

// crossHalf submits new transfers at rate for crossHalfFor, waits until
// every one reached its final state (finished counts the cluster's
// finished transfers), and times them from the regions' databases.
func (e *env) crossHalf(ctx context.Context, c *cluster.Cluster, names []string, accounts map[string][]string, rate float64,
	commits *commitClock, finished func() (int64, error)) (CrossHalf, error) {
	h := CrossHalf{PacedRate: rate, Transfers: max(2, int(rate*crossHalfFor.Seconds()))}
	cmds, err := e.crossCommands(h.Transfers, names, accounts)
	if err != nil {
		return h, err
	}
	before, err := finished()
	if err != nil {
		return h, err
	}
	if err := e.submitPaced(ctx, c, cmds, rate); err != nil {
		return h, err
	}
	for last, since := int64(-1), time.Now(); ; time.Sleep(50 * time.Millisecond) {
		n, err := finished()
		if err != nil {
			return h, err
		}
		if n-before >= int64(len(cmds)) {
			break
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > time.Minute {
			return h, fmt.Errorf("no transfer finished for a minute (%d of %d)", n-before, len(cmds))
		}
	}
	t, err := crossTimes(ctx, c, cmds)
	if err != nil {
		return h, err
	}
	var same, total []time.Duration // total: each cross-region transfer's, in hops' order
	var sameCommit, crossCommit []time.Duration
	hops := make([][]time.Duration, len(hopNames))
	for i, x := range t {
		final, ok := commits.final(cmds[i].TransferID, x.cross)
		if !ok {
			return h, fmt.Errorf("transfer %s: no COMMIT of its final state seen", cmds[i].TransferID)
		}
		if !x.cross {
			same = append(same, x.at[1].Sub(x.at[0]))
			sameCommit = append(sameCommit, final.Sub(x.at[0]))
			continue
		}
		crossCommit = append(crossCommit, final.Sub(x.at[0]))
		for k := range hopNames {
			hops[k] = append(hops[k], x.at[k+1].Sub(x.at[k]))
		}
		total = append(total, x.at[len(x.at)-1].Sub(x.at[0]))
	}
	if len(same) == 0 || len(total) == 0 {
		return h, fmt.Errorf("%d same-region and %d cross-region transfers timed, of %d", len(same), len(total), len(cmds))
	}
	slices.Sort(same)
	cross := slices.Sorted(slices.Values(total))
	h.SameP50Ms, h.SameP99Ms = ms(percentile(same, 0.5)), ms(percentile(same, 0.99))
	h.CrossP50Ms, h.CrossP99Ms = ms(percentile(cross, 0.5)), ms(percentile(cross, 0.99))
	if h.SameP50Ms > 0 {
		h.Ratio = h.CrossP50Ms / h.SameP50Ms
	}
	slices.Sort(sameCommit)
	slices.Sort(crossCommit)
	h.SameCommitP50Ms, h.SameCommitP99Ms = ms(percentile(sameCommit, 0.5)), ms(percentile(sameCommit, 0.99))
	h.CrossCommitP50Ms, h.CrossCommitP99Ms = ms(percentile(crossCommit, 0.5)), ms(percentile(crossCommit, 0.99))
	if h.SameCommitP50Ms > 0 {
		h.CommitRatio = h.CrossCommitP50Ms / h.SameCommitP50Ms
	}
	h.Hops = stagesOf(append(hopNames[:len(hopNames):len(hopNames)], "total submit → settled"), append(hops, total), total)
	return h, nil
}

// hopNames name the hops of a cross-region transfer, between the instants
// crossTimes reads.
// A step's "marked sent" is its outbox row's sent_at, written after the
// PubAck (by the ledger that committed it, or by the relay): the next
// transaction may begin before it, and its hop is then negative.
var hopNames = []string{
	"submit → debit (route, stream, batch)",
	"debit → credit step marked sent (publish, PubAck, mark)",
	"credit step marked sent → credit (stream, batch)",
	"credit → confirm step marked sent (publish, PubAck, mark)",
	"confirm step marked sent → settled (stream, batch)",
}

// crossTimed is one transfer's instants: for a same-region transfer its
// submit and its apply; for a cross-region one its submit, debit, credit
// step relayed, credit, confirm step relayed and settle.
type crossTimed struct {
	cross bool
	at    []time.Time
}

// crossTimes reads the instants of cmds' transfers from every region's
// database: the transfer's created_at (the submit), applied_at and
// settled_at in its source region, the credit's applied_at in the
// destination, and the sent_at of the two steps' outbox rows.
func crossTimes(ctx context.Context, c *cluster.Cluster, cmds []ledger.Command) ([]crossTimed, error) {
	ids := make([]string, len(cmds))
	var steps []string
	for i, cmd := range cmds {
		ids[i] = cmd.TransferID
		steps = append(steps, "step/"+cmd.TransferID+"/"+ledger.TypeCredit, "step/"+cmd.TransferID+"/"+ledger.TypeConfirm)
	}
	type row struct {
		region                      string
		to                          string
		created, applied, settled   *time.Time
		credited, creditSent, cSent *time.Time
	}
	rows := map[string]*row{}
	get := func(id string) *row {
		if rows[id] == nil {
			rows[id] = &row{}
		}
		return rows[id]
	}
	for _, n := range c.Names() {
		pool := c.Region(n).Ledger.Store.Pool()
		q, err := pool.Query(ctx, `SELECT id, to_account, created_at, applied_at, settled_at FROM transfers WHERE id = ANY($1)`, ids)
		if err != nil {
			return nil, err
		}
		for q.Next() {
			var id, to string
			var created, applied, settled *time.Time
			if err := q.Scan(&id, &to, &created, &applied, &settled); err != nil {
				q.Close()
				return nil, err
			}
			r := get(id)
			r.region, r.to, r.created, r.applied, r.settled = n, to, created, applied, settled
		}
		q.Close()
		if err := q.Err(); err != nil {
			return nil, err
		}
		q, err = pool.Query(ctx, `SELECT transfer_id, applied_at FROM credits WHERE transfer_id = ANY($1)`, ids)
		if err != nil {
			return nil, err
		}
		for q.Next() {
			var id string
			var at time.Time
			if err := q.Scan(&id, &at); err != nil {
				q.Close()
				return nil, err
			}
			get(id).credited = &at
		}
		q.Close()
		if err := q.Err(); err != nil {
			return nil, err
		}
		q, err = pool.Query(ctx, `SELECT split_part(msg_id, '/', 2), split_part(msg_id, '/', 3), sent_at FROM outbox WHERE msg_id = ANY($1)`, steps)
		if err != nil {
			return nil, err
		}
		for q.Next() {
			var id, typ string
			var at *time.Time
			if err := q.Scan(&id, &typ, &at); err != nil {
				q.Close()
				return nil, err
			}
			if typ == ledger.TypeCredit {
				get(id).creditSent = at
			} else {
				get(id).cSent = at
			}
		}
		q.Close()
		if err := q.Err(); err != nil {
			return nil, err
		}
	}
	var out []crossTimed
	for _, id := range ids {
		r := rows[id]
		if r == nil || r.created == nil || r.applied == nil {
			return nil, fmt.Errorf("transfer %s: not found where it was submitted", id)
		}
		home, _, _ := strings.Cut(r.to, "-")
		if home == r.region {
			out = append(out, crossTimed{at: []time.Time{*r.created, *r.applied}})
			continue
		}
		at := []*time.Time{r.created, r.applied, r.creditSent, r.credited, r.cSent, r.settled}
		if slices.Contains(at, nil) {
			return nil, fmt.Errorf("cross-region transfer %s: an instant is missing (%v)", id, at)
		}
		x := crossTimed{cross: true}
		for _, t := range at {
			x.at = append(x.at, *t)
		}
		out = append(out, x)
	}
	return out, nil
}

// submitPaced hands cmds to their source region's router at rate, at most
// crossSubmitters at once; CreatedAt is set at the submit.
func (e *env) submitPaced(ctx context.Context, c *cluster.Cluster, cmds []ledger.Command, rate float64) error {
	sem := make(chan struct{}, crossSubmitters)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for i, cmd := range cmds {
		if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
		if failed.Load() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			src, _ := e.regions.HomeRegion(cmd.From)
			cmd.CreatedAt = time.Now()
			if err := c.Submit(ctx, src, cmd); err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

// commitClock records when the ledgers committed each transfer's steps: the
// instant a decorated applier's Apply returned (after its COMMIT), for each
// command it applied or refused, by command type and transfer. The first
// COMMIT of a key is kept (a duplicate applies nothing).
type commitClock struct {
	mu sync.Mutex
	at map[commitKey]time.Time
}

type commitKey struct {
	typ      string
	transfer string
}

// wrap decorates a ledger's applier (ledgerd.Config.WrapApplier).
func (k *commitClock) wrap(a ledgerstream.Applier) ledgerstream.Applier { return clockedApplier{a, k} }

// final returns when the transaction that brought transfer to its final
// state committed: the transfer's own for a same-region one, its settle
// (a confirm or a refuse step) for a cross-region one.
func (k *commitClock) final(transfer string, cross bool) (time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !cross {
		t, ok := k.at[commitKey{ledger.TypeTransfer, transfer}]
		return t, ok
	}
	for _, typ := range []string{ledger.TypeConfirm, ledger.TypeRefuse} {
		if t, ok := k.at[commitKey{typ, transfer}]; ok {
			return t, true
		}
	}
	return time.Time{}, false
}

type clockedApplier struct {
	ledgerstream.Applier
	clock *commitClock
}

func (c clockedApplier) Apply(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	res, err := c.Applier.Apply(ctx, cmds)
	if err != nil {
		return res, err
	}
	now := time.Now()
	c.clock.mu.Lock()
	defer c.clock.mu.Unlock()
	for i, cmd := range cmds {
		if i >= len(res) || (res[i].Kind != ledger.Applied && res[i].Kind != ledger.Rejected) {
			continue
		}
		key := commitKey{cmd.Type, cmd.TransferID}
		if _, ok := c.clock.at[key]; !ok {
			c.clock.at[key] = now
		}
	}
	return res, nil
}
