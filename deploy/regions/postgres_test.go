package regions_test

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/compose"
	"github.com/paymesh/paymesh/internal/testbed/pgtest"
)

// A region's Postgres is a pg_auto_failover formation of servers built
// from deploy/postgres: its Dockerfile (the postgres image with
// pg_auto_failover) and its entrypoint, formation, which creates each
// server secured and runs its pg_autoctl.
const (
	postgresDir   = "deploy/postgres"
	formationFile = postgresDir + "/formation"
	postgresImage = "paymesh-postgres:15"
	// postgresPort is where every server listens inside its container.
	postgresPort = 5432
	// monitorDatabase and monitorUser are the monitor's, which the keepers
	// log in to.
	monitorDatabase = "pg_auto_failover"
	monitorUser     = "autoctl_node"
)

// postgresHealthcheck is every formation server's healthcheck: the
// entrypoint's health role.
var postgresHealthcheck = []string{"CMD", "formation", "health"}

// postgresBuildDir is deploy/postgres as the compose loader gives a build
// context: absolute.
var postgresBuildDir = func() string {
	d, err := filepath.Abs(filepath.Join(repoRoot, postgresDir))
	if err != nil {
		panic(err)
	}
	return d
}()

// isPostgresServer reports whether a service is a server of a region's
// formation: its image is built from deploy/postgres.
func isPostgresServer(s compose.Service) bool { return s.Build && s.Context == postgresBuildDir }

// postgresServers returns the compose services of a region's formation:
// its monitor, then its data nodes in table order.
func postgresServers(r regions.Region) []string {
	return append([]string{r.PostgresMonitorName()}, r.PostgresNodeNames()...)
}

// readRepoFile returns a file of the repository.
func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// postgresDockerfile returns deploy/postgres/Dockerfile.
func postgresDockerfile(t *testing.T) string { return readRepoFile(t, postgresDir+"/Dockerfile") }

