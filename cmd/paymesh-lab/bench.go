package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/paymesh/paymesh/internal/lab/bench"
)

type benchCmd struct {
	PostgresURL    string        `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server on which to create the bench databases (default: ${default_pg})."`
	DBPrefix       string        `name:"database-prefix" help:"Name the bench databases <prefix><scenario> (default paymesh_bench_): two runs on one server need different prefixes, or they drop each other's databases."`
	Scenarios      []string      `help:"Scenarios to run, comma-separated (default: all): uniform, replay, latency, replicas (topology start at R1 and R3, uniform again at R3), standby (uniform and api on a pg_auto_failover primary alone, then with its synchronous standby), hot, dedup-table, no-events (uniform with the events off), naive, ceiling (the apply transaction's SQL alone), tpcb, cross-region, api, api-process (paymesh api, router and ledger as processes, the load from the bench), ledger-process, holds, reads (the API's reads on a region of --read-transfers). uniform always runs: the others are compared with it."`
	Accounts       int           `help:"Accounts to open and fund (default 10000; --quick 2000)."`
	Transfers      int           `help:"Transfers per full-speed run (default 200000; --quick 30000)."`
	BatchSize      int           `name:"batch-size" help:"Most messages per ledger transaction (default: the ledger's, ${default_batch})."`
	BatchSizes     []int         `name:"batch-sizes" help:"Also run uniform at each of these batch sizes, comma-separated, and name the fastest."`
	Workers        int           `help:"Ledger consumers (default 2, as paymesh ledger)."`
	Shards         int           `help:"Ledger subjects (default ${default_shards})."`
	Window         int           `help:"Most transfers published but not yet committed (default 4096)."`
	APITransfers   int           `name:"api-transfers" help:"Transfers the api scenario sends through the HTTP API (default 20000; --quick 4000)."`
	APIConcurrency []int         `name:"api-concurrency" help:"Requests in flight of each api run, comma-separated (default 64,256); the first is the headline figure."`
	DedupRows      int64         `name:"dedup-rows" help:"Consume-log rows written before the dedup-table run (default 10000000; --quick 1000000)."`
	ReadTransfers  int           `name:"read-transfers" help:"Transfers in the region the reads scenario reads (default 10000000; --quick 1000000)."`
	Limit          time.Duration `help:"Longest publish phase of a full-speed run (default 60s; --quick 15s)."`
	Quick          bool          `help:"A run of about a minute: fewer accounts, transfers and consume-log rows, shorter baselines."`
	JSON           string        `name:"json" help:"Write the results as JSON to this file." type:"path"`
	CPUProfile     string        `name:"cpuprofile" help:"Write a CPU profile of the uniform run to this file." type:"path"`
	APIProfile     string        `name:"api-cpuprofile" help:"Write a CPU profile of the first api run (its requests, not its set-up) to this file." type:"path"`
	Keep           bool          `help:"Keep the bench databases afterwards."`
	Seed           uint64        `default:"1" help:"Seed of the random workload."`
	Telemetry      bool          `default:"true" negatable:"" help:"Run the services as they ship: traced with the OTEL_* variables' sampler (by default paymesh's: every retry and redelivery, and one new trace in 100), exported over OTLP to those variables' collector or else to a receiver in this process that drops what it takes, and their /metrics scraped every 5 s. --no-telemetry runs them without."`
	Paymesh        string        `name:"paymesh" help:"The product binary the process scenarios run (default: paymesh beside this command, else on PATH)." type:"existingfile"`
}

func (c *benchCmd) Run(ctx context.Context) error {
	res, err := bench.Run(ctx, bench.Config{LedgerBinary: c.processBinary(),
		PostgresURL: c.PostgresURL, DatabasePrefix: c.DBPrefix, Scenarios: c.Scenarios, Accounts: c.Accounts, Transfers: c.Transfers,
		BatchSize: c.BatchSize, BatchSizes: c.BatchSizes, Workers: c.Workers, Shards: c.Shards, Window: c.Window,
		APITransfers: c.APITransfers, APIConcurrency: c.APIConcurrency, DedupRows: c.DedupRows, ReadTransfers: c.ReadTransfers, Limit: c.Limit, Quick: c.Quick, Keep: c.Keep, CPUProfile: c.CPUProfile, APIProfile: c.APIProfile, Seed: c.Seed,
		Telemetry: c.Telemetry,
	}, os.Stdout)
	if err != nil {
		return err
	}
	res.Print(os.Stdout)
	if c.JSON != "" {
		if err := res.WriteJSON(c.JSON); err != nil {
			return err
		}
		fmt.Printf("results written to %s\n", c.JSON)
	}
	if !res.OK() {
		return errFailed
	}
	return nil
}

// processBinary returns the product binary for the process scenarios
// (ledger-process, api-process), or "" when there is none: bench then says
// that those scenarios need it.
func (c *benchCmd) processBinary() string {
	bin, err := productBinary(c.Paymesh)
	if err != nil {
		return ""
	}
	return bin
}
