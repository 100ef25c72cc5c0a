// Command paymesh is the product: a region's services (ledger, router,
// api), the operator's tools (migrate, verify, client, dlq) and the API
// client commands (accounts, transfers). It links none of the lab (demo,
// simulation, fault suite, bench, load, WAN links: cmd/paymesh-lab) and no
// nats-server; imports_test.go keeps it so.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// errFailed makes main exit 1 after a command already printed why.
var errFailed = errors.New("failed")

type cli struct {
	RegionsFile string  `name:"regions-file" env:"PAYMESH_REGIONS_FILE" help:"Region table (default: the built-in deploy/regions/regions.yaml)." type:"existingfile"`
	Verbose     bool    `short:"v" help:"Log debug messages."`
	TraceRatio  float64 `name:"trace-ratio" env:"PAYMESH_TRACE_RATIO" default:"${default_trace_ratio}" help:"Share of new traces recorded when OTEL_TRACES_SAMPLER names no sampler, 0 to 1; every retry and redelivery is recorded whatever the share."`

	Ledger    ledgerCmd    `cmd:"" help:"Run a region's ledger: consume its JetStream stream and apply transfers exactly once."`
	Router    routerCmd    `cmd:"" help:"Run a region's router: forward its route stream to the home regions and relay its ledger's outbox."`
	API       apiCmd       `cmd:"" name:"api" help:"Serve a region's HTTP API."`
	Migrate   migrateCmd   `cmd:"" help:"Apply a region's database migrations (the ledger's and the API's) and create its consume-log partitions."`
	Verify    verifyCmd    `cmd:"" help:"Check a region's ledger invariants and print PASS/FAIL for each."`
	Client    clientCmds   `cmd:"" help:"Register an API client (or an operator) and print its key; rotate, revoke and list its keys."`
	DLQ       dlqCmd       `cmd:"" name:"dlq" help:"List, show, replay and discard a region's dead letters."`
	Dup       dupCmd       `cmd:"" help:"Explain a region's duplicates from its metrics and traces."`
	Accounts  accountsCmd  `cmd:"" help:"Open and show accounts through the HTTP API."`
	Transfers transfersCmd `cmd:"" help:"Send and show transfers through the HTTP API."`
	Events    eventsCmd    `cmd:"" help:"Read your event feed through the HTTP API."`
	Webhooks  webhooksCmd  `cmd:"" help:"Receive your events by webhook: create, list, rotate and delete endpoints, read their attempts, redeliver an event."`
	Idemcheck idemcheckCmd `cmd:"" help:"Check an HTTP API's Idempotency-Key behaviour, black-box: the IETF draft's cases and concurrency, timeouts, regions; every effect read back; PASS/FAIL per case, exit 1 on a FAIL."`
	Receiver  receiverCmd  `cmd:"" help:"Run the reference webhook receiver: verify each delivery, apply each event once (in its own Postgres, in order per account), count duplicates by cause."`
}

// Validate refuses a --trace-ratio that is not a share.
func (c *cli) Validate() error {
	if err := telemetry.CheckTraceRatio(c.TraceRatio); err != nil {
		return fmt.Errorf("--trace-ratio: %w", err)
	}
	return nil
}

// cliVars are the defaults the flags' help and default tags name.
var cliVars = kong.Vars{"default_pg": pgdb.DefaultURL, "default_batch": fmt.Sprint(ledgerstream.DefaultBatchSize), "default_shards": fmt.Sprint(ledgerstream.DefaultShards),
	"default_trace_ratio": fmt.Sprint(telemetry.DefaultTraceRatio)}

func main() {
	var c cli
	k := kong.Parse(&c,
		kong.Name("paymesh"),
		kong.Description("A multi-region payment ledger that turns at-least-once messaging into exactly-once effects."),
		cliVars, kong.UsageOnError())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	level := slog.LevelInfo
	if c.Verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	table, err := regions.Open(c.RegionsFile)
	k.FatalIfErrorf(err)
	ids, err := idgen.NewRegions(table.Codes())
	k.FatalIfErrorf(err)
	k.BindTo(ctx, (*context.Context)(nil))
	shutdown, err := telemetry.SetupTracing(ctx, "paymesh-"+strings.Fields(k.Command())[0], telemetry.RetrySampler(c.TraceRatio))
	k.FatalIfErrorf(err)
	err = k.Run(table, ids, log)
	_ = shutdown(context.Background())
	if errors.Is(err, errFailed) {
		os.Exit(1)
	}
	k.FatalIfErrorf(err)
}
