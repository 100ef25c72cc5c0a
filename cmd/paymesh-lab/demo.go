package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/paymesh/paymesh/internal/lab/dashboard"
	"github.com/paymesh/paymesh/internal/lab/demo"
	"github.com/paymesh/paymesh/platform/pgdb"
)

type demoCmd struct {
	PostgresURL   string  `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server on which to create the demo databases (default: ${default_pg})."`
	Accounts      int     `default:"50" help:"Accounts to open and fund in each region."`
	Transfers     int     `default:"20000" help:"Transfers to send (about half cross-region)."`
	Seed          uint64  `default:"1" help:"Seed of the random workload."`
	HTTPShare     float64 `name:"http-share" default:"0.05" help:"Share of transfers sent through the HTTP API; the rest go to the routers."`
	CrossShare    float64 `name:"cross-share" default:"0.5" help:"Share of transfers between two regions."`
	Rate          float64 `default:"0" help:"Transfers per second to send at most (0: as fast as they go)."`
	Holds         int     `default:"0" help:"Holds of the holds-and-refunds phase after the transfers: captured (a third in part), voided or left to expire (0: 1 % of --transfers, at least 30; -1: none)."`
	Refunds       int     `default:"0" help:"Completed transfers refunded by their payee in that phase, half of them twice (0: 0.5 % of --transfers, at least 15; -1: none)."`
	ClientRetry   float64 `name:"client-retry" default:"0.05" help:"Rate of client retries with the same key, in any region."`
	ProducerRetry float64 `name:"producer-retry" default:"0.05" help:"Rate of router re-publishes with the same Nats-Msg-Id."`
	DropAck       float64 `name:"drop-ack" default:"0.03" help:"Rate of the acks of committed ledger messages that are dropped (forced redelivery)."`
	HookLoss      float64 `name:"hook-loss" default:"0.02" help:"Rate of the webhook receiver's 2xx answers lost on the way back (paymesh sends the event again)."`
	Poison        float64 `default:"0.002" help:"Rate of malformed messages."`
	Faults        string  `default:"cut-us,restart-eu-ledger,restart-ap-nats" help:"Faults to fire during the run, comma-separated (empty for none): cut-us (3 s), restart-eu-ledger, restart-ap-nats."`
	Report        string  `help:"Also write the report as JSON to this file."`
	Nodes         int     `default:"1" help:"nats-servers per region: 1, or 3 for a JetStream cluster with R3 streams (starts a few seconds slower)."`
	WAN           bool    `name:"wan" help:"Put the region table's WAN latency (deploy/regions/regions.yaml, wan round trips) on every region's link to the hub."`
	Stay          bool    `help:"Keep the regions, their APIs and the live page running after the report, until Ctrl-C."`
	Throwaway     bool    `name:"throwaway-postgres" help:"Use a throwaway PostgreSQL cluster from the local binaries even if a server answers."`
	Keep          bool    `help:"Keep the demo databases afterwards."`
	Dashboard     string  `default:"127.0.0.1:8100" help:"Address of the live page (throughput, duplicates by layer, invariants, alerts, traces with retries); 'off' for none."`
	Prometheus    string  `default:"auto" enum:"auto,on,off" help:"Run Debian's prometheus (make prometheus) with the alert rules of deploy/prometheus on the demo's /metrics: auto (when installed), on (fail without it), off."`

	traces *dashboard.Recorder
}

func (c *demoCmd) Run(ctx context.Context) error {
	if c.PostgresURL == "" {
		c.PostgresURL = pgdb.DefaultURL
	}
	if c.Rate < 0 {
		return fmt.Errorf("--rate %v must not be negative", c.Rate)
	}
	for name, r := range map[string]float64{"http-share": c.HTTPShare, "cross-share": c.CrossShare, "client-retry": c.ClientRetry, "producer-retry": c.ProducerRetry, "drop-ack": c.DropAck, "hook-loss": c.HookLoss, "poison": c.Poison} {
		if r < 0 || r > 1 {
			return fmt.Errorf("--%s %v: a rate must be between 0 and 1", name, r)
		}
	}
	if c.Accounts < 2 || c.Transfers < 0 {
		return fmt.Errorf("need at least 2 accounts per region and a non-negative transfer count")
	}
	if c.Nodes != 1 && c.Nodes != 3 {
		return fmt.Errorf("--nodes %d: want 1 (one nats-server per region) or 3 (a JetStream cluster)", c.Nodes)
	}
	var faults []string
	for _, f := range strings.Split(c.Faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(demo.FaultNames, f) {
			return fmt.Errorf("--faults: unknown fault %q (known: %s)", f, strings.Join(demo.FaultNames, ", "))
		}
		faults = append(faults, f)
	}
	rep, err := demo.Run(ctx, demo.Config{
		PostgresURL: c.PostgresURL, Accounts: c.Accounts, Transfers: c.Transfers, Seed: c.Seed, HTTPShare: c.HTTPShare, Holds: c.Holds, Refunds: c.Refunds,
		CrossShare: max(c.CrossShare, 1e-9), Rate: c.Rate,
		ClientRetry: c.ClientRetry, ProducerRetry: c.ProducerRetry, DropAck: c.DropAck, HookLoss: c.HookLoss, Poison: c.Poison,
		FixedPorts: true, Nodes: c.Nodes, WAN: c.WAN, Stay: c.Stay, Keep: c.Keep, Live: isTerminal(os.Stdout), Faults: faults, ThrowawayPostgres: c.Throwaway,
		Dashboard: dashboardAddr(c.Dashboard), Traces: c.traces, Prometheus: c.Prometheus,
	}, os.Stdout)
	if err != nil {
		return err
	}
	if c.Report != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(c.Report, b, 0o644); err != nil {
			return err
		}
	}
	if !c.Stay {
		rep.Print(os.Stdout)
	}
	if !rep.OK() {
		return errFailed
	}
	return nil
}

func dashboardAddr(flag string) string {
	if flag == "off" {
		return ""
	}
	return flag
}
