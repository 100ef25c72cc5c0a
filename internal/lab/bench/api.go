package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paymesh/paymesh/services/api"
)

// APIRun is the HTTP API scenario's result.
type APIRun struct {
	Transfers   int   `json:"transfers"`
	Concurrency int   `json:"concurrency"`
	Completed   int64 `json:"completed"` // answered 201
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
	return fmt.Sprintf("%-13s %8.0f/s  %d of %d answered 201 in %.1fs (%d requests in flight)  p50 %.1f ms p99 %.1f ms  CPU %.0f µs + Postgres %.0f µs per transfer  %s",
		API, a.Rate, a.Completed, a.Transfers, a.Seconds, a.Concurrency, a.P50Ms, a.P99Ms, a.CPUPerTransferUs, a.PGCPUPerTransferUs,
		invariants(a.Verified, a.VerifyReport))
}

// apiKey is the bench client's API key (the run's throwaway database only).
const apiKey = "pm_bench_0123456789abcdef"

// api runs one region in this process (internal/testbed/cluster: ledger, router and
// API on an embedded NATS server), and sends same-region transfers to its
// HTTP API as a client would: POST /v1/transfers with an Idempotency-Key,
// APIConcurrency at a time, each waiting for its answer (201 once the
// ledger applied it).
func (e *env) api(ctx context.Context) (APIRun, error) {
	res := APIRun{Transfers: e.cfg.APITransfers, Concurrency: e.cfg.APIConcurrency, Other: map[int]int64{}}
	code, _ := e.regions.Code("eu")
	c, stop, err := e.startCluster(ctx, map[string]uint8{"eu": code}, "api_", 10*time.Second)
	if err != nil {
		return res, err
	}
	defer stop()
	region := c.Region("eu")
	store := region.Ledger.Store
	if err := region.APIStore.PutClient(ctx, api.RegisteredClient{ID: Client, Name: "bench", RatePerSec: 1_000_000}, apiKey); err != nil {
		return res, err
	}
	accounts, err := openAccounts(ctx, e, store, "eu", e.cfg.Accounts)
	if err != nil {
		return res, err
	}
	reqs := make([][]byte, res.Transfers)
	for i := range reqs {
		from := accounts[e.rng.IntN(len(accounts))]
		to := from
		for to == from {
			to = accounts[e.rng.IntN(len(accounts))]
		}
		reqs[i], _ = json.Marshal(api.TransferRequest{From: from, To: to, Amount: int64(1 + e.rng.IntN(100)), Currency: "EUR"})
	}
	e.checkpoint(ctx)

	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: res.Concurrency}}
	defer hc.CloseIdleConnections()
	tag := e.seq.Add(1)
	var next, done atomic.Int64
	var mu sync.Mutex
	lat := make([]time.Duration, 0, res.Transfers)
	progress := e.progress(API, func() (int64, int64) { return done.Load(), int64(res.Transfers) })
	db := store.Pool().Config().ConnConfig.Database
	pg0, cpu0 := pgBackends(ctx, store.Pool(), db), cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, res.Concurrency)
	for range res.Concurrency {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < res.Transfers && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				began := time.Now()
				status, err := postTransfer(ctx, hc, region.APIURL, fmt.Sprintf("api%d-%d", tag, i), reqs[i])
				if err != nil {
					errs <- err
					return
				}
				d := time.Since(began)
				mu.Lock()
				if status == http.StatusCreated {
					res.Completed++
					lat = append(lat, d)
				} else {
					res.Other[status]++
				}
				mu.Unlock()
				done.Add(1)
			}
		})
	}
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	cpu := cpuTime() - cpu0
	pgCPU, pgOK := pgCPUDelta(pg0, pgBackends(ctx, store.Pool(), db))
	progress()
	close(errs)
	if err := <-errs; err != nil {
		return res, err
	}
	if res.Seconds > 0 {
		res.Rate = float64(res.Completed) / res.Seconds
	}
	res.CPUPerTransferUs, res.PGCPUPerTransferUs = -1, -1
	if res.Completed > 0 {
		res.CPUPerTransferUs = float64(cpu.Microseconds()) / float64(res.Completed)
		if pgOK {
			res.PGCPUPerTransferUs = float64(pgCPU.Microseconds()) / float64(res.Completed)
		}
	}
	slices.Sort(lat)
	res.P50Ms, res.P99Ms = ms(percentile(lat, 0.5)), ms(percentile(lat, 0.99))

	rep, err := quietReport(ctx, c)
	if err != nil {
		return res, err
	}
	var applied int64
	if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM transfers WHERE client_id = $1 AND type = 'transfer'`, Client).Scan(&applied); err != nil {
		return res, err
	}
	res.Verified = rep.OK() && len(res.Other) == 0 && applied == res.Completed
	if !res.Verified {
		res.VerifyReport = fmt.Sprintf("%d transfers recorded for %d answered 201; other answers %v\n%s", applied, res.Completed, res.Other, rep)
	}
	return res, nil
}

// postTransfer sends one POST /v1/transfers and returns its status.
func postTransfer(ctx context.Context, hc *http.Client, base, key string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/transfers", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", API, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
