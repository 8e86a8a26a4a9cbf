package apply_test

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// Golden tests over testdata/nvidia: files written from NVIDIA's published
// mig-parted and vgpu-device-manager examples (each form cited there).
// Every config parses; on a simulated host of each model, the configs
// that have an entry for it apply and re-apply with no change, and those
// that have none are refused as a whole, as nothing in them applies.

const (
	a100_40 = "A100-SXM4-40GB"
	a100_80 = "A100-SXM4-80GB"
	a30     = "A30-24GB"
	b200    = "B200-SXM-180GB"
	h100    = "H100-SXM5-80GB"
	h200    = "H200-SXM5-141GB"
	rtxPro  = "RTX-PRO-6000-BSE-96GB"
	l4      = "L4-24GB"
	a10     = "A10-24GB"
	t4      = "T4-16GB"
	l40s    = "L40S-48GB"
)

// configNames lists the named configs of an NVIDIA file under section.
func configNames(t *testing.T, file, section string) []string {
	t.Helper()
	var f map[string]any
	if err := yaml.Unmarshal(readFile(t, file), &f); err != nil {
		t.Fatal(err)
	}
	configs, _ := f[section].(map[string]any)
	var out []string
	for name := range configs {
		out = append(out, name)
	}
	sort.Strings(out)
	if len(out) == 0 {
		t.Fatalf("%s has no %s", file, section)
	}
	return out
}

func TestNVIDIAExamplesParse(t *testing.T) {
	for file, section := range map[string]string{"nvidia/mig-parted.yaml": "mig-configs", "nvidia/vgpu-device-manager.yaml": "vgpu-configs"} {
		for _, name := range configNames(t, file, section) {
			d := mustParse(t, file, name)
			for _, e := range d.Layout {
				if !e.Optional {
					t.Errorf("%s %s: entry %s is not optional", file, name, e.Source)
				}
				if section == "vgpu-configs" && e.GPU != "" && e.IndexOrder != apply.IndexPCI {
					t.Errorf("%s %s: entry %s counts GPUs by %q, want PCI order", file, name, e.Source, e.IndexOrder)
				}
			}
		}
	}
}

// outcome is what a config does on a host: apply, be refused whole as
// applying to nothing, or be refused for the GPU an index names (a GPU
// that does not offer the profile, as mig-parted and vgpu-device-manager
// fail there too).
type outcome int

const (
	nothing outcome = iota
	applied
	refused
)

// applyExample diffs config name of file on the host and checks the outcome.
func applyExample(t *testing.T, e *env, file, name, model string, want outcome) {
	t.Helper()
	d := mustParse(t, file, name)
	cs, err := apply.Diff(context.Background(), e.m, d)
	switch want {
	case nothing:
		if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(err.Error(), "nothing in it applies") {
			t.Errorf("%s on %s: %v, want it refused as applying to nothing", name, model, err)
		}
	case refused:
		if !errors.Is(err, manager.ErrInvalidArgument) || strings.Contains(err.Error(), "nothing in it applies") {
			t.Errorf("%s on %s: %v, want it refused for its GPU", name, model, err)
		}
	case applied:
		if err != nil {
			t.Errorf("%s on %s: %v", name, model, err)
			return
		}
		if len(d.Layout) > 1 && len(cs.Skipped) == 0 && !strings.HasPrefix(name, "custom") {
			t.Errorf("%s on %s: several entries, none skipped:\n%s", name, model, cs)
		}
		e.apply(d)
	}
}

func outcomeOf(applies, refuses map[string][]string, name, model string) outcome {
	switch {
	case slices.Contains(applies[name], model):
		return applied
	case slices.Contains(refuses[name], model):
		return refused
	}
	return nothing
}

func TestMigPartedExamplesApply(t *testing.T) {
	migCapable := []string{a100_40, a100_80, a30, b200, h100, h200, rtxPro}
	applies := map[string][]string{
		"all-disabled":       migCapable,
		"all-enabled":        migCapable,
		"all-1g.5gb":         {a100_40},
		"all-1g.10gb.me":     {a100_80, h100},
		"all-1g.10gb":        {a100_40, a100_80, h100},
		"all-1g.24gb.gfx":    {rtxPro},
		"all-1g.24gb.me.all": {rtxPro},
		"all-1g.24gb-me":     {rtxPro},
		"all-2g.48gb.gfx":    {rtxPro},
		"all-balanced":       {rtxPro, b200, h200, h100, a100_80, a100_40, a30},
		"custom-config":      append(slices.Clone(migCapable), l4), // devices [0] with MIG off
	}
	// One host per model, the configs applied in turn: each one reshapes
	// what the one before left. The GPUs run without vGPU (mig-parted's
	// bare-metal MIG): on a vGPU host with SR-IOV VFs a MIG mode change
	// waits for the VFs to go and a GPU reset.
	for _, model := range append(migCapable, l4) {
		t.Run(model, func(t *testing.T) {
			e := newEnvSpec(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: model, Flavour: gpu.FlavourNone}}})
			for _, name := range configNames(t, "nvidia/mig-parted.yaml", "mig-configs") {
				applyExample(t, e, "nvidia/mig-parted.yaml", name, model, outcomeOf(applies, nil, name, model))
			}
		})
	}
}

