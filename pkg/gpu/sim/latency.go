package sim

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Latency is how long the simulated driver takes for each operation that
// changes a GPU (options.latency in the host description). A call on a GPU
// waits for the calls before it on the same GPU, as the driver serialises
// them (one resource-manager lock per GPU); calls on different GPUs
// overlap. Empty fields take no time. docs/simulator.md says where each
// figure of TypicalLatency comes from.
type Latency struct {
	// GPUInstanceCreate and GPUInstanceDestroy: nvmlDeviceCreateGpuInstance*
	// and nvmlGpuInstanceDestroy.
	GPUInstanceCreate  string `json:"gpuInstanceCreate,omitempty"`
	GPUInstanceDestroy string `json:"gpuInstanceDestroy,omitempty"`
	// ComputeInstanceCreate and ComputeInstanceDestroy:
	// nvmlGpuInstanceCreateComputeInstance* and nvmlComputeInstanceDestroy.
	ComputeInstanceCreate  string `json:"computeInstanceCreate,omitempty"`
	ComputeInstanceDestroy string `json:"computeInstanceDestroy,omitempty"`
	// VGPUType: a write of a VF's current_vgpu_type (setting or clearing).
	VGPUType string `json:"vgpuType,omitempty"`
	// MdevCreate and MdevRemove: writes of mdev_supported_types/*/create
	// and of an mdev's remove.
	MdevCreate string `json:"mdevCreate,omitempty"`
	MdevRemove string `json:"mdevRemove,omitempty"`
	// MIGMode: nvmlDeviceSetMigMode.
	MIGMode string `json:"migMode,omitempty"`
	// Jitter spreads each call's time uniformly by up to this fraction
	// either way (0.1: ±10%); 0 to 1.
	Jitter float64 `json:"jitter,omitempty"`
}

// TypicalLatency is the figure set `vgpud sim latency --typical` and the
// recovery benchmark use. The figures are assumptions of the order of
// magnitude a real driver shows, not measurements (docs/simulator.md).
func TypicalLatency() Latency {
	return Latency{
		GPUInstanceCreate: "200ms", GPUInstanceDestroy: "100ms",
		ComputeInstanceCreate: "100ms", ComputeInstanceDestroy: "50ms",
		VGPUType: "150ms", MdevCreate: "150ms", MdevRemove: "100ms",
		MIGMode: "1s", Jitter: 0.1,
	}
}

// latClass is one operation the latency model times.
type latClass int

const (
	latNone latClass = iota
	latGICreate
	latGIDestroy
	latCICreate
	latCIDestroy
	latVGPUType
	latMdevCreate
	latMdevRemove
	latMIGMode
	latClasses
)

// nvmlLatClass maps a simulated NVML call to its class (latNone: untimed).
func nvmlLatClass(op string) latClass {
	switch op {
	case "CreateGpuInstance", "CreateGpuInstanceWithPlacement":
		return latGICreate
	case "GpuInstanceDestroy":
		return latGIDestroy
	case "CreateComputeInstance", "CreateComputeInstanceWithPlacement":
		return latCICreate
	case "ComputeInstanceDestroy":
		return latCIDestroy
	case "SetMigMode":
		return latMIGMode
	}
	return latNone
}

// maxOpLatency bounds each figure: longer than any driver call vgpud
// waits for would only make the simulator hang.
const maxOpLatency = 10 * time.Second

// parse checks the figures and returns them by class.
func (l *Latency) parse() ([latClasses]time.Duration, error) {
	var out [latClasses]time.Duration
	fields := []struct {
		name string
		v    string
		c    latClass
	}{
		{"gpuInstanceCreate", l.GPUInstanceCreate, latGICreate},
		{"gpuInstanceDestroy", l.GPUInstanceDestroy, latGIDestroy},
		{"computeInstanceCreate", l.ComputeInstanceCreate, latCICreate},
		{"computeInstanceDestroy", l.ComputeInstanceDestroy, latCIDestroy},
		{"vgpuType", l.VGPUType, latVGPUType},
		{"mdevCreate", l.MdevCreate, latMdevCreate},
		{"mdevRemove", l.MdevRemove, latMdevRemove},
		{"migMode", l.MIGMode, latMIGMode},
	}
	for _, f := range fields {
		if f.v == "" {
			continue
		}
		d, err := time.ParseDuration(f.v)
		if err != nil {
			return out, fmt.Errorf("%s: %w", f.name, err)
		}
		if d < 0 || d > maxOpLatency {
			return out, fmt.Errorf("%s: %v out of range 0..%v", f.name, d, maxOpLatency)
		}
		out[f.c] = d
	}
	if l.Jitter < 0 || l.Jitter > 1 {
		return out, fmt.Errorf("jitter: %v out of range 0..1", l.Jitter)
	}
	return out, nil
}

// latencyModel is the parsed Latency the calls read (Host.ops).
type latencyModel struct {
	by     [latClasses]time.Duration
	jitter float64
}

func newLatencyModel(l *Latency) *latencyModel {
	m := &latencyModel{}
	if l == nil {
		return m
	}
	by, err := l.parse()
	if err != nil {
		return m // Validate refused it before it was stored
	}
	m.by, m.jitter = by, l.Jitter
	return m
}

// of is one call's time: the class's figure, spread by the jitter.
func (m *latencyModel) of(c latClass) time.Duration {
	d := m.by[c]
	if d <= 0 || m.jitter == 0 {
		return d
	}
	f := 1 + m.jitter*(2*rand.Float64()-1)
	return time.Duration(float64(d) * f)
}

// gpuSerial serialises the timed calls of one GPU, as the driver does:
// one mutex per GPU index, made on first use.
type gpuSerial struct {
	mu  sync.Mutex
	per map[int]*sync.Mutex
}

func (s *gpuSerial) lock(idx int) func() {
	s.mu.Lock()
	if s.per == nil {
		s.per = map[int]*sync.Mutex{}
	}
	l := s.per[idx]
	if l == nil {
		l = &sync.Mutex{}
		s.per[idx] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// timed runs a call of class c on GPU idx: it waits for the GPU's earlier
// timed calls, takes the call's time, then runs fn (which applies the
// call's effect under the host lock), so the host lock is never held
// while the driver "works" and other GPUs' calls go on meanwhile. A
// refused call takes the same time (an assumption: the driver's checks
// run inside the same locked section). The serialisation is within the
// process: the daemon is the one that carves.
func (h *Host) timed(c latClass, idx int, fn func()) {
	m := h.ops.Load()
	if c == latNone || idx < 0 || m == nil || m.by[c] <= 0 {
		fn()
		return
	}
	unlock := h.serial.lock(idx)
	defer unlock()
	h.sleep(m.of(c))
	fn()
}

// SetLatency sets the per-operation latencies (an empty Latency turns
// them off); it is kept in the host's state like the rest of the host
// description.
func (h *Host) SetLatency(l Latency) error {
	if _, err := l.parse(); err != nil {
		return fmt.Errorf("%w: options.latency: %w", ErrBadSpec, err)
	}
	return h.mutate(func(st *state) (bool, error) {
		if l == (Latency{}) {
			st.Spec.Options.Latency = nil
		} else {
			st.Spec.Options.Latency = &l
		}
		h.ops.Store(newLatencyModel(st.Spec.Options.Latency))
		return true, nil
	})
}

// LatencySettings returns the per-operation latencies in force.
func (h *Host) LatencySettings() (Latency, error) {
	var l Latency
	err := h.view(func(st *state) error {
		if st.Spec.Options.Latency != nil {
			l = *st.Spec.Options.Latency
		}
		return nil
	})
	return l, err
}
