package paymesh_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// shipped are the folders of the code the product binary is built from.
var shipped = []string{"cmd/paymesh", "services", "platform", "pkg", "deploy"}

// Limits of the shipped code's shape (docs/ARCHITECTURE.md, "The tree,
// floor by floor"): package names that need no alias, and functions that
// read in one sitting.
const (
	maxAliases   = 5
	maxFuncLines = 80
)

// shape returns the named imports (aliases, not blank ones) and the
// functions longer than maxFuncLines of the non-test Go files under dirs.
func shape(t *testing.T, dirs ...string) (aliases, long []string) {
	t.Helper()
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				if imp.Name != nil && imp.Name.Name != "_" {
					aliases = append(aliases, fmt.Sprintf("%s: %s %s", path, imp.Name.Name, imp.Path.Value))
				}
			}
			for _, decl := range f.Decls {
				if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
					if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
						long = append(long, fmt.Sprintf("%s: %s is %d lines", path, fn.Name.Name, n))
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return aliases, long
}

// TestShippedCodeShape: the shipped code needs at most maxAliases import
// aliases, and none of its functions is over maxFuncLines lines.
func TestShippedCodeShape(t *testing.T) {
	aliases, long := shape(t, shipped...)
	if len(aliases) > maxAliases {
		t.Errorf("%d import aliases in shipped code, want at most %d:\n%s", len(aliases), maxAliases, strings.Join(aliases, "\n"))
	}
	for _, l := range long {
		t.Errorf("over %d lines: %s", maxFuncLines, l)
	}
}

// TestShapeCatches: the check sees an alias and a long function.
func TestShapeCatches(t *testing.T) {
	dir := t.TempDir()
	src := "package x\n\nimport str \"strings\"\n\nfunc long() {\n" + strings.Repeat("\t_ = str.ToUpper(\"\")\n", maxFuncLines) + "}\n"
	if err := writeFile(filepath.Join(dir, "x.go"), src); err != nil {
		t.Fatal(err)
	}
	aliases, long := shape(t, dir)
	if len(aliases) != 1 || len(long) != 1 {
		t.Fatalf("got aliases %q and long functions %q, want one of each", aliases, long)
	}
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }
