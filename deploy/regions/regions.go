// Package regions loads the region table from regions.yaml, the single source
// of truth for region names, numeric codes, NATS and Postgres settings and ports.
package regions

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

//go:embed regions.yaml
var defaultFile []byte

// MaxCode is the largest region code that fits the region bits of an ID
// (see pkg/idgen). Code 0 is reserved so that a zero ID never parses.
const MaxCode = 63

// Region is one region's settings.
type Region struct {
	Name     string   `yaml:"name"`
	Code     uint8    `yaml:"code"`
	NATS     NATS     `yaml:"nats"`
	Postgres Postgres `yaml:"postgres"`
	APIPort  int      `yaml:"api_port"`
	// MetricsPort, RouterMetricsPort and APIMetricsPort serve /metrics of
	// the region's ledger, router and HTTP API.
	MetricsPort       int `yaml:"metrics_port"`
	RouterMetricsPort int `yaml:"router_metrics_port"`
	APIMetricsPort    int `yaml:"api_metrics_port"`
	// WANPort is where the region's WAN link (paymesh-lab wan) listens for the
	// region's leafnode connection to the hub, on the host; WANControlPort
	// serves the link's control API.
	WANPort        int `yaml:"wan_port"`
	WANControlPort int `yaml:"wan_control_port"`
}

// Hub holds the ports of the leafnode hub that joins the regions. In
// docker-compose they stay inside the network; the process simulation
// uses them on the host.
type Hub struct {
	ClientPort  int `yaml:"client_port"`
	MonitorPort int `yaml:"monitor_port"`
	LeafPort    int `yaml:"leaf_port"`
}

// NATS is a region's JetStream cluster: the nats-servers that hold its
// domain's streams, each replica of an R3 stream on its own node.
type NATS struct {
	// Nodes are the cluster's servers, nats-<region>-1..N in
	// docker-compose (NodeName), with their host ports.
	Nodes []Node `yaml:"nodes"`
}

// Node is one nats-server of a region's cluster, by the host ports it is
// reached on: docker-compose publishes the client and monitor ports (the
// route port stays inside its network); the process simulation listens on
// all three.
type Node struct {
	ClientPort  int `yaml:"client_port"`
	MonitorPort int `yaml:"monitor_port"`
	RoutePort   int `yaml:"route_port"`
}

// ClusterSizes are the node counts a region's cluster may have: one
// server, or an odd number that keeps a Raft majority when one node is
// lost (an even count tolerates no more losses than the odd one below
// it), up to JetStream's largest replica count, 5.
var ClusterSizes = []int{1, 3, 5}

// NodeName returns the name of node i (0-based) of the region's cluster:
// its docker-compose service and its server_name, "nats-eu-1".
func (r Region) NodeName(i int) string { return fmt.Sprintf("nats-%s-%d", r.Name, i+1) }

// NodeNames returns the names of the region's nodes, in table order.
func (r Region) NodeNames() []string {
	out := make([]string, len(r.NATS.Nodes))
	for i := range r.NATS.Nodes {
		out[i] = r.NodeName(i)
	}
	return out
}

// Postgres is a region's highly available database: a pg_auto_failover
// formation of a monitor and data nodes (deploy/postgres), the first node
// the primary at the start and the others its synchronous standbys, one of
// which the monitor promotes when the primary fails.
type Postgres struct {
	// Database is the region's database on the formation.
	Database string `yaml:"database"`
	// Nodes are the formation's data nodes, postgres-<region>-1..N in
	// docker-compose (PostgresNodeName), with their host ports: at least
	// two, a primary and a standby.
	Nodes []PostgresNode `yaml:"nodes"`
	// MonitorPort is the host port of the formation's monitor,
	// postgres-<region>-monitor in docker-compose (PostgresMonitorName).
	MonitorPort int `yaml:"monitor_port"`
}

// PostgresNode is one data node of a region's formation, by the host port
// it is reached on.
type PostgresNode struct {
	Port int `yaml:"port"`
}

// MinPostgresNodes is the fewest data nodes a region's formation may have:
// a primary and a synchronous standby to take over from it.
const MinPostgresNodes = 2

// PostgresNodeName returns the name of data node i (0-based) of the
// region's formation: its docker-compose service and its host name,
// "postgres-eu-1".
func (r Region) PostgresNodeName(i int) string { return fmt.Sprintf("postgres-%s-%d", r.Name, i+1) }

// PostgresNodeNames returns the names of the region's data nodes, in table
// order.
func (r Region) PostgresNodeNames() []string {
	out := make([]string, len(r.Postgres.Nodes))
	for i := range r.Postgres.Nodes {
		out[i] = r.PostgresNodeName(i)
	}
	return out
}

// PostgresMonitorName returns the name of the region's formation monitor:
// its docker-compose service and its host name, "postgres-eu-monitor".
func (r Region) PostgresMonitorName() string { return "postgres-" + r.Name + "-monitor" }

// Table is the ordered set of regions.
type Table struct {
	Hub     Hub      `yaml:"hub"`
	Regions []Region `yaml:"regions"`
	WAN     WAN      `yaml:"wan"`

	rtt map[[2]string]time.Duration // from WAN.RoundTrips, both orders
}

