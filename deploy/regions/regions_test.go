package regions_test

import (
	"strings"
	"testing"

	"github.com/paymesh/paymesh/deploy/regions"
)

func TestDefault(t *testing.T) {
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range tab.Regions {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, ","); got != "eu,us,ap" {
		t.Fatalf("regions: got %s, want eu,us,ap", got)
	}
	if c := tab.Codes(); c["eu"] != 1 || c["us"] != 2 || c["ap"] != 3 {
		t.Fatalf("codes: got %v", c)
	}
}

func TestParseRejects(t *testing.T) {
	const ok = `
  - name: eu
    code: 1
    nats: {client_port: 1, monitor_port: 3}
    postgres: {database: paymesh_eu, port: 4}
    api_port: 5
    metrics_port: 6
    router_metrics_port: 7
    api_metrics_port: 8`
	if _, err := regions.Parse([]byte("regions:" + ok)); err != nil {
		t.Fatalf("valid table: %v", err)
	}
	second := strings.NewReplacer("name: eu", "name: us", "code: 1", "code: 2", "paymesh_eu", "paymesh_us", "client_port: 1,", "client_port: 11,",
		": 3}", ": 13}", "port: 4}", "port: 14}", "api_port: 5", "api_port: 15", "metrics_port: 6", "metrics_port: 16",
		"router_metrics_port: 7", "router_metrics_port: 17", "api_metrics_port: 8", "api_metrics_port: 18")
	tests := map[string]struct{ yaml, want string }{
		"Empty":           {"regions: []", "no regions"},
		"BadName":         {"regions:" + strings.Replace(ok, "name: eu", "name: EU", 1), "lowercase"},
		"CodeZero":        {"regions:" + strings.Replace(ok, "code: 1", "code: 0", 1), "outside 1..63"},
		"CodeTooLarge":    {"regions:" + strings.Replace(ok, "code: 1", "code: 64", 1), "outside 1..63"},
		"DuplicateName":   {"regions:" + ok + strings.Replace(second.Replace(ok), "name: us", "name: eu", 1), "defined twice"},
		"DuplicateCode":   {"regions:" + ok + strings.Replace(second.Replace(ok), "code: 2", "code: 1", 1), "code 1 already used"},
		"DuplicatePort":   {"regions:" + ok + strings.Replace(second.Replace(ok), "api_port: 15", "api_port: 5", 1), "port 5 already used"},
		"BadPort":         {"regions:" + strings.Replace(ok, "api_port: 5", "api_port: 70000", 1), "out of range"},
		"NoRouterMetrics": {"regions:" + strings.Replace(ok, "router_metrics_port: 7", "router_metrics_port: 0", 1), "port 0 out of range"},
		"SharedMetrics":   {"regions:" + strings.Replace(ok, "api_metrics_port: 8", "api_metrics_port: 6", 1), "port 6 already used"},
		"NoDatabase":      {"regions:" + strings.Replace(ok, "paymesh_eu", `""`, 1), "postgres.database is empty"},
		"UnknownField":    {"regions:" + ok + "\n    colour: blue", "colour"},
		"NotYAML":         {"{{{", "decode"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := regions.Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
