package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// Workload kinds (see Workload).
const (
	// WorkloadIdle submits nothing.
	WorkloadIdle = "idle"
	// WorkloadSteady submits work at a constant rate in short kernels.
	WorkloadSteady = "steady"
	// WorkloadBursty alternates seeded random on and off periods; Demand is its mean.
	WorkloadBursty = "bursty"
	// WorkloadNoisy wants the whole GPU, in long, power-hungry kernels: the
	// noisy neighbour.
	WorkloadNoisy = "noisy"
)

// ErrBadWorkload is wrapped by SetWorkload's validation errors.
var ErrBadWorkload = errors.New("invalid workload")

// Workload is the demand model of one vGPU or MIG GPU instance: the work it
// submits over time, as the fraction of the whole GPU's compute at full
// clock it would use if nothing held it back. The simulated scheduler
// (sched.go) serves that work by the GPU's policy; what it could not serve
// is the interference the share loop measures.
//
// A vGPU's workload runs only while a VM has the vGPU open (OpenDevice); a
// MIG GPU instance's runs whenever it is set (bare-metal jobs).
type Workload struct {
	// Kind is idle, steady, bursty or noisy.
	Kind string `json:"kind"`
	// Demand is the mean demand in [0,1] of a whole GPU (0: the kind's default).
	Demand float64 `json:"demand"`
	// KernelNs is the length of one kernel at full clock. The best-effort
	// scheduler preempts only between kernels, so long kernels overrun
	// their time slice (0: the kind's default).
	KernelNs int64 `json:"kernelNs,omitempty"`
	// PeriodNs and Duty shape a bursty workload: on and off periods average
	// PeriodNs*Duty and PeriodNs*(1-Duty) (0: defaults 400ms, 0.4).
	PeriodNs int64   `json:"periodNs,omitempty"`
	Duty     float64 `json:"duty,omitempty"`
	// Power is the power drawn per unit of compute, 1 being typical
	// (0: the kind's default).
	Power float64 `json:"power,omitempty"`
	// FB is the framebuffer in use as a fraction of the instance's (0: the kind's default).
	FB float64 `json:"fb,omitempty"`
	// Seed makes a bursty trace reproducible.
	Seed uint64 `json:"seed,omitempty"`
	// StartNs is the simulated time the workload was set: its trace starts there.
	StartNs int64 `json:"startNs,omitempty"`
}

// withDefaults fills the kind's defaults and validates the result.
func (w Workload) withDefaults(cal Calibration) (Workload, error) {
	bad := func(format string, a ...any) (Workload, error) {
		return w, fmt.Errorf("%w: %s", ErrBadWorkload, fmt.Sprintf(format, a...))
	}
	switch w.Kind {
	case WorkloadIdle:
		w.Demand = 0
		if w.FB == 0 {
			w.FB = 0.05
		}
	case WorkloadSteady, WorkloadBursty:
		if w.Demand == 0 {
			w.Demand = 0.2
		}
		if w.KernelNs == 0 {
			w.KernelNs = int64(cal.Kernel)
		}
		if w.Power == 0 {
			w.Power = 1
		}
		if w.FB == 0 {
			w.FB = 0.5
		}
		if w.Kind == WorkloadBursty {
			if w.PeriodNs == 0 {
				w.PeriodNs = int64(400 * time.Millisecond)
			}
			if w.Duty == 0 {
				w.Duty = 0.4
			}
		}
	case WorkloadNoisy:
		if w.Demand == 0 {
			w.Demand = 1
		}
		if w.KernelNs == 0 {
			w.KernelNs = int64(cal.NoisyKernel)
		}
		if w.Power == 0 {
			w.Power = cal.NoisyPower
		}
		if w.FB == 0 {
			w.FB = 0.9
		}
	default:
		return bad("kind %q: want idle, steady, bursty or noisy", w.Kind)
	}
	switch {
	case math.IsNaN(w.Demand) || w.Demand < 0 || w.Demand > 1:
		return bad("demand %v: want a fraction of the GPU in [0,1]", w.Demand)
	case w.KernelNs < 0 || w.KernelNs > int64(time.Second):
		return bad("kernel %v: want 0..1s", time.Duration(w.KernelNs))
	case w.PeriodNs < 0 || w.PeriodNs > int64(time.Hour):
		return bad("period %v: want 0..1h", time.Duration(w.PeriodNs))
	case w.Duty < 0 || w.Duty > 1:
		return bad("duty %v: want [0,1]", w.Duty)
	case w.Kind == WorkloadBursty && w.Duty == 0:
		return bad("duty 0 leaves a bursty workload no on time")
	case w.Power < 0 || w.Power > 3:
		return bad("power %v: want 0..3", w.Power)
	case w.FB < 0 || w.FB > 1:
		return bad("fb %v: want a fraction in [0,1]", w.FB)
	}
	if w.Kind == WorkloadBursty && w.Demand > w.Duty {
		return bad("bursty demand %v exceeds its duty %v (the on level would pass a whole GPU)", w.Demand, w.Duty)
	}
	return w, nil
}