// WAN is the table of network round-trip times between regions: the
// latency their WAN links (paymesh-lab wan) play.
type WAN struct {
	// RoundTrips maps a pair of regions, "eu-us", to its round-trip time,
	// a Go duration ("80ms"). Every pair of regions is given once, in
	// either order.
	RoundTrips map[string]string `yaml:"round_trips"`
}

var nameRE = regexp.MustCompile(`^[a-z]{2,8}$`)

// Default returns the regions embedded from regions.yaml. It returns an error
// only if that file is invalid, which a test rules out.
func Default() (Table, error) { return Parse(defaultFile) }

// Open returns the table of the file at path, or the built-in one when
// path is "" (the commands' --regions-file). It returns Load's errors.
func Open(path string) (Table, error) {
	if path == "" {
		return Default()
	}
	return Load(path)
}

// Load reads and validates a region file. It returns an error that names the
// file when it cannot be read or is invalid.
func Load(path string) (Table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Table{}, fmt.Errorf("regions: %w", err)
	}
	t, err := Parse(b)
	if err != nil {
		return Table{}, fmt.Errorf("regions: %s: %w", path, err)
	}
	return t, nil
}

// Parse decodes and validates a region table. Unknown fields, duplicate or
// malformed names, codes outside 1..MaxCode, a NATS cluster whose node
// count is not one of ClusterSizes, a Postgres formation with fewer than
// MinPostgresNodes data nodes, ports out of range, and duplicate codes or
// ports (anywhere in the table) are errors.
func Parse(b []byte) (Table, error) {
	var t Table
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&t); err != nil {
		return Table{}, fmt.Errorf("decode region table: %w", err)
	}
	if err := t.validate(); err != nil {
		return Table{}, err
	}
	rtt, err := t.WAN.parse(t.Regions)
	if err != nil {
		return Table{}, fmt.Errorf("wan: %w", err)
	}
	t.rtt = rtt
	return t, nil
}

// parse checks that the round trips name known regions, each pair once and
// every pair of regions, with durations of zero or more, and returns them
// keyed by both orders of each pair.
func (w WAN) parse(rs []Region) (map[[2]string]time.Duration, error) {
	known := map[string]bool{}
	for _, r := range rs {
		known[r.Name] = true
	}
	rtt := map[[2]string]time.Duration{}
	for key, v := range w.RoundTrips {
		a, b, ok := strings.Cut(key, "-")
		if !ok || a == b {
			return nil, fmt.Errorf("round trip %q: want two regions, such as \"eu-us\"", key)
		}
		for _, r := range []string{a, b} {
			if !known[r] {
				return nil, fmt.Errorf("round trip %q: unknown region %q", key, r)
			}
		}
		if _, ok := rtt[[2]string{a, b}]; ok {
			return nil, fmt.Errorf("round trip %q: pair given twice (also as %s-%s)", key, b, a)
		}
		if v == "" {
			return nil, fmt.Errorf("round trip %q: no time given", key)
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("round trip %q: %q: want a duration such as \"80ms\"", key, v)
		}
		if d < 0 {
			return nil, fmt.Errorf("round trip %q: %s is negative", key, d)
		}
		rtt[[2]string{a, b}], rtt[[2]string{b, a}] = d, d
	}
	for i, a := range rs {
		for _, b := range rs[i+1:] {
			if _, ok := rtt[[2]string{a.Name, b.Name}]; !ok {
				return nil, fmt.Errorf("no round trip for %s-%s", a.Name, b.Name)
			}
		}
	}
	return rtt, nil
}

func (t Table) validate() error {
	if len(t.Regions) == 0 {
		return errors.New("no regions defined")
	}
	names := map[string]bool{}
	codes := map[uint8]string{}
	ports := map[int]string{}
	for _, p := range []int{t.Hub.ClientPort, t.Hub.MonitorPort, t.Hub.LeafPort} {
		if p <= 0 || p > 65535 {
			return fmt.Errorf("hub: port %d out of range", p)
		}
		if _, ok := ports[p]; ok {
			return fmt.Errorf("hub: port %d given twice", p)
		}
		ports[p] = "hub"
	}
	for _, r := range t.Regions {
		if !nameRE.MatchString(r.Name) {
			return fmt.Errorf("region name %q: want 2-8 lowercase letters", r.Name)
		}
		if names[r.Name] {
			return fmt.Errorf("region %q defined twice", r.Name)
		}
		names[r.Name] = true
		if r.Code == 0 || r.Code > MaxCode {
			return fmt.Errorf("region %q: code %d outside 1..%d", r.Name, r.Code, MaxCode)
		}
		if other, ok := codes[r.Code]; ok {
			return fmt.Errorf("region %q: code %d already used by %q", r.Name, r.Code, other)
		}
		codes[r.Code] = r.Name
		if r.Postgres.Database == "" {
			return fmt.Errorf("region %q: postgres.database is empty", r.Name)
		}
		if n := len(r.NATS.Nodes); !slices.Contains(ClusterSizes, n) {
			return fmt.Errorf("region %q: nats.nodes: %d nodes, want %s (a majority must survive a lost node)", r.Name, n, sizes())
		}
		if n := len(r.Postgres.Nodes); n < MinPostgresNodes {
			return fmt.Errorf("region %q: postgres.nodes: %d nodes, want at least %d (a primary and a standby to take over)", r.Name, n, MinPostgresNodes)
		}
		for _, p := range []int{r.APIPort, r.MetricsPort, r.RouterMetricsPort, r.APIMetricsPort, r.WANPort, r.WANControlPort} {
			if err := claim(ports, p, r.Name); err != nil {
				return fmt.Errorf("region %q: %w", r.Name, err)
			}
		}
		for i, n := range r.NATS.Nodes {
			for _, p := range []int{n.ClientPort, n.MonitorPort, n.RoutePort} {
				if err := claim(ports, p, r.NodeName(i)); err != nil {
					return fmt.Errorf("region %q: nats node %d: %w", r.Name, i+1, err)
				}
			}
		}
		for i, n := range r.Postgres.Nodes {
			if err := claim(ports, n.Port, r.PostgresNodeName(i)); err != nil {
				return fmt.Errorf("region %q: postgres node %d: %w", r.Name, i+1, err)
			}
		}
		if err := claim(ports, r.Postgres.MonitorPort, r.PostgresMonitorName()); err != nil {
			return fmt.Errorf("region %q: postgres monitor: %w", r.Name, err)
		}
	}
	return nil
}

