package main

import (
	"context"
	"strings"
	"testing"
)

func TestDemoFlagsRejected(t *testing.T) {
	for name, c := range map[string]demoCmd{
		"RateAboveOne":     {Accounts: 10, DropAck: 1.5},
		"NegativeRate":     {Accounts: 10, Poison: -0.1},
		"OneAccount":       {Accounts: 1},
		"HTTPShare":        {Accounts: 10, HTTPShare: 2},
		"UnknownFault":     {Accounts: 10, Faults: "unplug-the-moon"},
		"CrossShare":       {Accounts: 10, CrossShare: -0.5},
		"NegativeSendRate": {Accounts: 10, Rate: -1},
		"NegativeCount":    {Accounts: 10, Transfers: -1},
		"PrometheusMode":   {Accounts: 10, Prometheus: "maybe"},
		"TwoNodes":         {Accounts: 10, Nodes: 2, Prometheus: "off"},
		"NegativeNodes":    {Accounts: 10, Nodes: -1, Prometheus: "off"},
	} {
		t.Run(name, func(t *testing.T) {
			if c.Nodes == 0 {
				c.Nodes = 1 // the flag's default: each case fails for its own reason
			}
			err := c.Run(context.Background())
			if err == nil {
				t.Fatal("want an error")
			}
			if strings.HasSuffix(name, "Nodes") && !strings.Contains(err.Error(), "want 1 (one nats-server per region) or 3") {
				t.Fatalf("got %v, want the --nodes error", err)
			}
		})
	}
}
