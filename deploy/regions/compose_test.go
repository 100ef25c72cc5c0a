package regions_test

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/natsauth"
)

type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	Environment map[string]string `yaml:"environment"`
	DependsOn   dependsOn         `yaml:"depends_on"`
}

// dependsOn reads depends_on in its list or its map form.
type dependsOn []string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i < len(n.Content); i += 2 {
			*d = append(*d, n.Content[i].Value)
		}
		return nil
	}
	var l []string
	err := n.Decode(&l)
	*d = l
	return err
}

// TestComposeMatchesRegions checks docker-compose.yml against the region
// table: every region has its nats, postgres, ledger, router and verify services,
// with the table's ports, database and names (the ledger, router and API
// each publish /metrics on their port of the table), and no service belongs to a
// region the table does not know. The services outside the regions are the
// load profile's, the observability stack (observability_test.go) and the
// leafnode hub nats-hub; every region's nats service runs from its config in
// deploy/regions/nats and depends on the hub; every ledger, router and API
// logs in to its region's server as its own user (internal/natsauth).
func TestComposeMatchesRegions(t *testing.T) {
	compose := loadCompose(t)
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	hub, ok := compose.Services[hubService]
	if !ok {
		t.Errorf("no service %s", hubService)
	}
	if want := natsCommand("hub"); !slices.Equal(hub.Command, want) {
		t.Errorf("%s: command %v, want %v", hubService, hub.Command, want)
	}
	if want := natsVolume("hub"); !slices.Contains(hub.Volumes, want) {
		t.Errorf("%s: volumes %v, want %s", hubService, hub.Volumes, want)
	}
	for name := range compose.Services {
		if name == hubService || name == "setup" || name == "loadgen" || slices.Contains(observabilityServices, name) {
			continue
		}
		i := strings.LastIndex(name, "-")
		if _, ok := tab.Get(name[i+1:]); i < 0 || !ok {
			t.Errorf("service %s does not belong to a region of regions.yaml", name)
		}
	}
	// The load profile reaches every region: setup writes the client to each
	// region's Postgres, loadgen calls each region's API.
	setup, load := compose.Services["setup"], compose.Services["loadgen"]
	for _, r := range tab.Regions {
		pg := fmt.Sprintf("%s=postgres://postgres@postgres-%s:5432/", r.Name, r.Name)
		if !strings.Contains(setup.Environment["PAYMESH_POSTGRES_URLS"], pg) {
			t.Errorf("setup: PAYMESH_POSTGRES_URLS %q lacks %s", setup.Environment["PAYMESH_POSTGRES_URLS"], pg)
		}
		apiURL := fmt.Sprintf("%s=http://api-%s:%d", r.Name, r.Name, r.APIPort)
		if !slices.Contains(strings.Split(load.Environment["PAYMESH_LOAD_APIS"], ","), apiURL) {
			t.Errorf("loadgen: PAYMESH_LOAD_APIS %q lacks %s", load.Environment["PAYMESH_LOAD_APIS"], apiURL)
		}
	}
	if setup.Environment["PAYMESH_CLIENT_KEY"] == "" || setup.Environment["PAYMESH_CLIENT_KEY"] != load.Environment["PAYMESH_API_KEY"] {
		t.Errorf("setup registers key %q, loadgen uses %q", setup.Environment["PAYMESH_CLIENT_KEY"], load.Environment["PAYMESH_API_KEY"])
	}
	for _, r := range tab.Regions {
		svc := func(kind string) composeService {
			s, ok := compose.Services[kind+"-"+r.Name]
			if !ok {
				t.Errorf("region %s: no service %s-%s", r.Name, kind, r.Name)
			}
			return s
		}
		natsSvc, pg, ledger, verify, rt, apiSvc := svc("nats"), svc("postgres"), svc("ledger"), svc("verify"), svc("router"), svc("api")

		for _, p := range []string{fmt.Sprintf("%d:4222", r.NATS.ClientPort), fmt.Sprintf("%d:8222", r.NATS.MonitorPort)} {
			if !slices.Contains(natsSvc.Ports, p) {
				t.Errorf("nats-%s: ports %v, want %s", r.Name, natsSvc.Ports, p)
			}
		}
		if got := pg.Environment["POSTGRES_DB"]; got != r.Postgres.Database {
			t.Errorf("postgres-%s: POSTGRES_DB %q, want %q", r.Name, got, r.Postgres.Database)
		}
		if p := fmt.Sprintf("%d:5432", r.Postgres.Port); !slices.Contains(pg.Ports, p) {
			t.Errorf("postgres-%s: ports %v, want %s", r.Name, pg.Ports, p)
		}
		for name, s := range map[string]composeService{"ledger": ledger, "verify": verify, "router": rt, "api": apiSvc} {
			env := s.Environment
			if env["PAYMESH_REGION"] != r.Name || env["PAYMESH_DATABASE"] != r.Postgres.Database {
				t.Errorf("%s-%s: region %q database %q, want %q %q", name, r.Name, env["PAYMESH_REGION"], env["PAYMESH_DATABASE"], r.Name, r.Postgres.Database)
			}
			u, err := url.Parse(env["PAYMESH_POSTGRES_URL"])
			if err != nil || u.Hostname() != "postgres-"+r.Name {
				t.Errorf("%s-%s: PAYMESH_POSTGRES_URL %q, want host postgres-%s", name, r.Name, env["PAYMESH_POSTGRES_URL"], r.Name)
			}
			if !slices.Contains(s.DependsOn, "postgres-"+r.Name) {
				t.Errorf("%s-%s: depends_on %v, want postgres-%s", name, r.Name, s.DependsOn, r.Name)
			}
		}
		for name, s := range map[string]composeService{natsauth.Ledger: ledger, natsauth.Router: rt, natsauth.API: apiSvc} {
			if got, want := s.Environment["PAYMESH_NATS_URL"], "nats://nats-"+r.Name+":4222"; got != want {
				t.Errorf("%s-%s: PAYMESH_NATS_URL %q, want %q", name, r.Name, got, want)
			}
			// Each service logs in as its own user of deploy/regions/nats.
			u, err := natsauth.UserOf(r.Name, name)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Environment["PAYMESH_NATS_USER"]; got != u.Name || s.Environment["PAYMESH_NATS_PASSWORD"] != u.Password {
				t.Errorf("%s-%s: PAYMESH_NATS_USER %q with PAYMESH_NATS_PASSWORD %q, want %s with its password",
					name, r.Name, got, s.Environment["PAYMESH_NATS_PASSWORD"], u.Name)
			}
		}
		if p := fmt.Sprintf("%d:%d", r.APIPort, r.APIPort); !slices.Contains(apiSvc.Ports, p) || apiSvc.Environment["PAYMESH_API_LISTEN"] != fmt.Sprintf("0.0.0.0:%d", r.APIPort) {
			t.Errorf("api-%s: ports %v listen %q, want %s", r.Name, apiSvc.Ports, apiSvc.Environment["PAYMESH_API_LISTEN"], p)
		}
		for _, e := range metricsEndpoints(r) {
			s := compose.Services[e.Service]
			if p := fmt.Sprintf("%d:%d", e.Port, e.Port); !slices.Contains(s.Ports, p) || s.Environment[e.Env] != fmt.Sprintf("0.0.0.0:%d", e.Port) {
				t.Errorf("%s: ports %v %s %q, want %s", e.Service, s.Ports, e.Env, s.Environment[e.Env], p)
			}
		}
		if !slices.Equal(rt.Command, []string{"router"}) {
			t.Errorf("router-%s: command %v, want [router]", r.Name, rt.Command)
		}
		if want := natsCommand(r.Name); !slices.Equal(natsSvc.Command, want) {
			t.Errorf("nats-%s: command %v, want %v", r.Name, natsSvc.Command, want)
		}
		if want := natsVolume(r.Name); !slices.Contains(natsSvc.Volumes, want) {
			t.Errorf("nats-%s: volumes %v, want %s", r.Name, natsSvc.Volumes, want)
		}
		if !slices.Contains(natsSvc.DependsOn, hubService) {
			t.Errorf("nats-%s: depends_on %v, want %s", r.Name, natsSvc.DependsOn, hubService)
		}
		if natsSvc.Image != hub.Image {
			t.Errorf("nats-%s: image %q, want the hub's %q", r.Name, natsSvc.Image, hub.Image)
		}
		if !slices.Equal(ledger.Command, []string{"ledger"}) || !slices.Equal(verify.Command, []string{"verify"}) {
			t.Errorf("region %s: ledger command %v, verify command %v", r.Name, ledger.Command, verify.Command)
		}
	}
}

// hubService is the compose service of the leafnode hub.
const hubService = "nats-hub"

// natsCommand is the command of the nats service that runs config name
// (a region or "hub").
func natsCommand(name string) []string { return []string{"-c", "/etc/nats/" + name + ".conf"} }

// natsVolume mounts config name read-only where natsCommand expects it.
func natsVolume(name string) string {
	return "./deploy/regions/nats/" + name + ".conf:/etc/nats/" + name + ".conf:ro"
}

// metricsEndpoint is where one paymesh service of a region serves /metrics:
// its compose service, the variable that sets its listen address and its
// port from the region table.
type metricsEndpoint struct {
	Service, Env string
	Port         int
}

// metricsEndpoints lists a region's ledger, router and API endpoints.
func metricsEndpoints(r regions.Region) []metricsEndpoint {
	return []metricsEndpoint{
		{"ledger-" + r.Name, "PAYMESH_METRICS_LISTEN", r.MetricsPort},
		{"router-" + r.Name, "PAYMESH_ROUTER_METRICS_LISTEN", r.RouterMetricsPort},
		{"api-" + r.Name, "PAYMESH_API_METRICS_LISTEN", r.APIMetricsPort},
	}
}
