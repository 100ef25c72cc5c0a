package ledger_test

import (
	"go/parser"
	"go/token"
	"os"
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
