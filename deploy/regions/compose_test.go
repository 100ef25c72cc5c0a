package regions_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/mod/modfile"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/compose"
	"github.com/paymesh/paymesh/platform/natsauth"
)

// repoRoot is the directory of docker-compose.yml, from which its relative
// paths start.
const repoRoot = "../.."

// loadCompose loads docker-compose.yml with the compose specification's
// loader, every profile enabled.
func loadCompose(t *testing.T) *compose.Project {
	t.Helper()
	p, err := compose.Load(filepath.Join(repoRoot, "docker-compose.yml"), compose.AllProfiles)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mustTable returns the region table of regions.yaml.
func mustTable(t *testing.T) regions.Table {
	t.Helper()
	tab, err := regions.Default()
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// service returns a compose service, failing the test when there is none.
func service(t *testing.T, p *compose.Project, name string) compose.Service {
	t.Helper()
	s, err := p.Service(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hubService is the compose service of the leafnode hub.
const hubService = "nats-hub"

// regionOf returns the region of regions.yaml a compose service belongs
// to: the one whose name ends it ("ledger-eu"), whose cluster has it as a
// node ("nats-eu-2"), or whose Postgres formation has it as its monitor or
// a data node ("postgres-eu-monitor", "postgres-eu-1"); "" for none.
func regionOf(tab regions.Table, name string) string {
	for _, r := range tab.Regions {
		if strings.HasSuffix(name, "-"+r.Name) || slices.Contains(r.NodeNames(), name) || slices.Contains(postgresServers(r), name) {
			return r.Name
		}
	}
	return ""
}

// natsURLs is the PAYMESH_NATS_URL of a region's services: every node of
// its cluster, in table order, over TLS.
func natsURLs(r regions.Region) string {
	var urls []string
	for _, n := range r.NodeNames() {
		urls = append(urls, "tls://"+n+":4222")
	}
	return strings.Join(urls, ",")
}

// The services outside the regions besides the hub and the observability
// stack (observability_test.go): the load profile's.
var loadServices = []string{"setup", "loadgen", "receiver-setup", "receiver"}

// natsCommand is the command of the nats service that runs config name
// (a region or "hub").
func natsCommand(name string) []string { return []string{"-c", natsConfTarget(name)} }

// natsConfTarget is where a nats service finds config name.
func natsConfTarget(name string) string { return "/etc/nats/" + name + ".conf" }

// checkNATSMount: the nats service mounts deploy/regions/nats/<name>.conf
// read-only where natsCommand expects it.
func checkNATSMount(t *testing.T, p *compose.Project, svc, name string) {
	t.Helper()
	want := "deploy/regions/nats/" + name + ".conf"
	if got, ro := mountedFile(t, p, svc, natsConfTarget(name)); got != want || !ro {
		t.Errorf("%s: mounts %s (read-only %v) at %s, want %s read-only", svc, got, ro, natsConfTarget(name), want)
	}
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

// ports returns a service's published ports as "host:container", sorted.
func ports(s compose.Service) []string {
	out := []string{}
	for _, p := range s.Ports {
		out = append(out, p.String())
	}
	sort.Strings(out)
	return out
}

// TestComposeMatchesRegions checks docker-compose.yml against the region
// table: every region has its nats, wan, postgres (its formation:
// postgres_test.go), ledger, router, api and verify services, with the
// table's ports, database and names (the ledger,
// router and API each publish /metrics on their port of the table), and no
// service belongs to a region the table does not know. The services outside
// the regions are the load profile's, the observability stack
// (observability_test.go) and the leafnode hub nats-hub; every region's
// nats service runs from its config in deploy/regions/nats and depends on
// its WAN link to the hub; every ledger, router and API logs in to its
// region's server as its own user (platform/natsauth).
func TestComposeMatchesRegions(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	hub := service(t, p, hubService)
	if want := natsCommand("hub"); !slices.Equal(hub.Command, want) {
		t.Errorf("%s: command %v, want %v", hubService, hub.Command, want)
	}
	checkNATSMount(t, p, hubService, "hub")
	for name := range p.Services {
		if name == hubService || name == certsService || slices.Contains(loadServices, name) || slices.Contains(observabilityServices, name) {
			continue
		}
		if regionOf(tab, name) == "" {
			t.Errorf("service %s does not belong to a region of regions.yaml", name)
		}
	}
	// The load profile reaches every region: setup writes the client to each
	// region's Postgres (its formation's writable node), loadgen calls each
	// region's API.
	setup, load := service(t, p, "setup"), service(t, p, "loadgen")
	setupURLs := postgresURLs(setup.Environment["PAYMESH_POSTGRES_URLS"])
	if len(setupURLs) != len(tab.Regions) {
		t.Errorf("setup: PAYMESH_POSTGRES_URLS has %d URLs, want one per region (%d)", len(setupURLs), len(tab.Regions))
	}
	for _, r := range tab.Regions {
		entry := slices.IndexFunc(setupURLs, func(u regionURL) bool { return u.Region == r.Name })
		if entry < 0 {
			t.Errorf("setup: PAYMESH_POSTGRES_URLS %q has no %s=URL", setup.Environment["PAYMESH_POSTGRES_URLS"], r.Name)
		} else {
			checkClientURL(t, "setup: PAYMESH_POSTGRES_URLS: "+r.Name, setupURLs[entry].URL, r)
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
		svc := func(kind string) compose.Service { return service(t, p, kind+"-"+r.Name) }
		ledger, verify, rt, apiSvc, dlq := svc("ledger"), svc("verify"), svc("router"), svc("api"), svc("dlq")
		checkNATSNodes(t, p, r, hub.Image)
		for name, s := range map[string]compose.Service{"ledger": ledger, "verify": verify, "router": rt, "api": apiSvc, "dlq": dlq} {
			env := s.Environment
			if env["PAYMESH_REGION"] != r.Name || env["PAYMESH_DATABASE"] != r.Postgres.Database {
				t.Errorf("%s-%s: region %q database %q, want %q %q", name, r.Name, env["PAYMESH_REGION"], env["PAYMESH_DATABASE"], r.Name, r.Postgres.Database)
			}
			// Its region's formation, through whichever node is writable,
			// once every node is healthy.
			checkClientURL(t, name+"-"+r.Name+": PAYMESH_POSTGRES_URL", env["PAYMESH_POSTGRES_URL"], r)
			for _, node := range r.PostgresNodeNames() {
				if cond := s.DependsOn[node]; cond != compose.ServiceHealthy {
					t.Errorf("%s-%s: depends on %s with condition %q, want %s", name, r.Name, node, cond, compose.ServiceHealthy)
				}
			}
			if !isPaymesh(p, s) {
				t.Errorf("%s-%s: image %q (built %v from %q), want the paymesh image built from the Dockerfile", name, r.Name, s.Image, s.Build, s.Context)
			}
		}
		// The ledger exports the synchronous standbys its region is meant to
		// have (paymesh_postgres_standbys_expected): every data node but the
		// primary.
		if got, want := ledger.Environment["PAYMESH_POSTGRES_STANDBYS"], strconv.Itoa(len(r.Postgres.Nodes)-1); got != want {
			t.Errorf("ledger-%s: PAYMESH_POSTGRES_STANDBYS %q, want %s (every data node of regions.yaml but the primary)", r.Name, got, want)
		}
		for name, s := range map[string]compose.Service{natsauth.Ledger: ledger, natsauth.Router: rt, natsauth.API: apiSvc} {
			if got, want := s.Environment["PAYMESH_NATS_URL"], natsURLs(r); got != want {
				t.Errorf("%s-%s: PAYMESH_NATS_URL %q, want %q (every node of its cluster)", name, r.Name, got, want)
			}
			if got, want := s.Environment["PAYMESH_STREAM_REPLICAS"], strconv.Itoa(len(r.NATS.Nodes)); got != want {
				t.Errorf("%s-%s: PAYMESH_STREAM_REPLICAS %q, want %s (a replica on every node of the cluster)", name, r.Name, got, want)
			}
			for _, node := range r.NodeNames() {
				if cond := s.DependsOn[node]; cond != compose.ServiceHealthy {
					t.Errorf("%s-%s: depends on %s with condition %q, want %s", name, r.Name, node, cond, compose.ServiceHealthy)
				}
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
		if hp, ok := apiSvc.Published(r.APIPort); !ok || hp != r.APIPort || apiSvc.Environment["PAYMESH_API_LISTEN"] != fmt.Sprintf("0.0.0.0:%d", r.APIPort) {
			t.Errorf("api-%s: ports %v listen %q, want %d:%d", r.Name, ports(apiSvc), apiSvc.Environment["PAYMESH_API_LISTEN"], r.APIPort, r.APIPort)
		}
		for _, e := range metricsEndpoints(r) {
			s := service(t, p, e.Service)
			if hp, ok := s.Published(e.Port); !ok || hp != e.Port || s.Environment[e.Env] != fmt.Sprintf("0.0.0.0:%d", e.Port) {
				t.Errorf("%s: ports %v %s %q, want %d:%d", e.Service, ports(s), e.Env, s.Environment[e.Env], e.Port, e.Port)
			}
		}
		if !slices.Equal(rt.Command, []string{"router"}) || !slices.Equal(apiSvc.Command, []string{"api"}) {
			t.Errorf("region %s: router command %v, api command %v", r.Name, rt.Command, apiSvc.Command)
		}
		if !slices.Equal(ledger.Command, []string{"ledger"}) || !slices.Equal(verify.Command, []string{"verify"}) {
			t.Errorf("region %s: ledger command %v, verify command %v", r.Name, ledger.Command, verify.Command)
		}
	}
}

// checkNATSNodes: a region's cluster is one compose service per node of
// regions.yaml (nats-<region>-<n>, no other nats service of the region),
// each running the region's one config with its own name in
// NATS_SERVER_NAME, its own named volume for the JetStream store, the
// table's client and monitor ports, the hub's image, and a dependency on
// the region's WAN link.
func checkNATSNodes(t *testing.T, p *compose.Project, r regions.Region, image string) {
	t.Helper()
	for _, name := range p.ServiceNames() {
		if strings.HasPrefix(name, "nats-") && regionOf(mustTable(t), name) == r.Name && !slices.Contains(r.NodeNames(), name) {
			t.Errorf("%s: a nats service of region %s that is not a node of its cluster in regions.yaml (%v)", name, r.Name, r.NodeNames())
		}
	}
	stores := map[string]string{}
	for i, node := range r.NATS.Nodes {
		name := r.NodeName(i)
		s := service(t, p, name)
		if got, want := s.Ports, []compose.Port{{Host: node.ClientPort, Container: 4222, Protocol: "tcp"}, {Host: node.MonitorPort, Container: 8222, Protocol: "tcp"}}; !slices.Equal(got, want) {
			t.Errorf("%s: ports %v, want %v (regions.yaml)", name, got, want)
		}
		if want := natsCommand(r.Name); !slices.Equal(s.Command, want) {
			t.Errorf("%s: command %v, want %v (the region's one config)", name, s.Command, want)
		}
		checkNATSMount(t, p, name, r.Name)
		if got := s.Environment["NATS_SERVER_NAME"]; got != name {
			t.Errorf("%s: NATS_SERVER_NAME %q, want %q (its server_name)", name, got, name)
		}
		v, ok := s.Mount("/data")
		switch {
		case !ok || v.Type != "volume" || v.ReadOnly:
			t.Errorf("%s: /data is %+v, want a writable named volume for its JetStream store", name, v)
		case stores[v.Source] != "":
			t.Errorf("%s: shares its store volume %s with %s", name, v.Source, stores[v.Source])
		default:
			stores[v.Source] = name
		}
		if _, ok := s.DependsOn["wan-"+r.Name]; !ok {
			t.Errorf("%s: depends_on %v, want its WAN link wan-%s", name, s.DependsOn, r.Name)
		}
		if s.Image != image {
			t.Errorf("%s: image %q, want the hub's %q", name, s.Image, image)
		}
	}
}

// TestComposeWANLinks: every region's nats-server joins the hub through
// its WAN link wan-<region>, a `paymesh-lab wan` of the paymesh image that
// listens on the hub's leaf port, forwards to nats-hub, takes its default
// latency from the region's link, and publishes its control API on the
// region's wan_control_port; loadgen applies its fault plan through those
// control APIs.
func TestComposeWANLinks(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	load := service(t, p, "loadgen")
	if i := slices.Index(load.Command, "--faults"); i < 0 || i+1 >= len(load.Command) || load.Command[i+1] != "default" {
		t.Errorf("loadgen: command %v, want --faults default", load.Command)
	}
	for _, r := range tab.Regions {
		name := "wan-" + r.Name
		w := service(t, p, name)
		if !w.Build || !slices.Equal(w.Command, []string{"wan"}) {
			t.Errorf("%s: built %v, command %v; want the paymesh image running [wan]", name, w.Build, w.Command)
		}
		want := map[string]string{
			"PAYMESH_WAN_LINK":    r.Name,
			"PAYMESH_WAN_LISTEN":  fmt.Sprintf("0.0.0.0:%d", tab.Hub.LeafPort),
			"PAYMESH_WAN_TARGET":  fmt.Sprintf("%s:%d", hubService, tab.Hub.LeafPort),
			"PAYMESH_WAN_CONTROL": fmt.Sprintf("0.0.0.0:%d", r.WANControlPort),
		}
		for k, v := range want {
			if w.Environment[k] != v {
				t.Errorf("%s: %s %q, want %q", name, k, w.Environment[k], v)
			}
		}
		if got, want := ports(w), []string{fmt.Sprintf("%d:%d", r.WANControlPort, r.WANControlPort)}; !slices.Equal(got, want) {
			t.Errorf("%s: ports %v, want exactly %v (regions.yaml's wan_control_port)", name, got, want)
		}
		if _, ok := w.DependsOn[hubService]; !ok {
			t.Errorf("%s: depends_on %v, want %s", name, w.DependsOn, hubService)
		}
		ctl := fmt.Sprintf("%s=http://%s:%d", r.Name, name, r.WANControlPort)
		if !slices.Contains(strings.Split(load.Environment["PAYMESH_LOAD_WAN"], ","), ctl) {
			t.Errorf("loadgen: PAYMESH_LOAD_WAN %q lacks %s", load.Environment["PAYMESH_LOAD_WAN"], ctl)
		}
		if _, ok := load.DependsOn[name]; !ok {
			t.Errorf("loadgen: depends_on %v, want %s", load.DependsOn, name)
		}
	}
}

// TestComposePortsFromRegions: every service of a region publishes only
// ports of that region in regions.yaml, on the same port inside the
// container when the service is paymesh's (its listen address); the hub
// publishes only its own (its monitor port as hub.monitor_port); the
// services outside the regions publish no port of the table.
func TestComposePortsFromRegions(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	owner := map[int]string{tab.Hub.ClientPort: "hub", tab.Hub.MonitorPort: "hub", tab.Hub.LeafPort: "hub"}
	for _, r := range tab.Regions {
		for _, port := range []int{r.Postgres.MonitorPort, r.APIPort, r.MetricsPort, r.RouterMetricsPort, r.APIMetricsPort, r.WANPort, r.WANControlPort} {
			owner[port] = r.Name
		}
		for _, n := range r.Postgres.Nodes {
			owner[n.Port] = r.Name
		}
		for _, n := range r.NATS.Nodes {
			for _, port := range []int{n.ClientPort, n.MonitorPort, n.RoutePort} {
				owner[port] = r.Name
			}
		}
	}
	if got, want := ports(service(t, p, hubService)), []string{fmt.Sprintf("%d:8222", tab.Hub.MonitorPort)}; !slices.Equal(got, want) {
		t.Errorf("%s: ports %v, want %v (hub.monitor_port)", hubService, got, want)
	}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		region := regionOf(tab, name)
		for _, port := range s.Ports {
			switch {
			case name == hubService:
			case region == "" && owner[port.Host] != "":
				t.Errorf("%s: publishes %s, a port of %s in regions.yaml", name, port, owner[port.Host])
			case region != "" && owner[port.Host] != region:
				t.Errorf("%s: publishes %s, not a port of region %s in regions.yaml", name, port, region)
			case region != "" && isPaymesh(p, s) && port.Host != port.Container:
				t.Errorf("%s: publishes %s; a paymesh service listens on its table port", name, port)
			}
		}
	}
}

// isInfra reports whether a service runs Postgres (a server of a
// region's formation) or NATS, which the paymesh services wait for.
func isInfra(s compose.Service) bool {
	return isPostgresServer(s) || strings.HasPrefix(s.Image, "postgres:") || strings.HasPrefix(s.Image, "nats:")
}

// isPaymesh reports whether a service runs an image of the repository's
// Dockerfile (the product's or the lab's).
func isPaymesh(p *compose.Project, s compose.Service) bool { return s.Build && s.Context == p.Dir }

// TestComposeHealthchecks: every Postgres server is one of a formation,
// healthy by its entrypoint's own check (formation health: it runs,
// secured), and NATS has a healthcheck (the monitor port's /healthz); every
// dependency on them waits for service_healthy, and every service_healthy
// dependency has a healthcheck to wait for.
func TestComposeHealthchecks(t *testing.T) {
	p := loadCompose(t)
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if strings.HasPrefix(s.Image, "postgres:") {
			t.Errorf("%s: runs the image %s itself; a region's Postgres is a formation of %s's image", name, s.Image, postgresDir)
		}
		if isPostgresServer(s) && !slices.Equal(s.Healthcheck, postgresHealthcheck) {
			t.Errorf("%s: healthcheck %q, want %q (the server runs, secured; a standby, made from its primary)", name, s.Healthcheck, postgresHealthcheck)
		}
		if strings.HasPrefix(s.Image, "nats:") && !slices.ContainsFunc(s.Healthcheck, func(a string) bool { return strings.HasSuffix(a, ":8222/healthz") }) {
			t.Errorf("%s: healthcheck %q, want the monitor port's /healthz", name, s.Healthcheck)
		}
		for dep, cond := range s.DependsOn {
			d := service(t, p, dep)
			if isInfra(d) && cond != compose.ServiceHealthy {
				t.Errorf("%s: depends on %s with condition %s, want %s", name, dep, cond, compose.ServiceHealthy)
			}
			if cond == compose.ServiceHealthy && d.Healthcheck == nil {
				t.Errorf("%s: waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
	}
}

// TestComposeImagesMatchSimulation: compose runs what the process
// simulation runs: the nats-server version go.mod pins, this machine's
// PostgreSQL major version (the base image of deploy/postgres, with that
// major's pg_auto_failover, and the tag of the image compose builds from
// it), and Debian's Prometheus (when installed; set
// PAYMESH_REQUIRE_PROMETHEUS to fail instead of skipping without it).
func TestComposeImagesMatchSimulation(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	natsImage := "nats:" + strings.TrimPrefix(goModVersion(t, "github.com/nats-io/nats-server/v2"), "v") + "-alpine"
	major := localPostgresMajor(t)
	df := postgresDockerfile(t)
	if from := regexp.MustCompile(`(?m)^FROM (\S+)\s*$`).FindAllStringSubmatch(df, -1); len(from) != 1 || from[0][1] != "postgres:"+major {
		t.Errorf("%s/Dockerfile: FROM %v, want one stage FROM postgres:%s (the local PostgreSQL the simulation runs)", postgresDir, from, major)
	}
	if ext := "postgresql-" + major + "-auto-failover"; !regexp.MustCompile(`\b` + regexp.QuoteMeta(ext) + `\b`).MatchString(df) {
		t.Errorf("%s/Dockerfile: does not install %s, pg_auto_failover for PostgreSQL %s", postgresDir, ext, major)
	}
	images := map[string]string{hubService: natsImage}
	for _, r := range tab.Regions {
		for _, n := range r.NodeNames() {
			images[n] = natsImage
		}
		for _, n := range postgresServers(r) {
			images[n] = "paymesh-postgres:" + major
		}
	}
	for name, want := range images {
		if got := service(t, p, name).Image; got != want {
			t.Errorf("%s: image %q, want %q", name, got, want)
		}
	}

	prom := service(t, p, prometheusService).Image
	out, err := exec.Command("prometheus", "--version").CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("no prometheus binary to compare %s with (%v); scripts/prometheus installs it", prom, err)
		if os.Getenv("PAYMESH_REQUIRE_PROMETHEUS") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	m := regexp.MustCompile(`prometheus, version (\d+\.\d+\.\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("prometheus --version: no version in %q", out)
	}
	if want := "prom/prometheus:v" + m[1]; prom != want {
		t.Errorf("%s: image %q, want %q (the local prometheus the simulation runs)", prometheusService, prom, want)
	}
}

// goMod parses the repository's go.mod.
func goMod(t *testing.T) *modfile.File {
	t.Helper()
	path := filepath.Join(repoRoot, "go.mod")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.ParseLax(path, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// goModVersion returns the version go.mod requires of a module.
func goModVersion(t *testing.T, module string) string {
	t.Helper()
	for _, r := range goMod(t).Require {
		if r.Mod.Path == module {
			return r.Mod.Version
		}
	}
	t.Fatalf("go.mod requires no %s", module)
	return ""
}

// localPostgresMajor returns the major version of the local PostgreSQL
// server binary. It skips the test when there is none.
func localPostgresMajor(t *testing.T) string {
	t.Helper()
	bin := localPostgresBin(t, "postgres")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	m := regexp.MustCompile(`\(PostgreSQL\) (\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s --version: no version in %q", bin, out)
	}
	return m[1]
}

// localPostgresBin returns a local PostgreSQL program: on PATH, or the
// newest /usr/lib/postgresql/<version>/bin/<name> (where the throwaway
// clusters of platform/pgdb come from). It skips the test when there is
// none.
func localPostgresBin(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(bins) == 0 {
		t.Skipf("no local PostgreSQL program %s (on PATH or under /usr/lib/postgresql/*/bin)", name)
	}
	sort.Slice(bins, func(i, j int) bool { return pgDirVersion(bins[i]) > pgDirVersion(bins[j]) })
	return bins[0]
}

// pgDirVersion is the version folder of /usr/lib/postgresql/<v>/bin/<program>.
func pgDirVersion(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(bin))))
	return v
}

// hostMappings are the ports that docker-compose.yml keeps inside its
// network, on the host ports the process simulation gives them: the hub's
// leaf port, each region's WAN link on its wan_port, and each node's
// cluster port on its route_port.
func hostMappings(tab regions.Table) map[string]string {
	m := map[string]string{fmt.Sprintf("%s:%d", hubService, tab.Hub.LeafPort): fmt.Sprintf("127.0.0.1:%d", tab.Hub.LeafPort)}
	for _, r := range tab.Regions {
		m[fmt.Sprintf("wan-%s:%d", r.Name, tab.Hub.LeafPort)] = fmt.Sprintf("127.0.0.1:%d", r.WANPort)
		for i, n := range r.NATS.Nodes {
			m[fmt.Sprintf("%s:%d", r.NodeName(i), clusterPort)] = fmt.Sprintf("127.0.0.1:%d", n.RoutePort)
		}
	}
	return m
}

// TestComposeEnvironmentMapsToHost: the environment of every service and
// the nats-server configs map to the host (what the process simulation
// starts the services with): every address they name is published or
// mapped, a region's paymesh services reach every data node of its Postgres
// formation and every node of its nats cluster and listen on the table's
// ports, the data nodes reach their monitor on its port, and its nats nodes
// route to each other on their route ports and join the hub through its
// WAN link's host port.
func TestComposeEnvironmentMapsToHost(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	m, err := p.Mapper(hostMappings(tab))
	if err != nil {
		t.Fatal(err)
	}
	mapped := map[string]map[string]string{}
	for _, name := range p.ServiceNames() {
		env, err := m.ServiceEnv(p.Services[name])
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		mapped[name] = env
	}
	for _, r := range tab.Regions {
		want := map[string]map[string]string{
			"ledger-" + r.Name: {"PAYMESH_METRICS_LISTEN": fmt.Sprintf("127.0.0.1:%d", r.MetricsPort)},
			"router-" + r.Name: {"PAYMESH_ROUTER_METRICS_LISTEN": fmt.Sprintf("127.0.0.1:%d", r.RouterMetricsPort)},
			"api-" + r.Name: {
				"PAYMESH_API_LISTEN":         fmt.Sprintf("127.0.0.1:%d", r.APIPort),
				"PAYMESH_API_METRICS_LISTEN": fmt.Sprintf("127.0.0.1:%d", r.APIMetricsPort),
			},
			"wan-" + r.Name: {
				"PAYMESH_WAN_LISTEN":  fmt.Sprintf("127.0.0.1:%d", r.WANPort),
				"PAYMESH_WAN_TARGET":  fmt.Sprintf("127.0.0.1:%d", tab.Hub.LeafPort),
				"PAYMESH_WAN_CONTROL": fmt.Sprintf("127.0.0.1:%d", r.WANControlPort),
			},
		}
		var clients, routes, pgAddrs []string
		for _, n := range r.NATS.Nodes {
			clients = append(clients, fmt.Sprintf("tls://127.0.0.1:%d", n.ClientPort))
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d\n", n.RoutePort))
		}
		for _, n := range r.Postgres.Nodes {
			pgAddrs = append(pgAddrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
		}
		for _, kind := range []string{"ledger", "router", "api"} {
			want[kind+"-"+r.Name]["PAYMESH_NATS_URL"] = strings.Join(clients, ",")
			want[kind+"-"+r.Name]["PAYMESH_POSTGRES_URL"] = fmt.Sprintf("postgres://postgres:%s@%s/postgres?sslmode=verify-full&sslrootcert=/certs/ca.pem&target_session_attrs=read-write",
				postgresPassword(r), strings.Join(pgAddrs, ","))
		}
		// Each data node's keeper reaches the monitor on its host port.
		for _, node := range r.PostgresNodeNames() {
			want[node] = map[string]string{"PGAF_MONITOR": fmt.Sprintf("postgres://autoctl_node:%s@127.0.0.1:%d/pg_auto_failover?sslmode=verify-full&sslrootcert=/certs/ca.pem",
				postgresPassword(r), r.Postgres.MonitorPort)}
		}
		for svc, vars := range want {
			for k, v := range vars {
				if got := mapped[svc][k]; got != v {
					t.Errorf("%s: %s maps to %q, want %q", svc, k, got, v)
				}
			}
		}
		conf, err := os.ReadFile(filepath.Join(natsConfDir, r.Name+".conf"))
		if err != nil {
			t.Fatal(err)
		}
		text, err := m.Text(string(conf))
		if err != nil {
			t.Errorf("%s.conf: %v", r.Name, err)
		}
		if link := fmt.Sprintf("@127.0.0.1:%d\"", r.WANPort); !strings.Contains(text, link) {
			t.Errorf("%s.conf: mapped to the host, its leaf remote does not go to %s", r.Name, link)
		}
		for _, route := range routes {
			if !strings.Contains(text, route) {
				t.Errorf("%s.conf: mapped to the host, it has no route %s", r.Name, strings.TrimSpace(route))
			}
		}
	}
}

// images are the Dockerfile's two final targets: the binary each copies
// from its build stage, and the commands of docker-compose.yml it may run
// (the product's services and tools; the lab's WAN links, load and
// development PKI).
var images = map[string]struct {
	pkg, binary string
	commands    []string
}{
	"paymesh": {"./cmd/paymesh", "/paymesh", []string{"ledger", "router", "api", "migrate", "verify", "client", "dlq", "receiver", "webhooks"}},
	"lab":     {"./cmd/paymesh-lab", "/paymesh-lab", []string{"wan", "load", "certs"}},
}

// TestDockerfileBuildsPaymesh: the Dockerfile builds the product image
// (./cmd/paymesh, the default target) and the lab image (./cmd/paymesh-lab,
// target lab), each a static binary built with a Go that satisfies go.mod's
// go line and run as its entrypoint; every paymesh service of
// docker-compose.yml names its target, and the target's binary has the
// service's command. No region service runs from the lab image. The only
// images built from another folder are the Postgres formations', from
// deploy/postgres.
func TestDockerfileBuildsPaymesh(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	stages := regexp.MustCompile(`(?m)^FROM (\S+) AS (\S+)$`).FindAllStringSubmatch(df, -1)
	if len(stages) == 0 || stages[len(stages)-1][2] != "paymesh" {
		t.Errorf("Dockerfile: the last stage (the default target) is not paymesh, the product: %v", stages)
	}
	for target, img := range images {
		block := stageText(df, target)
		if block == "" {
			t.Errorf("Dockerfile: no stage %q", target)
			continue
		}
		from := regexp.MustCompile(`(?m)^COPY --from=(\S+) (\S+) ` + regexp.QuoteMeta(img.binary) + `$`).FindStringSubmatch(block)
		if from == nil {
			t.Errorf("Dockerfile: stage %s copies no %s", target, img.binary)
			continue
		}
		build := regexp.MustCompile(`(?m)^RUN CGO_ENABLED=0 go build -trimpath -o ` + regexp.QuoteMeta(from[2]) + ` ` + regexp.QuoteMeta(img.pkg) + `$`)
		if !build.MatchString(stageText(df, from[1])) {
			t.Errorf("Dockerfile: stage %s builds no static %s from %s", from[1], from[2], img.pkg)
		}
		if !strings.Contains(block, `ENTRYPOINT ["`+img.binary+`"]`) {
			t.Errorf(`Dockerfile: stage %s: entrypoint is not ["%s"], which the services' commands are given to`, target, img.binary)
		}
	}
	from := regexp.MustCompile(`(?m)^FROM golang:(\d+)\.(\d+)\S* AS build$`).FindStringSubmatch(df)
	f := goMod(t)
	if f.Go == nil {
		t.Fatal("go.mod: no go line")
	}
	goLine := strings.SplitN(f.Go.Version, ".", 3)
	if from == nil || len(goLine) < 2 || from[1] != goLine[0] || from[2] != goLine[1] {
		t.Errorf("Dockerfile: build stage %q, want FROM golang:%s... AS build (go.mod: go %s)", regexp.MustCompile(`(?m)^FROM .* AS build$`).FindString(df), strings.Join(goLine[:min(2, len(goLine))], "."), f.Go.Version)
	}
	p := loadCompose(t)
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if !s.Build {
			continue
		}
		if s.Context != p.Dir {
			// Built elsewhere: only the servers of a region's Postgres
			// formation, from deploy/postgres (postgres_test.go).
			if !isPostgresServer(s) || regionOf(mustTable(t), name) == "" {
				t.Errorf("%s: built from %s, want the repository's Dockerfile (or, for a server of a region's Postgres formation, %s)", name, s.Context, postgresDir)
			}
			continue
		}
		img, ok := images[s.Target]
		switch {
		case !ok:
			t.Errorf("%s: build target %q, want one of the Dockerfile's images (paymesh, lab)", name, s.Target)
		case len(s.Command) == 0:
			t.Errorf("%s: no command for the %s image", name, s.Target)
		case !slices.Contains(img.commands, s.Command[0]):
			t.Errorf("%s: command %q is not one of the %s image's (%v)", name, s.Command[0], s.Target, img.commands)
		}
	}
}

// stageText returns the lines of the Dockerfile's stage name, from its FROM
// line to the next one ("" when there is none).
func stageText(df, name string) string {
	loc := regexp.MustCompile(`(?m)^FROM \S+ AS ` + regexp.QuoteMeta(name) + `$`).FindStringIndex(df)
	if loc == nil {
		return ""
	}
	rest := df[loc[0]:]
	if next := regexp.MustCompile(`(?m)^FROM `).FindAllStringIndex(rest, 2); len(next) == 2 {
		rest = rest[:next[1][0]]
	}
	return strings.TrimSpace(rest)
}

// TestComposeHealthchecksAnswer runs the healthchecks against the real
// servers: a Postgres server's (its entrypoint's health role,
// postgres_test.go) fails until the entrypoint marks the server ready and
// where no server listens, and passes on the local server once it is; the
// nats-servers' /healthz URL answers 200 on a nats-server of the version
// go.mod pins (the image's), with JetStream as the regions run it.
func TestComposeHealthchecksAnswer(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	t.Run("postgres", func(t *testing.T) { checkFormationHealthchecks(t, p, tab) })

	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, HTTPHost: "127.0.0.1", HTTPPort: -1,
		JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	monitor := srv.MonitorAddr().String()
	natsServices := []string{hubService}
	for _, r := range tab.Regions {
		natsServices = append(natsServices, r.NodeNames()...)
	}
	for _, name := range natsServices {
		hc := service(t, p, name).Healthcheck
		i := slices.IndexFunc(hc, func(a string) bool { return strings.HasPrefix(a, "http://127.0.0.1:8222/") })
		if i < 0 {
			t.Errorf("%s: healthcheck %q has no URL on the monitor port 127.0.0.1:8222", name, hc)
			continue
		}
		target := strings.Replace(hc[i], "127.0.0.1:8222", monitor, 1)
		resp, err := http.Get(target)
		if err != nil {
			t.Errorf("%s: healthcheck URL %s: %v", name, target, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: healthcheck URL %s: %s, want 200", name, target, resp.Status)
		}
	}
}
