package conventions

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/vgpud/vgpud"

// pkgInfo is one package of the module as the rules see it: where it is,
// what its doc comment allows, and what its non-test files import.
type pkgInfo struct {
	dir string // module-relative, "pkg/gpu"
	// rule is the text after "Imports:" in the package doc; "" when the
	// doc has no such line.
	rule    string
	imports []string // every import path of its non-test files
}

// execAllowed are the trees whose non-test code may run other programs:
// test harnesses and benchmark drivers. The daemon and the CLI never do.
var execAllowed = []string{"internal/testenv/...", "bench/..."}

func TestImportRules(t *testing.T) {
	pkgs, err := loadPackages(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages; is the module root right?", len(pkgs))
	}
	for _, p := range checkImports(pkgs) {
		t.Error(p)
	}
}

// TestImportRulesCatchViolations: the checker itself finds each kind of
// broken rule.
func TestImportRulesCatchViolations(t *testing.T) {
	pkgs := []pkgInfo{
		{dir: "pkg/a", rule: "nothing from vgpud.", imports: []string{"fmt", module + "/pkg/b"}},
		{dir: "pkg/b", rule: "pkg/c.", imports: []string{"os/exec"}},
		{dir: "pkg/c", imports: nil},
		{dir: "pkg/d", rule: "pkg/sub/..., pkg/c.", imports: []string{module + "/pkg/sub/x", module + "/pkg/c"}},
		{dir: "internal/testenv/x", rule: "nothing from vgpud.", imports: []string{"os/exec"}},
	}
	got := strings.Join(checkImports(pkgs), "\n")
	for _, want := range []string{
		"pkg/a imports pkg/b, which its package doc does not allow",
		"pkg/b: its package doc says it imports pkg/c, which it does not",
		"pkg/b imports os/exec",
		"pkg/c: its package doc has no",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("checker missed %q; it said:\n%s", want, got)
		}
	}
	for _, clean := range []string{"pkg/d", "internal/testenv/x"} {
		if strings.Contains(got, clean+" ") || strings.Contains(got, clean+":") {
			t.Errorf("checker blamed %s, which keeps its rule:\n%s", clean, got)
		}
	}
}

// checkImports returns every way a package breaks its stated rule.
func checkImports(pkgs []pkgInfo) []string {
	var problems []string
	for _, p := range pkgs {
		for _, imp := range p.imports {
			if imp == "os/exec" && !allowedBy(execAllowed, p.dir) {
				problems = append(problems, p.dir+" imports os/exec: only test harnesses run other programs")
			}
		}
		if p.rule == "" {
			problems = append(problems, p.dir+`: its package doc has no "Imports:" line saying which of the module's packages it may import`)
			continue
		}
		allowed := parseRule(p.rule)
		var used []string
		for _, imp := range p.imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			used = append(used, rel)
			if !allowedBy(allowed, rel) {
				problems = append(problems, p.dir+" imports "+rel+", which its package doc does not allow (Imports: "+p.rule+")")
			}
		}
		for _, a := range allowed {
			if !strings.HasSuffix(a, "/...") && !slices.Contains(used, a) {
				problems = append(problems, p.dir+": its package doc says it imports "+a+", which it does not")
			}
		}
	}
	return problems
}

// parseRule reads "pkg/gpu, pkg/profile." or "nothing from vgpud.".
func parseRule(rule string) []string {
	rule = strings.TrimSuffix(strings.TrimSpace(rule), ".")
	if strings.HasPrefix(rule, "nothing") {
		return nil
	}
	var out []string
	for _, f := range strings.Split(rule, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func allowedBy(rules []string, dir string) bool {
	for _, r := range rules {
		if sub, ok := strings.CutSuffix(r, "/..."); ok {
			if dir == sub || strings.HasPrefix(dir, sub+"/") {
				return true
			}
		} else if dir == r {
			return true
		}
	}
	return false
}

// walkGoFiles calls fn with every Go file of the module under root, as go
// list ./... sees them: .git, testdata, bin and node_modules are skipped.
func walkGoFiles(root string, fn func(path string) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "bin", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		return fn(path)
	})
}

// loadPackages reads every package of the module under root: the doc
// comment's Imports line and the imports of its non-test files.
func loadPackages(root string) ([]pkgInfo, error) {
	byDir := map[string]*pkgInfo{}
	err := walkGoFiles(root, func(path string) error {
		if strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" && hasBuildIgnore(f) {
			return nil
		}
		p := byDir[rel]
		if p == nil {
			p = &pkgInfo{dir: rel}
			byDir[rel] = p
		}
		for _, imp := range f.Imports {
			s, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(p.imports, s) {
				p.imports = append(p.imports, s)
			}
		}
		if f.Doc != nil {
			if r, ok := importsLine(f.Doc); ok {
				p.rule = r
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]pkgInfo, 0, len(byDir))
	for _, p := range byDir {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].dir < out[j].dir })
	return out, nil
}

// importsLine finds "Imports: ..." in a doc comment; the rule may run on
// to the next lines until a line ends with a period.
func importsLine(doc *ast.CommentGroup) (string, bool) {
	lines := strings.Split(doc.Text(), "\n")
	for i, l := range lines {
		// An indented line is an example in a code block, not the rule.
		rest, ok := strings.CutPrefix(l, "Imports:")
		if !ok {
			continue
		}
		rule := strings.TrimSpace(rest)
		for j := i + 1; !strings.HasSuffix(rule, ".") && j < len(lines) && strings.TrimSpace(lines[j]) != ""; j++ {
			rule += " " + strings.TrimSpace(lines[j])
		}
		return rule, true
	}
	return "", false
}

// hasBuildIgnore reports a file kept out of builds (a generator run with
// go run), which is not part of its directory's package.
func hasBuildIgnore(f *ast.File) bool {
	for _, c := range f.Comments {
		for _, l := range c.List {
			if strings.HasPrefix(l.Text, "//go:build ignore") {
				return true
			}
		}
	}
	return false
}