// claim records that owner uses port p, and returns an error when p is
// out of range or another owner already uses it.
func claim(ports map[int]string, p int, owner string) error {
	if p <= 0 || p > 65535 {
		return fmt.Errorf("port %d out of range", p)
	}
	if other, ok := ports[p]; ok {
		return fmt.Errorf("port %d already used by %q", p, other)
	}
	ports[p] = owner
	return nil
}

// sizes lists ClusterSizes as "1, 3 or 5".
func sizes() string {
	s := make([]string, len(ClusterSizes))
	for i, n := range ClusterSizes {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Get returns the region with the given name, or false.
func (t Table) Get(name string) (Region, bool) {
	for _, r := range t.Regions {
		if r.Name == name {
			return r, true
		}
	}
	return Region{}, false
}

// Names returns the region names in table order.
func (t Table) Names() []string {
	names := make([]string, len(t.Regions))
	for i, r := range t.Regions {
		names[i] = r.Name
	}
	return names
}

// Codes returns the name-to-code map that pkg/idgen needs.
func (t Table) Codes() map[string]uint8 {
	m := make(map[string]uint8, len(t.Regions))
	for _, r := range t.Regions {
		m[r.Name] = r.Code
	}
	return m
}

// RoundTrip returns the network round-trip time between regions a and b
// from the wan table: 0 for a region with itself or a region the table does
// not have.
func (t Table) RoundTrip(a, b string) time.Duration { return t.rtt[[2]string{a, b}] }

// LinkDelay returns the one-way delay of the region's WAN link to the hub,
// or 0 for a region the table does not have.
//
// The regions meet in a star through the hub, so a message from a to b
// crosses a's link and b's: with d_r the one-way delay of region r's link,
// RTT(a, b) = 2·(d_a + d_b). With h_ab = RTT(a, b)/2 the delays solve
// d_a + d_b = h_ab for every pair, in the least-squares sense when there
// are more pairs than regions: minimising Σ_{a<b} (d_a + d_b − h_ab)²
// gives, per region r, Σ_{b≠r} (d_r + d_b − h_rb) = 0, that is
// (n−2)·d_r + S = H_r with S = Σ d and H_r = Σ_{b≠r} h_rb. Summing over r,
// (2n−2)·S = Σ_r H_r = 2·H with H = Σ_{a<b} h_ab, so S = H/(n−1) and
//
//	d_r = (H_r − H/(n−1)) / (n−2)    for n ≥ 3.
//
// For three regions that is exact: d_eu = (h_eu-us + h_eu-ap − h_us-ap)/2.
// Two regions cannot be told apart, so each link takes half: d = h/2; one
// region has no link delay. A negative solution (a pair much faster than the
// others allow) is clamped at 0. The defaults, eu-us 80 ms, us-ap 150 ms and
// eu-ap 220 ms, give eu 37.5 ms, us 2.5 ms and ap 72.5 ms: the hub sits
// next to us.
func (t Table) LinkDelay(region string) time.Duration {
	n := len(t.Regions)
	if _, ok := t.Get(region); !ok || n < 2 {
		return 0
	}
	if n == 2 {
		return t.RoundTrip(t.Regions[0].Name, t.Regions[1].Name) / 4
	}
	var hr, h float64 // H_r and H, in nanoseconds
	for i, a := range t.Regions {
		for _, b := range t.Regions[i+1:] {
			half := float64(t.RoundTrip(a.Name, b.Name)) / 2
			h += half
			if a.Name == region || b.Name == region {
				hr += half
			}
		}
	}
	d := (hr - h/float64(n-1)) / float64(n-2)
	return time.Duration(max(d, 0))
}
