package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paymesh/paymesh/internal/lab/compose"
)

// root is the repository, two folders up from this package.
func root(tb testing.TB) string {
	tb.Helper()
	r, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// TestEveryComposeServiceHasACounterpart: every service of
// docker-compose.yml, all profiles, is run by the simulation or named in
// NotRun with its reason, and NotRun names only images the file uses.
func TestEveryComposeServiceHasACounterpart(t *testing.T) {
	p, err := compose.Load(filepath.Join(root(t), composeFile), compose.AllProfiles)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := makePlan(p)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, s := range p.Services {
		used[imageName(s.Image)] = true
	}
	for img, why := range NotRun {
		if !used[img] {
			t.Errorf("NotRun names image %s, which docker-compose.yml does not use", img)
		}
		if why == "" {
			t.Errorf("NotRun: image %s without a reason", img)
		}
	}
	for _, k := range []kind{kindNATS, kindFormation, kindPrometheus, kindJaeger, kindService, kindSetup, kindLoad, kindTool} {
		if len(pl.of(k)) == 0 {
			t.Errorf("no service runs as a %s", k)
		}
	}
	// The WAN links, the load and the development PKI run from the lab
	// binary, every region service and tool from the product's.
	sm := &sim{plan: pl, cfg: Config{Binary: "paymesh", LabBinary: "paymesh-lab"}}
	for n, k := range pl.kinds {
		if k < kindService {
			continue
		}
		want := "paymesh"
		if c := p.Services[n].Command[0]; c == "wan" || c == "load" || c == "certs" {
			want = "paymesh-lab"
		}
		if got := sm.binary(n); got != want {
			t.Errorf("%s (%s) runs %s, want %s", n, p.Services[n].Command[0], got, want)
		}
	}
	if len(pl.order) != len(pl.kinds) {
		t.Fatalf("start order has %d services, want %d", len(pl.order), len(pl.kinds))
	}
	pos := map[string]int{}
	for i, n := range pl.order {
		pos[n] = i
	}
	for n := range pl.kinds {
		for d := range p.Services[n].DependsOn {
			if _, run := pl.kinds[d]; run && pos[d] > pos[n] {
				t.Errorf("%s starts before its dependency %s", n, d)
			}
		}
	}
}

// TestServiceWithoutCounterpart: a service the simulation cannot run and
// NotRun does not name fails the plan, by name.
func TestServiceWithoutCounterpart(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(t), composeFile))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "\nservices:\n", "\nservices:\n  cache:\n    image: redis:7\n  tool:\n    build: {context: ., target: debug}\n    command: [\"verify\"]\n", 1)
	if s == string(b) {
		t.Fatal("no services: line in docker-compose.yml")
	}
	path := filepath.Join(t.TempDir(), composeFile)
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := compose.Load(path, compose.AllProfiles)
	if err != nil {
		t.Fatal(err)
	}
	_, err = makePlan(p)
	if err == nil || !strings.Contains(err.Error(), `cache (image "redis:7"`) || !strings.Contains(err.Error(), "tool (") {
		t.Fatalf("got %v, want an error naming the service cache, and tool (a Dockerfile target that is neither the product nor the lab)", err)
	}
}
