package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paymesh/paymesh/platform/subjects"
	"github.com/paymesh/paymesh/services/api"
	"github.com/paymesh/paymesh/services/api/apidb"
	"github.com/paymesh/paymesh/services/ledger/ledgerd"
)

// APIProcessRun is the api scenario with the load from outside the API's
// process: `paymesh api`, `paymesh router` and `paymesh ledger` each in a
// process of its own, as a region deploys them, and the bench's HTTP client
// in the bench process.
type APIProcessRun struct {
	APIRun
	// CPU per answered transfer in microseconds of each service's process
	// (from /proc/<pid>/stat: "api", "router", "ledger"), and of the bench
	// process (the HTTP client and the embedded nats-server); -1 when it
	// could not be read. APIRun's CPUPerTransferUs is the three services'
	// sum.
	ServiceCPUUs map[string]float64 `json:"service_cpu_us"`
	BenchCPUUs   float64            `json:"bench_cpu_us"`
}

func (p APIProcessRun) line() string {
	capped := ""
	if p.Capped {
		capped = "  (sending stopped at the time limit)"
	}
	return fmt.Sprintf("%-13s %8.0f/s  %d of %d answered 201 in %.1fs (%d requests in flight)  p50 %.1f ms p99 %.1f ms  CPU per transfer: api %.0f + router %.0f + ledger %.0f + Postgres %.0f µs (bench client and nats-server %.0f µs)%s  %s",
		APIProcess, p.Rate, p.Completed, p.Transfers, p.Seconds, p.Concurrency, p.P50Ms, p.P99Ms,
		p.ServiceCPUUs["api"], p.ServiceCPUUs["router"], p.ServiceCPUUs["ledger"], p.PGCPUPerTransferUs, p.BenchCPUUs,
		capped, invariants(p.Verified, p.VerifyReport))
}

