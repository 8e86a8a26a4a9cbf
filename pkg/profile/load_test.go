package profile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func TestEmbeddedCatalogIsValid(t *testing.T) {
	c, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Models()) == 0 {
		t.Fatal("no models")
	}
}

// modelYAML returns the valid test model renamed to name, with its vGPU type
// ids moved by idBase so that two such models can share a catalog.
func modelYAML(t *testing.T, name, product string, idBase int) []byte {
	t.Helper()
	m := validModel()
	m.Name, m.Product = name, product
	for i := range m.VGPU.Types {
		m.VGPU.Types[i].ID += idBase
	}
	return marshal(t, m)
}

func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLoadRules has one case per rule of Load: what a catalog directory and
// its overrides may hold.
func TestLoadRules(t *testing.T) {
	a := func(t *testing.T) []byte { return modelYAML(t, "GPU-A", "NVIDIA A", 0) }
	b := func(t *testing.T) []byte { return modelYAML(t, "GPU-B", "NVIDIA B", 100) }
	tests := []struct {
		name      string
		base      func(t *testing.T) fstest.MapFS
		overrides func(t *testing.T) []string // directories, created under t.TempDir()
		want      []string                    // the error must name each; nil: no error
	}{
		{
			name: "type id reused across two models",
			base: func(t *testing.T) fstest.MapFS {
				return fstest.MapFS{"a.yaml": {Data: a(t)}, "b.yaml": {Data: modelYAML(t, "GPU-B", "NVIDIA B", 0)}}
			},
			want: []string{"profiles/b.yaml", "model GPU-B", "vgpu type TEST-24C: id 9001 already used by model GPU-A (profiles/a.yaml)"},
		},
		{
			name: "duplicate model in one directory",
			base: func(t *testing.T) fstest.MapFS {
				return fstest.MapFS{"a.yaml": {Data: a(t)}, "a-copy.yml": {Data: modelYAML(t, "GPU-A", "NVIDIA A", 100)}}
			},
			// Directory order: a-copy.yml is read first.
			want: []string{"profiles/a.yaml", "model GPU-A", "name already defined in profiles/a-copy.yml"},
		},
		{
			name: "duplicate model in one override directory",
			base: func(t *testing.T) fstest.MapFS { return fstest.MapFS{"a.yaml": {Data: a(t)}} },
			overrides: func(t *testing.T) []string {
				dir := t.TempDir()
				writeFile(t, dir, "1.yaml", modelYAML(t, "GPU-B", "NVIDIA B", 100))
				writeFile(t, dir, "2.yaml", modelYAML(t, "GPU-B", "NVIDIA B", 200))
				return []string{dir}
			},
			want: []string{"2.yaml", "model GPU-B", "name already defined in", "1.yaml"},
		},
		{
			name: "invalid file in the base",
			base: func(t *testing.T) fstest.MapFS {
				return fstest.MapFS{"a.yaml": {Data: a(t)}, "bad.yaml": {Data: []byte("version: v1\nname: GPU-C\nfoo: 1\n")}}
			},
			want: []string{"profiles/bad.yaml", "model GPU-C", `unknown field "foo"`},
		},
		{
			name: "invalid file in an override directory",
			base: func(t *testing.T) fstest.MapFS { return fstest.MapFS{"a.yaml": {Data: a(t)}} },
			overrides: func(t *testing.T) []string {
				dir := t.TempDir()
				writeFile(t, dir, "a.yaml", []byte(strings.Replace(string(a(t)), "version: v1", "version: v9", 1)))
				return []string{dir}
			},
			want: []string{"a.yaml", "model GPU-A", "version:", `"v9" is not supported`},
		},
		{
			name: "override reuses a type id of another model",
			base: func(t *testing.T) fstest.MapFS { return fstest.MapFS{"a.yaml": {Data: a(t)}} },
			overrides: func(t *testing.T) []string {
				dir := t.TempDir()
				writeFile(t, dir, "b.yaml", modelYAML(t, "GPU-B", "NVIDIA B", 0))
				return []string{dir}
			},
			want: []string{"b.yaml", "model GPU-B", "id 9001 already used by model GPU-A"},
		},
		{
			name: "override directory replaces and adds models",
			base: func(t *testing.T) fstest.MapFS { return fstest.MapFS{"a.yaml": {Data: a(t)}} },
			overrides: func(t *testing.T) []string {
				dir := t.TempDir()
				writeFile(t, dir, "mine.yaml", modelYAML(t, "GPU-A", "NVIDIA A rev2", 0))
				writeFile(t, dir, "b.yaml", b(t))
				writeFile(t, dir, "README.md", []byte("not a catalog file"))
				return []string{dir}
			},
		},
		{
			name:      "missing override directory is ignored",
			base:      func(t *testing.T) fstest.MapFS { return fstest.MapFS{"a.yaml": {Data: a(t)}} },
			overrides: func(t *testing.T) []string { return []string{filepath.Join(t.TempDir(), "absent"), ""} },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dirs []string
			if tt.overrides != nil {
				dirs = tt.overrides(t)
			}
			c, err := profile.Load(tt.base(t), dirs...)
			if tt.want != nil {
				if c != nil {
					t.Errorf("Load returned a catalog with the error")
				}
				checkInvalid(t, err, tt.want...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := c.Model("GPU-A"); !ok {
				t.Errorf("GPU-A missing")
			}
		})
	}
}

func TestLoadOverrideReplacesModel(t *testing.T) {
	base := fstest.MapFS{
		"a.yaml": {Data: modelYAML(t, "GPU-A", "NVIDIA A", 0)},
		"b.yaml": {Data: modelYAML(t, "GPU-B", "NVIDIA B", 100)},
	}
	first, second := t.TempDir(), t.TempDir()
	// The replacement may reuse its own model's type ids: the old entry is gone.
	writeFile(t, first, "a.yaml", modelYAML(t, "GPU-A", "NVIDIA A rev2", 0))
	writeFile(t, first, "c.yaml", modelYAML(t, "GPU-C", "NVIDIA C", 200))
	writeFile(t, second, "a-again.yaml", modelYAML(t, "GPU-A", "NVIDIA A rev3", 300))

	c, err := profile.Load(base, first, filepath.Join(t.TempDir(), "absent"), second)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range c.Models() {
		names = append(names, m.Name)
	}
	if got, want := strings.Join(names, ","), "GPU-A,GPU-B,GPU-C"; got != want {
		t.Errorf("models = %s, want %s (sorted)", got, want)
	}
	checks := []struct {
		model, product, source string
		typeID                 int
	}{
		{"GPU-A", "NVIDIA A rev3", filepath.Join(second, "a-again.yaml"), 9301},
		{"GPU-B", "NVIDIA B", "profiles/b.yaml", 9101},
		{"GPU-C", "NVIDIA C", filepath.Join(first, "c.yaml"), 9201},
	}
	for _, ck := range checks {
		m, ok := c.Model(ck.model)
		if !ok {
			t.Fatalf("%s missing", ck.model)
		}
		if m.Product != ck.product || m.Source() != ck.source {
			t.Errorf("%s: product %q from %q, want %q from %q", ck.model, m.Product, m.Source(), ck.product, ck.source)
		}
		if _, ok := m.VGPUTypeByID(ck.typeID); !ok {
			t.Errorf("%s: type %d missing", ck.model, ck.typeID)
		}
	}
}

func TestIdentify(t *testing.T) {
	// Two models share a device id; the product name tells them apart.
	base := fstest.MapFS{
		"a.yaml": {Data: modelYAML(t, "GPU-A", "NVIDIA A", 0)},
		"b.yaml": {Data: modelYAML(t, "GPU-B", "NVIDIA B", 100)},
	}
	c, err := profile.Load(base)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		id      uint16
		product string
		want    string // "" = not found
	}{
		{"id and product", 0x1234, "NVIDIA B", "GPU-B"},
		{"id, unknown product: first by name", 0x1234, "NVIDIA Z", "GPU-A"},
		{"unknown id, known product", 0x9999, "NVIDIA B", "GPU-B"},
		{"unknown id and product", 0x9999, "NVIDIA Z", ""},
		{"unknown id, no product", 0x9999, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := c.Identify(tt.id, tt.product)
			got := ""
			if ok {
				got = m.Name
			}
			if got != tt.want {
				t.Errorf("Identify(%#04x, %q) = %q, want %q", tt.id, tt.product, got, tt.want)
			}
		})
	}
}
