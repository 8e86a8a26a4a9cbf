package discover_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func setup(t *testing.T, mirror bool) (*sim.Host, *nvmlb.Backend, *profile.Catalog) {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(t.TempDir(), nil, cat, sim.OpenOptions{Mirror: mirror})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	b := nvmlb.New(h.NVML(), cat, nvmlb.Options{})
	if err := b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return h, b, cat
}

// The default host's inventory is discovered through NVML and sysfs, not
// copied from the catalog: the MIG profiles, placements and types come
// from driver calls and attribute reads.
func TestDefaultHostInventory(t *testing.T) {
	h, b, cat := setup(t, false)
	ctx := context.Background()
	inv, err := discover.Inventory(ctx, b, sysfs.New(h.FS()))
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 4 {
		t.Fatalf("%d GPUs, want 4", len(inv.GPUs))
	}
	want := []struct {
		model   string
		flavour gpu.Flavour
		mig     bool
	}{
		{"H100-SXM5-80GB", gpu.FlavourVFIO, true},
		{"H100-SXM5-80GB", gpu.FlavourVFIO, false},
		{"L4-24GB", gpu.FlavourVFIO, false},
		{"A10-24GB", gpu.FlavourMdev, false},
	}
	for i, w := range want {
		g := inv.GPUs[i]
		if g.Model != w.model || g.VGPU.Flavour != w.flavour || g.MIG.Enabled != w.mig || len(g.Errors) > 0 {
			t.Errorf("GPU %d: model %s flavour %s mig %v errors %v; want %+v", i, g.Model, g.VGPU.Flavour, g.MIG.Enabled, g.Errors, w)
		}
		m, _ := cat.Model(g.Model)
		if m.MIG != nil && len(g.MIG.Profiles) != len(m.MIG.GPUInstanceProfiles) {
			t.Errorf("GPU %d: %d MIG profiles, catalog has %d", i, len(g.MIG.Profiles), len(m.MIG.GPUInstanceProfiles))
		}
		if len(g.VGPU.Supported) == 0 {
			t.Errorf("GPU %d: no vGPU types", i)
		}
	}
	h100 := inv.GPUs[0]
	for _, p := range h100.MIG.Profiles {
		if p.Name == "3g.40gb" {
			if len(p.Placements) != 2 || p.Placements[0] != (gpu.Range{Start: 0, Size: 4}) || p.Placements[1] != (gpu.Range{Start: 4, Size: 4}) {
				t.Errorf("3g.40gb placements %v", p.Placements)
			}
		}
	}
	if len(h100.VGPU.VFs) != 32 || h100.VGPU.TotalVFs != 32 {
		t.Errorf("H100 VFs: %d of %d", len(h100.VGPU.VFs), h100.VGPU.TotalVFs)
	}
	a10 := inv.GPUs[3]
	if len(a10.VGPU.MdevParents) != a10.VGPU.TotalVFs || len(a10.VGPU.MdevParents[0].Types) == 0 {
		t.Errorf("A10 mdev parents %d (VFs %d)", len(a10.VGPU.MdevParents), a10.VGPU.TotalVFs)
	}
}

// The on-disk mirror read with the production OSFS gives the same
// inventory as the simulator's FS, after carving on every flavour.
func TestMirrorMatchesFS(t *testing.T) {
	h, b, cat := setup(t, true)
	ctx := context.Background()
	inv, err := discover.Inventory(ctx, b, sysfs.New(h.FS()))
	if err != nil {
		t.Fatal(err)
	}
	h100 := inv.GPUs[0].UUID
	if _, err := b.CreateGPUInstance(ctx, h100, 9, 4); err != nil {
		t.Fatal(err)
	}
	s := sysfs.New(h.FS())
	m, _ := cat.Model("H100-SXM5-80GB")
	vt, _ := m.VGPUTypeByName("H100XM-3-40C")
	if err := s.SetVFType(inv.GPUs[0].VGPU.VFs[2].PCI, vt.ID); err != nil {
		t.Fatal(err)
	}
	a10, _ := cat.Model("A10-24GB")
	q, _ := a10.VGPUTypeByName("A10-4Q")
	if err := s.CreateMdev(inv.GPUs[3].VGPU.MdevParents[1].PCI, q.ID, "4b20d080-1b54-4048-85b3-a6a62d165c01"); err != nil {
		t.Fatal(err)
	}
	viaSim, err := discover.Inventory(ctx, b, sysfs.New(h.FS()))
	if err != nil {
		t.Fatal(err)
	}
	viaDisk, err := discover.Inventory(ctx, b, sysfs.New(sysfs.OSFS{Root: h.SysRoot()}))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(viaSim)
	d, _ := json.Marshal(viaDisk)
	if string(a) != string(d) {
		t.Fatalf("mirror differs:\nsim  %s\ndisk %s", a, d)
	}
	if viaSim.GPUs[0].MIG.Instances[0].VGPUs != 1 || len(viaSim.GPUs[3].VGPU.Mdevs) != 1 {
		t.Fatalf("carving not visible: %+v", viaSim.GPUs[0].MIG.Instances)
	}
}

func TestLostGPUIsReportedNotFatal(t *testing.T) {
	h, b, _ := setup(t, false)
	if err := h.LoseGPU(sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Inventory(context.Background(), b, sysfs.New(h.FS()))
	if err != nil {
		t.Fatal(err)
	}
	g, _ := inv.ByPCI(sim.DefaultL4)
	if g != nil {
		t.Fatalf("lost GPU listed by PCI %+v", g)
	}
	lost := 0
	for _, g := range inv.GPUs {
		if g.Lost {
			lost++
		}
	}
	if lost != 1 || len(inv.GPUs) != 4 {
		t.Fatalf("lost = %d of %d", lost, len(inv.GPUs))
	}
}
