package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/internal/testbed/natsembed"
	"github.com/paymesh/paymesh/services/ledger"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// CrossRun is the cross-region scenario's result.
type CrossRun struct {
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
	Verified   bool    `json:"verified"`
	// VerifyReport is the global invariant report when it failed.
	VerifyReport string `json:"verify_report,omitempty"`
}

func (c CrossRun) line() string {
	return fmt.Sprintf("%-13s %8.0f/s  %d of %d completed in %.1fs (%.0f%% cross-region, regions %v)  same-region p50 %.1f ms p99 %.1f ms, cross-region p50 %.1f ms p99 %.1f ms  %s",
		Cross, c.Rate, c.Completed, c.Transfers, c.Seconds, 100*c.CrossShare, c.Regions, c.SameP50Ms, c.SameP99Ms, c.CrossP50Ms, c.CrossP99Ms, invariants(c.Verified, c.VerifyReport))
}

// crossSubmitters is how many transfers are submitted to the routers at once.
const crossSubmitters = 32

// cross runs two regions in this process (internal/testbed/cluster: ledger, router
// and API per region on an embedded NATS topology), submits transfers to
// the source region's router, half of them to an account of the other
// region (a saga: debit into transit, credit, confirm), and measures until
// every transfer reached its final state.
func (e *env) cross(ctx context.Context) (CrossRun, error) {
	names := []string{"eu", "us"}
	codes := map[string]uint8{}
	for _, n := range names {
		codes[n], _ = e.regions.Code(n)
	}
	res := CrossRun{Regions: names, BatchSize: e.cfg.BatchSize, Transfers: e.cfg.CrossTransfers, CrossShare: 0.5}
	c, stop, err := e.startCluster(ctx, codes, "x_", 0)
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
	cmds := make([]ledger.Command, res.Transfers)
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
			return res, err
		}
		cmds[i] = ledger.Command{Type: ledger.TypeTransfer, TransferID: id, ClientID: Client,
			IdempotencyKey: fmt.Sprintf("x%d-%d", e.seq.Add(1), i), From: from, To: to,
			Amount: int64(1 + e.rng.IntN(100)), Currency: "EUR"}
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
	progress := e.progress(Cross, func() (int64, int64) { return done.Load(), int64(res.Transfers) })
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
// NATS topology, each on a database named after prefix; stop shuts them
// down and drops the databases.
func (e *env) startCluster(ctx context.Context, codes map[string]uint8, prefix string, apiWait time.Duration) (c *cluster.Cluster, stop func(), err error) {
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
		DatabasePrefix: prefix, Shards: e.cfg.Shards, BatchSize: e.cfg.BatchSize, AckWait: 30 * time.Second, APIWait: apiWait})
	if err != nil {
		topo.Shutdown()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return c, func() {
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
