package sim_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// rtxPro is a host with one RTX PRO 6000 Blackwell in MIG mode beside a
// MIG H100, the two kinds of GPU instance the per-GPU-instance scheduler
// tells apart.
const rtxPro = "0000:c1:00.0"

// rtxProGfx1g is the NVML index of the 1g.24gb+gfx profile, the one the
// DC-1-* vGPU types share.
const rtxProGfx1g = 10

func rtxProEnv(t *testing.T) *env {
	t.Helper()
	return newEnv(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "RTX-PRO-6000-BSE-96GB", PCI: rtxPro, Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, MIG: true},
	}})
}

func giSched(t *testing.T, x nvml.GpuInstance) nvml.VgpuSchedulerStateInfo_v2 {
	t.Helper()
	s, ret := x.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: graphics})
	if ret != nvml.SUCCESS {
		t.Fatalf("GpuInstanceGetVgpuSchedulerState_v2: %v", ret)
	}
	return s
}

// TestGPUInstanceSchedulerRefusals: the per-GPU-instance scheduler calls
// with the return codes nvml.h gives them.
func TestGPUInstanceSchedulerRefusals(t *testing.T) {
	e := rtxProEnv(t)
	d := e.dev(t, rtxPro)
	x := mustGI(t, d, rtxProGfx1g, 0)
	equal200 := &nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, Frequency: 200}

	if s := giSched(t, x); s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT || s.Timeslice != 2_000_000 {
		t.Fatalf("new GPU instance's scheduler = %+v, want best effort, 2 ms", s)
	}
	h100GI := mustGI(t, e.dev(t, sim.DefaultH100MIG), p3g, 0)
	plainGI := mustGI(t, d, 0, 3) // 1g.24gb: no vGPU type lives there
	for _, tt := range []struct {
		name string
		gi   nvml.GpuInstance
		set  *nvml.VgpuSchedulerState_v2
		want nvml.Return
	}{
		{"nil state", x, nil, nvml.ERROR_INVALID_ARGUMENT},
		{"unknown policy", x, &nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: 9}, nvml.ERROR_INVALID_ARGUMENT},
		{"slice over 30 ms", x, &nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, Frequency: 10}, nvml.ERROR_INVALID_ARGUMENT},
		{"ARR factor out of range", x, &nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, AvgFactor: 99}, nvml.ERROR_INVALID_ARGUMENT},
		{"NVENC engine", x, &nvml.VgpuSchedulerState_v2{EngineId: nvml.VGPU_SCHEDULER_ENGINE_TYPE_NVENC0, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE}, nvml.ERROR_NOT_SUPPORTED},
		{"Hopper GPU instance", h100GI, equal200, nvml.ERROR_NOT_SUPPORTED},
		{"GPU instance without vGPU types", plainGI, equal200, nvml.ERROR_NOT_SUPPORTED},
	} {
		if got := tt.gi.SetVgpuSchedulerState_v2(tt.set); got != tt.want {
			t.Errorf("%s: set = %v, want %v", tt.name, got, tt.want)
		}
	}
	if s := giSched(t, x); s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT {
		t.Fatalf("a refused set changed the scheduler: %+v", s)
	}
	if _, ret := h100GI.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: graphics}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("Hopper GPU instance's state: %v, want NOT_SUPPORTED", ret)
	}

	if ret := x.SetVgpuSchedulerState_v2(equal200); ret != nvml.SUCCESS {
		t.Fatalf("set equal share at 200 Hz: %v", ret)
	}
	if s := giSched(t, x); s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE || s.Timeslice != 5_000_000 {
		t.Fatalf("after the set: %+v, want equal share, 5 ms", s)
	}
	if sum, _ := e.h.Summary(); !strings.Contains(sum, ",sched=equal_share/5ms)") {
		t.Fatalf("summary does not show the GPU instance's scheduler:\n%s", sum)
	}
	l, ret := x.GetVgpuSchedulerLog_v2(nvml.VgpuSchedulerLogInfo_v2{EngineId: graphics})
	if ret != nvml.SUCCESS || l.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE || l.Timeslice != 5_000_000 {
		t.Fatalf("log: %v %+v", ret, l.SchedulerPolicy)
	}

	// A VM running in the GPU instance: the driver refuses any set.
	vf := vfOf(rtxPro, 0)
	writeOK(t, e, vfType(vf), typeID(t, e, "RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-1-12Q"))
	if err := e.h.OpenDevice(vf, "0b5e2f36-6a4c-4c43-9f1e-0d7f4a1b2c3d", "vm1"); err != nil {
		t.Fatal(err)
	}
	fixed := &nvml.VgpuSchedulerState_v2{EngineId: graphics, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE}
	if ret := x.SetVgpuSchedulerState_v2(fixed); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("set with a VM running in the GPU instance: %v, want NOT_SUPPORTED", ret)
	}
	if err := e.h.CloseDevice(vf); err != nil {
		t.Fatal(err)
	}
	if ret := x.SetVgpuSchedulerState_v2(fixed); ret != nvml.SUCCESS {
		t.Fatalf("set once the VM stopped: %v", ret)
	}

	// The driver's unload forgets it.
	if err := e.h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	if err := e.h.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	if s := giSched(t, x); s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT {
		t.Fatalf("after a module reload: %+v, want the default", s)
	}

	// So does the GPU instance's destroy: the handle goes stale and a new
	// GPU instance in its place starts from the default.
	if ret := x.SetVgpuSchedulerState_v2(fixed); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	writeOK(t, e, vfType(vf), 0)
	if ret := x.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("destroy: %v", ret)
	}
	if _, ret := x.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: graphics}); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Fatalf("destroyed GPU instance: %v, want INVALID_ARGUMENT", ret)
	}
	if s := giSched(t, mustGI(t, d, rtxProGfx1g, 0)); s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT {
		t.Fatalf("re-created GPU instance: %+v, want the default", s)
	}
}
