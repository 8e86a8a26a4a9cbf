package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
)

// GPU Performance Monitoring (GPM): how a Hopper or newer host reads a MIG
// instance's activity (reference 5.4: whole-GPU utilization is
// NOT_SUPPORTED with MIG on). The samples are the workload model's
// activity counters; its memory is read through a MIG device handle
// (nvml_mig.go).

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
	return d.telemetry(op, func(g *gpuState, r *workload.GPURun) nvml.Return {
		if !gpmCapable(g) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		s.gpu, s.gi, s.t, s.valid = g.UUID, giID, r.Time(), true
		if giID < 0 {
			s.busy, s.dram = r.Activity(-1)
			return nvml.SUCCESS
		}
		if !g.MIGCurrent || g.giByID(giID) == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s.busy, s.dram = r.Activity(giID)
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
