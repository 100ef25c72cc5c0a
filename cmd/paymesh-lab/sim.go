package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/paymesh/paymesh/internal/lab/sim"
)

// simCmd runs the docker-compose topology as processes on this machine.
type simCmd struct {
	Quick        bool          `help:"A run of at most about 90 s: a 45 s load with every fault."`
	Load         time.Duration `help:"How long the load runs (default 120s; 45s with --quick)."`
	Faults       []string      `help:"Faults to fire, comma-separated (default: all): kill-ledger-eu, kill-router-ap, kill-api-us, kill-nats-ap (a node of ap's cluster), cut-eu, kill-nats-leader-eu (the node leading LEDGER_EU), degrade-us; none for none."`
	LoseCommands bool          `name:"lose-commands" help:"Also lose commands on purpose: purge eu's ledger stream while its ledger is down, so commands already acknowledged (saga steps relayed into eu, requests handed to the stream) are gone; the run must end in FAIL naming their keys."`
	NoWANLatency bool          `name:"no-wan-latency" help:"Run the WAN links without the region table's latency (to measure what it costs)."`
	Report       string        `help:"Also write the report as JSON to this file." type:"path"`
	Root         string        `help:"The repository (docker-compose.yml, deploy/, go.mod) (default: the current folder or the nearest one above it with docker-compose.yml and go.mod)." type:"existingdir"`
	Seed         uint64        `default:"1" help:"Seed of the load."`
	Paymesh      string        `name:"paymesh" help:"The product binary the services run (default: paymesh beside this command, else on PATH)." type:"existingfile"`
}

func (c *simCmd) Run(ctx context.Context) error {
	root := c.Root
	if root == "" {
		var err error
		if root, err = findRoot(); err != nil {
			return err
		}
	}
	bin, err := productBinary(c.Paymesh)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the paymesh-lab binary for the WAN links and the load: %w", err)
	}
	rep, err := sim.Run(ctx, sim.Config{Root: root, Binary: bin, LabBinary: self, Load: c.Load, Quick: c.Quick, Faults: c.Faults,
		LoseCommands: c.LoseCommands, NoWANLatency: c.NoWANLatency, Live: isTerminal(os.Stdout), Seed: c.Seed}, os.Stdout)
	if errors.Is(err, context.Canceled) {
		fmt.Println("\ninterrupted: every process the simulation started is stopped and its Postgres clusters removed")
		return errFailed
	}
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	if c.Report != "" {
		if err := rep.WriteJSON(c.Report); err != nil {
			return err
		}
		fmt.Printf("report written to %s\n", c.Report)
	}
	if !rep.OK() {
		return errFailed
	}
	return nil
}

// findRoot returns the current folder or the nearest one above it that
// holds docker-compose.yml and go.mod.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		_, e1 := os.Stat(filepath.Join(d, "docker-compose.yml"))
		_, e2 := os.Stat(filepath.Join(d, "go.mod"))
		if e1 == nil && e2 == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no docker-compose.yml and go.mod in %s or above it: run from the repository or give --root", dir)
		}
	}
}
