package sim_test

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// The hand-made MIG changes (`vgpud sim create-gi`, `destroy-gi`): a GPU
// instance with one compute instance spanning it, destroyed with its
// compute instances, and the driver's refusals passed on.
func TestManualGPUInstance(t *testing.T) {
	e := newEnv(t, nil)
	id, err := e.h.CreateGPUInstance(sim.DefaultH100MIG, nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	if err != nil {
		t.Fatal(err)
	}
	gi, r := e.dev(t, sim.DefaultH100MIG).GetGpuInstanceById(id)
	if r != nvml.SUCCESS {
		t.Fatalf("GPU instance %d after create-gi: %v", id, r)
	}
	info := ciProfileInfo(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE)
	if cis, r := gi.GetComputeInstances(&info); r != nvml.SUCCESS || len(cis) != 1 {
		t.Fatalf("compute instances spanning GPU instance %d: %d, %v; want 1", id, len(cis), r)
	}
	if err := e.h.DestroyGPUInstance(sim.DefaultH100MIG, id); err != nil {
		t.Fatal(err)
	}
	if _, r := e.dev(t, sim.DefaultH100MIG).GetGpuInstanceById(id); r == nvml.SUCCESS {
		t.Fatalf("GPU instance %d still there after destroy-gi", id)
	}
	if err := e.h.DestroyGPUInstance(sim.DefaultH100MIG, id); !errors.Is(err, nvml.ERROR_NOT_FOUND) {
		t.Fatalf("destroy-gi of a GPU instance that is gone: %v, want NOT_FOUND", err)
	}
	if _, err := e.h.CreateGPUInstance("0000:ff:00.0", nvml.GPU_INSTANCE_PROFILE_1_SLICE); err == nil {
		t.Fatal("create-gi on a GPU the host lacks succeeded")
	}
}
