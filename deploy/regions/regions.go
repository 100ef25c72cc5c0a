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
	// WANPort is where the region's WAN link (paymesh wan) listens for the
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

// NATS holds a region's nats-server ports as published by docker-compose.
type NATS struct {
	ClientPort  int `yaml:"client_port"`
	MonitorPort int `yaml:"monitor_port"`
}

// Postgres holds a region's database name and published port.
type Postgres struct {
	Database string `yaml:"database"`
	Port     int    `yaml:"port"`
}

// Table is the ordered set of regions.
type Table struct {
	Hub     Hub      `yaml:"hub"`
	Regions []Region `yaml:"regions"`
}

var nameRE = regexp.MustCompile(`^[a-z]{2,8}$`)

// Default returns the regions embedded from regions.yaml. It returns an error
// only if that file is invalid, which a test rules out.
func Default() (Table, error) { return Parse(defaultFile) }

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
// malformed names, codes outside 1..MaxCode and duplicate codes or ports are
// errors.
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
	return t, nil
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
		for _, p := range []int{r.NATS.ClientPort, r.NATS.MonitorPort, r.Postgres.Port, r.APIPort, r.MetricsPort, r.RouterMetricsPort, r.APIMetricsPort, r.WANPort, r.WANControlPort} {
			if p <= 0 || p > 65535 {
				return fmt.Errorf("region %q: port %d out of range", r.Name, p)
			}
			if other, ok := ports[p]; ok {
				return fmt.Errorf("region %q: port %d already used by %q", r.Name, p, other)
			}
			ports[p] = r.Name
		}
	}
	return nil
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

// Codes returns the name-to-code map that pkg/idgen needs.
func (t Table) Codes() map[string]uint8 {
	m := make(map[string]uint8, len(t.Regions))
	for _, r := range t.Regions {
		m[r.Name] = r.Code
	}
	return m
}