// dockerfileEnv returns the variables the Dockerfile sets with ENV
// name=value.
func dockerfileEnv(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^ENV (\w+)=(\S+)\s*$`).FindAllStringSubmatch(postgresDockerfile(t), -1) {
		env[m[1]] = m[2]
	}
	return env
}

// formationHome returns the folder a server keeps everything in
// (PGAF_HOME, from the image's ENV), which its volume holds.
func formationHome(t *testing.T) string {
	t.Helper()
	home := dockerfileEnv(t)["PGAF_HOME"]
	if !strings.HasPrefix(home, "/") {
		t.Fatalf("%s/Dockerfile: ENV PGAF_HOME=%q, want an absolute folder", postgresDir, home)
	}
	return home
}

// formationScript is what the tests read of the entrypoint: every
// variable it names, those each role needs, where the health role looks
// for the server's socket and the file that marks it ready.
type formationScript struct {
	vars              map[string]bool
	needs             map[string][]string // by role; "" for every role
	socket, readyName string
	text              string
}

// readFormation reads deploy/postgres/formation.
func readFormation(t *testing.T) formationScript {
	t.Helper()
	f := formationScript{vars: map[string]bool{}, needs: map[string][]string{}, text: readRepoFile(t, formationFile)}
	for _, v := range regexp.MustCompile(`\b(?:PGAF_[A-Z_]+|POSTGRES_[A-Z_]+|PGPORT)\b`).FindAllString(f.text, -1) {
		f.vars[v] = true
	}
	for _, m := range regexp.MustCompile(`(?m)^need ([A-Z_ ]+)$`).FindAllStringSubmatch(f.text, -1) {
		f.needs[""] = append(f.needs[""], strings.Fields(m[1])...)
	}
	for _, m := range regexp.MustCompile(`(?m)^(\w+)\) need ([A-Z_ ]+?) ;;$`).FindAllStringSubmatch(f.text, -1) {
		f.needs[m[1]] = append(f.needs[m[1]], strings.Fields(m[2])...)
	}
	if m := regexp.MustCompile(`(?m)^socket=(/\S+)$`).FindStringSubmatch(f.text); m != nil {
		f.socket = m[1]
	}
	if m := regexp.MustCompile(`(?m)^ready="\$PGAF_HOME/([\w.-]+)"$`).FindStringSubmatch(f.text); m != nil {
		f.readyName = m[1]
	}
	if len(f.needs["monitor"]) == 0 || len(f.needs["node"]) == 0 || f.socket == "" || f.readyName == "" {
		t.Fatalf("%s: found no variables needed by the monitor (%v) or a node (%v), no socket folder (%q) or no ready file (%q)",
			formationFile, f.needs["monitor"], f.needs["node"], f.socket, f.readyName)
	}
	return f
}

// pgURL is a Postgres URL of docker-compose.yml taken apart, libpq's
// multi-host form (host:port,host:port) included.
type pgURL struct {
	Hosts          []string // host:port, in the URL's order
	User, Password string
	Database       string
	Query          url.Values
}

func parsePGURL(raw string) (pgURL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return pgURL{}, err
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return pgURL{}, fmt.Errorf("scheme %q, want postgres", u.Scheme)
	}
	pw, _ := u.User.Password()
	return pgURL{Hosts: strings.Split(u.Host, ","), User: u.User.Username(), Password: pw,
		Database: strings.TrimPrefix(u.Path, "/"), Query: u.Query()}, nil
}

// nodeAddrs returns the addresses of a region's data nodes inside the
// compose network, in table order.
func nodeAddrs(r regions.Region) []string {
	var out []string
	for _, n := range r.PostgresNodeNames() {
		out = append(out, net.JoinHostPort(n, strconv.Itoa(postgresPort)))
	}
	return out
}

// checkClientURL: a service's Postgres URL reaches region r's formation
// through whichever data node takes writes: it lists every data node of
// regions.yaml, in table order, with target_session_attrs=read-write, logs
// in as postgres with the region's password to the postgres database (the
// services pick theirs), and verifies the server (verify-full, the certs
// volume's CA).
func checkClientURL(t *testing.T, what, raw string, r regions.Region) {
	t.Helper()
	u, err := parsePGURL(raw)
	if err != nil {
		t.Errorf("%s: %q: %v", what, raw, err)
		return
	}
	if !slices.Equal(u.Hosts, nodeAddrs(r)) {
		t.Errorf("%s: hosts %v, want every data node of region %s's formation, in order: %v", what, u.Hosts, r.Name, nodeAddrs(r))
	}
	if u.User != "postgres" || u.Password != postgresPassword(r) || u.Database != "postgres" {
		t.Errorf("%s: user %q with password %q on database %q, want postgres with region %s's password on postgres", what, u.User, u.Password, u.Database, r.Name)
	}
	q := u.Query
	if q.Get("target_session_attrs") != "read-write" || q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") != caCert {
		t.Errorf("%s: target_session_attrs %q sslmode %q sslrootcert %q, want read-write (the writable node, after a failover too), verify-full, %s",
			what, q.Get("target_session_attrs"), q.Get("sslmode"), q.Get("sslrootcert"), caCert)
	}
}

// checkMonitorURL: a data node's keeper reaches its region's monitor, as
// autoctl_node with the region's password on the monitor's database, and
// verifies it (verify-full, the certs volume's CA).
func checkMonitorURL(t *testing.T, what, raw string, r regions.Region) {
	t.Helper()
	u, err := parsePGURL(raw)
	if err != nil {
		t.Errorf("%s: %q: %v", what, raw, err)
		return
	}
	if want := []string{net.JoinHostPort(r.PostgresMonitorName(), strconv.Itoa(postgresPort))}; !slices.Equal(u.Hosts, want) {
		t.Errorf("%s: hosts %v, want region %s's monitor %v", what, u.Hosts, r.Name, want)
	}
	if u.User != monitorUser || u.Password != postgresPassword(r) || u.Database != monitorDatabase {
		t.Errorf("%s: user %q with password %q on database %q, want %s with region %s's password on %s", what, u.User, u.Password, u.Database, monitorUser, r.Name, monitorDatabase)
	}
	if q := u.Query; q.Get("sslmode") != "verify-full" || q.Get("sslrootcert") != caCert {
		t.Errorf("%s: sslmode %q sslrootcert %q, want verify-full, %s", what, q.Get("sslmode"), q.Get("sslrootcert"), caCert)
	}
}

// waitsHealthy reports whether compose starts service name only once dep
// is healthy: name depends on dep with service_healthy, or on a service
// that waits so.
func waitsHealthy(p *compose.Project, name, dep string) bool {
	seen := map[string]bool{}
	var walk func(string) bool
	walk = func(n string) bool {
		if seen[n] {
			return false
		}
		seen[n] = true
		for d, cond := range p.Services[n].DependsOn {
			if d == dep && cond == compose.ServiceHealthy || d != dep && walk(d) {
				return true
			}
		}
		return false
	}
	return walk(name)
}

// formationTimers are the monitor's failover timers (milliseconds), which
// the entrypoint sets on the monitor only.
var formationTimers = []string{"PGAF_HEALTH_CHECK_MS", "PGAF_UNHEALTHY_MS", "PGAF_DEMOTE_MS"}

// maxFailover bounds the sum of the timers: a failover in seconds, where
// pg_auto_failover's defaults take about 50 s.
const maxFailover = 10 * time.Second

// TestComposePostgresFormations: every region's Postgres is a formation of
// exactly the monitor and the data nodes of regions.yaml
// (postgres-<region>-monitor, postgres-<region>-1..N), each built from
// deploy/postgres as paymesh-postgres:15, restarted unless stopped,
// healthy by the entrypoint's health role, running its role (monitor or
// node) with every variable the entrypoint needs for it and none it does
// not read, published on the table's host port, with its own named volume
// on the image's PGAF_HOME (no other service mounts it); each data node
// has its name in the formation (<region>-<n>), the region's database, and
// the monitor's URL (verify-full, the region's password), and waits for
// the monitor, a later node for the first (the primary it is made from);
// the monitor sets the failover timers (at most maxFailover together), the
// nodes none. Every Postgres URL of the file is a client's of one
// region's formation (checkClientURL) or a keeper's of its monitor
// (checkMonitorURL, in PGAF_MONITOR only), and a client of a formation
// starts only once every data node of it is healthy.
func TestComposePostgresFormations(t *testing.T) {
	p := loadCompose(t)
	tab := mustTable(t)
	f := readFormation(t)
	home, imageEnv := formationHome(t), dockerfileEnv(t)
	mounts := map[string][]string{} // named volume: the services that mount it
	for _, name := range p.ServiceNames() {
		for _, v := range p.Services[name].Volumes {
			if v.Type == "volume" {
				mounts[v.Source] = append(mounts[v.Source], name)
			}
		}
	}
	for _, r := range tab.Regions {
		servers := postgresServers(r)
		for _, name := range p.ServiceNames() {
			s := p.Services[name]
			ours := regionOf(tab, name) == r.Name || strings.HasPrefix(name, "postgres-"+r.Name+"-")
			if ours && (isPostgresServer(s) || strings.HasPrefix(name, "postgres-")) && !slices.Contains(servers, name) {
				t.Errorf("%s: a Postgres service of region %s that is not its monitor or a data node in regions.yaml (%v)", name, r.Name, servers)
			}
		}
		names := map[string]string{}
		for i, name := range servers {
			role, hostPort := "monitor", r.Postgres.MonitorPort
			if i > 0 {
				role, hostPort = "node", r.Postgres.Nodes[i-1].Port
			}
			s := service(t, p, name)
			env := s.Environment
			if !isPostgresServer(s) || s.Target != "" || s.Image != postgresImage {
				t.Errorf("%s: built %v from %q (target %q) as %q, want %s built from %s", name, s.Build, s.Context, s.Target, s.Image, postgresImage, postgresDir)
			}
			if s.Restart != "unless-stopped" {
				t.Errorf("%s: restart %q, want unless-stopped (a server that fails comes back and rejoins)", name, s.Restart)
			}
			if !slices.Equal(s.Healthcheck, postgresHealthcheck) {
				t.Errorf("%s: healthcheck %q, want %q", name, s.Healthcheck, postgresHealthcheck)
			}
			if !slices.Equal(s.Command, []string{role}) {
				t.Errorf("%s: command %q, want [%s]", name, s.Command, role)
			}
			if want := []compose.Port{{Host: hostPort, Container: postgresPort, Protocol: "tcp"}}; !slices.Equal(s.Ports, want) {
				t.Errorf("%s: ports %v, want %v (regions.yaml)", name, s.Ports, want)
			}
			if env["PGAF_HOSTNAME"] != name {
				t.Errorf("%s: PGAF_HOSTNAME %q, want %q (the name the other servers and the clients reach it by)", name, env["PGAF_HOSTNAME"], name)
			}
			for _, v := range append(slices.Clone(f.needs[""]), f.needs[role]...) {
				if env[v] == "" && imageEnv[v] == "" {
					t.Errorf("%s: %s is not set, which %s %s needs", name, v, formationFile, role)
				}
			}
			for k := range env {
				if !f.vars[k] {
					t.Errorf("%s: sets %s, which %s does not read", name, k, formationFile)
				}
			}
			v, ok := s.Mount(home)
			switch {
			case !ok || v.Type != "volume" || v.ReadOnly:
				t.Errorf("%s: %s is %+v, want a writable named volume (the server's data and pg_autoctl's state)", name, home, v)
			case !slices.Equal(mounts[v.Source], []string{name}):
				t.Errorf("%s: its volume %s is mounted by %v, want by it alone", name, v.Source, mounts[v.Source])
			}
			if role == "monitor" {
				var sum time.Duration
				for _, k := range formationTimers {
					ms, err := strconv.Atoi(env[k])
					if err != nil || ms <= 0 {
						t.Errorf("%s: %s %q, want a positive number of milliseconds", name, k, env[k])
					}
					sum += time.Duration(ms) * time.Millisecond
				}
				if sum > maxFailover {
					t.Errorf("%s: failover timers %s together, want at most %s", name, sum, maxFailover)
				}
				for _, k := range []string{"PGAF_MONITOR", "PGAF_NAME", "POSTGRES_DB"} {
					if _, ok := env[k]; ok {
						t.Errorf("%s: sets %s, a data node's", name, k)
					}
				}
				continue
			}
			for _, k := range formationTimers {
				if _, ok := env[k]; ok {
					t.Errorf("%s: sets %s, which only the monitor reads", name, k)
				}
			}
			if want := fmt.Sprintf("%s-%d", r.Name, i); env["PGAF_NAME"] != want {
				t.Errorf("%s: PGAF_NAME %q, want %q", name, env["PGAF_NAME"], want)
			}
			if other, ok := names[env["PGAF_NAME"]]; ok {
				t.Errorf("%s: PGAF_NAME %q, also %s's", name, env["PGAF_NAME"], other)
			}
			names[env["PGAF_NAME"]] = name
			if env["POSTGRES_DB"] != r.Postgres.Database {
				t.Errorf("%s: POSTGRES_DB %q, want %q (regions.yaml)", name, env["POSTGRES_DB"], r.Postgres.Database)
			}
			checkMonitorURL(t, name+": PGAF_MONITOR", env["PGAF_MONITOR"], r)
			deps := []string{r.PostgresMonitorName()}
			if i > 1 {
				deps = append(deps, r.PostgresNodeName(0)) // the primary it is made from
			}
			for _, d := range deps {
				if cond := s.DependsOn[d]; cond != compose.ServiceHealthy {
					t.Errorf("%s: depends on %s with condition %q, want %s", name, d, cond, compose.ServiceHealthy)
				}
			}
		}
	}

	// Every Postgres URL names one region's formation: a client's, which
	// waits for every data node, or a keeper's of its monitor.
	firstNode, monitors := map[string]regions.Region{}, map[string]regions.Region{}
	for _, r := range tab.Regions {
		firstNode[nodeAddrs(r)[0]] = r
		monitors[net.JoinHostPort(r.PostgresMonitorName(), strconv.Itoa(postgresPort))] = r
	}
	clients := 0
	for _, name := range p.ServiceNames() {
		for k, v := range p.Services[name].Environment {
			for _, item := range postgresURLs(v) {
				what := name + ": " + k
				u, err := parsePGURL(item.URL)
				if err != nil {
					t.Errorf("%s: %q: %v", what, item.URL, err)
					continue
				}
				if r, ok := monitors[u.Hosts[0]]; ok {
					checkMonitorURL(t, what, item.URL, r)
					if k != "PGAF_MONITOR" || !slices.Contains(r.PostgresNodeNames(), name) {
						t.Errorf("%s: names region %s's monitor; only its data nodes' PGAF_MONITOR may", what, r.Name)
					}
					continue
				}
				r, ok := firstNode[u.Hosts[0]]
				if !ok {
					t.Errorf("%s: %s names no formation of regions.yaml (its first host is no region's first data node)", what, pgRedact(item.URL))
					continue
				}
				clients++
				checkClientURL(t, what, item.URL, r)
				if item.Region != "" && item.Region != r.Name {
					t.Errorf("%s: %s=%s names region %s's formation", what, item.Region, pgRedact(item.URL), r.Name)
				}
				for _, node := range r.PostgresNodeNames() {
					if !waitsHealthy(p, name, node) {
						t.Errorf("%s: names region %s's formation but does not wait for %s to be healthy", name, r.Name, node)
					}
				}
			}
		}
	}
	if clients == 0 {
		t.Error("no service names a formation's data nodes")
	}
}

// pgRedact returns a URL with its password hidden.
func pgRedact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<invalid url>"
	}
	return u.Redacted()
}

// checkFormationHealthchecks runs each formation server's healthcheck, as
// its image runs it (deploy/postgres/formation with the image's
// PGAF_HOME), against the local server's socket: it fails before the
// entrypoint marks the server ready (a server being made, a standby taking
// its base backup), passes once it is, and fails with the ready mark where
// no server listens. It skips when the local server has no socket where
// the entrypoint looks.
func checkFormationHealthchecks(t *testing.T, p *compose.Project, tab regions.Table) {
	f := readFormation(t)
	u, err := url.Parse(pgtest.AdminURL())
	if err != nil || u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost" {
		t.Skipf("the test server %s is not local; the healthcheck runs on the server's own socket", pgtest.AdminURL())
	}
	pgPort := u.Port()
	if pgPort == "" {
		pgPort = "5432"
	}
	if _, err := os.Stat(filepath.Join(f.socket, ".s.PGSQL."+pgPort)); err != nil {
		t.Skipf("no local Postgres socket where %s looks (%v)", formationFile, err)
	}
	pgIsReady := localPostgresBin(t, "pg_isready")
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	script, err := filepath.Abs(filepath.Join(repoRoot, formationFile))
	if err != nil {
		t.Fatal(err)
	}
	run := func(hc []string, home, port string) error {
		cmd := exec.Command("sh", append([]string{script}, hc[2:]...)...)
		cmd.Env = []string{"PATH=" + filepath.Dir(pgIsReady) + ":/usr/bin:/bin", "PGAF_HOME=" + home, "PGPORT=" + port}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	for _, r := range tab.Regions {
		for _, name := range postgresServers(r) {
			hc := service(t, p, name).Healthcheck
			if len(hc) < 2 || hc[0] != "CMD" || hc[1] != "formation" {
				t.Errorf("%s: healthcheck %q, want [CMD formation ...] (the image's entrypoint)", name, hc)
				continue
			}
			home := t.TempDir()
			if err := run(hc, home, pgPort); err == nil {
				t.Errorf("%s: healthcheck %q passes before the entrypoint marks the server ready", name, hc)
			}
			if err := os.WriteFile(filepath.Join(home, f.readyName), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := run(hc, home, pgPort); err != nil {
				t.Errorf("%s: healthcheck %q on the local server, marked ready: %v", name, hc, err)
			}
			if err := run(hc, home, closed); err == nil {
				t.Errorf("%s: healthcheck %q passes where no server listens", name, hc)
			}
		}
	}
}
