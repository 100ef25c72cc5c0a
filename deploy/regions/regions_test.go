package regions_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

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
	// Every region runs a three-node cluster, for R3 streams.
	for _, r := range tab.Regions {
		if got, want := strings.Join(r.NodeNames(), ","), fmt.Sprintf("nats-%[1]s-1,nats-%[1]s-2,nats-%[1]s-3", r.Name); got != want {
			t.Errorf("region %s: nodes %s, want %s", r.Name, got, want)
		}
	}
}

// TestDefaultPostgres: every region's database is a formation of a monitor
// and two data nodes, named as docker-compose's services, on the host
// ports 55<code>, 56<code> and, for the monitor, 57<code>.
func TestDefaultPostgres(t *testing.T) {
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range tab.Regions {
		if got, want := strings.Join(r.PostgresNodeNames(), ","), fmt.Sprintf("postgres-%[1]s-1,postgres-%[1]s-2", r.Name); got != want {
			t.Errorf("region %s: postgres nodes %s, want %s", r.Name, got, want)
		}
		if got, want := r.PostgresMonitorName(), "postgres-"+r.Name+"-monitor"; got != want {
			t.Errorf("region %s: postgres monitor %s, want %s", r.Name, got, want)
		}
		want := []regions.PostgresNode{{Port: 5500 + int(r.Code)}, {Port: 5600 + int(r.Code)}}
		if !slices.Equal(r.Postgres.Nodes, want) || r.Postgres.MonitorPort != 5700+int(r.Code) {
			t.Errorf("region %s: postgres nodes %v monitor port %d, want %v and %d", r.Name, r.Postgres.Nodes, r.Postgres.MonitorPort, want, 5700+int(r.Code))
		}
	}
}

