package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// migPartedDefault is NVIDIA mig-parted's own default config file,
// unmodified (pkg/apply/testdata/nvidia/upstream/README.md).
var migPartedDefault = filepath.Join("..", "pkg", "apply", "testdata", "nvidia", "upstream", "config-default.yaml")

// defaultHostConfigs are the configs of migPartedDefault with an entry
// for the default simulated host's GPUs: its two H100-SXM5-80GB (the L4
// and the A10 have no MIG). Every other config names only profiles or
// device filters of other models.
var defaultHostConfigs = []string{
	"all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb", "all-3g.40gb",
	"all-4g.40gb", "all-7g.80gb", "all-balanced", "all-disabled", "all-enabled",
}

// TestMigPartedDefaultConfigThroughVgpuctl: on the default simulated
// host, with the NVML sessions modelled (vgpud's own holds the GPUs),
// `vgpuctl apply -f config-default.yaml --select C` applies each config C
// that has an entry for its GPUs in one apply, from the default layout and
// chained (each after the one before), MIG mode changes carried through a
// GPU reset on the H100 with SR-IOV VFs; the dry run after it lists no
// change; every other config is refused whole as applying to nothing.
func TestMigPartedDefaultConfigThroughVgpuctl(t *testing.T) {
	data, err := os.ReadFile(migPartedDefault)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		MigConfigs map[string]any `json:"mig-configs"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range f.MigConfigs {
		names = append(names, n)
	}
	sort.Strings(names)

	dir := t.TempDir()
	spec := filepath.Join(dir, "host.yaml")
	if err := os.WriteFile(spec, []byte("version: v1\ngpus:\n"+
		"  - {model: H100-SXM5-80GB, pci: \""+sim.DefaultH100MIG+"\", flavour: vfio, mig: true}\n"+
		"  - {model: H100-SXM5-80GB, pci: \""+sim.DefaultH100TS+"\", flavour: vfio}\n"+
		"  - {model: L4-24GB, pci: \""+sim.DefaultL4+"\", flavour: vfio, numaNode: 1}\n"+
		"  - {model: A10-24GB, pci: \""+sim.DefaultA10+"\", flavour: mdev, numaNode: 1}\n"+
		"options: {nvmlSessions: true}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The default layout, to go back to between configs: MIG on the first
	// H100, off on the second, no instances.
	home := filepath.Join(dir, "default.yaml")
	if err := os.WriteFile(home, []byte("version: v1\nlayout:\n"+
		"  - {gpu: \""+sim.DefaultH100MIG+"\", mig: true, instances: []}\n"+
		"  - {gpu: \""+sim.DefaultH100TS+"\", mig: false, instances: []}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--sim-host", spec}})

	applyOne := func(t *testing.T, name string) {
		t.Helper()
		r := d.ctl(t, "apply", "-f", migPartedDefault, "--select", name)
		if r.code != 0 {
			t.Fatalf("apply --select %s: exit %d\nstdout: %s\nstderr: %s\n%s", name, r.code, r.out, r.err, tailText(d.log(), 3000))
		}
		r = d.ctl(t, "apply", "-f", migPartedDefault, "--select", name, "--dry-run").must(t, "dry run")
		if !strings.HasPrefix(r.out, "no changes: ") {
			t.Fatalf("dry run after apply --select %s lists changes:\n%s", name, r.out)
		}
		if r := d.ctl(t, "reconcile").must(t, "reconcile"); !strings.Contains(r.out, " 0 pending") {
			t.Fatalf("reconcile after %s:\n%s", name, r.out)
		}
	}
	for _, name := range names {
		if slices.Contains(defaultHostConfigs, name) {
			continue
		}
		r := d.ctl(t, "apply", "-f", migPartedDefault, "--select", name, "--dry-run")
		if r.code == 0 || !strings.Contains(r.err, "nothing in it applies") {
			t.Errorf("apply --select %s: exit %d %q; want it refused as applying to nothing", name, r.code, r.err)
		}
	}
	for _, name := range defaultHostConfigs {
		if !slices.Contains(names, name) {
			t.Fatalf("%s has no config %s", migPartedDefault, name)
		}
		t.Run("from-default/"+name, func(t *testing.T) {
			d.ctl(t, "apply", "-f", home).must(t, "back to the default layout")
			applyOne(t, name)
		})
	}
	t.Run("chained", func(t *testing.T) {
		for _, name := range defaultHostConfigs {
			applyOne(t, name)
		}
		// And back, in the other order.
		for _, name := range slices.Backward(defaultHostConfigs) {
			applyOne(t, name)
		}
	})
}
