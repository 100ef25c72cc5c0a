package sim

import (
	"context"
	"flag"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paymesh/paymesh/internal/lab/compose"
	"github.com/paymesh/paymesh/internal/testbed/pgserver"
	"github.com/paymesh/paymesh/internal/testbed/promcheck"
)

// long puts the tests that run compose's whole topology (minutes each, nine
// Postgres servers among their processes) in the run: make test-long passes
// it; make test runs the quick simulation instead.
var long = flag.Bool("sim.long", false, "run the tests that start compose's whole topology (make test-long)")

// needSim skips the test unless a simulation can run here: -sim.long, not
// -short, the local PostgreSQL and Prometheus binaries installed, and every fixed
// port of the simulation free (a `make sim` or a demo running alongside
// holds them; the test then skips rather than fight it). It returns the
// config of a run with the product and lab binaries, built into a
// temporary folder.
func needSim(t *testing.T) Config {
	t.Helper()
	if testing.Short() || !*long {
		t.Skip("runs the whole topology as processes: make test-long (-sim.long)")
	}
	if err := pgserver.Available(); err != nil {
		t.Skip(err)
	}
	if err := promcheck.Installed(); err != nil {
		t.Skip(err)
	}
	r := root(t)
	p, err := compose.Load(filepath.Join(r, composeFile), compose.AllProfiles)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := makePlan(p)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSim(Config{Root: r}, io.Discard, pl)
	if err != nil {
		t.Fatal(err)
	}
	if s.mapper, err = p.Mapper(s.extraMappings()); err != nil {
		t.Fatal(err)
	}
	if err := checkPorts(s.ports()); err != nil {
		t.Skipf("the simulation's ports are not free: %v", err)
	}
	dir := t.TempDir()
	bins := map[string]string{}
	for _, name := range []string{"paymesh", "paymesh-lab"} {
		bins[name] = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", bins[name], "./cmd/"+name)
		cmd.Dir = r
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v: %s", name, err, out)
		}
	}
	return Config{Root: r, Binary: bins["paymesh"], LabBinary: bins["paymesh-lab"], Seed: 1}
}

// lineWriter is a concurrency-safe writer that calls on for each line.
type lineWriter struct {
	mu  sync.Mutex
	buf strings.Builder
	on  func(line string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if w.on != nil {
		for _, l := range strings.Split(string(b), "\n") {
			w.on(l)
		}
	}
	return len(b), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestCancelFreesEverything cancels a run once its topology is up and the
// load runs, and checks that every port of the simulation is free again,
// no process of the run is left (the Postgres servers, which run as
// another user, among them) and their volumes are gone.
func TestCancelFreesEverything(t *testing.T) {
	cfg := needSim(t)
	cfg.Load = 20 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	servers := 0
	out := &lineWriter{on: func(l string) {
		if strings.HasPrefix(l, "load: ") {
			time.AfterFunc(2*time.Second, cancel)
		}
		if strings.Contains(l, "pg_auto_failover") && strings.Contains(l, "ready in") {
			servers++
		}
	}}
	s, err := prepare(cfg, out)
	if err != nil {
		t.Fatal(err)
	}
	ports := s.ports()
	_, err = s.run(ctx)
	s.cleanup()
	if err == nil || ctx.Err() == nil {
		t.Fatalf("run: got %v before the cancel, want it canceled; output:\n%s", err, out)
	}
	if servers == 0 {
		t.Fatalf("no Postgres server started; output:\n%s", out)
	}
	if err := checkPorts(ports); err != nil {
		t.Fatalf("after the cancel: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.dir, volumesDir)); !os.IsNotExist(err) {
		t.Errorf("the volumes' folder %s still exists (%v)", filepath.Join(s.dir, volumesDir), err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cwd")
	for _, p := range procs {
		if cwd, err := os.Readlink(p); err == nil && strings.HasPrefix(cwd, s.dir+"/") {
			cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			t.Errorf("process %s still works in the run folder (%s): %s", filepath.Base(filepath.Dir(p)), cwd, strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	for port, svc := range ports {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 200*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("port %d (%s) still answers", port, svc)
		}
	}
}

// TestLoseCommandsFails: a run that purges eu's ledger stream while its
// ledger is down loses commands already acknowledged to their publishers:
// the saga steps relayed into eu (and any request an API handed to the
// stream). It must end in FAIL and name the keys: those never recorded,
// or those whose transfer a lost step left unfinished.
func TestLoseCommandsFails(t *testing.T) {
	cfg := needSim(t)
	cfg.Load, cfg.Faults, cfg.LoseCommands = 24*time.Second, []string{FaultKillAPI}, true
	out := &lineWriter{}
	rep, err := Run(context.Background(), cfg, out)
	if err != nil {
		t.Fatalf("%v; output:\n%s", err, out)
	}
	rep.Print(out)
	if rep.OK() {
		t.Fatalf("the run passed, want FAIL; output:\n%s", out)
	}
	named := map[string][]string{
		"every acknowledged key is in its home ledger":  rep.Lost,
		"every recorded transfer reached a final state": rep.Stuck,
	}
	failed := 0
	for _, c := range rep.Checks {
		for prefix, keys := range named {
			if !strings.HasPrefix(c.Name, prefix) || len(keys) == 0 {
				continue
			}
			if c.OK || !strings.Contains(c.Detail, strings.Fields(keys[0])[0]) {
				t.Fatalf("check %+v: want FAIL naming key %s", c, keys[0])
			}
			failed++
		}
	}
	if failed == 0 {
		t.Fatalf("no key named as lost or left unfinished; output:\n%s", out)
	}
}