func TestVGPUDeviceManagerExamplesApply(t *testing.T) {
	models := []string{l4, a10, a30, h100, t4, l40s, a100_40, a100_80, h200, b200}
	applies := map[string][]string{
		"L4-4Q":        {l4},
		"A10-4C":       {a10},
		"A30-1-6C":     {a30},
		"A30-1-6CME":   {a30},
		"H100XM-1-10C": {h100},
		"T4-small":     {t4},
		"default":      models,
	}
	// T4-small names GPU 0 (its second entry, GPU 1, is skipped on a
	// host of one GPU): a GPU without T4-1Q refuses it.
	refuses := map[string][]string{"T4-small": slices.DeleteFunc(slices.Clone(models), func(m string) bool { return m == t4 })}
	file := "nvidia/vgpu-device-manager.yaml"
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			for _, name := range configNames(t, file, "vgpu-configs") {
				// A fresh host per config, in the MIG mode its types need:
				// on a vGPU host with SR-IOV VFs a MIG mode change waits for
				// the VFs to go and a GPU reset, which apply cannot do.
				mig := slices.ContainsFunc(mustParse(t, file, name).Layout, func(e apply.LayoutEntry) bool { return e.MIG != nil && *e.MIG || migBacked(e) })
				e := newEnvSpec(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: model, MIG: mig && model != l4 && model != a10 && model != t4 && model != l40s}}})
				applyExample(t, e, file, name, model, outcomeOf(applies, refuses, name, model))
			}
		})
	}
}

// migBacked: the entry asks for a MIG-backed vGPU type (<GPU>-<G>-<GB><S>).
func migBacked(e apply.LayoutEntry) bool {
	for _, in := range e.Instances {
		if parts := strings.Split(in.Profile, "-"); len(parts) == 3 && len(parts[1]) == 1 && parts[1] >= "1" && parts[1] <= "9" {
			return true
		}
	}
	return false
}

// The dry run names each skipped entry and why.
func TestNVIDIASkippedEntriesShown(t *testing.T) {
	e := newEnvSpec(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: h100}}})
	cs, err := apply.Diff(context.Background(), e.m, mustParse(t, "nvidia/mig-parted.yaml", "all-balanced"))
	if err != nil {
		t.Fatal(err)
	}
	out := cs.String()
	for _, want := range []string{
		"skipped mig-configs.all-balanced[0]: no GPU of this host matches the device filter 0x294110DE\n",
		"skipped mig-configs.all-balanced[6]: no GPU of this host matches the device filter 0x20B710DE\n",
		"create 3g.40gb for tenant default on ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if len(cs.Skipped) != 6 {
		t.Errorf("%d entries skipped, want the 6 of other models:\n%s", len(cs.Skipped), out)
	}
}

// vgpu-device-manager counts GPUs in PCI address order, mig-parted by
// NVML index: on a host whose NVML order differs (the simulator numbers
// GPUs in the order the host description lists them), `devices: [0]`
// names different GPUs in the two formats.
func TestNVIDIAIndexOrders(t *testing.T) {
	e := newEnvSpec(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: l4, PCI: "0000:81:00.0"}, // NVML index 0, second in PCI order
		{Model: t4, PCI: "0000:21:00.0"}, // NVML index 1, first in PCI order
		{Model: h100, PCI: "0000:61:00.0", MIG: true},
	}})
	vdm := `version: v1
vgpu-configs:
  by-pci:
    - devices: [0]
      vgpu-devices: {"T4-1Q": 2}
    - devices: [2]
      vgpu-devices: {"L4-4Q": 2}
`
	d, err := apply.Parse("by-pci.yaml", []byte(vdm), "by-pci")
	if err != nil {
		t.Fatal(err)
	}
	e.apply(d)
	mp := `version: v1
mig-configs:
  by-nvml:
    - devices: [2]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
`
	if d, err = apply.Parse("by-nvml.yaml", []byte(mp), "by-nvml"); err != nil {
		t.Fatal(err)
	}
	e.apply(d)
	want := []string{"0000:21:00.0 default T4-1Q×2", "0000:61:00.0 default 3g.40gb×2", "0000:81:00.0 default L4-4Q×2"}
	if got := e.layout(); !slices.Equal(got, want) {
		t.Errorf("layout %q, want %q", got, want)
	}
}
