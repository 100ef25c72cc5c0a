// Package sim runs the docker-compose topology as separate OS processes on
// this machine: the hub's nats-server and each region's JetStream cluster of
// three (built from the version go.mod pins, configured from
// deploy/regions/nats with loopback ports), a throwaway Postgres per region
// on its compose host port, a `paymesh-lab wan` per region link, and per region
// the `paymesh ledger`, `router` and `api` processes with the environment
// docker-compose.yml gives them. It registers the load client and runs
// `paymesh-lab load` as compose's setup and loadgen services do, fires a fault
// schedule (kill -9 and restart of services and of nats nodes, among them
// the node leading eu's ledger stream, a cut WAN link, a degraded one),
// scrapes everything with Prometheus, and ends with a report: outcomes,
// latency, duplicates, alerts, invariants, and whether every acknowledged
// request was applied exactly once.
package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/compose"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
	"github.com/paymesh/paymesh/pkg/dedup"
	"github.com/paymesh/paymesh/pkg/idgen"
	"github.com/paymesh/paymesh/platform/pgdb"
	"github.com/paymesh/paymesh/services/ledger/postgres"
)

// Config sets up a simulation run.
type Config struct {
	// Root is the repository: docker-compose.yml, deploy/ and go.mod.
	Root string
	// Binary is the product binary (cmd/paymesh): the services and tools
	// of the compose services built from the Dockerfile's product target.
	Binary string
	// LabBinary is the lab binary (cmd/paymesh-lab): the WAN links and the
	// load, the compose services built from its lab target.
	LabBinary string
	// BinDir caches nats-server builds (default Root/bin).
	BinDir string
	// Load is how long the load runs (default 120 s; 45 s with Quick).
	Load time.Duration
	// Quick is a run of at most about 90 s in all.
	Quick bool
	// Faults are the faults to fire (default: all of FaultNames; NoFaults
	// alone for none).
	Faults []string
	// LoseCommands adds a fault that loses commands on purpose (FaultLose:
	// eu's ledger stream purged while its ledger is down, so the saga
	// steps relayed into it, and any request eu's API handed to it, are
	// gone); the run must end in FAIL naming their keys.
	LoseCommands bool
	// NoWANLatency runs the WAN links without the region table's latency
	// (PAYMESH_WAN_LATENCY=0), to measure what the latency costs.
	NoWANLatency bool
	// Live redraws one status line (a terminal) instead of printing a line
	// every few seconds.
	Live bool
	Seed uint64
}

// The compose file and the services' container ports that publish
// nothing on the host (the hub, the wan links' leafnode side).
const (
	composeFile       = "docker-compose.yml"
	natsClientPort    = 4222
	natsMonitorPort   = 8222
	leafPort          = 7422
	clusterPort       = 6222 // where a region's nodes listen for each other's routes
	hubService        = "nats-hub"
	wanServicePrefix  = "wan-"
	otelEndpointEnv   = "OTEL_EXPORTER_OTLP_ENDPOINT"
	startTimeout      = 90 * time.Second
	stopGrace         = 10 * time.Second
	quickLoad         = 45 * time.Second
	defaultLoad       = 120 * time.Second
	restartDelay      = 2 * time.Second
	statusEvery       = 3 * time.Second
	liveStatusEvery   = 500 * time.Millisecond
	drainTimeout      = 90 * time.Second
	loadTransferLimit = "10000000" // the load is bounded by time (--duration)
	loadConcurrency   = "64"
)

// sim is one run.
type sim struct {
	cfg     Config
	out     io.Writer
	dir     string
	table   regions.Table
	ids     *idgen.Regions
	plan    *plan
	mapper  *compose.Mapper
	procs   *procs
	natsBin string
	// jaegerBin is the jaeger binary, when the simulation runs Jaeger.
	jaegerBin string

	stores map[string]*postgres.Store // by region
	pools  []*pgxpool.Pool

	prom   *promcheck.Server
	alerts *alerts

	mu        sync.Mutex
	fired     []string
	phase     string
	loadStart time.Time
	degraded  [2]time.Time // when the degraded link began and ended
	// leaderKills are the stream leader kills undone so far.
	leaderKills []LeaderKill
	// laterFaultErrors are the failures of fault steps that run after
	// their fault fired (the purge of loseFault).
	laterFaultErrors []string
	// failover is what the kill of a Postgres primary cost
	// (pgFailoverFault); failoverDone is closed once another node takes
	// writes (or that failed), rejoinDone once the wiped node rejoined.
	failover                 *Failover
	failoverDone, rejoinDone chan struct{}
	// ledgerKills are the kills of a region's ledger (killFault).
	ledgerKills []ServiceKill
}

