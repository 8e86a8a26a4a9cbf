package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// The simulated GPUs' performance is modelled by pkg/gpu/sim/workload.
// This file feeds it: it describes each GPU of the state as the engine
// sees it (engineGPU) and offers the engine's clock and ground truth on
// the Host. The engine lives in the Host, not in state.json: like the
// driver's scheduler it starts afresh with the process.

// ErrRealTime is returned by Advance while the model follows the wall clock.
var ErrRealTime = errors.New("the simulated clock follows real time (call UseManualClock first)")

// engine returns the host's workload model. Callers hold h.mu.
func (h *Host) engine() *workload.Engine {
	if h.eng == nil {
		h.eng = workload.New(workload.DefaultCalibration())
	}
	return h.eng
}

// advance brings every GPU's model to the current time; it returns that time.
func (h *Host) advance(st *state) int64 {
	gpus := make([]*workload.GPU, len(st.GPUs))
	for i, g := range st.GPUs {
		gpus[i] = engineGPU(st, g)
	}
	return h.engine().Advance(gpus)
}

// run brings one GPU's model to the current time and returns it.
func (h *Host) run(st *state, g *gpuState) *workload.GPURun {
	return h.engine().AdvanceGPU(engineGPU(st, g))
}

// engineGPU is what the engine needs to know of g: its policy, power limit
// and running instances with their workloads and shares. It is made again
// only when the state changed (a new generation, or a state read anew,
// whose GPUs are new), so that the engine, which re-reads a GPU only when
// handed a new one, does no work while the state stands still.
func engineGPU(st *state, g *gpuState) *workload.GPU {
	if g.engine != nil && g.engineGen == st.Generation {
		return g.engine
	}
	in := &workload.GPU{UUID: g.UUID, Power: workload.PowerOf(g.model.Name), Lost: g.Lost, MIG: g.MIGCurrent,
		CapW: g.capW(), Policy: g.Sched.Policy, Timeslice: int64(g.timeslice())}
	add := func(key string, handle uint32, gi int, share float64, w *workload.Workload) {
		x := workload.Instance{Key: key, Handle: handle, GI: gi, Share: share}
		if w != nil {
			x.Workload = *w
		}
		in.Instances = append(in.Instances, x)
	}
	keyOf := func(v *vgpu) string {
		for _, f := range g.VFs {
			if f.VGPU == v {
				return f.PCI
			}
		}
		for _, m := range g.Mdevs {
			if m.VGPU == v {
				return m.UUID
			}
		}
		return ""
	}
	if g.MIGCurrent {
		// A MIG instance runs while its workload is set; a MIG-backed vGPU
		// while its VM runs and it has a workload.
		total := 1.0
		if g.model.MIG != nil && g.model.MIG.ComputeSlices > 0 {
			total = float64(g.model.MIG.ComputeSlices)
		}
		for _, x := range g.GIs {
			p := giProfileOf(g, x)
			share := 0.0
			if p != nil {
				share = float64(p.ComputeSlices) / total
			}
			if w := st.Workloads[migKey(g.UUID, x.ID)]; w != nil {
				add(migKey(g.UUID, x.ID), 0, x.ID, share, w)
			}
			for _, v := range g.vgpusOnGI(x.ID) {
				if k := keyOf(v); v.VM != "" && k != "" && st.Workloads[k] != nil {
					add(k, v.Handle, x.ID, share, st.Workloads[k])
				}
			}
		}
	} else {
		// Every time-sliced vGPU whose VM runs takes its turn, with a
		// workload or idle.
		for _, v := range g.activeVGPUs() {
			if v.GI >= 0 {
				continue
			}
			k := keyOf(v)
			if k == "" {
				continue
			}
			add(k, v.Handle, -1, fixedShare(g, v), st.Workloads[k])
		}
	}
	g.engine, g.engineGen = in, st.Generation
	return in
}

// fixedShare is the share FIXED_SHARE gives a time-sliced vGPU: 1/max
// instances of its type, or its framebuffer's share of the GPU in
// mixed-size mode.
func fixedShare(g *gpuState, v *vgpu) float64 {
	t := g.typeOf(v)
	if t == nil {
		return 0
	}
	if g.Heterogeneous && g.model.MemoryMiB > 0 {
		return float64(t.FramebufferMiB) / float64(g.model.MemoryMiB)
	}
	if t.MaxInstances > 0 {
		return 1 / float64(t.MaxInstances)
	}
	return 0
}

// capW is the power limit in force on g.
func (g *gpuState) capW() float64 {
	p := workload.PowerOf(g.model.Name)
	if g.PowerCapW > 0 && g.PowerCapW < p.TDPW {
		return float64(g.PowerCapW)
	}
	return float64(p.TDPW)
}

// UseManualClock stops the workload model's clock from following the wall
// clock: from now on only Advance moves it. It starts at a fixed instant
// (2026-01-01 UTC) so that runs are reproducible. Everything the model
// held is reset.
func (h *Host) UseManualClock() error {
	return h.view(func(*state) error {
		h.eng = workload.NewManual(h.engine().Calibration(), workload.ManualEpoch)
		return nil
	})
}

// SetCalibration replaces the workload model's constants
// (workload.DefaultCalibration is what a host starts with); the model
// restarts.
func (h *Host) SetCalibration(c workload.Calibration) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return h.view(func(*state) error {
		if e := h.engine(); e.Manual() {
			h.eng = workload.NewManual(c, e.Now())
		} else {
			h.eng = workload.New(c)
		}
		return nil
	})
}

// Calibration returns the workload model's constants.
func (h *Host) Calibration() workload.Calibration {
	var c workload.Calibration
	_ = h.view(func(*state) error { c = h.engine().Calibration(); return nil })
	return c
}

// Advance moves the manual clock by d, simulating every GPU on the way.
func (h *Host) Advance(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("advance by %v: negative", d)
	}
	return h.view(func(st *state) error {
		if !h.engine().MoveClock(d) {
			return ErrRealTime
		}
		h.advance(st)
		return nil
	})
}

// Now is the workload model's current time.
func (h *Host) Now() time.Time {
	var t int64
	_ = h.view(func(*state) error { t = h.engine().Now(); return nil })
	return time.Unix(0, t)
}

// Truth returns the ground truth now (advancing the model to now).
func (h *Host) Truth() (workload.Truth, error) {
	out := workload.Truth{GPUs: map[string]workload.GPUTruth{}, Instances: map[string]workload.InstanceTruth{}}
	err := h.view(func(st *state) error {
		out = h.engine().Truth(h.advance(st))
		return nil
	})
	return out, err
}
