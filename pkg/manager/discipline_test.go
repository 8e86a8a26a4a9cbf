package manager_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The manager is the crash-safe core: an error it drops can leave a record,
// an intent or a device behind without a word in the log. So a call result
// assigned to the blank identifier, where it may be an error, needs a
// comment on its line or the line above saying why it may be dropped (or
// the error is handled instead: logged or returned).
//
// Without type information the check decides which results may be errors
// from the source alone: for a function or method declared in this
// package (interfaces included) by its declared result types, and for any
// other call by Go's convention that an error comes last. `_ = f()` always
// counts. Package-level `var _ I = (*T)(nil)` checks are not assignments
// and are left alone.

// TestDiscardedResultsAreExplained checks the package's non-test files.
func TestDiscardedResultsAreExplained(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatal("no source files found; the test must run in the package directory")
	}
	for _, p := range unexplainedDiscards(fset, files) {
		t.Errorf("%s: result of %s dropped into _ without a comment saying why (handle the error, or say why it may be dropped)", p.pos, p.call)
	}
}

// TestDiscardCheckCatches shows the check flags what it is meant to, so
// that a clean package means something.
func TestDiscardCheckCatches(t *testing.T) {
	const src = `package p

type Virt interface {
	Attach(h string) (bool, error)
}

func (m *M) read() (int, error) { return 0, nil }
func (m *M) pair() (string, bool) { return "", false }

func f(m *M, v Virt) {
	_ = m.db.Update(nil)
	n, _ := m.read()
	_, err := m.read()
	s, _ := m.pair()
	_, _ = v.Attach("x")
	live, _ := v.Attach("x")
	md, _ := cat.Model("x")
	// The payload is plain data: Marshal cannot fail.
	b, _ := json.Marshal(n)
	c, _ := json.Marshal(n) // cannot fail
	_ = b
	_, _, _, _, _, _ = err, s, live, md, c, n
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range unexplainedDiscards(fset, []*ast.File{f}) {
		got = append(got, fmt.Sprintf("%d %s", p.pos.Line, p.call))
	}
	want := []string{"11 m.db.Update", "12 m.read", "15 v.Attach", "16 v.Attach", "17 cat.Model"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("flagged %q, want %q", got, want)
	}
}

type discard struct {
	pos  token.Position
	call string
}

// unexplainedDiscards lists the assignments of call results to _ that may
// drop an error and carry no comment on their line or the line above.
func unexplainedDiscards(fset *token.FileSet, files []*ast.File) []discard {
	results := declaredResults(files)
	var out []discard
	for _, f := range files {
		commented := map[int]bool{}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				for l := fset.Position(c.Pos()).Line; l <= fset.Position(c.End()).Line; l++ {
					commented[l] = true
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || !dropsError(as, results) {
				return true
			}
			pos := fset.Position(as.Pos())
			if commented[pos.Line] || commented[pos.Line-1] {
				return true
			}
			call := ""
			for _, r := range as.Rhs {
				if c, ok := r.(*ast.CallExpr); ok {
					call = exprString(c.Fun)
					break
				}
			}
			out = append(out, discard{pos: pos, call: call})
			return true
		})
	}
	return out
}

// dropsError reports whether an assignment puts a call result that may be
// an error into _.
func dropsError(as *ast.AssignStmt, results map[string][][]bool) bool {
	if len(as.Rhs) == len(as.Lhs) {
		// One value per call: a call put whole into _ is dropped whole.
		for i, r := range as.Rhs {
			if _, ok := r.(*ast.CallExpr); ok && isBlank(as.Lhs[i]) {
				return true
			}
		}
		return false
	}
	call, ok := as.Rhs[0].(*ast.CallExpr)
	if !ok {
		return false // a map index, type assertion or receive: no error to drop
	}
	allBlank := true
	for _, l := range as.Lhs {
		allBlank = allBlank && isBlank(l)
	}
	if allBlank {
		return true
	}
	decls, local := results[calleeName(call.Fun)]
	for i, l := range as.Lhs {
		if !isBlank(l) {
			continue
		}
		if !local {
			if i == len(as.Lhs)-1 {
				return true
			}
			continue
		}
		for _, errs := range decls {
			if i < len(errs) && errs[i] {
				return true
			}
		}
	}
	return false
}

// declaredResults maps the name of every function, method and interface
// method declared in files to, per declaration, which results are errors.
func declaredResults(files []*ast.File) map[string][][]bool {
	out := map[string][][]bool{}
	add := func(name string, ft *ast.FuncType) {
		var errs []bool
		if ft.Results != nil {
			for _, fld := range ft.Results.List {
				isErr := exprString(fld.Type) == "error"
				for range max(1, len(fld.Names)) {
					errs = append(errs, isErr)
				}
			}
		}
		out[name] = append(out[name], errs)
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch d := n.(type) {
			case *ast.FuncDecl:
				add(d.Name.Name, d.Type)
			case *ast.InterfaceType:
				for _, m := range d.Methods.List {
					if ft, ok := m.Type.(*ast.FuncType); ok {
						for _, name := range m.Names {
							add(name.Name, ft)
						}
					}
				}
			}
			return true
		})
	}
	return out
}

// calleeName is the name a call is made by: f, x.f, f[T].
func calleeName(fun ast.Expr) string {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	case *ast.IndexExpr:
		return calleeName(f.X)
	case *ast.IndexListExpr:
		return calleeName(f.X)
	}
	return ""
}

func isBlank(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "_"
}

func exprString(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return exprString(x.X) + "." + x.Sel.Name
	case *ast.CallExpr:
		return exprString(x.Fun) + "()"
	case *ast.IndexExpr:
		return exprString(x.X) + "[…]"
	case *ast.StarExpr:
		return "*" + exprString(x.X)
	}
	return fmt.Sprintf("%T", e)
}