// migKey is the workload key of a MIG GPU instance.
func migKey(gpuUUID string, giID int) string { return gpuUUID + "/gi" + strconv.Itoa(giID) }

// workloadKey resolves what SetWorkload accepts (an mdev UUID, a VF PCI
// address, or GPU/giN with GPU a PCI address or UUID) to the key the state
// keeps workloads under.
func (st *state) workloadKey(dev string) (string, *gpuState, error) {
	if gpuID, gi, ok := strings.Cut(dev, "/gi"); ok {
		g := st.gpu(gpuID)
		if g == nil {
			if pci, err := gpu.NormalizePCI(gpuID); err == nil {
				g = st.gpu(pci)
			}
		}
		if g == nil {
			return "", nil, fmt.Errorf("%w: %s", ErrNoSuchGPU, gpuID)
		}
		id, err := strconv.Atoi(gi)
		if err != nil || g.giByID(id) == nil {
			return "", nil, fmt.Errorf("%w: GPU %s has no GPU instance %q", ErrNoSuchDevice, g.PCI, gi)
		}
		return migKey(g.UUID, id), g, nil
	}
	key := strings.ToLower(dev)
	if pci, err := gpu.NormalizePCI(dev); err == nil {
		key = pci
	}
	if v, g := st.findVGPU(key); v != nil {
		return key, g, nil
	}
	return "", nil, fmt.Errorf("%w: %s (want an mdev UUID, a VF address with a vGPU, or GPU/giN)", ErrNoSuchDevice, dev)
}

// SetWorkload sets the workload of a vGPU (mdev UUID or VF address) or a
// MIG GPU instance ("GPU/giN", GPU a PCI address or UUID). It takes effect
// at the current simulated time; the framebuffer use follows w.FB.
func (h *Host) SetWorkload(dev string, w Workload) error {
	return h.mutate(func(st *state) (bool, error) {
		key, g, err := st.workloadKey(dev)
		if err != nil {
			return false, err
		}
		eng := h.engine()
		w, err := w.withDefaults(eng.cal)
		if err != nil {
			return false, err
		}
		now := eng.advance(st)
		w.StartNs = now
		if st.Workloads == nil {
			st.Workloads = map[string]*Workload{}
		}
		st.Workloads[key] = &w
		if v, _ := st.findVGPU(key); v != nil {
			if t := g.typeOf(v); t != nil {
				v.FbUsed = uint64(w.FB * float64(t.FramebufferMiB<<20))
			}
		}
		return true, nil
	})
}

// ClearWorkload removes a device's workload (it goes idle).
func (h *Host) ClearWorkload(dev string) error {
	return h.mutate(func(st *state) (bool, error) {
		key, _, err := st.workloadKey(dev)
		if err != nil {
			return false, err
		}
		if _, ok := st.Workloads[key]; !ok {
			return false, nil
		}
		h.engine().advance(st)
		delete(st.Workloads, key)
		if v, _ := st.findVGPU(key); v != nil {
			v.FbUsed = 0
		}
		return true, nil
	})
}

// Workloads returns the workloads by key (mdev UUID, VF address, GPU-UUID/giN).
func (h *Host) Workloads() (map[string]Workload, error) {
	out := map[string]Workload{}
	err := h.view(func(st *state) error {
		for k, w := range st.Workloads {
			out[k] = *w
		}
		return nil
	})
	return out, err
}

// SetPowerCap caps a GPU's power at watts (0 removes the cap), as
// `nvidia-smi -pl` does: under load the clocks drop until the GPU's power
// fits, and every instance on it slows down.
func (h *Host) SetPowerCap(id string, watts int) error {
	return h.mutate(func(st *state) (bool, error) {
		g := st.gpu(id)
		if g == nil {
			return false, fmt.Errorf("%w: %s", ErrNoSuchGPU, id)
		}
		p := powerOf(g.model)
		if watts != 0 && (watts < p.minCapW() || watts > p.TDPW) {
			return false, fmt.Errorf("power cap %d W on %s: want %d..%d W: %w", watts, g.PCI, p.minCapW(), p.TDPW, ErrBadWorkload)
		}
		h.engine().advance(st)
		g.PowerCapW = watts
		return true, nil
	})
}
