package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/paymesh/paymesh/internal/lab/chaos"
	"github.com/paymesh/paymesh/platform/pgdb"
)

type chaosCmd struct {
	PostgresURL string        `name:"postgres-url" env:"PAYMESH_POSTGRES_URL" help:"Postgres server on which to create the region databases (default: ${default_pg})."`
	Seeds       []uint64      `default:"1" help:"Seeds, comma-separated: each scenario runs once per seed, and a seed replays the same requests."`
	Scenarios   []string      `help:"Scenarios to run, comma-separated, by name or number (default: all built)."`
	Duration    time.Duration `default:"10s" help:"How long each scenario's workload runs."`
	JSON        string        `name:"json" help:"Write the results as JSON to this file." type:"path"`
	Keep        bool          `help:"Keep the region databases afterwards."`
}

func (c *chaosCmd) Run(ctx context.Context) error {
	url := c.PostgresURL
	if url == "" {
		url = pgdb.DefaultURL
	}
	res, err := chaos.Run(ctx, chaos.Config{PostgresURL: url, Seeds: c.Seeds, Scenarios: c.Scenarios, Duration: c.Duration, Keep: c.Keep}, os.Stdout)
	if err != nil && len(res) == 0 {
		return err
	}
	fmt.Println()
	chaos.Print(os.Stdout, res)
	if c.JSON != "" {
		if err := chaos.WriteJSON(c.JSON, res); err != nil {
			return err
		}
		fmt.Printf("results written to %s\n", c.JSON)
	}
	if err != nil {
		return err
	}
	if !chaos.AllPassed(res) {
		return errFailed
	}
	return nil
}
