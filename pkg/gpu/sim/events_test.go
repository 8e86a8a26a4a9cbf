package sim_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// A GPU reset, a VF rebind, a driver unload and a lost GPU's return each
// put heterogeneous mode and the vGPU scheduler back at the driver's
// defaults (docs/simulator.md, "What an event loses").
func TestEventsLoseSettings(t *testing.T) {
	for _, tt := range []struct {
		name  string
		event func(h *sim.Host) error
	}{
		{"reset", resetWithVFsOff},
		{"vf-rebind", func(h *sim.Host) error { return h.RebindVFs(sim.DefaultL4) }},
		{"driver-reload", func(h *sim.Host) error {
			if err := h.SetDriverLoaded(false); err != nil {
				return err
			}
			return h.SetDriverLoaded(true)
		}},
		{"lost-and-back", func(h *sim.Host) error {
			if err := h.LoseGPU(sim.DefaultL4); err != nil {
				return err
			}
			return h.RecoverGPU(sim.DefaultL4)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil)
			d := e.dev(t, sim.DefaultL4)
			if ret := d.SetVgpuHeterogeneousMode(hetMode(1)); ret != nvml.SUCCESS {
				t.Fatalf("SetVgpuHeterogeneousMode: %v", ret)
			}
			set := nvml.VgpuSchedulerState_v2{EngineId: nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS, SchedulerPolicy: nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE, Frequency: 500}
			if ret := d.SetVgpuSchedulerState_v2(&set); ret != nvml.SUCCESS {
				t.Fatalf("SetVgpuSchedulerState_v2: %v", ret)
			}
			if err := tt.event(e.h); err != nil {
				t.Fatal(err)
			}
			d = e.dev(t, sim.DefaultL4)
			if m, ret := d.GetVgpuHeterogeneousMode(); ret != nvml.SUCCESS || m.Mode != 0 {
				t.Fatalf("heterogeneous mode after the event: %+v, %v; want 0", m, ret)
			}
			s, ret := d.GetVgpuSchedulerState_v2(nvml.VgpuSchedulerStateInfo_v2{EngineId: nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS})
			if ret != nvml.SUCCESS || s.SchedulerPolicy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT {
				t.Fatalf("scheduler after the event: %+v, %v; want best effort", s, ret)
			}
		})
	}
}

// A VF rebind is refused while a VM holds one of the GPU's vGPUs, and
// then changes nothing.
func TestRebindVFsRefusedWhileAVMRuns(t *testing.T) {
	e := newEnv(t, nil)
	d := e.dev(t, sim.DefaultL4)
	if ret := d.SetVgpuHeterogeneousMode(hetMode(1)); ret != nvml.SUCCESS {
		t.Fatalf("SetVgpuHeterogeneousMode: %v", ret)
	}
	vf := vfOf(sim.DefaultL4, 0)
	writeOK(t, e, vfType(vf), typeID(t, e, "L4-24GB", "L4-4Q"))
	if err := e.h.OpenDevice(vf, "0b7c1b6e-8d5f-4c4e-9a47-6f7d3f0c2a11", "vm1"); err != nil {
		t.Fatal(err)
	}
	if err := e.h.RebindVFs(sim.DefaultL4); err == nil {
		t.Fatal("VF rebind under a running VM succeeded")
	}
	if m, _ := e.dev(t, sim.DefaultL4).GetVgpuHeterogeneousMode(); m.Mode != 1 {
		t.Fatalf("the refused rebind changed heterogeneous mode: %+v", m)
	}
}

// resetWithVFsOff resets the L4 as an operator must: its VFs disabled
// first (the driver refuses a reset while they are enabled), enabled again
// after.
func resetWithVFsOff(h *sim.Host) error {
	if err := h.SetVFs(sim.DefaultL4, false); err != nil {
		return err
	}
	if err := h.ResetGPU(sim.DefaultL4); err != nil {
		return err
	}
	return h.SetVFs(sim.DefaultL4, true)
}
