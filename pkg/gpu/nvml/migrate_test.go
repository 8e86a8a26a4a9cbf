package nvml_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// migHost is one simulated host for the migration calls.
type migHost struct {
	h    *sim.Host
	b    *nvmlb.Backend
	fs   *sysfs.Sysfs
	uuid map[string]string // PCI address → GPU UUID
}

func openMigHost(t *testing.T, spec *sim.Spec) *migHost {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(t.TempDir(), spec, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	b := nvmlb.New(h.NVML(), cat, nvmlb.Options{})
	ctx := context.Background()
	if err := b.Init(ctx); err != nil {
		t.Fatal(err)
	}
	gpus, err := b.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := &migHost{h: h, b: b, fs: sysfs.New(h.FS()), uuid: map[string]string{}}
	for _, g := range gpus {
		m.uuid[g.PCI] = g.UUID
	}
	return m
}

// runVGPU gives the first VF of pf a vGPU of typ, opened by a VM.
func (m *migHost) runVGPU(t *testing.T, pf string, typ int, vm string) gpu.VGPURef {
	t.Helper()
	v, err := m.fs.Discover(pf)
	if err != nil || len(v.VGPU.VFs) == 0 {
		t.Fatalf("VFs of %s: %v", pf, err)
	}
	vf := v.VGPU.VFs[0].PCI
	if err := m.fs.SetVFType(vf, typ); err != nil {
		t.Fatal(err)
	}
	if err := m.h.OpenDevice(vf, vm, "vm"); err != nil {
		t.Fatal(err)
	}
	return gpu.VGPURef{VMID: vm, Type: typ, GPUInstance: -1}
}

const vmUUID = "6f2c0d1e-6a43-4b8e-9a51-0c9d4b7f3e21"

func spec(gpus ...sim.GPUSpec) *sim.Spec { return &sim.Spec{Version: "v1", GPUs: gpus} }

// The driver's rules, through the backend over the simulator: a vGPU
// moves live to a GPU of the same model, driver branch, ECC setting and
// MIG mode; otherwise nvmlGetVgpuCompatibility answers none with the
// limit; the metadata travel as bytes the other host reads back.
func TestVGPUCompatibility(t *testing.T) {
	ctx := context.Background()
	h100 := sim.GPUSpec{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100TS, Flavour: gpu.FlavourVFIO}
	src := openMigHost(t, spec(h100))
	vm, err := src.b.VGPUMetadata(ctx, src.uuid[sim.DefaultH100TS], src.runVGPU(t, sim.DefaultH100TS, 1304, vmUUID))
	if err != nil {
		t.Fatalf("vGPU metadata: %v", err)
	}
	if _, err := nvmlb.DecodeVGPUMetadata(vm); err != nil {
		t.Fatalf("the blob does not read back: %v", err)
	}
	eccOff, noLive, mig := h100, h100, h100
	eccOff.ECCOff, noLive.NoLiveMigration = true, true
	mig.MIG, mig.PCI = true, sim.DefaultH100MIG
	newer := spec(h100)
	newer.Driver.Version = "590.10.01"
	for _, tt := range []struct {
		name  string
		spec  *sim.Spec
		pci   string
		vm    gpu.VMCompatibility
		limit gpu.CompatLimit
	}{
		{"same GPU type and driver", spec(h100), sim.DefaultH100TS, gpu.CompatCold | gpu.CompatHibernate | gpu.CompatSleep | gpu.CompatLive, gpu.LimitNone},
		{"another GPU type", spec(sim.GPUSpec{Model: "L4-24GB", PCI: sim.DefaultL4, Flavour: gpu.FlavourVFIO}), sim.DefaultL4, gpu.CompatNone, gpu.LimitGPU},
		{"ECC off", spec(eccOff), sim.DefaultH100TS, gpu.CompatNone, gpu.LimitGPU},
		{"MIG on", spec(mig), sim.DefaultH100MIG, gpu.CompatNone, gpu.LimitGPU},
		{"another driver branch", newer, sim.DefaultH100TS, gpu.CompatNone, gpu.LimitHostDriver | gpu.LimitGuestDriver},
		{"no live migration", spec(noLive), sim.DefaultH100TS, gpu.CompatCold | gpu.CompatHibernate | gpu.CompatSleep, gpu.LimitOther},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dst := openMigHost(t, tt.spec)
			pg, err := dst.b.PGPUMetadata(ctx, dst.uuid[tt.pci])
			if err != nil {
				t.Fatalf("GPU metadata: %v", err)
			}
			c, err := dst.b.VGPUCompatibility(ctx, vm, pg)
			if err != nil {
				t.Fatal(err)
			}
			if c.VM != tt.vm || c.Limit != tt.limit {
				t.Fatalf("compatibility = %s (limit %s), want %s (limit %s)", c.VM, c.Limit, tt.vm, tt.limit)
			}
		})
	}
}

