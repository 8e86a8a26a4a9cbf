package conventions

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// docs/architecture.md is the map of the tree; these tests keep it true:
// every package and every file of cmd/vgpud has its row, every path the
// doc names exists, and no comment cites a document (or a section of one)
// that does not exist.

const archDoc = "docs/architecture.md"

// archRow is one row of the doc's package table.
type archRow struct {
	paths []string // the backticked paths of the first cell: "pkg/gpu", "bench/"
	text  string   // the whole row
}

func TestArchitectureRows(t *testing.T) {
	root := filepath.Join("..", "..")
	doc := readFile(t, filepath.Join(root, archDoc))
	rows := packageRows(doc)
	if len(rows) < 20 {
		t.Fatalf("found %d rows in %s's package table; is the parse right?", len(rows), archDoc)
	}
	pkgs, err := packageDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range missingRows(rows, pkgs) {
		t.Error(p)
	}
	files, err := goFiles(filepath.Join(root, "cmd", "vgpud"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range unnamedFiles(rows, "cmd/vgpud", files) {
		t.Error(p)
	}
}

func TestArchitecturePaths(t *testing.T) {
	root := filepath.Join("..", "..")
	doc := readFile(t, filepath.Join(root, archDoc))
	for _, p := range missingPaths(root, doc) {
		t.Error(p)
	}
}

func TestCommentsCiteDocs(t *testing.T) {
	root := filepath.Join("..", "..")
	cites, err := docCitations(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(cites) < 10 {
		t.Fatalf("found %d citations of documents in comments; is the parse right?", len(cites))
	}
	for _, p := range badCitations(root, cites) {
		t.Error(p)
	}
}

// TestArchitectureChecksCatch: each check finds what it is for.
func TestArchitectureChecksCatch(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "pkg", "a", "a.go"), "package a\n")
	write(t, filepath.Join(root, "pkg", "a", "b.go"), "package a\n")
	write(t, filepath.Join(root, "pkg", "c", "c.go"), "package c\n")
	write(t, filepath.Join(root, "bench", "x", "x.go"), "package main\n")
	write(t, filepath.Join(root, "docs", "real.md"), "# Real\n\n## A section\n")
	write(t, filepath.Join(root, "pkg", "d", "d.go"), `// Package d (see docs/gone.md, and docs/real.md, "No such section";
// docs/real.md, "A section" is fine, and so is ../../docs/real.md).
package d
`)
	doc := "# T\n\n## Packages\n\n| path | owns |\n|---|---|\n" +
		"| `pkg/a` | a (a.go, gone.go) |\n" +
		"| `bench/` | benchmarks |\n" +
		"| `pkg/e` | e |\n\nSee pkg/a/a.go, pkg/nowhere/x.go and `missing.go`.\n"
	rows := packageRows(doc)
	pkgs, err := packageDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	files, err := goFiles(filepath.Join(root, "pkg", "a"))
	if err != nil {
		t.Fatal(err)
	}
	cites, err := docCitations(root)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(slices.Concat(missingRows(rows, pkgs), unnamedFiles(rows, "pkg/a", files),
		missingPaths(root, doc), badCitations(root, cites)), "\n")
	for _, want := range []string{
		"package pkg/c has no row",
		"package pkg/d has no row",
		"pkg/a/b.go is not named in the `pkg/a` row",
		"names gone.go in the `pkg/a` row",
		"names pkg/nowhere/x.go",
		"names pkg/e",
		"names missing.go",
		"pkg/d/d.go cites docs/gone.md",
		`pkg/d/d.go cites docs/real.md, "No such section"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("checker missed %q; it said:\n%s", want, got)
		}
	}
	for _, clean := range []string{"package pkg/a ", "bench/x", "pkg/a/a.go", `"A section"`, "../../docs/real.md"} {
		if strings.Contains(got, clean) {
			t.Errorf("checker blamed %s, which is right:\n%s", clean, got)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var backticked = regexp.MustCompile("`([^`]+)`")

// packageRows reads the table under "## Packages".
func packageRows(doc string) []archRow {
	_, table, _ := strings.Cut(doc, "\n## Packages\n")
	table, _, _ = strings.Cut(table, "\n## ")
	var rows []archRow
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.TrimSpace(cells[0]) != "" {
			continue
		}
		var row archRow
		for _, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			row.paths = append(row.paths, m[1])
		}
		if len(row.paths) == 0 {
			continue // the header and its rule
		}
		row.text = line
		rows = append(rows, row)
	}
	return rows
}

// packageDirs lists every directory of the module holding Go files (test
// files too: e2e has nothing else), as go list ./... does.
func packageDirs(root string) ([]string, error) {
	seen := map[string]bool{}
	err := walkGoFiles(root, func(path string) error {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		if hasBuildIgnore(f) {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		seen[filepath.ToSlash(rel)] = true
		return nil
	})
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out, err
}

// goFiles lists the non-test Go files of one directory.
func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			out = append(out, n)
		}
	}
	return out, nil
}

// missingRows: a package is in the table when the first cell of a row
// names it, or names a tree ("bench/") it is under.
func missingRows(rows []archRow, pkgs []string) []string {
	var problems []string
	for _, p := range pkgs {
		found := false
		for _, r := range rows {
			for _, path := range r.paths {
				if path == p || strings.HasSuffix(path, "/") && strings.HasPrefix(p+"/", path) {
					found = true
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("package %s has no row in %s's package table: add a row whose first cell is `%s` and say what it owns", p, archDoc, p))
		}
	}
	return problems
}

// unnamedFiles: every file of the package named in the row for dir.
func unnamedFiles(rows []archRow, dir string, files []string) []string {
	var row *archRow
	for i, r := range rows {
		if slices.Contains(r.paths, dir) {
			row = &rows[i]
		}
	}
	if row == nil {
		return []string{fmt.Sprintf("%s has no row whose first cell is `%s`", archDoc, dir)}
	}
	var problems []string
	for _, f := range unnamedInText(row.text, files) {
		problems = append(problems, fmt.Sprintf("%s/%s is not named in the `%s` row of %s: add %s to that row with what it holds", dir, f, dir, archDoc, f))
	}
	return problems
}

var (
	// repoPath: a path from the repository's root, as the doc writes one.
	repoPath = regexp.MustCompile(`(?:^|[\s(\x60'"|,])((?:cmd|pkg|internal|docs|bench|e2e|dashboards|cockpit|profiles|scripts|systemd)/[\w./*-]*)`)
	// fileName: a file named without its directory ("serve.go",
	// "dbus/bus.conf.in"): in a row, below the row's package; elsewhere
	// (only .go files), anywhere in the tree.
	fileName = regexp.MustCompile(`(?:^|[\s(\x60'"|,])([\w-]+(?:/[\w.-]+)*\.(?:go|py|in|md|sh))\b`)
)

// missingPaths returns every path the doc names that is not in the tree.
func missingPaths(root, doc string) []string {
	var problems []string
	exists := func(p string) bool {
		m, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(p)))
		return len(m) > 0
	}
	checked := map[string]bool{}
	for _, m := range repoPath.FindAllStringSubmatch(doc, -1) {
		p := strings.TrimRight(m[1], ".,:;")
		if checked[p] {
			continue
		}
		checked[p] = true
		if !exists(p) {
			problems = append(problems, fmt.Sprintf("%s names %s, which is not in the tree: correct the path or drop it", archDoc, p))
		}
	}
	rows := packageRows(doc)
	inRow := map[string]bool{}
	for _, r := range rows {
		for _, m := range fileName.FindAllStringSubmatch(r.text, -1) {
			name := m[1]
			if repoPath.MatchString(" " + name) {
				continue
			}
			inRow[name] = true
			found := false
			for _, dir := range r.paths {
				found = found || exists(strings.TrimSuffix(dir, "/")+"/"+name)
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s names %s in the `%s` row, which is in none of %s", archDoc, name, r.paths[0], strings.Join(r.paths, ", ")))
			}
		}
	}
	var all map[string]bool
	for _, m := range fileName.FindAllStringSubmatch(doc, -1) {
		name := m[1]
		if inRow[name] || !strings.HasSuffix(name, ".go") || strings.Contains(name, "/") || checked[name] {
			continue
		}
		checked[name] = true
		if all == nil {
			all = allFileNames(root)
		}
		if !all[name] {
			problems = append(problems, fmt.Sprintf("%s names %s, which no directory of the tree holds: correct the name or drop it", archDoc, name))
		}
	}
	return problems
}

