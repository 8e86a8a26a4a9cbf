package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// The Host's side of the workload model: which device a workload belongs
// to, what setting one does to the state (its framebuffer use), and the
// power cap that slows a GPU down.

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
func (h *Host) SetWorkload(dev string, w workload.Workload) error {
	return h.mutate(func(st *state) (bool, error) {
		key, g, err := st.workloadKey(dev)
		if err != nil {
			return false, err
		}
		w, err := w.WithDefaults(h.engine().Calibration())
		if err != nil {
			return false, err
		}
		now := h.advance(st)
		w.StartNs = now
		if st.Workloads == nil {
			st.Workloads = map[string]*workload.Workload{}
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
		h.advance(st)
		delete(st.Workloads, key)
		if v, _ := st.findVGPU(key); v != nil {
			v.FbUsed = 0
		}
		return true, nil
	})
}

// Workloads returns the workloads by key (mdev UUID, VF address, GPU-UUID/giN).
func (h *Host) Workloads() (map[string]workload.Workload, error) {
	out := map[string]workload.Workload{}
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
		p := workload.PowerOf(g.model.Name)
		if watts != 0 && (watts < p.MinCapW() || watts > p.TDPW) {
			return false, fmt.Errorf("power cap %d W on %s: want %d..%d W: %w", watts, g.PCI, p.MinCapW(), p.TDPW, workload.ErrInvalid)
		}
		h.advance(st)
		g.PowerCapW = watts
		return true, nil
	})
}
