package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/internal/testbed/cluster"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// APIRun is the HTTP API scenario's result.
type APIRun struct {
	Transfers   int   `json:"transfers"`
	Concurrency int   `json:"concurrency"`
	Completed   int64 `json:"completed"` // answered 201
	// Capped is set when the run stopped sending at the time limit (Limit)
	// before every transfer was sent.
	Capped bool `json:"capped,omitempty"`
	// Other counts answers other than 201, by status; a run with any is
	// not verified.
	Other map[int]int64 `json:"other,omitempty"`
	// Seconds runs from the first request to the last answer; Rate is
	// Completed over it.
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`
	// Request→answer latency percentiles, as the client saw them.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// CPU per answered transfer in microseconds: this process (client,
	// API, router, ledger, nats-server) and the database's Postgres
	// backends (-1 when /proc could not be read).
	CPUPerTransferUs   float64 `json:"cpu_per_transfer_us"`
	PGCPUPerTransferUs float64 `json:"pg_cpu_per_transfer_us"`
	Verified           bool    `json:"verified"`
	VerifyReport       string  `json:"verify_report,omitempty"`
}

func (a APIRun) line() string {
	capped := ""
	if a.Capped {
		capped = "  (sending stopped at the time limit)"
	}
	return fmt.Sprintf("%-13s %8.0f/s  %d of %d answered 201 in %.1fs (%d requests in flight)  p50 %.1f ms p99 %.1f ms  CPU %.0f µs + Postgres %.0f µs per transfer%s  %s",
		API, a.Rate, a.Completed, a.Transfers, a.Seconds, a.Concurrency, a.P50Ms, a.P99Ms, a.CPUPerTransferUs, a.PGCPUPerTransferUs,
		capped, invariants(a.Verified, a.VerifyReport))
}

// apiKey is the bench client's API key (the run's throwaway database only).
const apiKey = "pm_bench_0123456789abcdef"

// api runs one region in this process (internal/testbed/cluster: ledger, router and
// API on an embedded NATS server), and sends same-region transfers to its
// HTTP API as a client would: POST /v1/transfers with an Idempotency-Key,
// concurrency at a time, each waiting for its answer (201 once the ledger
// applied it).
func (e *env) api(ctx context.Context, concurrency int) (APIRun, error) {
	res := APIRun{Transfers: e.cfg.APITransfers, Concurrency: concurrency, Other: map[int]int64{}}
	c, region, accounts, stop, err := e.apiRegion(ctx, "api_")
	if err != nil {
		return res, err
	}
	defer stop()
	store := region.Ledger.Store
	reqs := e.apiRequests(accounts, res.Transfers)
	e.checkpoint(ctx)

	db := store.Pool().Config().ConnConfig.Database
	stopProfile, err := e.apiProfile(concurrency)
	if err != nil {
		return res, err
	}
	pg0, cpu0 := pgBackends(ctx, store.Pool(), db), cpuTime()
	load, err := e.driveAPI(ctx, API, region.APIURL, reqs, concurrency)
	cpu := cpuTime() - cpu0
	stopProfile()
	pgCPU, pgOK := pgCPUDelta(pg0, pgBackends(ctx, store.Pool(), db))
	if err != nil {
		return res, err
	}
	load.fill(&res)
	res.CPUPerTransferUs, res.PGCPUPerTransferUs = perTransfer(cpu, true, res.Completed), perTransfer(pgCPU, pgOK, res.Completed)

	rep, err := quietReport(ctx, c)
	if err != nil {
		return res, err
	}
	return res, checkAnswered(ctx, store.Pool(), rep, &res, 0)
}

// apiRegion starts one region (eu) with its API for the bench client, and
// opens and funds its accounts; stop stops the region.
func (e *env) apiRegion(ctx context.Context, prefix string) (_ *cluster.Cluster, _ *cluster.Region, accounts []string, stop func(), err error) {
	code, _ := e.regions.Code("eu")
	c, stop, err := e.startCluster(ctx, map[string]uint8{"eu": code}, prefix, 10*time.Second, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	region := c.Region("eu")
	if err := region.APIStore.PutClient(ctx, api.RegisteredClient{ID: Client, Name: "bench", RatePerSec: 1_000_000}, apiKey); err != nil {
		return nil, nil, nil, nil, err
	}
	if accounts, err = openAccounts(ctx, e, region.Ledger.Store, "eu", e.cfg.Accounts); err != nil {
		return nil, nil, nil, nil, err
	}
	return c, region, accounts, stop, nil
}

// apiProfile starts the CPU profile of the first api run, if one was
// asked for (Config.APIProfile); the function it returns stops it.
func (e *env) apiProfile(concurrency int) (func(), error) {
	if e.cfg.APIProfile == "" || len(e.cfg.APIConcurrency) == 0 || concurrency != e.cfg.APIConcurrency[0] {
		return func() {}, nil
	}
	f, err := os.Create(e.cfg.APIProfile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// apiRequests draws n same-region transfer bodies between distinct random
// accounts.
func (e *env) apiRequests(accounts []string, n int) [][]byte {
	reqs := make([][]byte, n)
	for i := range reqs {
		from := accounts[e.rng.IntN(len(accounts))]
		to := from
		for to == from {
			to = accounts[e.rng.IntN(len(accounts))]
		}
		reqs[i], _ = json.Marshal(api.TransferRequest{From: from, To: to, Amount: int64(1 + e.rng.IntN(100)), Currency: "EUR"})
	}
	return reqs
}

// apiLoad is what driveAPI measured.
type apiLoad struct {
	completed int64
	other     map[int]int64
	capped    bool
	seconds   float64
	lat       []time.Duration // of the 201 answers, sorted
}

func (l apiLoad) fill(r *APIRun) {
	r.Completed, r.Other, r.Capped, r.Seconds = l.completed, l.other, l.capped, l.seconds
	if l.seconds > 0 {
		r.Rate = float64(l.completed) / l.seconds
	}
	r.P50Ms, r.P99Ms = ms(percentile(l.lat, 0.5)), ms(percentile(l.lat, 0.99))
}

// driveAPI sends reqs as POST /v1/transfers to base, concurrency at a
// time over keep-alive connections, each with an Idempotency-Key of its
// own, until every request is answered or Limit has passed since the
// first (then no new request starts). A request that gets no answer fails
// the run.
func (e *env) driveAPI(ctx context.Context, what, base string, reqs [][]byte, concurrency int) (apiLoad, error) {
	rs := make([]apiReq, len(reqs))
	for i, b := range reqs {
		rs[i] = apiReq{path: "/v1/transfers", body: b, want: http.StatusCreated}
	}
	res, _, err := e.drive(ctx, what, base, rs, concurrency)
	return res, err
}

// drive sends reqs to base as driveAPI does, and returns what it measured
// (a request answered with its want status counts as completed, with its
// latency) and the IDs the completed answers named, in request order (""
// for the others).
func (e *env) drive(ctx context.Context, what, base string, reqs []apiReq, concurrency int) (apiLoad, []string, error) {
	res := apiLoad{other: map[int]int64{}, lat: make([]time.Duration, 0, len(reqs))}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	defer hc.CloseIdleConnections()
	tag := e.seq.Add(1)
	ids := make([]string, len(reqs))
	var next, done atomic.Int64
	var capped atomic.Bool
	var mu sync.Mutex
	progress := e.progress(what, func() (int64, int64) { return done.Load(), int64(len(reqs)) })
	defer progress()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, concurrency)
	for range concurrency {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(reqs) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if time.Since(start) > e.cfg.Limit {
					capped.Store(true)
					return
				}
				began := time.Now()
				status, id, err := postFor(ctx, hc, base, fmt.Sprintf("%s%d-%d", strings.ReplaceAll(what, " ", "-"), tag, i), reqs[i])
				if err != nil {
					errs <- fmt.Errorf("%s: %w", what, err)
					return
				}
				d := time.Since(began)
				mu.Lock()
				if status == reqs[i].want {
					res.completed++
					res.lat = append(res.lat, d)
					ids[i] = id
				} else {
					res.other[status]++
				}
				mu.Unlock()
				done.Add(1)
			}
		})
	}
	wg.Wait()
	res.seconds = time.Since(start).Seconds()
	res.capped = capped.Load()
	close(errs)
	if err := <-errs; err != nil {
		return res, nil, err
	}
	if err := ctx.Err(); err != nil {
		return res, nil, err
	}
	slices.Sort(res.lat)
	return res, ids, nil
}

// perTransfer is cpu in microseconds per transfer; -1 when it could not
// be read (ok false) or nothing was answered.
func perTransfer(cpu time.Duration, ok bool, transfers int64) float64 {
	if !ok || transfers <= 0 {
		return -1
	}
	return float64(cpu.Microseconds()) / float64(transfers)
}

// checkAnswered sets r.Verified: the invariants held (rep), every answer
// was a 201, and the bench client's transfers recorded in the database are
// exactly the answered ones, each once, and extra more answered before the
// measurement.
func checkAnswered(ctx context.Context, pool *pgxpool.Pool, rep postgres.Report, r *APIRun, extra int64) error {
	var applied, distinct int64
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT idempotency_key) FROM transfers WHERE client_id = $1 AND type = 'transfer'`, Client).Scan(&applied, &distinct); err != nil {
		return err
	}
	r.Verified = rep.OK() && len(r.Other) == 0 && applied == r.Completed+extra && distinct == applied
	if !r.Verified {
		r.VerifyReport = fmt.Sprintf("%d transfers recorded (%d keys) for %d answered 201; other answers %v\n%s", applied, distinct, r.Completed+extra, r.Other, rep)
	}
	return nil
}
