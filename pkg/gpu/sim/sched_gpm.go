package sim

import (
	"sort"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// GPU Performance Monitoring (GPM) and MIG device handles: how a Hopper or
// newer host reads a MIG instance's activity and memory (reference 5.4:
// whole-GPU utilization is NOT_SUPPORTED with MIG on).

// gpmSample is a simulated GPM sample: the model's cumulative activity
// counters of one GPU or GPU instance at one time.
type gpmSample struct {
	*mock.GpmSample
	l     *lib
	freed bool
	valid bool
	gpu   string
	gi    int // -1: the whole GPU
	t     int64
	busy  float64
	dram  float64
}

var _ nvml.GpmSample = (*gpmSample)(nil)

func gpmCapable(g *gpuState) bool {
	switch g.model.Architecture {
	case "hopper", "blackwell":
		return true
	}
	return false
}

// GpmSampleAlloc allocates a sample.
func (l *lib) GpmSampleAlloc() (nvml.GpmSample, nvml.Return) {
	if ret := l.libCall("GpmSampleAlloc", func(*state) {}); ret != nvml.SUCCESS {
		return nil, ret
	}
	return &gpmSample{GpmSample: &mock.GpmSample{}, l: l, gi: -1}, nvml.SUCCESS
}

// GpmSampleFree frees a sample.
func (l *lib) GpmSampleFree(s nvml.GpmSample) nvml.Return {
	if s == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return s.Free()
}

// GpmSampleGet samples the whole GPU.
func (l *lib) GpmSampleGet(d nvml.Device, s nvml.GpmSample) nvml.Return {
	if s == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return s.Get(d)
}

// GpmMigSampleGet samples one GPU instance.
func (l *lib) GpmMigSampleGet(d nvml.Device, gi int, s nvml.GpmSample) nvml.Return {
	if s == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return s.MigGet(d, gi)
}

// GpmQueryDeviceSupport: GPM exists on Hopper and newer.
func (l *lib) GpmQueryDeviceSupport(d nvml.Device) (nvml.GpmSupport, nvml.Return) {
	dev, ok := d.(*device)
	if !ok || dev.h != l.h {
		return nvml.GpmSupport{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return dev.GpmQueryDeviceSupport()
}

func (d *device) GpmQueryDeviceSupport() (nvml.GpmSupport, nvml.Return) {
	s := nvml.GpmSupport{Version: nvml.GPM_SUPPORT_VERSION}
	ret := d.read("GpmQueryDeviceSupport", func(_ *state, g *gpuState) nvml.Return {
		if gpmCapable(g) {
			s.IsSupportedDevice = 1
		}
		return nvml.SUCCESS
	})
	return s, ret
}

func (d *device) GpmSampleGet(s nvml.GpmSample) nvml.Return { return s.Get(d) }

func (d *device) GpmMigSampleGet(gi int, s nvml.GpmSample) nvml.Return { return s.MigGet(d, gi) }

func (s *gpmSample) Free() nvml.Return {
	if ret := s.l.libCall("GpmSampleFree", func(*state) {}); ret != nvml.SUCCESS {
		return ret
	}
	if s.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.freed = true
	return nvml.SUCCESS
}

func (s *gpmSample) Get(dev nvml.Device) nvml.Return { return s.take(dev, -1) }

func (s *gpmSample) MigGet(dev nvml.Device, gi int) nvml.Return { return s.take(dev, gi) }

func (s *gpmSample) take(dev nvml.Device, giID int) nvml.Return {
	d, ok := dev.(*device)
	if !ok || d.h != s.l.h || s.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	op := "GpmSampleGet"
	if giID >= 0 {
		op = "GpmMigSampleGet"
	}
	return d.telemetry(op, func(g *gpuState, r *gpuRun) nvml.Return {
		if !gpmCapable(g) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		s.gpu, s.gi, s.t, s.valid = g.UUID, giID, r.t, true
		if giID < 0 {
			s.busy, s.dram = r.busy, r.memBusy
			return nvml.SUCCESS
		}
		if !g.MIGCurrent || g.giByID(giID) == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s.busy, s.dram = 0, 0
		if x := r.gis[giID]; x != nil {
			s.busy, s.dram = x.busy, x.dram
		}
		return nvml.SUCCESS
	})
}

// GpmMetricsGet computes metrics between two samples of the same GPU or
// GPU instance: SM and graphics utilization, SM occupancy and DRAM
// bandwidth utilization, in percent. Other metrics are NOT_SUPPORTED.
func (l *lib) GpmMetricsGet(m *nvml.GpmMetricsGetType) nvml.Return {
	if !l.initialized() {
		return nvml.ERROR_UNINITIALIZED
	}
	// A library call (it computes from two samples the caller holds), but
	// like every call it takes the configured latency and fault rules.
	return l.h.call("GpmMetricsGet", -1, false, func(*state, *gpuState) (bool, nvml.Return) {
		return false, gpmMetrics(m)
	})
}

func gpmMetrics(m *nvml.GpmMetricsGetType) nvml.Return {
	if m == nil || int(m.NumMetrics) > len(m.Metrics) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if m.Version != nvml.GPM_METRICS_GET_VERSION {
		return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
	}
	a, ok1 := m.Sample1.(*gpmSample)
	b, ok2 := m.Sample2.(*gpmSample)
	if !ok1 || !ok2 || !a.valid || !b.valid || a.freed || b.freed || a.gpu != b.gpu || a.gi != b.gi || b.t <= a.t {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	dt := float64(b.t - a.t)
	sm := 100 * (b.busy - a.busy) / dt
	dram := 100 * (b.dram - a.dram) / dt
	for i := 0; i < int(m.NumMetrics); i++ {
		x := &m.Metrics[i]
		x.NvmlReturn = uint32(nvml.SUCCESS)
		switch nvml.GpmMetricId(x.MetricId) {
		case nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_GRAPHICS_UTIL:
			x.Value = sm
		case nvml.GPM_METRIC_SM_OCCUPANCY:
			x.Value = sm * 0.7
		case nvml.GPM_METRIC_DRAM_BW_UTIL:
			x.Value = dram
		default:
			x.Value = 0
			x.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
		}
	}
	return nvml.SUCCESS
}

// --- MIG device handles ---

// migDevice is a MIG device handle: one compute instance of a GPU instance.
type migDevice struct {
	*mock.Device
	d      *device
	gi, ci int
}

var _ nvml.Device = (*migDevice)(nil)

func (d *device) IsMigDeviceHandle() (bool, nvml.Return) {
	ret := d.read("IsMigDeviceHandle", func(*state, *gpuState) nvml.Return { return nvml.SUCCESS })
	return false, ret
}

// migDevices lists (gi, ci) pairs in the order MIG device indices follow.
func migDevices(g *gpuState) [][2]int {
	var out [][2]int
	gis := append([]*gi(nil), g.GIs...)
	sort.Slice(gis, func(i, j int) bool { return gis[i].ID < gis[j].ID })
	for _, x := range gis {
		cis := append([]*ci(nil), x.CIs...)
		sort.Slice(cis, func(i, j int) bool { return cis[i].ID < cis[j].ID })
		for _, c := range cis {
			out = append(out, [2]int{x.ID, c.ID})
		}
	}
	return out
}

// GetMigDeviceHandleByIndex returns the idx-th MIG device; NOT_FOUND past the last.
func (d *device) GetMigDeviceHandleByIndex(idx int) (nvml.Device, nvml.Return) {
	var pair [2]int
	ret := d.read("GetMigDeviceHandleByIndex", func(_ *state, g *gpuState) nvml.Return {
		if g.model.MIG == nil || !g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if idx < 0 || idx >= g.model.MIG.ComputeSlices {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		list := migDevices(g)
		if idx >= len(list) {
			return nvml.ERROR_NOT_FOUND
		}
		pair = list[idx]
		return nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return &migDevice{Device: baseDevice, d: d, gi: pair[0], ci: pair[1]}, nvml.SUCCESS
}

func (m *migDevice) read(op string, fn func(st *state, g *gpuState, x *gi) nvml.Return) nvml.Return {
	return m.d.read(op, func(st *state, g *gpuState) nvml.Return {
		x := g.giByID(m.gi)
		if x == nil || !g.MIGCurrent {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		found := false
		for _, c := range x.CIs {
			found = found || c.ID == m.ci
		}
		if !found {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return fn(st, g, x)
	})
}

func (m *migDevice) IsMigDeviceHandle() (bool, nvml.Return) {
	ret := m.read("IsMigDeviceHandle", func(*state, *gpuState, *gi) nvml.Return { return nvml.SUCCESS })
	return true, ret
}

func (m *migDevice) GetGpuInstanceId() (int, nvml.Return) {
	ret := m.read("GetGpuInstanceId", func(*state, *gpuState, *gi) nvml.Return { return nvml.SUCCESS })
	return m.gi, ret
}

func (m *migDevice) GetComputeInstanceId() (int, nvml.Return) {
	ret := m.read("GetComputeInstanceId", func(*state, *gpuState, *gi) nvml.Return { return nvml.SUCCESS })
	return m.ci, ret
}

func (m *migDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	ret := m.read("GetDeviceHandleFromMigDeviceHandle", func(*state, *gpuState, *gi) nvml.Return { return nvml.SUCCESS })
	return m.d, ret
}

func (m *migDevice) GetUUID() (string, nvml.Return) {
	var s string
	ret := m.read("GetUUID", func(_ *state, g *gpuState, x *gi) nvml.Return {
		s = "MIG-" + hashUUID("mig:"+g.UUID+":"+strconv.Itoa(x.ID)+":"+strconv.Itoa(m.ci))
		return nvml.SUCCESS
	})
	return s, ret
}

// GetMemoryInfo is the GPU instance's framebuffer and what its workloads use.
func (m *migDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	var mem nvml.Memory
	ret := m.read("GetMemoryInfo", func(st *state, g *gpuState, x *gi) nvml.Return {
		p := giProfileOf(g, x)
		if p == nil {
			return nvml.ERROR_UNKNOWN
		}
		mem.Total = p.MemoryMiB << 20
		frac := 0.0
		if w := st.Workloads[migKey(g.UUID, x.ID)]; w != nil {
			frac = w.FB
		}
		for _, v := range g.vgpusOnGI(x.ID) {
			mem.Used += v.FbUsed
		}
		mem.Used += uint64(frac * float64(mem.Total))
		if mem.Used > mem.Total {
			mem.Used = mem.Total
		}
		mem.Free = mem.Total - mem.Used
		return nvml.SUCCESS
	})
	return mem, ret
}
