package nvml_test

import (
	"context"
	"errors"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func setup(t *testing.T) (*sim.Host, *nvmlb.Backend, []gpu.GPU) {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(t.TempDir(), nil, cat, sim.OpenOptions{})
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
	return h, b, gpus
}

func TestGPUInstanceLifecycle(t *testing.T) {
	_, b, gpus := setup(t)
	ctx := context.Background()
	u := gpus[0].UUID
	gi, err := b.CreateGPUInstance(ctx, u, 9, 4)
	if err != nil {
		t.Fatal(err)
	}
	if gi.Placement != (gpu.Range{Start: 4, Size: 4}) || gi.ProfileID != 9 {
		t.Fatalf("GI %+v", gi)
	}
	again, err := b.CreateGPUInstance(ctx, u, 9, 4)
	if err != nil || again.ID != gi.ID {
		t.Fatalf("repeat create: %+v, %v; want the same instance", again, err)
	}
	if _, err := b.CreateGPUInstance(ctx, u, 0, 0); !errors.Is(err, gpu.ErrNoResources) || !errors.Is(err, gonvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Fatalf("7g over a 3g at 4: %v", err)
	}
	if _, err := b.CreateGPUInstance(ctx, u, 9, 2); !errors.Is(err, gpu.ErrInvalid) {
		t.Fatalf("illegal start: %v", err)
	}
	ci, err := b.CreateComputeInstance(ctx, u, gi.ID, -1, -1)
	if err != nil || ci.Placement.Size != 3 {
		t.Fatalf("full compute instance: %+v, %v", ci, err)
	}
	if again, err := b.CreateComputeInstance(ctx, u, gi.ID, -1, -1); err != nil || again.ID != ci.ID {
		t.Fatalf("repeat compute instance: %+v, %v", again, err)
	}
	if err := b.DestroyGPUInstance(ctx, u, gi.ID); !errors.Is(err, gpu.ErrInUse) {
		t.Fatalf("destroy with CI: %v", err)
	}
	if err := b.DestroyComputeInstance(ctx, u, gi.ID, ci.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.DestroyComputeInstance(ctx, u, gi.ID, ci.ID); err != nil {
		t.Fatalf("repeat CI destroy: %v", err)
	}
	if err := b.DestroyGPUInstance(ctx, u, gi.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.DestroyGPUInstance(ctx, u, gi.ID); err != nil {
		t.Fatalf("repeat GI destroy: %v", err)
	}
	if _, err := b.CreateGPUInstance(ctx, gpus[1].UUID, 9, 0); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("MIG off: %v", err)
	}
}

// TestComputeInstancesAtPlacements: 1c compute instances at chosen starts
// in one 3g GPU instance, idempotent per start, the driver's refusals kept
// in the error chain.
func TestComputeInstancesAtPlacements(t *testing.T) {
	_, b, gpus := setup(t)
	ctx := context.Background()
	u := gpus[0].UUID
	gi, err := b.CreateGPUInstance(ctx, u, 9, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for _, start := range []int{2, 0, 1} {
		ci, err := b.CreateComputeInstance(ctx, u, gi.ID, 0, start)
		if err != nil || ci.Placement != (gpu.Range{Start: start, Size: 1}) || ci.ProfileID != 0 {
			t.Fatalf("1c at %d: %+v, %v", start, ci, err)
		}
		again, err := b.CreateComputeInstance(ctx, u, gi.ID, 0, start)
		if err != nil || again.ID != ci.ID {
			t.Fatalf("repeat 1c at %d: %+v, %v; want compute instance %d", start, again, err, ci.ID)
		}
		ids[ci.ID] = true
	}
	if len(ids) != 3 {
		t.Fatalf("compute instance ids %v, want three", ids)
	}
	if _, err := b.CreateComputeInstance(ctx, u, gi.ID, 1, 0); !errors.Is(err, gpu.ErrNoResources) || !errors.Is(err, gonvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Fatalf("2c over two 1c: %v", err)
	}
	if _, err := b.CreateComputeInstance(ctx, u, gi.ID, 4, 0); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("7c profile in a 3g: %v", err)
	}
	if err := b.DestroyGPUInstance(ctx, u, gi.ID); !errors.Is(err, gpu.ErrInUse) {
		t.Fatalf("destroy a GI with compute instances: %v", err)
	}
}

func TestMIGModeNeedsReset(t *testing.T) {
	h, b, gpus := setup(t)
	ctx := context.Background()
	err := b.SetMIGMode(ctx, gpus[1].UUID, true)
	if !errors.Is(err, gpu.ErrResetRequired) || !errors.Is(err, gonvml.ERROR_IN_USE) {
		t.Fatalf("enable with VFs: %v, want ErrResetRequired wrapping IN_USE", err)
	}
	if err := b.SetMIGMode(ctx, gpus[2].UUID, true); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("L4: %v", err)
	}
	if err := h.SetVFs(gpus[1].PCI, false); err != nil {
		t.Fatal(err)
	}
	if err := b.SetMIGMode(ctx, gpus[1].UUID, true); err != nil {
		t.Fatalf("enable on an idle GPU: %v", err)
	}
}

func TestCallTimeout(t *testing.T) {
	h, b, gpus := setup(t)
	if err := h.AddFault(sim.Fault{Op: "GetMigMode", Delay: "300ms"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Describe(ctx, gpus[0].UUID); err == nil {
		// Describe records per-GPU failures; the context error surfaces.
		t.Fatalf("want a timeout")
	}
	if err := b.SetMIGMode(ctx, gpus[0].UUID, true); !errors.Is(err, gpu.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
}

// rebootingLib hands out GPU and compute instance handles whose Destroy
// reboots the simulated host first: the handle the backend just looked up
// is then stale, as when `sim reboot` (or a real reset) lands between a
// lookup and the call on it.
type rebootingLib struct {
	gonvml.Interface
	h *sim.Host
}

func (l rebootingLib) DeviceGetHandleByUUID(uuid string) (gonvml.Device, gonvml.Return) {
	d, r := l.Interface.DeviceGetHandleByUUID(uuid)
	if r != gonvml.SUCCESS {
		return d, r
	}
	return rebootingDevice{d, l.h}, r
}

type rebootingDevice struct {
	gonvml.Device
	h *sim.Host
}

func (d rebootingDevice) GetGpuInstanceById(id int) (gonvml.GpuInstance, gonvml.Return) {
	gi, r := d.Device.GetGpuInstanceById(id)
	if r != gonvml.SUCCESS {
		return gi, r
	}
	return rebootingGI{gi, d.h}, r
}

type rebootingGI struct {
	gonvml.GpuInstance
	h *sim.Host
}

func (g rebootingGI) Destroy() gonvml.Return {
	if err := g.h.Reboot(); err != nil {
		panic(err)
	}
	return g.GpuInstance.Destroy()
}

func (g rebootingGI) GetComputeInstanceById(id int) (gonvml.ComputeInstance, gonvml.Return) {
	ci, r := g.GpuInstance.GetComputeInstanceById(id)
	if r != gonvml.SUCCESS {
		return ci, r
	}
	return rebootingCI{ci, g.h}, r
}

type rebootingCI struct {
	gonvml.ComputeInstance
	h *sim.Host
}

func (c rebootingCI) Destroy() gonvml.Return {
	if err := c.h.Reboot(); err != nil {
		panic(err)
	}
	return c.ComputeInstance.Destroy()
}

// A destroy whose instance went between the lookup and the call (a reboot
// took it: the driver calls the handle invalid) has nothing left to do:
// success, not an invalid argument.
func TestDestroyOfInstanceGoneMeanwhile(t *testing.T) {
	h, b, gpus := setup(t)
	ctx := context.Background()
	u := gpus[0].UUID
	for _, ci := range []bool{true, false} {
		gi, err := b.CreateGPUInstance(ctx, u, 9, 0)
		if err != nil {
			t.Fatal(err)
		}
		c, err := b.CreateComputeInstance(ctx, u, gi.ID, -1, -1)
		if err != nil {
			t.Fatal(err)
		}
		rb := nvmlb.New(rebootingLib{h.NVML(), h}, nil, nvmlb.Options{})
		if err := rb.Init(ctx); err != nil {
			t.Fatal(err)
		}
		if ci {
			err = rb.DestroyComputeInstance(ctx, u, gi.ID, c.ID)
		} else {
			err = rb.DestroyGPUInstance(ctx, u, gi.ID)
		}
		if err != nil {
			t.Fatalf("destroy (compute instance %v) racing a reboot: %v, want success", ci, err)
		}
	}
}
