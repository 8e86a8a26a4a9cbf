package e2e

import (
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// `vgpud inventory --sim -o json` lists the default simulated host's four
// GPUs as discovery (NVML and sysfs) reads them: MIG profiles with their
// legal placements on the H100s, vGPU types and VFs or mdev types on the
// time-sliced GPUs.
func TestInventoryOfTheSimulatedHost(t *testing.T) {
	out, err := exec.Command(vgpudBin, "inventory", "--sim", "--state-dir", t.TempDir(), "-o", "json").Output()
	if err != nil {
		t.Fatalf("vgpud inventory: %v", err)
	}
	var inv gpu.Inventory
	if err := json.Unmarshal(out, &inv); err != nil {
		t.Fatalf("inventory JSON: %v\n%s", err, out)
	}
	want := map[string]struct {
		model   string
		mig     bool
		flavour gpu.Flavour
	}{
		sim.DefaultH100MIG: {"H100-SXM5-80GB", true, gpu.FlavourVFIO},
		sim.DefaultH100TS:  {"H100-SXM5-80GB", false, gpu.FlavourVFIO},
		sim.DefaultL4:      {"L4-24GB", false, gpu.FlavourVFIO},
		sim.DefaultA10:     {"A10-24GB", false, gpu.FlavourMdev},
	}
	if len(inv.GPUs) != len(want) {
		t.Fatalf("%d GPUs, want %d:\n%s", len(inv.GPUs), len(want), out)
	}
	for _, g := range inv.GPUs {
		w, ok := want[g.PCI]
		if !ok || g.Model != w.model || g.MIG.Enabled != w.mig || g.VGPU.Flavour != w.flavour || g.UUID == "" || g.MemoryBytes == 0 {
			t.Fatalf("GPU %s: model %s, MIG %v, flavour %s, uuid %q; want %+v", g.PCI, g.Model, g.MIG.Enabled, g.VGPU.Flavour, g.UUID, w)
		}
		if g.Model == "H100-SXM5-80GB" {
			placements := 0
			for _, p := range g.MIG.Profiles {
				placements += len(p.Placements)
			}
			if len(g.MIG.Profiles) < 6 || placements < 15 {
				t.Fatalf("GPU %s: %d MIG profiles with %d placements from NVML", g.PCI, len(g.MIG.Profiles), placements)
			}
		}
		switch g.VGPU.Flavour {
		case gpu.FlavourVFIO:
			if len(g.VGPU.VFs) == 0 || len(g.VGPU.Supported) == 0 {
				t.Fatalf("GPU %s: %d VFs, %d supported vGPU types", g.PCI, len(g.VGPU.VFs), len(g.VGPU.Supported))
			}
		case gpu.FlavourMdev:
			if len(g.VGPU.MdevParents) == 0 || len(g.VGPU.MdevParents[0].Types) == 0 {
				t.Fatalf("GPU %s: no mdev types", g.PCI)
			}
		}
	}
}