// Run runs the simulation, writing progress and the report to out. It
// returns the report, and an error when the topology cannot start (a port
// taken, a binary missing) or ctx ends; everything it started is stopped
// and the throwaway clusters are removed before it returns.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	s, err := prepare(cfg, out)
	if err != nil {
		return nil, err
	}
	defer s.cleanup()
	return s.run(ctx)
}

// prepare loads the compose file and the region table and checks that
// every port the run needs is free.
func prepare(cfg Config, out io.Writer) (*sim, error) {
	if cfg.Root == "" {
		return nil, errors.New("sim: Config.Root: the repository folder is needed (docker-compose.yml, deploy/, go.mod)")
	}
	if cfg.Binary == "" || cfg.LabBinary == "" {
		return nil, errors.New("sim: Config.Binary and Config.LabBinary: the paymesh and paymesh-lab binaries are needed")
	}
	if cfg.BinDir == "" {
		cfg.BinDir = filepath.Join(cfg.Root, "bin")
	}
	if cfg.Load == 0 {
		cfg.Load = defaultLoad
		if cfg.Quick {
			cfg.Load = quickLoad
		}
	}
	if cfg.Load < 10*time.Second {
		return nil, fmt.Errorf("sim: load of %s: want at least 10s for the fault schedule", cfg.Load)
	}
	switch {
	case len(cfg.Faults) == 0:
		cfg.Faults = FaultNames
	case len(cfg.Faults) == 1 && cfg.Faults[0] == NoFaults:
		cfg.Faults = nil
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(FaultNames, f) {
			return nil, fmt.Errorf("sim: unknown fault %q (known: %s)", f, strings.Join(FaultNames, ", "))
		}
	}
	project, err := compose.Load(filepath.Join(cfg.Root, composeFile), compose.AllProfiles)
	if err != nil {
		return nil, err
	}
	pl, err := makePlan(project)
	if err != nil {
		return nil, err
	}
	s, err := newSim(cfg, out, pl)
	if err != nil {
		return nil, err
	}
	if s.mapper, err = project.Mapper(s.extraMappings()); err != nil {
		return nil, err
	}
	if err := checkPorts(s.ports()); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return s, nil
}

// newSim reads the region table of cfg.Root for a plan.
func newSim(cfg Config, out io.Writer, pl *plan) (*sim, error) {
	table, err := regions.Load(filepath.Join(cfg.Root, "deploy", "regions", "regions.yaml"))
	if err != nil {
		return nil, err
	}
	ids, err := idgen.NewRegions(table.Codes())
	if err != nil {
		return nil, err
	}
	return &sim{cfg: cfg, out: out, table: table, ids: ids, plan: pl, stores: map[string]*postgres.Store{}}, nil
}

// extraMappings places the ports compose does not publish: the hub's
// (regions.yaml hub), each wan link's leafnode side (its wan_port) and each
// nats node's cluster port (its route_port).
func (s *sim) extraMappings() map[string]string {
	at := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	m := map[string]string{}
	if _, ok := s.plan.project.Services[hubService]; ok {
		m[hubService+":"+strconv.Itoa(natsClientPort)] = at(s.table.Hub.ClientPort)
		m[hubService+":"+strconv.Itoa(natsMonitorPort)] = at(s.table.Hub.MonitorPort)
		m[hubService+":"+strconv.Itoa(leafPort)] = at(s.table.Hub.LeafPort)
	}
	for _, r := range s.table.Regions {
		if _, ok := s.plan.project.Services[wanServicePrefix+r.Name]; ok {
			m[wanServicePrefix+r.Name+":"+strconv.Itoa(leafPort)] = at(r.WANPort)
		}
		for i, n := range r.NATS.Nodes {
			if _, ok := s.plan.project.Services[r.NodeName(i)]; ok {
				m[r.NodeName(i)+":"+strconv.Itoa(clusterPort)] = at(n.RoutePort)
			}
		}
	}
	s.jaegerExtraMappings(m)
	return m
}

