// Package paymesh_test holds the module's package-role rules.
package paymesh_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/paymesh/paymesh"

// roles, from the bottom up. A package may depend on its own role and the
// roles listed under may; anything of the module that is not listed is
// refused. Test files are not counted: a test may use a test bed.
var roles = []struct {
	role   string
	prefix []string
	may    []string
}{
	// Libraries anyone could import: nothing of the module but each other.
	{"library", []string{"pkg/"}, nil},
	// What the services share: logins, connections, migrations, telemetry.
	{"platform", []string{"platform/"}, []string{"library"}},
	// The shipped services.
	{"service", []string{"services/"}, []string{"library", "platform"}},
	// Per-region configuration, read by the services' commands and by tests.
	{"deploy", []string{"deploy/"}, []string{"library", "platform", "service"}},
	// Test beds: clusters, embedded NATS, fault proxy, per-test databases.
	{"testbed", []string{"internal/testbed/"}, []string{"library", "platform", "service", "deploy"}},
	// The lab: demo, bench, chaos, dashboard, load, simulation.
	{"lab", []string{"internal/lab/"}, []string{"library", "platform", "service", "deploy", "testbed"}},
	// The product: the services and the operator's tools (cmd/paymesh).
	{"product", []string{"cmd/paymesh/"}, []string{"library", "platform", "service", "deploy"}},
	// The lab's command (cmd/paymesh-lab): demo, sim, chaos, bench, load, wan.
	{"lab command", []string{"cmd/paymesh-lab/"}, []string{"library", "platform", "service", "deploy", "testbed", "lab"}},
}

// roleOf returns the role of a package of the module, or "".
func roleOf(pkg string) string {
	rel := strings.TrimPrefix(pkg, module+"/") + "/"
	for _, r := range roles {
		for _, p := range r.prefix {
			if strings.HasPrefix(rel, p) {
				return r.role
			}
		}
	}
	return ""
}

// violations returns, for each package, the imports that break its role's
// rule (non-test dependencies, direct and indirect).
func violations(pkgs map[string][]string) []string {
	allowed := map[string]map[string]bool{}
	for _, r := range roles {
		allowed[r.role] = map[string]bool{r.role: true}
		for _, m := range r.may {
			allowed[r.role][m] = true
		}
	}
	var out []string
	for pkg, deps := range pkgs {
		role := roleOf(pkg)
		if pkg == module {
			continue // this test's own package
		}
		if role == "" {
			out = append(out, pkg+" has no role (see roles)")
			continue
		}
		for _, d := range deps {
			if !strings.HasPrefix(d, module+"/") && d != module {
				continue
			}
			if dr := roleOf(d); !allowed[role][dr] {
				out = append(out, pkg+" ("+role+") depends on "+d+" ("+dr+")")
			}
		}
	}
	return out
}

// TestPackageRoles fails when a package depends on a role above its own:
// for example a shipped service on a test bed or the lab, or the platform
// on a service.
func TestPackageRoles(t *testing.T) {
	pkgs := goList(t, "./...")
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages of the module: want them all", len(pkgs))
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestPackageRolesCatch: the rule refuses a service that imports the lab
// or a test bed, and the platform importing a service (telemetry reading a
// service's counters, say: each service registers its own instruments).
func TestPackageRolesCatch(t *testing.T) {
	bad := map[string][]string{
		module + "/services/ledger/ledgerd": {module + "/internal/lab/chaos"},
		module + "/services/api":            {module + "/internal/testbed/cluster"},
		module + "/platform/pgdb":           {module + "/services/ledger"},
		module + "/platform/telemetry":      {module + "/services/router"},
		module + "/pkg/dedup":               {module + "/platform/pgdb"},
	}
	if got := violations(bad); len(got) != len(bad) {
		t.Fatalf("got %d violations, want %d: %q", len(got), len(bad), got)
	}
	ok := map[string][]string{
		module + "/internal/lab/chaos":      {module + "/internal/testbed/cluster", module + "/services/ledger"},
		module + "/services/ledger/ledgerd": {module + "/platform/pgdb", module + "/pkg/dedup", "github.com/jackc/pgx/v5"},
	}
	if got := violations(ok); len(got) != 0 {
		t.Fatalf("got violations %q, want none", got)
	}
}

// notInProduct are the packages the product binary must not link: the lab,
// the test beds, and an embedded nats-server (the lab's and the tests'
// topology), by import path prefix.
var notInProduct = []string{module + "/internal/lab/", module + "/internal/testbed/", "github.com/nats-io/nats-server/"}

// labIn returns the packages of deps that the product must not link.
func labIn(deps []string) []string {
	var out []string
	for _, d := range deps {
		for _, p := range notInProduct {
			if strings.HasPrefix(d+"/", p) {
				out = append(out, d)
			}
		}
	}
	return out
}

// TestProductShipsNoLab: `go list -deps ./cmd/paymesh`, the binary the
// product image holds, lists no lab, test-bed or nats-server package.
func TestProductShipsNoLab(t *testing.T) {
	pkgs := goList(t, "-deps", "./cmd/paymesh")
	if _, ok := pkgs[module+"/services/ledger/ledgerd"]; !ok {
		t.Fatalf("go list -deps ./cmd/paymesh lists no ledger (%d packages): want every dependency", len(pkgs))
	}
	var deps []string
	for p := range pkgs {
		deps = append(deps, p)
	}
	for _, d := range labIn(deps) {
		t.Errorf("the product binary links %s", d)
	}
	if got := labIn([]string{module + "/internal/lab/chaos", "github.com/nats-io/nats-server/v2/server", module + "/internal/testbed/natsembed", module + "/services/api"}); len(got) != 3 {
		t.Errorf("labIn found %q, want the lab, the nats-server and the test bed", got)
	}
}

// goList returns every package of patterns with its non-test dependencies.
func goList(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	args := []string{"list", "-json=ImportPath,Deps"}
	if len(patterns) == 0 || patterns[0] != "-deps" {
		args = append(args, "-deps=false")
	}
	cmd := exec.Command("go", append(args, patterns...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(out)
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p.Deps
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	return pkgs
}
