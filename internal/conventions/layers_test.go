package conventions

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// floor is one layer of the module: its packages may import the module's
// packages on the floors it names, and no others (its own only when it
// names itself). Each package's "Imports:" line says exactly what it
// imports; the floors say what any package at that height may import at
// all, so editing a package's own line cannot let an upward import in.
type floor struct {
	name      string
	pkgs      []string // module-relative; "x/..." for a tree
	mayImport []string // floor names
}

// floors is the module's layering, bottom up: the one declaration that
// TestLayers holds every package's imports to (docs/architecture.md,
// "Layers").
var floors = []floor{
	{name: "base", pkgs: []string{
		"pkg/gpu", "pkg/profile", "pkg/tenant", "pkg/version", "pkg/uevent", "pkg/placementapi",
		"pkg/gpu/sim/workload", "internal/hostcall", "pkg/metricsweb", "profiles", "dashboards",
	}},
	{name: "backends", mayImport: []string{"base"}, pkgs: []string{
		"pkg/gpu/nvml", "pkg/gpu/sysfs", "pkg/gpu/sim", "pkg/virt", "pkg/store", "pkg/placement", "pkg/share",
	}},
	{name: "views", mayImport: []string{"base", "backends"}, pkgs: []string{
		"pkg/discover", "pkg/share/nvmldriver", "pkg/metrics", "pkg/config", "internal/invariant",
	}},
	{name: "manager", mayImport: []string{"base", "backends", "views"}, pkgs: []string{
		"pkg/manager",
	}},
	{name: "services", mayImport: []string{"base", "backends", "views", "manager"}, pkgs: []string{
		"pkg/apply", "pkg/fleet", "pkg/health", "pkg/share/managersource", "pkg/metrics/forward",
	}},
	{name: "api", mayImport: []string{"base", "backends", "views", "manager", "services"}, pkgs: []string{
		"pkg/dbusapi",
	}},
	{name: "programs", mayImport: []string{"base", "backends", "views", "manager", "services", "api"}, pkgs: []string{
		"cmd/vgpud", "cmd/vgpuctl", "dashboards/gen",
	}},
	// Test harnesses stand on the product and on each other; no product
	// package imports them.
	{name: "harnesses", mayImport: []string{"base", "backends", "views", "manager", "services", "api", "harnesses"}, pkgs: []string{
		"internal/testenv/...",
	}},
	{name: "tests", mayImport: []string{"base", "backends", "views", "manager", "services", "api", "harnesses"}, pkgs: []string{
		"bench/...", "e2e/...", "internal/conventions",
	}},
}

func TestLayers(t *testing.T) {
	root := filepath.Join("..", "..")
	pkgs, err := loadPackages(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages; is the module root right?", len(pkgs))
	}
	// Packages of test files only (e2e) import nothing the floors govern,
	// but need a floor all the same.
	dirs, err := packageDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !slices.ContainsFunc(pkgs, func(p pkgInfo) bool { return p.dir == d }) {
			pkgs = append(pkgs, pkgInfo{dir: d})
		}
	}
	for _, p := range checkLayers(floors, pkgs) {
		t.Error(p)
	}
	// The doc's list of the floors names every package the declaration does.
	doc := readFile(t, filepath.Join(root, archDoc))
	_, section, _ := strings.Cut(doc, "\n## Layers\n")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, f := range floors {
		for _, p := range f.pkgs {
			sub := strings.TrimSuffix(p, "/...")
			if !strings.Contains(section, "`"+sub+"`") && !strings.Contains(section, "`"+sub+"/`") {
				t.Errorf("%s, \"Layers\", does not name %s, which internal/conventions/layers_test.go puts on floor %s: add it there", archDoc, sub, f.name)
			}
		}
	}
}

// TestLayersCatchViolations: the checker finds an upward import, an import
// on the same floor, a package on no floor and a floor naming no package,
// whatever the package's own Imports line says.
func TestLayersCatchViolations(t *testing.T) {
	fl := []floor{
		{name: "low", pkgs: []string{"pkg/a", "pkg/b", "pkg/gone"}},
		{name: "high", mayImport: []string{"low"}, pkgs: []string{"pkg/c", "x/..."}},
	}
	pkgs := []pkgInfo{
		{dir: "pkg/a", rule: "pkg/c.", imports: []string{module + "/pkg/c"}},
		{dir: "pkg/b", rule: "pkg/a.", imports: []string{module + "/pkg/a"}},
		{dir: "pkg/c", rule: "pkg/a.", imports: []string{"fmt", module + "/pkg/a"}},
		{dir: "x/y", rule: "pkg/c.", imports: []string{module + "/pkg/c"}},
		{dir: "pkg/new", rule: "nothing from vgpud."},
	}
	got := strings.Join(checkLayers(fl, pkgs), "\n")
	for _, want := range []string{
		"pkg/a (floor low) imports pkg/c (floor high)",
		"pkg/b (floor low) imports pkg/a (floor low)",
		"x/y (floor high) imports pkg/c (floor high)",
		"package pkg/new is on no floor",
		"floor low names pkg/gone, which is no package",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("checker missed %q; it said:\n%s", want, got)
		}
	}
	if strings.HasPrefix(got, "pkg/c ") || strings.Contains(got, "\npkg/c ") {
		t.Errorf("checker blamed pkg/c, which keeps to its floor:\n%s", got)
	}
}

// checkLayers returns every import that breaks the floors, every package
// on none, and every floor entry that names no package.
func checkLayers(fl []floor, pkgs []pkgInfo) []string {
	var problems []string
	floorOf := func(dir string) (floor, bool) {
		var best floor
		bestLen, found := -1, false
		for _, f := range fl {
			for _, p := range f.pkgs {
				sub, tree := strings.CutSuffix(p, "/...")
				switch {
				case !tree && p == dir:
					return f, true
				case tree && (dir == sub || strings.HasPrefix(dir, sub+"/")) && len(sub) > bestLen:
					best, bestLen, found = f, len(sub), true
				}
			}
		}
		return best, found
	}
	for _, p := range pkgs {
		f, ok := floorOf(p.dir)
		if !ok {
			problems = append(problems, fmt.Sprintf("package %s is on no floor: add it to the floor it belongs to in internal/conventions/layers_test.go (and to docs/architecture.md, \"Layers\")", p.dir))
			continue
		}
		for _, imp := range p.imports {
			rel, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			g, ok := floorOf(rel)
			if !ok {
				continue // reported as a package on no floor
			}
			if !slices.Contains(f.mayImport, g.name) {
				may := "nothing from vgpud"
				if len(f.mayImport) > 0 {
					may = "floors " + strings.Join(f.mayImport, ", ")
				}
				problems = append(problems, fmt.Sprintf("%s (floor %s) imports %s (floor %s); floor %s may import %s: move the code, or the package to another floor in internal/conventions/layers_test.go", p.dir, f.name, rel, g.name, f.name, may))
			}
		}
	}
	for _, f := range fl {
		for _, p := range f.pkgs {
			sub, tree := strings.CutSuffix(p, "/...")
			if !slices.ContainsFunc(pkgs, func(q pkgInfo) bool {
				return q.dir == sub || tree && strings.HasPrefix(q.dir, sub+"/")
			}) {
				problems = append(problems, fmt.Sprintf("floor %s names %s, which is no package: drop it from internal/conventions/layers_test.go", f.name, p))
			}
		}
	}
	return problems
}