// apiProcess starts one region as three processes of the paymesh binary
// on a database of its own and the bench's nats-server, registers the
// bench client, and sends the api scenario's transfers to the API process
// over keep-alive connections, at the first APIConcurrency. The schema,
// the streams and the funded accounts are made from this process first
// (an in-process ledger that consumes nothing and is closed before the
// services start).
func (e *env) apiProcess(ctx context.Context) (APIProcessRun, error) {
	concurrency := e.cfg.APIConcurrency[0]
	res := APIProcessRun{APIRun: APIRun{Transfers: e.cfg.APITransfers - 1, Concurrency: concurrency, Other: map[int]int64{}},
		ServiceCPUUs: map[string]float64{}}
	name := e.cfg.DatabasePrefix + "api_process"
	url, err := e.createDB(ctx, name)
	if err != nil {
		return res, err
	}
	defer e.dropDB(ctx, name)
	if err := e.resetStreams(ctx); err != nil {
		return res, err
	}
	if err := e.nats.js.DeleteStream(ctx, subjects.RouteStream(region)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return res, fmt.Errorf("delete stream %s: %w", subjects.RouteStream(region), err)
	}
	setup, err := ledgerd.Open(ctx, ledgerd.Config{Region: region, Regions: e.regions, Node: 1, PostgresURL: url, NATSURL: e.nats.url,
		Shards: e.cfg.Shards, CacheSize: 0, Answers: apidb.Answers{}, AnswersSchema: new(apidb.Migrations())})
	if err != nil {
		return res, err
	}
	defer setup.Close()
	store := setup.Store
	accounts, err := openAccounts(ctx, e, store, region, e.cfg.Accounts)
	if err != nil {
		return res, err
	}
	if err := apidb.New(store.Pool()).PutClient(ctx, api.RegisteredClient{ID: Client, Name: "bench", RatePerSec: 1_000_000}, apiKey); err != nil {
		return res, err
	}
	reqs := e.apiRequests(accounts, e.cfg.APITransfers)

	listen, err := freeAddr()
	if err != nil {
		return res, err
	}
	base := "http://" + listen
	common := []string{"--region", region, "--postgres-url", e.cfg.PostgresURL, "--database", name, "--nats-url", e.nats.url,
		"--metrics-listen", "off", "--shards", strconv.Itoa(e.cfg.Shards),
		"--insecure-dev"} // the bench's own servers: no users, no TLS
	var svcs []*service
	defer func() {
		for i := len(svcs) - 1; i >= 0; i-- {
			svcs[i].stop()
		}
	}()
	for _, args := range [][]string{
		e.ledgerArgs(name, 3),
		append([]string{"router"}, common...),
		append([]string{"api", "--listen", listen, "--node", "4", "--wait", "10s"}, common...),
	} {
		s, err := e.startService(ctx, args...)
		if err != nil {
			return res, err
		}
		svcs = append(svcs, s)
	}
	if err := waitReady(ctx, base, svcs); err != nil {
		return res, err
	}
	// One transfer through the whole path first, so that the measurement
	// starts with every consumer bound: it is recorded, and counted below.
	if err := warmUp(ctx, base, reqs[0]); err != nil {
		return res, errors.Join(err, failedServices(svcs))
	}
	reqs = reqs[1:]
	e.checkpoint(ctx)

	db := store.Pool().Config().ConnConfig.Database
	cpu0 := make([]time.Duration, len(svcs))
	for i, s := range svcs {
		cpu0[i], _ = procCPU(s.pid())
	}
	pg0, bench0 := pgBackends(ctx, store.Pool(), db), cpuTime()
	load, err := e.driveAPI(ctx, APIProcess, base, reqs, concurrency)
	bench := cpuTime() - bench0
	pgCPU, pgOK := pgCPUDelta(pg0, pgBackends(ctx, store.Pool(), db))
	var services time.Duration
	servicesOK := true
	for i, s := range svcs {
		cpu1, ok := procCPU(s.pid())
		servicesOK = servicesOK && ok
		services += cpu1 - cpu0[i]
		res.ServiceCPUUs[s.name] = perTransfer(cpu1-cpu0[i], ok, load.completed)
	}
	if err != nil {
		return res, errors.Join(err, failedServices(svcs))
	}
	load.fill(&res.APIRun)
	res.CPUPerTransferUs = perTransfer(services, servicesOK, res.Completed)
	res.PGCPUPerTransferUs = perTransfer(pgCPU, pgOK, res.Completed)
	res.BenchCPUUs = perTransfer(bench, true, res.Completed)
	if err := failedServices(svcs); err != nil {
		return res, err
	}

	rep, err := store.Verify(ctx)
	if err != nil {
		return res, err
	}
	return res, checkAnswered(ctx, store.Pool(), rep, &res.APIRun, 1)
}

// warmUp sends one transfer and waits for its 201, up to a minute.
func warmUp(ctx context.Context, base string, body []byte) error {
	hc := &http.Client{Timeout: time.Minute}
	defer hc.CloseIdleConnections()
	status, _, err := postFor(ctx, hc, base, "warm-up", apiReq{path: "/v1/transfers", body: body})
	if err != nil {
		return err
	}
	if status != http.StatusCreated {
		return fmt.Errorf("%s: the first transfer was answered %d, want 201", APIProcess, status)
	}
	return nil
}

// failedServices names the services whose process has ended.
func failedServices(svcs []*service) error {
	var errs []error
	for _, s := range svcs {
		errs = append(errs, s.failed())
	}
	return errors.Join(errs...)
}

// waitReady waits, up to a minute, until the API at base answers GET
// /readyz with 200; a service that exits meanwhile fails the wait at once.
func waitReady(ctx context.Context, base string, svcs []*service) error {
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(time.Minute)
	for {
		if err := failedServices(svcs); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API at %s was not ready within a minute", base)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freeAddr returns a loopback address with a port free just now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