func TestParseRejects(t *testing.T) {
	const ok = `
  - name: eu
    code: 1
    nats: {nodes: [{client_port: 1, monitor_port: 3, route_port: 2}]}
    postgres: {database: paymesh_eu, nodes: [{port: 4}, {port: 40}], monitor_port: 41}
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
		"monitor_port: 3,", "monitor_port: 13,", "route_port: 2}", "route_port: 12}", "{port: 4}", "{port: 14}", "{port: 40}", "{port: 50}",
		"monitor_port: 41", "monitor_port: 51", "api_port: 5", "api_port: 15", "metrics_port: 6", "metrics_port: 16",
		"router_metrics_port: 7", "router_metrics_port: 17", "api_metrics_port: 8", "api_metrics_port: 18",
		"wan_port: 9", "wan_port: 19", "wan_control_port: 10", "wan_control_port: 20")
	if _, err := regions.Parse([]byte(hub + "regions:" + ok + second.Replace(ok) + "\nwan: {round_trips: {eu-us: 1ms}}\n")); err != nil {
		t.Fatalf("valid table of two regions: %v", err)
	}
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
		"TwoNodes":        {hub + "regions:" + strings.Replace(ok, "}]}", "}, {client_port: 21, monitor_port: 22, route_port: 23}]}", 1), `"eu": nats.nodes: 2 nodes, want 1, 3 or 5`},
		"NoNodes":         {hub + "regions:" + strings.Replace(ok, "nats: {nodes: [{client_port: 1, monitor_port: 3, route_port: 2}]}", "nats: {}", 1), "nats.nodes: 0 nodes"},
		"OldNATSLayout":   {hub + "regions:" + strings.Replace(ok, "nodes: [{client_port: 1, monitor_port: 3, route_port: 2}]", "client_port: 1, monitor_port: 3", 1), "client_port"},
		"NodePortShared": {hub + "regions:" + strings.Replace(ok, "}]}", "}, {client_port: 21, monitor_port: 1, route_port: 23}, {client_port: 24, monitor_port: 25, route_port: 26}]}", 1),
			`nats node 2: port 1 already used by "nats-eu-1"`},
		"NodePortIsAService": {hub + "regions:" + strings.Replace(ok, "route_port: 2}", "route_port: 5}", 1), `"eu": nats node 1: port 5 already used by "eu"`},
		"NoRoutePort":        {hub + "regions:" + strings.Replace(ok, ", route_port: 2}", "}", 1), "nats node 1: port 0 out of range"},
		"UnknownNodeField":   {hub + "regions:" + strings.Replace(ok, "route_port: 2}", "route_port: 2, gateway_port: 7}", 1), "gateway_port"},
		// A region's Postgres is a formation: a monitor and at least two
		// data nodes, every port its own in the whole table.
		"OnePostgresNode":             {hub + "regions:" + strings.Replace(ok, ", {port: 40}]", "]", 1), `"eu": postgres.nodes: 1 nodes, want at least 2`},
		"NoPostgresNodes":             {hub + "regions:" + strings.Replace(ok, " nodes: [{port: 4}, {port: 40}],", "", 1), `"eu": postgres.nodes: 0 nodes, want at least 2`},
		"OldPostgresLayout":           {hub + "regions:" + strings.Replace(ok, "nodes: [{port: 4}, {port: 40}], monitor_port: 41", "port: 4", 1), "field port not found"},
		"PostgresNodeField":           {hub + "regions:" + strings.Replace(ok, "{port: 40}", "{port: 40, replication_port: 42}", 1), "replication_port"},
		"PostgresNodeNoPort":          {hub + "regions:" + strings.Replace(ok, "{port: 40}", "{}", 1), `"eu": postgres node 2: port 0 out of range`},
		"PostgresNodeBadPort":         {hub + "regions:" + strings.Replace(ok, "{port: 40}", "{port: 70000}", 1), `"eu": postgres node 2: port 70000 out of range`},
		"PostgresNodesShareAPort":     {hub + "regions:" + strings.Replace(ok, "{port: 40}", "{port: 4}", 1), `"eu": postgres node 2: port 4 already used by "postgres-eu-1"`},
		"PostgresNodePortIsAService":  {hub + "regions:" + strings.Replace(ok, "{port: 4}", "{port: 5}", 1), `"eu": postgres node 1: port 5 already used by "eu"`},
		"PostgresNodePortIsANATSNode": {hub + "regions:" + strings.Replace(ok, "{port: 40}", "{port: 2}", 1), `"eu": postgres node 2: port 2 already used by "nats-eu-1"`},
		"PostgresNodePortIsTheHub":    {hub + "regions:" + strings.Replace(ok, "{port: 40}", "{port: 101}", 1), `"eu": postgres node 2: port 101 already used by "hub"`},
		"PostgresNodePortOfAnotherRegion": {hub + "regions:" + ok + strings.Replace(second.Replace(ok), "{port: 50}", "{port: 40}", 1),
			`"us": postgres node 2: port 40 already used by "postgres-eu-2"`},
		"NoMonitorPort":         {hub + "regions:" + strings.Replace(ok, ", monitor_port: 41", "", 1), `"eu": postgres monitor: port 0 out of range`},
		"MonitorBadPort":        {hub + "regions:" + strings.Replace(ok, "monitor_port: 41", "monitor_port: 65536", 1), `"eu": postgres monitor: port 65536 out of range`},
		"MonitorPortIsANode":    {hub + "regions:" + strings.Replace(ok, "monitor_port: 41", "monitor_port: 40", 1), `"eu": postgres monitor: port 40 already used by "postgres-eu-2"`},
		"MonitorPortIsAService": {hub + "regions:" + strings.Replace(ok, "monitor_port: 41", "monitor_port: 10", 1), `"eu": postgres monitor: port 10 already used by "eu"`},
		"MonitorPortOfAnotherRegion": {hub + "regions:" + ok + strings.Replace(second.Replace(ok), "monitor_port: 51", "monitor_port: 41", 1),
			`"us": postgres monitor: port 41 already used by "postgres-eu-monitor"`},
		"ServicePortIsAPostgresNode": {hub + "regions:" + ok + strings.Replace(second.Replace(ok), "api_port: 15", "api_port: 40", 1),
			`"us": port 40 already used by "postgres-eu-2"`},
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

func TestRoundTrips(t *testing.T) {
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		a, b string
		want time.Duration
	}{{"eu", "us", 80 * time.Millisecond}, {"us", "eu", 80 * time.Millisecond}, {"us", "ap", 150 * time.Millisecond},
		{"eu", "ap", 220 * time.Millisecond}, {"eu", "eu", 0}, {"eu", "mars", 0}} {
		if got := tab.RoundTrip(tt.a, tt.b); got != tt.want {
			t.Errorf("RoundTrip(%s, %s): got %s, want %s", tt.a, tt.b, got, tt.want)
		}
	}
	want := map[string]time.Duration{"eu": 37500 * time.Microsecond, "us": 2500 * time.Microsecond, "ap": 72500 * time.Microsecond, "mars": 0}
	for r, d := range want {
		if got := tab.LinkDelay(r); got != d {
			t.Errorf("LinkDelay(%s): got %s, want %s", r, got, d)
		}
	}
	// Through the hub, a round trip between two regions crosses both links
	// twice: with three regions the star plays the table exactly.
	for _, p := range [][2]string{{"eu", "us"}, {"us", "ap"}, {"eu", "ap"}} {
		if got := 2 * (tab.LinkDelay(p[0]) + tab.LinkDelay(p[1])); got != tab.RoundTrip(p[0], p[1]) {
			t.Errorf("%s-%s through the hub: got %s, want %s", p[0], p[1], got, tab.RoundTrip(p[0], p[1]))
		}
	}
}

// table returns a valid table of the named regions with the given wan
// section.
func table(t *testing.T, wan string, names ...string) (regions.Table, error) {
	t.Helper()
	var b strings.Builder
	b.WriteString("hub: {client_port: 100, monitor_port: 101, leaf_port: 102}\nregions:\n")
	for i, n := range names {
		p := 1000 + 20*i
		fmt.Fprintf(&b, "  - {name: %s, code: %d, nats: {nodes: [{client_port: %d, monitor_port: %d, route_port: %d}]},"+
			" postgres: {database: db_%s, nodes: [{port: %d}, {port: %d}], monitor_port: %d},"+
			" api_port: %d, metrics_port: %d, router_metrics_port: %d, api_metrics_port: %d, wan_port: %d, wan_control_port: %d}\n",
			n, i+1, p, p+1, p+9, n, p+2, p+10, p+11, p+3, p+4, p+5, p+6, p+7, p+8)
	}
	b.WriteString(wan)
	return regions.Parse([]byte(b.String()))
}

func TestLinkDelayLeastSquares(t *testing.T) {
	ms := time.Millisecond
	// Four links of 10, 20, 30 and 40 ms: the pairwise table they make is
	// solved back exactly.
	tab, err := table(t, "wan: {round_trips: {aa-bb: 60ms, aa-cc: 80ms, aa-dd: 100ms, bb-cc: 100ms, bb-dd: 120ms, cc-dd: 140ms}}", "aa", "bb", "cc", "dd")
	if err != nil {
		t.Fatal(err)
	}
	for r, want := range map[string]time.Duration{"aa": 10 * ms, "bb": 20 * ms, "cc": 30 * ms, "dd": 40 * ms} {
		if got := tab.LinkDelay(r); got != want {
			t.Errorf("LinkDelay(%s): got %s, want %s", r, got, want)
		}
	}
	// Two regions split the round trip evenly.
	tab, err = table(t, "wan: {round_trips: {aa-bb: 100ms}}", "aa", "bb")
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.LinkDelay("aa"); got != 25*ms {
		t.Errorf("two regions: got %s, want 25ms", got)
	}
	// aa is close to both others, which are far apart: its solution is
	// negative and clamped at 0.
	tab, err = table(t, "wan: {round_trips: {aa-bb: 10ms, aa-cc: 10ms, bb-cc: 200ms}}", "aa", "bb", "cc")
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.LinkDelay("aa"); got != 0 {
		t.Errorf("clamped: got %s, want 0", got)
	}
	// One region alone has no link delay and needs no table.
	tab, err = table(t, "", "aa")
	if err != nil || tab.LinkDelay("aa") != 0 {
		t.Errorf("one region: got %s, %v", tab.LinkDelay("aa"), err)
	}
}

func TestRoundTripsRejects(t *testing.T) {
	tests := map[string]struct{ wan, want string }{
		"UnknownRegion": {"wan: {round_trips: {aa-bb: 1ms, aa-cc: 1ms, bb-cc: 1ms, aa-zz: 1ms}}", `unknown region "zz"`},
		"Negative":      {"wan: {round_trips: {aa-bb: -1ms, aa-cc: 1ms, bb-cc: 1ms}}", "-1ms is negative"},
		"NoValue":       {"wan: {round_trips: {aa-bb: , aa-cc: 1ms, bb-cc: 1ms}}", `"aa-bb": no time given`},
		"MissingPair":   {"wan: {round_trips: {aa-bb: 1ms, aa-cc: 1ms}}", "no round trip for bb-cc"},
		"NoTable":       {"", "no round trip for aa-bb"},
		"GivenTwice":    {"wan: {round_trips: {aa-bb: 1ms, bb-aa: 2ms, aa-cc: 1ms, bb-cc: 1ms}}", "given twice"},
		"BadDuration":   {"wan: {round_trips: {aa-bb: fast, aa-cc: 1ms, bb-cc: 1ms}}", `"fast": want a duration`},
		"NotAPair":      {"wan: {round_trips: {aabb: 1ms, aa-cc: 1ms, bb-cc: 1ms}}", "want two regions"},
		"SamePair":      {"wan: {round_trips: {aa-aa: 1ms, aa-bb: 1ms, aa-cc: 1ms, bb-cc: 1ms}}", "want two regions"},
		"UnknownField":  {"wan: {rtt: {aa-bb: 1ms}}", "rtt"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := table(t, tt.wan, "aa", "bb", "cc")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
