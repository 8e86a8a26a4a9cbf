package nvml_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// TestGPUInstanceSchedulerCalls: the per-GPU-instance scheduler through
// the backend on a simulated RTX PRO 6000 Blackwell and a Hopper: set,
// read back, the log, and the refusals as the manager sees them.
func TestGPUInstanceSchedulerCalls(t *testing.T) {
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	spec := &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "RTX-PRO-6000-BSE-96GB", PCI: "0000:c1:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, MIG: true},
	}}
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
	rtx, hopper := gpus[0].UUID, gpus[1].UUID
	gi, err := b.CreateGPUInstance(ctx, rtx, 47, 0) // 1g.24gb+gfx
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetGPUInstanceScheduler(ctx, rtx, gi.ID, gpu.VGPUScheduler{Policy: gpu.SchedEqualShare, Timeslice: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	got, err := b.GPUInstanceScheduler(ctx, rtx, gi.ID)
	if err != nil || got != (gpu.VGPUScheduler{Policy: gpu.SchedEqualShare, Timeslice: 5 * time.Millisecond}) {
		t.Fatalf("read back: %+v, %v", got, err)
	}
	if l, err := b.GPUInstanceSchedulerLog(ctx, rtx, gi.ID); err != nil || l.Policy != nvmlb.PolicyEqualShare {
		t.Fatalf("log: %+v, %v", l, err)
	}
	if err := b.SetGPUInstanceScheduler(ctx, rtx, gi.ID, gpu.VGPUScheduler{Policy: "round_robin"}); !errors.Is(err, gpu.ErrInvalid) {
		t.Errorf("unknown policy: %v, want ErrInvalid", err)
	}
	if err := b.SetGPUInstanceScheduler(ctx, rtx, gi.ID, gpu.VGPUScheduler{Policy: gpu.SchedEqualShare, Timeslice: time.Second}); !errors.Is(err, gpu.ErrInvalid) {
		t.Errorf("1 s slice: %v, want ErrInvalid", err)
	}
	if _, err := b.GPUInstanceScheduler(ctx, rtx, gi.ID+5); !errors.Is(err, gpu.ErrNotFound) {
		t.Errorf("no such GPU instance: %v, want ErrNotFound", err)
	}
	hgi, err := b.CreateGPUInstance(ctx, hopper, 9, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetGPUInstanceScheduler(ctx, hopper, hgi.ID, gpu.VGPUScheduler{Policy: gpu.SchedEqualShare}); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("Hopper GPU instance: %v, want ErrNotSupported", err)
	}
}

// TestGPUInstanceSchedulerMissingFromDriver: a driver whose library lacks
// the calls is NOT_SUPPORTED naming the call, before any GPU instance is
// looked up.
func TestGPUInstanceSchedulerMissingFromDriver(t *testing.T) {
	lib, dev := &mock.Interface{}, &mock.Device{}
	lib.ExtensionsFunc = func() gonvml.ExtendedInterface {
		return lacking("nvmlGpuInstanceGetVgpuSchedulerState_v2", "nvmlGpuInstanceSetVgpuSchedulerState_v2", "nvmlGpuInstanceGetVgpuSchedulerLog_v2")
	}
	b, _ := fakeBackend(lib, dev)
	ctx := context.Background()
	for name, err := range map[string]error{
		"nvmlGpuInstanceGetVgpuSchedulerState_v2": func() error { _, err := b.GPUInstanceSchedulerState(ctx, "GPU-fake", 1); return err }(),
		"nvmlGpuInstanceSetVgpuSchedulerState_v2": b.SetGPUInstanceSchedulerState(ctx, "GPU-fake", 1, nvmlb.SchedulerState{Policy: nvmlb.PolicyFixedShare}),
		"nvmlGpuInstanceGetVgpuSchedulerLog_v2":   func() error { _, err := b.GPUInstanceSchedulerLog(ctx, "GPU-fake", 1); return err }(),
	} {
		if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want ErrNotSupported naming it", name, err)
		}
	}
}
