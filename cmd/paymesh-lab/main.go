// Command paymesh-lab is paymesh's lab: the three-region demo, the process
// simulation of docker-compose.yml, the fault suite, the bench, the load
// generator and the WAN links. It never ships in the product image; the
// services it runs as processes are the product binary's (cmd/paymesh).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/platform/telemetry"
	"github.com/paymesh/paymesh/services/ledger/ledgerstream"
)

// errFailed makes main exit 1 after a command already printed why.
var errFailed = errors.New("failed")

type cli struct {
	RegionsFile string `name:"regions-file" env:"PAYMESH_REGIONS_FILE" help:"Region table (default: the built-in deploy/regions/regions.yaml)." type:"existingfile"`
	Verbose     bool   `short:"v" help:"Log debug messages."`

	Demo  demoCmd  `cmd:"" help:"Run the three-region demo in one process: transfers (half cross-region) with injected duplicates and faults, a live page, then the global invariant report."`
	Sim   simCmd   `cmd:"" help:"Run docker-compose.yml's topology as processes on this machine, with load, a fault schedule, Prometheus and alerts, then a PASS/FAIL report."`
	Chaos chaosCmd `cmd:"" help:"Run the fault-injection scenarios on a three-region cluster and check the ledger's invariants against the recorded history."`
	Bench benchCmd `cmd:"" help:"Measure throughput and latency on the local Postgres and an embedded nats-server, against baselines run alongside."`
	Load  loadCmd  `cmd:"" help:"Drive transfers through running regions' HTTP APIs (the demo's with --stay, or docker-compose)."`
	WAN   wanCmd   `cmd:"" name:"wan" help:"Run a region's WAN link to the hub: a TCP proxy with the table's latency, jitter, resets, cut and heal, and a control API."`
	Certs certsCmd `cmd:"" help:"Make the development CA and the certificates of docker-compose.yml's servers (the hub, each region's cluster and Postgres), for TLS on every link."`
}

// cliVars are the defaults the flags' help and default tags name.
var cliVars = kong.Vars{"default_pg": pgdb.DefaultURL, "default_batch": fmt.Sprint(ledgerstream.DefaultBatchSize), "default_shards": fmt.Sprint(ledgerstream.DefaultShards)}

func main() {
	var c cli
	k := kong.Parse(&c,
		kong.Name("paymesh-lab"),
		kong.Description("paymesh's lab: the demo, the process simulation, the fault suite, the bench, load and WAN links."),
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
	k.BindTo(ctx, (*context.Context)(nil))
	var procs []sdktrace.SpanProcessor
	if strings.HasPrefix(k.Command(), "demo") && dashboardAddr(c.Demo.Dashboard) != "" {
		// The live page lists the demo's traces: record them in memory.
		c.Demo.traces = dashboard.NewRecorder()
		procs = append(procs, c.Demo.traces)
	}
	shutdown, err := telemetry.SetupTracing(ctx, "paymesh-"+strings.Fields(k.Command())[0], nil, procs...)
	k.FatalIfErrorf(err)
	err = k.Run(table, log)
	_ = shutdown(context.Background())
	if errors.Is(err, errFailed) {
		os.Exit(1)
	}
	k.FatalIfErrorf(err)
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// productBinary returns the paymesh binary that runs the services as
// processes: flag when given, else `paymesh` beside this command (make
// build puts both in bin/), else `paymesh` on PATH. It returns an error
// that says how to build it.
func productBinary(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if self, err := os.Executable(); err == nil {
		sibling := filepath.Join(filepath.Dir(self), "paymesh")
		if fi, err := os.Stat(sibling); err == nil && !fi.IsDir() {
			return sibling, nil
		}
	}
	if p, err := exec.LookPath("paymesh"); err == nil {
		return p, nil
	}
	return "", errors.New("no paymesh binary beside paymesh-lab or on PATH: build both with `make build` (bin/paymesh, bin/paymesh-lab) or give --paymesh")
}