// The refusals, with the driver's codes: a GPU that hosts no vGPU has no
// vGPU metadata (NOT_SUPPORTED); a vGPU no VM runs has none either
// (NOT_FOUND); a blob that is not the driver's is an invalid argument,
// whether it does not decode or decodes to something else.
func TestVGPUMetadataRefusals(t *testing.T) {
	ctx := context.Background()
	h100 := sim.GPUSpec{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100TS, Flavour: gpu.FlavourVFIO}
	none := sim.GPUSpec{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourNone}
	m := openMigHost(t, spec(h100, none))
	if _, err := m.b.PGPUMetadata(ctx, m.uuid[sim.DefaultH100MIG]); !errors.Is(err, gpu.ErrNotSupported) || !errors.Is(err, gonvml.ERROR_NOT_SUPPORTED) {
		t.Errorf("GPU metadata of a GPU without vGPU: %v, want NOT_SUPPORTED", err)
	}
	if _, err := m.b.VGPUMetadata(ctx, m.uuid[sim.DefaultH100TS], gpu.VGPURef{VMID: vmUUID, Type: 1304, GPUInstance: -1}); !errors.Is(err, gpu.ErrNotFound) {
		t.Errorf("metadata of a vGPU no VM runs: %v, want not found", err)
	}
	vm, err := m.b.VGPUMetadata(ctx, m.uuid[sim.DefaultH100TS], m.runVGPU(t, sim.DefaultH100TS, 1304, vmUUID))
	if err != nil {
		t.Fatal(err)
	}
	pg, err := m.b.PGPUMetadata(ctx, m.uuid[sim.DefaultH100TS])
	if err != nil {
		t.Fatal(err)
	}
	short := vm[:10]
	lying := bytes.Clone(vm)
	lying[204]++ // opaqueDataSize one more than the blob holds
	pv, _ := nvmlb.DecodePGPUMetadata(pg)
	swapped := nvmlb.EncodeVGPUMetadata(gonvml.VgpuMetadata{OpaqueData: pv.OpaqueData}) // a GPU's data in a vGPU's blob
	for name, blob := range map[string]gpu.VGPUMetadata{"short": short, "size": lying, "another's data": swapped} {
		if _, err := m.b.VGPUCompatibility(ctx, blob, pg); !errors.Is(err, gpu.ErrInvalid) {
			t.Errorf("%s blob: %v, want invalid argument", name, err)
		}
	}
	if _, err := m.b.VGPUCompatibility(ctx, vm, gpu.PGPUMetadata(vm)); !errors.Is(err, gpu.ErrInvalid) {
		t.Errorf("a vGPU's blob as a GPU's: %v, want invalid argument", err)
	}
}

// On mdev hosts the running vGPU is found by its mdev UUID.
func TestVGPUMetadataByMdev(t *testing.T) {
	ctx := context.Background()
	m := openMigHost(t, spec(sim.GPUSpec{Model: "A10-24GB", PCI: sim.DefaultA10, Flavour: gpu.FlavourMdev}))
	parents, err := m.fs.MdevParents()
	if err != nil || len(parents) == 0 {
		t.Fatalf("mdev parents: %v %v", parents, err)
	}
	const md = "0b6f1c44-2f1e-4a8d-8d0e-0a0f6c2b9d11"
	if err := m.fs.CreateMdev(parents[0], 701, md); err != nil {
		t.Fatal(err)
	}
	if err := m.h.OpenDevice(md, vmUUID, "vm"); err != nil {
		t.Fatal(err)
	}
	vm, err := m.b.VGPUMetadata(ctx, m.uuid[sim.DefaultA10], gpu.VGPURef{MdevUUID: md})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := m.b.PGPUMetadata(ctx, m.uuid[sim.DefaultA10])
	if err != nil {
		t.Fatal(err)
	}
	if c, err := m.b.VGPUCompatibility(ctx, vm, pg); err != nil || c.VM&gpu.CompatLive == 0 {
		t.Fatalf("same GPU: %+v %v, want live", c, err)
	}
}