func allFileNames(root string) map[string]bool {
	all := map[string]bool{}
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			all[d.Name()] = true
		}
		return nil
	})
	return all
}

// citation is one mention of a document in a Go comment.
type citation struct {
	file    string // module-relative
	doc     string // as written: "docs/fleet.md"
	section string // the quoted section after it, if any
}

// docCite: a document, then perhaps ", "Section"" (the quote may be
// typographic or single).
var docCite = regexp.MustCompile(`([\w./-]*[\w-]+\.md)\b(?:,\s+["“']([^"”']+)["”'])?`)

// docCitations reads every comment of every Go file, test files too.
func docCitations(root string) ([]citation, error) {
	var out []citation
	err := walkGoFiles(root, func(path string) error {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, c := range f.Comments {
			text := strings.Join(strings.Fields(c.Text()), " ")
			for _, m := range docCite.FindAllStringSubmatch(text, -1) {
				out = append(out, citation{file: filepath.ToSlash(rel), doc: m[1], section: m[2]})
			}
		}
		return nil
	})
	return out, err
}

// badCitations: a cited document must exist (from the repository's root,
// from the citing file's directory, or under docs/), and a cited section
// must be one of its headings.
func badCitations(root string, cites []citation) []string {
	var problems []string
	for _, c := range cites {
		var text []byte
		for _, p := range []string{c.doc, filepath.Join(filepath.Dir(c.file), c.doc), filepath.Join("docs", c.doc)} {
			if b, err := os.ReadFile(filepath.Join(root, p)); err == nil {
				text = b
				break
			}
		}
		cite := c.doc
		if c.section != "" {
			cite += `, "` + c.section + `"`
		}
		switch {
		case text == nil:
			problems = append(problems, fmt.Sprintf("%s cites %s, which does not exist: cite the document that says it (docs/*.md)", c.file, cite))
		case c.section != "" && !hasHeading(string(text), c.section):
			problems = append(problems, fmt.Sprintf("%s cites %s, which has no such heading: cite one of its headings", c.file, cite))
		}
	}
	return problems
}

func hasHeading(doc, section string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, "#") && strings.Contains(strings.ToLower(l), strings.ToLower(section)) {
			return true
		}
	}
	return false
}

// TestManagerDocMap: pkg/manager's package doc (doc.go) places every file
// of the package in its map.
func TestManagerDocMap(t *testing.T) {
	dir := filepath.Join("..", "..", "pkg", "manager")
	files, err := goFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	doc := readFile(t, filepath.Join(dir, "doc.go"))
	files = slices.DeleteFunc(files, func(f string) bool { return f == "doc.go" })
	for _, p := range unnamedInText(doc, files) {
		t.Errorf("pkg/manager/%s is not in pkg/manager/doc.go's map of files: add it to its group (operations, recovery, views, ports)", p)
	}
}

// unnamedInText returns the files text does not name.
func unnamedInText(text string, files []string) []string {
	var out []string
	for _, f := range files {
		if !regexp.MustCompile(`(^|[^\w./-])` + regexp.QuoteMeta(f) + `($|[^\w])`).MatchString(text) {
			out = append(out, f)
		}
	}
	return out
}
