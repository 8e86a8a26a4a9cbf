package nvml_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// realGPU runs the read-only checks against the NVIDIA driver of this
// machine (scripts/check-real-gpu.sh). They never change a GPU setting.
var realGPU = flag.Bool("real-gpu", false, "run the read-only checks against the real NVIDIA driver")

// TestRealGPU enumerates the real GPUs through the backend and compares
// NVML's GPU-instance profile table of each with the catalog entry of its
// model: id, slices, instance count, memory, SMs and placements.
func TestRealGPU(t *testing.T) {
	if !*realGPU {
		t.Skip("pass -real-gpu on a host with the NVIDIA driver")
	}
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := nvmlb.New(gonvml.New(), cat, nvmlb.Options{})
	if err := b.Init(ctx); err != nil {
		t.Fatalf("NVML: %v", err)
	}
	defer b.Shutdown(ctx)
	drv, err := b.Driver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver %s, NVML %s", drv.Version, drv.NVMLVersion)
	gpus, err := b.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) == 0 {
		t.Fatal("no GPU enumerated")
	}
	for _, g := range gpus {
		t.Logf("GPU %d %s %s %q device 0x%04x model %q memory %d MiB MIG capable=%v enabled=%v pending=%v errors=%v",
			g.Index, g.UUID, g.PCI, g.Product, g.PCIDeviceID, g.Model, g.MemoryBytes>>20, g.MIG.Capable, g.MIG.Enabled, g.MIG.Pending, g.Errors)
		m, ok := cat.Model(g.Model)
		if !ok {
			t.Errorf("GPU %s (%q, 0x%04x) matches no catalog model", g.PCI, g.Product, g.PCIDeviceID)
			continue
		}
		if m.MIG == nil {
			continue
		}
		var diffs []string
		seen := map[int]bool{}
		for _, p := range g.MIG.Profiles {
			seen[p.ID] = true
			c, ok := m.GPUInstanceProfileByID(p.ID)
			if !ok {
				diffs = append(diffs, fmt.Sprintf("NVML profile id %d (index %d) is not in the catalog", p.ID, p.Index))
				continue
			}
			var starts []int
			for _, pl := range p.Placements {
				starts = append(starts, pl.Start)
			}
			got := fmt.Sprintf("index %d slices %d max %d mem %d MiB sms %d ce %d dec %d enc %d jpg %d ofa %d starts %v size %d",
				p.Index, p.Slices, p.MaxInstances, p.MemoryMiB, p.SMs, p.CopyEngines, p.Decoders, p.Encoders, p.JPEGs, p.OFAs, starts, sizeOf(p.Placements))
			want := fmt.Sprintf("index %d slices %d max %d mem %d MiB sms %d ce %d dec %d enc %d jpg %d ofa %d starts %v size %d",
				c.Index, c.ComputeSlices, c.MaxInstances, c.MemoryMiB, c.SMs, c.CopyEngines, c.Decoders, c.Encoders, c.JPEGs, c.OFAs, c.Placements, c.Size)
			if got != want {
				diffs = append(diffs, fmt.Sprintf("%s (id %d):\n    NVML    %s\n    catalog %s", c.Name, p.ID, got, want))
			} else {
				t.Logf("  %-12s id %-2d matches the catalog", c.Name, p.ID)
			}
		}
		for _, c := range m.MIG.GPUInstanceProfiles {
			if !seen[c.ID] {
				diffs = append(diffs, fmt.Sprintf("catalog profile %s (id %d) is not reported by NVML", c.Name, c.ID))
			}
		}
		if len(diffs) > 0 {
			t.Errorf("GPU %s (%s): the catalog differs from NVML:\n  %s", g.PCI, m.Name, strings.Join(diffs, "\n  "))
		}
	}
}

func sizeOf(r []gpu.Range) int {
	if len(r) == 0 {
		return 0
	}
	return r[0].Size
}

// TestRealGPUCurrentCalls reads every real GPU through the calls that
// replaced NVML's deprecated ones: the temperature through
// nvmlDeviceGetTemperatureV, the vGPU scheduler state and log through the
// _v2 calls. Read-only. Without the vGPU manager (or with MIG on) the
// scheduler answers NOT_SUPPORTED, and so does a driver that lacks a _v2
// function (looked up, never called); anything else is a failure.
func TestRealGPUCurrentCalls(t *testing.T) {
	if !*realGPU {
		t.Skip("pass -real-gpu on a host with the NVIDIA driver")
	}
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := nvmlb.New(gonvml.New(), cat, nvmlb.Options{})
	if err := b.Init(ctx); err != nil {
		t.Fatalf("NVML: %v", err)
	}
	defer b.Shutdown(ctx)
	gpus, err := b.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		p := b.Probe(g.UUID)
		tel, err := p.Telemetry(ctx, true)
		if err != nil {
			t.Errorf("GPU %s telemetry: %v", g.PCI, err)
		} else if tel.TemperatureC <= 0 || tel.TemperatureC > 120 {
			t.Errorf("GPU %s: temperature %.0f °C from GetTemperatureV", g.PCI, tel.TemperatureC)
		}
		st, err := p.SchedulerState(ctx)
		if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
			t.Errorf("GPU %s scheduler state (_v2): %v", g.PCI, err)
		}
		l, lerr := p.SchedulerLog(ctx)
		if lerr != nil && !errors.Is(lerr, gpu.ErrNotSupported) {
			t.Errorf("GPU %s scheduler log (_v2): %v", g.PCI, lerr)
		}
		t.Logf("GPU %s %s: %.0f °C; scheduler %+v (%v); log of %d runs (%v)", g.PCI, g.Model, tel.TemperatureC, st, err, len(l.Entries), lerr)
		// The per-GPU-instance scheduler (Blackwell GB20x), read only:
		// elsewhere the driver answers NOT_SUPPORTED.
		for _, x := range g.MIG.Instances {
			gs, err := b.GPUInstanceSchedulerState(ctx, g.UUID, x.ID)
			if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
				t.Errorf("GPU %s GPU instance %d scheduler state (_v2): %v", g.PCI, x.ID, err)
			}
			gl, lerr := b.GPUInstanceSchedulerLog(ctx, g.UUID, x.ID)
			if lerr != nil && !errors.Is(lerr, gpu.ErrNotSupported) {
				t.Errorf("GPU %s GPU instance %d scheduler log (_v2): %v", g.PCI, x.ID, lerr)
			}
			t.Logf("GPU %s GPU instance %d: scheduler %+v (%v); log of %d runs (%v)", g.PCI, x.ID, gs, err, len(gl.Entries), lerr)
		}
	}
}
