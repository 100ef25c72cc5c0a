package ledger_test

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestDomainImports keeps the domain free of adapters: no pgx, NATS or
// OpenTelemetry in services/ledger itself.
func TestDomainImports(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, banned := range []string{"github.com/jackc/pgx", "github.com/nats-io", "go.opentelemetry.io"} {
				if strings.HasPrefix(path, banned) {
					t.Errorf("%s imports %s: the domain must not depend on an adapter", e.Name(), path)
				}
			}
		}
	}
}

// TestLedgerDoesNotLinkAPI keeps the HTTP API out of the ledger's build:
// the apply transaction records first answers through the ledger adapter's
// Answers interface, which the API implements and the wiring hands in.
func TestLedgerDoesNotLinkAPI(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/paymesh/paymesh/services/ledger/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/paymesh/paymesh/services/api" || strings.HasPrefix(dep, "github.com/paymesh/paymesh/services/api/") {
			t.Errorf("services/ledger/... depends on %s", dep)
		}
	}
}