// listenPorts returns the host ports a service listens on in the
// simulation: its published ones and its extra mappings.
func (s *sim) listenPorts(name string) []int {
	var out []int
	for _, p := range s.plan.project.Services[name].Ports {
		out = append(out, p.Host)
	}
	for from, to := range s.extraMappings() {
		if strings.HasPrefix(from, name+":") {
			_, port, _ := net.SplitHostPort(to)
			n, _ := strconv.Atoi(port)
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ports returns every host port the run listens on, with its service.
func (s *sim) ports() map[int]string {
	m := map[int]string{}
	for name := range s.plan.kinds {
		for _, p := range s.listenPorts(name) {
			m[p] = name
		}
	}
	return m
}

// env returns a service's compose environment mapped to loopback
// (compose.Mapper.ServiceEnv: its own 0.0.0.0 listen addresses become the
// host address its port is reached on, every service address its
// published or mapped port) and to the run folder (the paths of its
// mounts: mapPaths), with the OTLP endpoint moved from compose's collector
// (not run) to Jaeger's own OTLP receiver, or removed when no Jaeger runs.
func (s *sim) env(name string) (map[string]string, error) {
	env, err := s.mapper.ServiceEnv(s.plan.project.Services[name])
	if err != nil {
		return nil, err
	}
	m, err := s.mounts(name)
	if err != nil {
		return nil, err
	}
	for k, v := range env {
		env[k] = mapPaths(m, v)
	}
	if _, ok := env[otelEndpointEnv]; ok {
		if to := s.otlpEndpoint(); to != "" {
			env[otelEndpointEnv] = to
		} else {
			delete(env, otelEndpointEnv)
		}
	}
	if hosts, ok := env[allowHostsEnv]; ok {
		env[allowHostsEnv] = s.mapHosts(hosts)
	}
	return env, nil
}

// allowHostsEnv names the hosts an API delivers webhooks to though they
// are not public: compose's service names, loopback here.
const allowHostsEnv = "PAYMESH_WEBHOOK_ALLOW_HOSTS"

// mapHosts maps a comma-separated list of hosts: a compose service's name
// is reached on loopback.
func (s *sim) mapHosts(list string) string {
	hosts := strings.Split(list, ",")
	for i, h := range hosts {
		if _, ok := s.plan.project.Services[strings.TrimSpace(h)]; ok {
			hosts[i] = "127.0.0.1"
		}
	}
	return strings.Join(slices.Compact(hosts), ",")
}

// args returns a service's compose command with its mounts' paths mapped
// to the run folder and every service address to loopback (a receiver's
// URL in a webhooks create, say).
func (s *sim) args(name string) ([]string, error) {
	m, err := s.mounts(name)
	if err != nil {
		return nil, err
	}
	args := mappedPaths(m, s.plan.project.Services[name].Command)
	for i, a := range args {
		if args[i], err = s.mapper.Text(a); err != nil {
			return nil, fmt.Errorf("sim: %s: %w", name, err)
		}
	}
	return args, nil
}

func (s *sim) setPhase(p string) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
}

func (s *sim) logf(format string, args ...any) {
	fmt.Fprintf(s.out, format+"\n", args...)
}

// cleanup stops every process and removes the throwaway clusters, the
// JetStream stores, compose's named volumes (the development PKI) and
// Prometheus's data; the logs, the load's history and the configs stay in
// the run folder.
func (s *sim) cleanup() {
	if s.prom != nil {
		s.prom.Stop()
	}
	if s.procs != nil {
		s.procs.stopAll(stopGrace)
	}
	for _, p := range s.pools {
		p.Close()
	}
	if s.dir != "" {
		_ = os.RemoveAll(filepath.Join(s.dir, "nats"))
		_ = os.RemoveAll(filepath.Join(s.dir, "prometheus", "data"))
		_ = os.RemoveAll(filepath.Join(s.dir, volumesDir)) // compose's named volumes: the PKI, the CA's key among it
	}
}

// run starts the topology, drives the load and the faults, and reports.
func (s *sim) run(ctx context.Context) (*Report, error) {
	var err error
	if s.dir, err = os.MkdirTemp("", "paymesh-sim-"); err != nil {
		return nil, fmt.Errorf("sim: run folder: %w", err)
	}
	if s.procs, err = newProcs(s.dir); err != nil {
		return nil, err
	}
	s.logf("paymesh-lab sim: docker-compose.yml as processes; run folder %s (logs in %s)", s.dir, filepath.Join(s.dir, "logs"))
	if err := s.prepareJaeger(ctx); err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(s.plan.notRun)) {
		s.logf("  not run: %s: %s", name, s.plan.notRun[name])
	}
	if s.natsBin, err = buildNATSServer(ctx, s.cfg.Root, s.cfg.BinDir, s.out); err != nil {
		return nil, err
	}
	began := time.Now()
	if err := s.startAll(ctx); err != nil {
		return nil, err
	}
	u, err := s.endpoints()
	if err != nil {
		return nil, err
	}
	for _, r := range s.table.Regions {
		s.logf("API %s: %s", r.Name, u.APIs[r.Name])
	}
	s.logf("/metrics: %s", strings.Join(u.Metrics, " "))
	if err := s.startPrometheus(ctx); err != nil {
		return nil, err
	}
	fs := s.schedule(s.cfg.Load)
	rep := &Report{RunDir: s.dir}
	for _, f := range fs {
		rep.Scheduled = append(rep.Scheduled, f.Name)
	}
	s.logf("fault schedule (load of %s):\n%s", s.cfg.Load, strings.TrimRight(describe(fs), "\n"))
	if err := s.drive(ctx, fs, rep); err != nil {
		return nil, err
	}
	s.mu.Lock()
	rep.Fired = slices.Clone(s.fired)
	rep.LeaderKills = slices.Clone(s.leaderKills)
	rep.FaultErrors = append(rep.FaultErrors, s.laterFaultErrors...)
	s.mu.Unlock()
	if rep.Verify, err = s.drain(ctx); err != nil {
		return nil, err
	}
	rep.Failed, rep.Restarted = s.procs.failed(), s.procs.restarted()
	if err := s.checkHistory(ctx, rep); err != nil {
		return nil, err
	}
	s.measureFailover(ctx, rep)
	s.measureKills(ctx, rep)
	if rep.Unfinished > 0 {
		rep.RouterLogs = s.routerLogs()
	}
	client, err := s.setupClient()
	if err != nil {
		return nil, err
	}
	if rep.Hooks, err = s.auditHooks(ctx, client); err != nil {
		return nil, err
	}
	if rep.Transport, err = s.transport(ctx); err != nil {
		rep.TransportError = err.Error()
	}
	if err := s.observe(ctx, rep, s.loadStart); err != nil {
		return nil, err
	}
	s.runTools(ctx, rep)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rep.Elapsed = time.Since(began)
	rep.judge()
	return rep, nil
}

// startAll starts every long-running service in dependency order and runs
// the setup commands, waiting for each to be ready.
func (s *sim) startAll(ctx context.Context) error {
	start := time.Now()
	for _, name := range s.plan.order {
		var err error
		switch s.plan.kinds[name] {
		case kindFormation:
			err = s.startFormationNode(ctx, name)
		case kindNATS:
			err = s.startNATS(ctx, name)
		case kindJaeger:
			err = s.startJaeger(ctx, name)
		case kindService:
			err = s.startService(ctx, name)
		case kindSetup:
			err = s.runCommand(ctx, name, nil)
		}
		if err != nil {
			return err
		}
	}
	if err := s.waitFormations(ctx); err != nil {
		return err
	}
	s.logf("topology up in %s", time.Since(start).Round(100*time.Millisecond))
	return s.openStores(ctx)
}

// startNATS writes the service's config files, rewritten for loopback,
// and starts nats-server with compose's command, its container paths
// replaced by the rewritten files, and compose's environment (a node's
// NATS_SERVER_NAME).
func (s *sim) startNATS(ctx context.Context, name string) error {
	svc := s.plan.project.Services[name]
	env, err := s.env(name)
	if err != nil {
		return err
	}
	mounts, err := s.mounts(name)
	if err != nil {
		return err
	}
	confDir := filepath.Join(s.dir, "nats")
	args := slices.Clone(svc.Command)
	for i, a := range args {
		v, ok := svc.Mount(a)
		if !ok {
			continue
		}
		b, err := os.ReadFile(v.Source)
		if err != nil {
			return fmt.Errorf("sim: %s: %w", name, err)
		}
		b, err = rewriteConf(b, name, s.mapper, filepath.Join(confDir, name+"-data"))
		if err != nil {
			return err
		}
		b = []byte(mapPaths(mounts, string(b)))
		path := filepath.Join(confDir, name+"-"+filepath.Base(v.Target))
		if err := os.MkdirAll(confDir, 0o755); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		args[i] = path
	}
	return s.startProc(ctx, procSpec{Name: name, Path: s.natsBin, Args: args, Env: env})
}

// startService starts a paymesh service with its compose command and
// mapped environment, once the nats-servers it waits for in compose are
// healthy.
func (s *sim) startService(ctx context.Context, name string) error {
	if err := s.waitHealthy(ctx, name); err != nil {
		return err
	}
	env, err := s.env(name)
	if err != nil {
		return err
	}
	if s.cfg.NoWANLatency && strings.HasPrefix(name, wanServicePrefix) {
		env["PAYMESH_WAN_LATENCY"] = "0"
	}
	args, err := s.args(name)
	if err != nil {
		return err
	}
	svc := s.plan.project.Services[name]
	return s.startProc(ctx, procSpec{Name: name, Path: s.binary(name), Args: args, Env: env,
		Restart: slices.Contains([]string{"always", "unless-stopped", "on-failure"}, svc.Restart)})
}

// startProc starts a process and waits until it listens on all its ports.
func (s *sim) startProc(ctx context.Context, spec procSpec) error {
	p, err := s.procs.start(spec)
	if err != nil {
		return err
	}
	ports := s.listenPorts(spec.Name)
	if err := s.waitReady(ctx, p, ports); err != nil {
		return err
	}
	s.logf("  %-14s pid %d, listening on %s", spec.Name, p.pid(), portList(ports))
	return nil
}

func portList(ports []int) string {
	var ss []string
	for _, p := range ports {
		ss = append(ss, strconv.Itoa(p))
	}
	if len(ss) == 0 {
		return "no port"
	}
	return strings.Join(ss, ", ")
}

// waitReady waits until the process itself listens on every port (a
// listener of another program does not count), and fails early when the
// process exits.
func (s *sim) waitReady(ctx context.Context, p *proc, ports []int) error {
	deadline := time.Now().Add(startTimeout)
	for _, port := range ports {
		for {
			if pid, _ := portPID(port); pid != 0 && pid == p.pid() {
				break
			}
			if done, exitErr := p.exited(); done {
				return fmt.Errorf("sim: %s exited before listening on port %d (%v): %s", p.spec.Name, port, exitErr, tail(p.log, 8))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sim: %s not listening on port %d after %s (the port is held%s): %s", p.spec.Name, port, startTimeout, or(portOwner(port), " by nobody"), tail(p.log, 8))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// routerLogs returns the last lines of each router's log, which say why a
// relay or a forward did not get through.
func (s *sim) routerLogs() []string {
	var out []string
	for _, name := range s.plan.of(kindService) {
		if p := s.procs.get(name); p != nil && strings.HasPrefix(name, "router") {
			out = append(out, fmt.Sprintf("%s's log ends: %s", name, tail(p.log, 12)))
		}
	}
	return out
}

// tail returns the last n lines of a log file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n    " + strings.Join(lines, "\n    ")
}

// runCommand runs a paymesh command service to completion, with extra
// arguments after compose's command.
func (s *sim) runCommand(ctx context.Context, name string, extra []string) error {
	p, err := s.startCommand(name, extra)
	if err != nil {
		return err
	}
	if err := p.wait(ctx); err != nil {
		return fmt.Errorf("sim: %w: %s", err, tail(p.log, 8))
	}
	s.logf("  %-14s ran: %s", name, strings.Join(p.spec.Args, " "))
	return nil
}

func (s *sim) startCommand(name string, extra []string) (*proc, error) {
	env, err := s.env(name)
	if err != nil {
		return nil, err
	}
	args, err := s.args(name)
	if err != nil {
		return nil, err
	}
	return s.procs.start(procSpec{Name: name, Path: s.binary(name), Args: append(args, extra...), Env: env})
}

// binary returns the binary a compose service runs: the lab's for the
// Dockerfile's lab target, else the product's.
func (s *sim) binary(name string) string {
	if s.plan.project.Services[name].Target == labTarget {
		return s.cfg.LabBinary
	}
	return s.cfg.Binary
}

// openStores opens each region's database in this process, for the checks.
func (s *sim) openStores(ctx context.Context) error {
	for _, r := range s.table.Regions {
		url, err := s.regionDB(r)
		if err != nil {
			return err
		}
		pool, err := postgres.Connect(ctx, url, 30*time.Second, 0)
		if err != nil {
			return fmt.Errorf("sim: region %s: %w", r.Name, err)
		}
		s.pools = append(s.pools, pool)
		s.stores[r.Name] = postgres.New(pool, postgres.Config{Region: r.Name, Regions: s.ids, Dedup: postgres.NewConsumeLog(dedup.New(dedup.Config{WindowDays: 7}))})
	}
	return nil
}

// regionDB returns the URL of a region's database as its ledger sees it
// (the ledger service's mapped PAYMESH_POSTGRES_URL and PAYMESH_DATABASE).
func (s *sim) regionDB(r regions.Region) (string, error) {
	env, err := s.env("ledger-" + r.Name)
	if err != nil {
		return "", err
	}
	db := env["PAYMESH_DATABASE"]
	if db == "" {
		db = r.Postgres.Database
	}
	return pgdb.WithDatabase(env["PAYMESH_POSTGRES_URL"], db)
}
