package ledger_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"testing"

	"github.com/paymesh/paymesh/services/ledger"
)

// TestCodesComplete: Codes lists every Code constant that error.go
// declares, once each.
func TestCodesComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "error.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []ledger.Code
	ast.Inspect(f, func(n ast.Node) bool {
		v, ok := n.(*ast.ValueSpec)
		if !ok || v.Type == nil || len(v.Values) != 1 {
			return true
		}
		if id, ok := v.Type.(*ast.Ident); ok && id.Name == "Code" {
			if lit, ok := v.Values[0].(*ast.BasicLit); ok {
				s, _ := strconv.Unquote(lit.Value)
				declared = append(declared, ledger.Code(s))
			}
		}
		return true
	})
	got := ledger.Codes()
	if len(declared) < 10 || !slices.Equal(got, declared) {
		t.Fatalf("Codes() = %v, want the constants of error.go %v", got, declared)
	}
}
