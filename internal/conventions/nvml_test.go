package conventions

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The NVIDIA driver's header marks superseded functions DEPRECATED; vgpud
// calls their replacements (the _v2 scheduler calls, GetTemperatureV).
// The C compiler cannot tell: it warns about every deprecated function
// go-nvml binds, called or not, which is why the build passes
// -Wno-deprecated-declarations. This check is the one that can tell: it
// maps each deprecated C function to the go-nvml methods that call it, and
// fails if vgpud's code names one (a call, a method value, or a simulator
// method serving it). `make lint` runs it with NVML_MODULE_DIR set.

const nvmlImport = "github.com/NVIDIA/go-nvml/pkg/nvml"

func TestNoDeprecatedNVML(t *testing.T) {
	dir, err := nvmlModuleDir(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	deprecated, err := deprecatedNVML(filepath.Join(dir, "pkg", "nvml"))
	if err != nil {
		t.Fatal(err)
	}
	// The header this go-nvml carries deprecates these three at least; an
	// empty map would mean the parse broke, not that all is well.
	for _, m := range []string{"GetVgpuSchedulerState", "SetVgpuSchedulerState", "GetVgpuSchedulerLog", "GetTemperature"} {
		if deprecated[m] == "" {
			t.Fatalf("go-nvml's %s is not found deprecated in %s; is the parse right?", m, dir)
		}
	}
	uses, err := deprecatedUses(filepath.Join("..", ".."), deprecated)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range uses {
		t.Error(u)
	}
}

// TestDeprecatedNVMLCatches: the checker finds a call, a method value and
// a method declaration of a deprecated function, through go-nvml's
// library-level wrapper too, and leaves its replacement alone.
func TestDeprecatedNVMLCatches(t *testing.T) {
	nvml := t.TempDir()
	write(t, filepath.Join(nvml, "nvml.h"), `
DEPRECATED(13.0) nvmlReturn_t DECLDIR nvmlDeviceGetOld(nvmlDevice_t device, unsigned int *v);
nvmlReturn_t DECLDIR nvmlDeviceGetOld_v2(nvmlDevice_t device, unsigned int *v);
`)
	write(t, filepath.Join(nvml, "device.go"), `package nvml
func nvmlDeviceGetOld(d nvmlDevice, v *uint32) Return { return 0 }
func nvmlDeviceGetOld_v2(d nvmlDevice, v *uint32) Return { return 0 }
func (device nvmlDevice) GetOld() (uint32, Return) { var v uint32; return v, nvmlDeviceGetOld(device, &v) }
func (device nvmlDevice) GetOld_v2() (uint32, Return) { var v uint32; return v, nvmlDeviceGetOld_v2(device, &v) }
func (l *library) DeviceGetOld(device Device) (uint32, Return) { return device.GetOld() }
`)
	dep, err := deprecatedNVML(nvml)
	if err != nil {
		t.Fatal(err)
	}
	if dep["GetOld"] != "nvmlDeviceGetOld" || dep["DeviceGetOld"] != "nvmlDeviceGetOld" || dep["GetOld_v2"] != "" {
		t.Fatalf("deprecated: %v", dep)
	}
	root := t.TempDir()
	write(t, filepath.Join(root, "pkg", "a", "a.go"), `package a
import gonvml "`+nvmlImport+`"
func f(d gonvml.Device) { d.GetOld(); d.GetOld_v2() }
var g = gonvml.Device.GetOld
type dev struct{ gonvml.Device }
func (dev) GetOld() (uint32, gonvml.Return) { return 0, 0 }
`)
	write(t, filepath.Join(root, "pkg", "b", "b.go"), "package b\nfunc (x T) GetOld() {}\nfunc h(x T) { x.GetOld() }\n")
	uses, err := deprecatedUses(root, dep)
	if err != nil {
		t.Fatal(err)
	}
	if len(uses) != 3 {
		t.Errorf("found %d uses, want the call, the method value and the method (not pkg/b, which has no go-nvml):\n%s", len(uses), strings.Join(uses, "\n"))
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// nvmlModuleDir is go-nvml's directory in the module cache: $NVML_MODULE_DIR
// (what `go list -m -f {{.Dir}}` says), else the cache path of the version
// go.mod requires.
func nvmlModuleDir(root string) (string, error) {
	if d := os.Getenv("NVML_MODULE_DIR"); d != "" {
		return d, nil
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/NVIDIA/go-nvml\s+(\S+)`).FindSubmatch(mod)
	if m == nil {
		return "", fmt.Errorf("go.mod requires no github.com/NVIDIA/go-nvml")
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			gopath = filepath.Join(home, "go")
		}
		cache = filepath.Join(filepath.SplitList(gopath)[0], "pkg", "mod")
	}
	// The module cache escapes capitals as '!' and the lower-case letter.
	escaped := regexp.MustCompile(`[A-Z]`).ReplaceAllStringFunc("github.com/NVIDIA/go-nvml", func(s string) string { return "!" + strings.ToLower(s) })
	d := filepath.Join(cache, escaped+"@"+string(m[1]))
	if _, err := os.Stat(d); err != nil {
		return "", fmt.Errorf("go-nvml is not in the module cache (set NVML_MODULE_DIR): %w", err)
	}
	return d, nil
}

var deprecatedDecl = regexp.MustCompile(`DEPRECATED\([^)]*\)\s*nvmlReturn_t\s+DECLDIR\s+(nvml\w+)\s*\(`)

// deprecatedNVML maps each go-nvml method that calls a function nvml.h
// marks DEPRECATED, directly or through another such method (the library's
// DeviceGetX calls the device's GetX), to that C function.
func deprecatedNVML(dir string) (map[string]string, error) {
	h, err := os.ReadFile(filepath.Join(dir, "nvml.h"))
	if err != nil {
		return nil, err
	}
	cfuncs := map[string]bool{}
	for _, m := range deprecatedDecl.FindAllSubmatch(h, -1) {
		cfuncs[string(m[1])] = true
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var methods []*ast.FuncDecl
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return nil, err
		}
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && fd.Body != nil {
				methods = append(methods, fd)
			}
		}
	}
	out := map[string]string{}
	for changed := true; changed; {
		changed = false
		for _, fd := range methods {
			if out[fd.Name.Name] != "" {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || out[fd.Name.Name] != "" {
					return out[fd.Name.Name] == ""
				}
				switch fn := call.Fun.(type) {
				case *ast.Ident:
					if cfuncs[fn.Name] {
						out[fd.Name.Name], changed = fn.Name, true
					}
				case *ast.SelectorExpr:
					if c := out[fn.Sel.Name]; c != "" {
						out[fd.Name.Name], changed = c, true
					}
				}
				return true
			})
		}
	}
	// The versioned calls' handlers all name their methods V1, V2...: such
	// a name, carried by a handler that calls no deprecated function, says
	// nothing, and is left out. (Other clashes, such as the unit's
	// GetTemperature beside the device's, are kept: vgpud calls no unit
	// function, and a false alarm names the line to look at.)
	ambiguous := map[string]bool{}
	for _, fd := range methods {
		if out[fd.Name.Name] != "" && strings.HasSuffix(recvType(fd), "Handler") && !callsAny(fd, cfuncs, out) {
			ambiguous[fd.Name.Name] = true
		}
	}
	for name := range ambiguous {
		delete(out, name)
	}
	return out, nil
}

func recvType(fd *ast.FuncDecl) string {
	t := fd.Recv.List[0].Type
	if st, ok := t.(*ast.StarExpr); ok {
		t = st.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// callsAny reports whether fd's body calls one of cfuncs, or a method of
// the names in methods.
func callsAny(fd *ast.FuncDecl, cfuncs map[string]bool, methods map[string]string) bool {
	found := false
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				found = found || cfuncs[fn.Name]
			case *ast.SelectorExpr:
				found = found || methods[fn.Sel.Name] != ""
			}
		}
		return !found
	})
	return found
}

// deprecatedUses lists where the Go files under root that import go-nvml
// name a deprecated method: a call or method value (x.GetTemperature), or
// a method of that name (a fake or the simulator serving it).
func deprecatedUses(root string, deprecated map[string]string) ([]string, error) {
	var uses []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if !importsNVML(file) {
			return nil
		}
		ast.Inspect(file, func(n ast.Node) bool {
			var name *ast.Ident
			what := "uses"
			switch x := n.(type) {
			case *ast.SelectorExpr:
				name = x.Sel
			case *ast.FuncDecl:
				if x.Recv != nil {
					name, what = x.Name, "serves"
				}
			}
			if name != nil && deprecated[name.Name] != "" {
				rel, _ := filepath.Rel(root, fset.Position(name.Pos()).Filename)
				uses = append(uses, fmt.Sprintf("%s:%d %s %s, which calls the deprecated %s: use its replacement (nvml.h names it)",
					rel, fset.Position(name.Pos()).Line, what, name.Name, deprecated[name.Name]))
			}
			return true
		})
		return nil
	})
	sort.Strings(uses)
	return uses, err
}

func importsNVML(f *ast.File) bool {
	for _, im := range f.Imports {
		if strings.Trim(im.Path.Value, `"`) == nvmlImport {
			return true
		}
	}
	return false
}
