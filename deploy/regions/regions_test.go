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
    api_metrics_port: 8
    wan_port: 9
    wan_control_port: 10`
	const hub = "hub: {client_port: 100, monitor_port: 101, leaf_port: 102}\n"
	if _, err := regions.Parse([]byte(hub + "regions:" + ok)); err != nil {
		t.Fatalf("valid table: %v", err)
	}
	second := strings.NewReplacer("name: eu", "name: us", "code: 1", "code: 2", "paymesh_eu", "paymesh_us", "client_port: 1,", "client_port: 11,",
		": 3}", ": 13}", "port: 4}", "port: 14}", "api_port: 5", "api_port: 15", "metrics_port: 6", "metrics_port: 16",
		"router_metrics_port: 7", "router_metrics_port: 17", "api_metrics_port: 8", "api_metrics_port: 18",
		"wan_port: 9", "wan_port: 19", "wan_control_port: 10", "wan_control_port: 20")
	tests := map[string]struct{ yaml, want string }{
		"Empty":           {hub + "regions: []", "no regions"},
		"BadName":         {hub + "regions:" + strings.Replace(ok, "name: eu", "name: EU", 1), "lowercase"},
		"CodeZero":        {hub + "regions:" + strings.Replace(ok, "code: 1", "code: 0", 1), "outside 1..63"},
		"CodeTooLarge":    {hub + "regions:" + strings.Replace(ok, "code: 1", "code: 64", 1), "outside 1..63"},
		"DuplicateName":   {hub + "regions:" + ok + strings.Replace(second.Replace(ok), "name: us", "name: eu", 1), "defined twice"},
		"DuplicateCode":   {hub + "regions:" + ok + strings.Replace(second.Replace(ok), "code: 2", "code: 1", 1), "code 1 already used"},
		"DuplicatePort":   {hub + "regions:" + ok + strings.Replace(second.Replace(ok), "api_port: 15", "api_port: 5", 1), "port 5 already used"},
		"BadPort":         {hub + "regions:" + strings.Replace(ok, "api_port: 5", "api_port: 70000", 1), "out of range"},
		"NoRouterMetrics": {hub + "regions:" + strings.Replace(ok, "router_metrics_port: 7", "router_metrics_port: 0", 1), "port 0 out of range"},
		"SharedMetrics":   {hub + "regions:" + strings.Replace(ok, "api_metrics_port: 8", "api_metrics_port: 6", 1), "port 6 already used"},
		"NoDatabase":      {hub + "regions:" + strings.Replace(ok, "paymesh_eu", `""`, 1), "postgres.database is empty"},
		"UnknownField":    {hub + "regions:" + ok + "\n    colour: blue", "colour"},
		"NotYAML":         {"{{{", "decode"},
		"NoWANControl":    {hub + "regions:" + strings.Replace(ok, "wan_control_port: 10", "wan_control_port: 0", 1), "port 0 out of range"},
		"NoHub":           {"regions:" + ok, "hub: port 0 out of range"},
		"HubPortShared":   {strings.Replace(hub, "leaf_port: 102", "leaf_port: 9", 1) + "regions:" + ok, "port 9 already used by \"hub\""},
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
