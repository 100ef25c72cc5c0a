package sim

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/deploy/regions"
	"github.com/paymesh/paymesh/internal/lab/compose"
)

// mapperOf returns the compose file's mapper with the simulation's extra
// mappings.
func mapperOf(t *testing.T) (*sim, *compose.Mapper) {
	t.Helper()
	p, err := compose.Load(filepath.Join(root(t), composeFile), compose.AllProfiles)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := makePlan(p)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSim(Config{Root: root(t)}, io.Discard, pl)
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.Mapper(s.extraMappings())
	if err != nil {
		t.Fatal(err)
	}
	s.mapper = m
	return s, m
}

// TestRewriteConf: every nats config of docker-compose.yml, as each node
// that runs it, listens on loopback at the node's ports of regions.yaml
// (client, monitor and cluster route), stores JetStream in the run folder,
// routes to every node of its region at their route ports, and a region's
// leafnode remote goes to its mapped address.
func TestRewriteConf(t *testing.T) {
	s, m := mapperOf(t)
	for _, name := range s.plan.of(kindNATS) {
		svc := s.plan.project.Services[name]
		conf := svc.Command[len(svc.Command)-1]
		v, ok := svc.Mount(conf)
		if !ok {
			t.Fatalf("%s: command %v names no mounted config", name, svc.Command)
		}
		b, err := os.ReadFile(v.Source)
		if err != nil {
			t.Fatal(err)
		}
		out, err := rewriteConf(b, name, m, "/run/x")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := string(out)
		var want []string
		if name == hubService {
			want = []string{fmt.Sprintf("listen: 127.0.0.1:%d\n", s.table.Hub.ClientPort), fmt.Sprintf("http: 127.0.0.1:%d\n", s.table.Hub.MonitorPort),
				fmt.Sprintf("listen: 127.0.0.1:%d\n", s.table.Hub.LeafPort)}
		} else {
			r, i := nodeOf(t, s, name)
			n := r.NATS.Nodes[i]
			want = []string{fmt.Sprintf("listen: 127.0.0.1:%d\n", n.ClientPort), fmt.Sprintf("http: 127.0.0.1:%d\n", n.MonitorPort),
				fmt.Sprintf("  listen: 127.0.0.1:%d\n", n.RoutePort), `store_dir: "/run/x"`, "@127.0.0.1:"}
			for _, other := range r.NATS.Nodes {
				want = append(want, fmt.Sprintf("nats-route://127.0.0.1:%d\n", other.RoutePort)) // every node's route port
			}
			if _, ok := s.plan.project.Services[wanServicePrefix+r.Name]; ok {
				want = append(want, fmt.Sprintf("@127.0.0.1:%d\"", r.WANPort)) // through the region's WAN link
			}
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: rewritten config lacks %q:\n%s", name, w, got)
			}
		}
		for _, line := range strings.Split(got, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, bad := range []string{"0.0.0.0", "nats-hub:", "wan-", "/data", "://nats-"} {
				if strings.Contains(line, bad) {
					t.Errorf("%s: rewritten config still has %q: %s", name, bad, line)
				}
			}
		}
	}
}

// nodeOf returns the region and node index of a nats service of a
// region's cluster, failing the test for any other name.
func nodeOf(t *testing.T, s *sim, name string) (regions.Region, int) {
	t.Helper()
	for _, r := range s.table.Regions {
		if i := slices.Index(r.NodeNames(), name); i >= 0 {
			return r, i
		}
	}
	t.Fatalf("%s: not a node of a region's cluster in regions.yaml", name)
	return regions.Region{}, 0
}

// TestRewriteConfBadInput: a config without a client port, or with a
// remote the mapper cannot place, is an error naming the service.
func TestRewriteConfBadInput(t *testing.T) {
	_, m := mapperOf(t)
	for _, conf := range []string{
		"server_name: eu\nhttp: 8222\n",
		"port: 4222\nleafnodes { remotes = [ { url: \"nats-leaf://u:p@nowhere:7422\" } ] }\n",
		"port: 4999\n",
		"port: 4222\ncluster { port: 6222, routes: [nats-route://nats-mars-1:6222] }\n",
	} {
		if _, err := rewriteConf([]byte(conf), "nats-eu", m, "/x"); err == nil || !strings.Contains(err.Error(), "nats-eu") {
			t.Errorf("config %q: got %v, want an error naming nats-eu", conf, err)
		}
	}
}

// TestCheckPorts names the port taken and the process holding it.
func TestCheckPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	err = checkPorts(map[int]string{port: "api-eu"})
	want := fmt.Sprintf("port %d (api-eu) is taken by %s (pid %d)", port, filepath.Base(os.Args[0])[:min(15, len(filepath.Base(os.Args[0])))], os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
	ln.Close()
	if err := checkPorts(map[int]string{port: "api-eu"}); err != nil {
		t.Fatalf("a free port: %v", err)
	}
}
