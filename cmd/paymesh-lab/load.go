package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/paymesh/paymesh/internal/lab/loadgen"
	"github.com/paymesh/paymesh/internal/testbed/faultproxy"
)

type loadCmd struct {
	APIs        []string      `name:"api" env:"PAYMESH_LOAD_APIS" default:"eu=http://127.0.0.1:8101,us=http://127.0.0.1:8102,ap=http://127.0.0.1:8103" help:"region=URL of each region's API."`
	APIKey      string        `name:"api-key" env:"PAYMESH_API_KEY" required:"" help:"API key of a client allowed the overdraft."`
	Accounts    int           `default:"5" help:"Accounts to open in each region."`
	Overdraft   int64         `default:"1000000" help:"Overdraft of each account (minor units); the client must be allowed it."`
	Transfers   int           `default:"2000" help:"Transfers to send."`
	Concurrency int           `default:"16" help:"Requests in flight."`
	Retry       float64       `default:"0.1" help:"Share of transfers sent again with the same key in another region."`
	Cross       float64       `default:"0.5" help:"Share of transfers between accounts of two regions."`
	History     string        `env:"PAYMESH_LOAD_HISTORY" help:"Write every acknowledged transfer request (key, client, region asked, status, transfer id) to this file as JSON lines." type:"path"`
	Client      string        `env:"PAYMESH_LOAD_CLIENT" help:"The API key's client id, written to --history."`
	Duration    time.Duration `help:"Stop sending after this long, even before --transfers (0: no limit)."`
	Seed        uint64        `default:"1" help:"Seed of the random load."`
	Faults      string        `help:"Fault plan to apply to the WAN links while the load runs: 'default', or items <cut|degrade>-<region>@<start>+<duration> such as cut-us@10s+5s,degrade-us@20s+15s."`
	WAN         []string      `name:"wan" env:"PAYMESH_LOAD_WAN" help:"region=URL of each region's WAN link control API (paymesh wan), for --faults."`
}

func (c *loadCmd) Run(ctx context.Context) error {
	apis, err := regionURLs("--api", c.APIs)
	if err != nil {
		return err
	}
	if c.Retry < 0 || c.Retry > 1 {
		return fmt.Errorf("--retry %v: a rate must be between 0 and 1", c.Retry)
	}
	runPlan := func(context.Context) error { return nil }
	if c.Faults != "" {
		if len(c.WAN) == 0 {
			return errors.New("--faults needs --wan region=URL of each WAN link's control API (paymesh wan --control)")
		}
		wan, err := regionURLs("--wan", c.WAN)
		if err != nil {
			return err
		}
		links := map[string]*faultproxy.Client{}
		var names []string
		for _, a := range c.WAN { // in the order given: "default" picks from it
			name, _, _ := strings.Cut(a, "=")
			names = append(names, name)
			links[name] = faultproxy.NewClient(wan[name])
		}
		plan, err := loadgen.ParsePlan(c.Faults, names)
		if err != nil {
			return fmt.Errorf("--faults: %w", err)
		}
		plan.Print(os.Stdout)
		runPlan = func(ctx context.Context) error { return loadgen.RunPlan(ctx, plan, links, os.Stdout) }
	}
	cfg := loadgen.Config{APIs: apis, APIKey: c.APIKey, Accounts: c.Accounts, Overdraft: c.Overdraft,
		Transfers: c.Transfers, Concurrency: c.Concurrency, Retry: c.Retry, Cross: c.Cross, Client: c.Client, Duration: c.Duration, Seed: c.Seed}
	if c.History != "" {
		f, err := os.Create(c.History)
		if err != nil {
			return err
		}
		defer f.Close()
		cfg.History = f
	}
	pctx, stopPlan := context.WithCancel(ctx)
	planErr := make(chan error, 1)
	go func() { planErr <- runPlan(pctx) }()
	res, err := loadgen.Run(ctx, cfg, os.Stdout)
	stopPlan() // heals the faults in force, skips those not yet due
	res.Print(os.Stdout)
	return errors.Join(err, <-planErr)
}

// regionURLs parses region=http://host:port items of flag.
func regionURLs(flag string, items []string) (map[string]string, error) {
	urls := map[string]string{}
	for _, a := range items {
		region, url, ok := strings.Cut(a, "=")
		if !ok || region == "" || !strings.HasPrefix(url, "http") {
			return nil, fmt.Errorf("%s %q: want region=http://host:port", flag, a)
		}
		urls[region] = url
	}
	return urls, nil
}
