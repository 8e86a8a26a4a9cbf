package nvml

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// Telemetry (reference 5.4, 5.5): running vGPUs, utilization, framebuffer
// use, power, clocks and clock event reasons, and per MIG instance GPM
// activity and memory.

// VGPU is a vGPU NVML reports as active (a VM has it open).
type VGPU struct {
	// Handle is NVML's vGPU instance handle. The scheduler log's runlist
	// ids and the utilization samples name vGPUs by it.
	Handle   uint32
	UUID     string
	MdevUUID string // "" on vendor-VFIO hosts
	VMID     string // the VM's UUID on KVM
	TypeID   int
	GI       int // the GPU instance of a MIG-backed vGPU, -1 otherwise
	FBUsed   uint64
}

// vgpuHandle returns the C handle behind a vGPU instance: the real
// binding's type is a uint32 underneath; the simulator's says it with GetID.
func vgpuHandle(v gonvml.VgpuInstance) (uint32, bool) {
	if x, ok := v.(interface{ GetID() uint32 }); ok {
		return x.GetID(), true
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Uint32 {
		return uint32(rv.Uint()), true
	}
	return 0, false
}

// ActiveVGPUCount counts the GPU's running vGPUs (one driver call).
func (p *Probe) ActiveVGPUCount(ctx context.Context) (int, error) {
	ctx, release, herr := p.b.hold(ctx, "ActiveVGPUCount")
	if herr != nil {
		return 0, herr
	}
	defer release()
	list, err := onDevice(ctx, p, "GetActiveVgpus", gonvml.Device.GetActiveVgpus)
	if err != nil {
		return 0, err
	}
	return len(list), nil
}

// ActiveVGPUs lists the GPU's running vGPUs with their framebuffer use.
// A vGPU whose VM stops between the list and its queries is left out.
func (p *Probe) ActiveVGPUs(ctx context.Context) ([]VGPU, error) {
	ctx, release, herr := p.b.hold(ctx, "ActiveVGPUs")
	if herr != nil {
		return nil, herr
	}
	defer release()
	list, err := onDevice(ctx, p, "GetActiveVgpus", gonvml.Device.GetActiveVgpus)
	if err != nil {
		return nil, err
	}
	out := make([]VGPU, 0, len(list))
	for _, v := range list {
		h, ok := vgpuHandle(v)
		if !ok {
			continue
		}
		x := VGPU{Handle: h, GI: -1}
		gone := func(err error) bool { return errors.Is(err, gpu.ErrNotFound) || errors.Is(err, gpu.ErrInvalid) }
		if x.UUID, err = call(ctx, p.b, "VgpuInstanceGetUUID", v.GetUUID); err != nil {
			if gone(err) {
				continue
			}
			return nil, fmt.Errorf("GPU %s: vGPU %d: %w", p.uuid, h, err)
		}
		if x.MdevUUID, err = call(ctx, p.b, "VgpuInstanceGetMdevUUID", v.GetMdevUUID); err != nil && !errors.Is(err, gpu.ErrNotSupported) {
			if gone(err) {
				continue
			}
			return nil, fmt.Errorf("GPU %s: vGPU %d mdev: %w", p.uuid, h, err)
		}
		if x.VMID, _, err = call2(ctx, p.b, "VgpuInstanceGetVmID", v.GetVmID); err != nil && !gone(err) {
			return nil, fmt.Errorf("GPU %s: vGPU %d VM: %w", p.uuid, h, err)
		}
		if t, err := call(ctx, p.b, "VgpuInstanceGetType", v.GetType); err == nil && t != nil {
			x.TypeID = int(t.GetID())
		}
		if x.FBUsed, err = call(ctx, p.b, "VgpuInstanceGetFbUsage", v.GetFbUsage); err != nil && !gone(err) {
			return nil, fmt.Errorf("GPU %s: vGPU %d framebuffer: %w", p.uuid, h, err)
		}
		if gi, err := call(ctx, p.b, "VgpuInstanceGetGpuInstanceId", v.GetGpuInstanceId); err == nil && gi >= 0 && uint32(gi) != invalidID {
			x.GI = gi
		}
		out = append(out, x)
	}
	return out, nil
}

// UtilSample is one utilization sample of a vGPU, as fractions of the GPU.
type UtilSample struct {
	Handle uint32
	// Time is the sample's timestamp in µs.
	Time    uint64
	SM, Mem float64
}

func sampleValue(t gonvml.ValueType, b [8]byte) float64 {
	switch t {
	case gonvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[:]))
	case gonvml.VALUE_TYPE_UNSIGNED_INT, gonvml.VALUE_TYPE_SIGNED_INT:
		return float64(binary.LittleEndian.Uint32(b[:4]))
	case gonvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.LittleEndian.Uint16(b[:2]))
	default:
		return float64(binary.LittleEndian.Uint64(b[:]))
	}
}

// VGPUUtilization returns the running vGPUs' utilization samples newer
// than since (µs), and the newest timestamp seen (since when none is newer).
func (p *Probe) VGPUUtilization(ctx context.Context, since uint64) ([]UtilSample, uint64, error) {
	ctx, release, herr := p.b.hold(ctx, "VGPUUtilization")
	if herr != nil {
		return nil, 0, herr
	}
	defer release()
	type samples struct {
		vt  gonvml.ValueType
		raw []gonvml.VgpuInstanceUtilizationSample
	}
	u, err := onDevice(ctx, p, "GetVgpuUtilization", func(d gonvml.Device) (samples, gonvml.Return) {
		vt, raw, ret := d.GetVgpuUtilization(since)
		return samples{vt, raw}, ret
	})
	if errors.Is(err, gpu.ErrNotFound) {
		return nil, since, nil
	}
	if err != nil {
		return nil, since, err
	}
	out := make([]UtilSample, 0, len(u.raw))
	last := since
	for _, s := range u.raw {
		out = append(out, UtilSample{Handle: s.VgpuInstance, Time: s.TimeStamp, SM: sampleValue(u.vt, s.SmUtil) / 100, Mem: sampleValue(u.vt, s.MemUtil) / 100})
		last = max(last, s.TimeStamp)
	}
	return out, last, nil
}

// Clocks is the GPU's SM clock and clock event reasons now.
type Clocks struct {
	SMMHz   uint32
	Reasons uint64
}

// Clocks reads the current SM clock and clock event reasons.
func (p *Probe) Clocks(ctx context.Context) (Clocks, error) {
	ctx, release, herr := p.b.hold(ctx, "Clocks")
	if herr != nil {
		return Clocks{}, herr
	}
	defer release()
	var c Clocks
	var err error
	if c.Reasons, err = onDevice(ctx, p, "GetCurrentClocksEventReasons", gonvml.Device.GetCurrentClocksEventReasons); err != nil {
		return c, err
	}
	c.SMMHz, err = onDevice(ctx, p, "GetClockInfo", func(d gonvml.Device) (uint32, gonvml.Return) { return d.GetClockInfo(gonvml.CLOCK_SM) })
	if err != nil {
		return c, err
	}
	return c, nil
}

// Telemetry is a GPU's whole-device readings; a reading the GPU does not
// support in its mode (utilization with MIG on) is left out (its Has flag false).
type Telemetry struct {
	HasUtil          bool
	Util, MemUtil    float64 // fractions
	PowerW           float64
	PowerLimitW      float64
	HasEnergy        bool
	EnergyJ          float64 // since the driver loaded
	TemperatureC     float64
	SMMaxMHz         uint32
	MemTotal, MemUse uint64
}

// Telemetry reads the GPU's utilization, power, energy and temperature.
// With full it also reads what moves slowly (power limit, maximum clock,
// memory) and which readings the GPU supports in its mode; without, those
// come from the last full read and unsupported readings are not asked for
// again. A GPU that is lost fails the whole read.
func (p *Probe) Telemetry(ctx context.Context, full bool) (Telemetry, error) {
	ctx, release, herr := p.b.hold(ctx, "Telemetry")
	if herr != nil {
		return Telemetry{}, herr
	}
	defer release()
	p.mu.Lock()
	t, known := p.tel, p.telRead
	p.mu.Unlock()
	if !known {
		full = true
	}
	soft := func(err error) error {
		if err == nil || errors.Is(err, gpu.ErrNotSupported) {
			return nil
		}
		return err
	}
	if full || t.HasUtil {
		u, err := onDevice(ctx, p, "GetUtilizationRates", gonvml.Device.GetUtilizationRates)
		if err == nil {
			t.HasUtil, t.Util, t.MemUtil = true, float64(u.Gpu)/100, float64(u.Memory)/100
		} else if err := soft(err); err != nil {
			return t, err
		} else {
			t.HasUtil = false
		}
	}
	mw, err := onDevice(ctx, p, "GetPowerUsage", gonvml.Device.GetPowerUsage)
	if err := soft(err); err != nil {
		return t, err
	}
	t.PowerW = float64(mw) / 1000
	if full || t.HasEnergy {
		mj, err := onDevice(ctx, p, "GetTotalEnergyConsumption", gonvml.Device.GetTotalEnergyConsumption)
		if err == nil {
			t.HasEnergy, t.EnergyJ = true, float64(mj)/1000
		} else if err := soft(err); err != nil {
			return t, err
		} else {
			t.HasEnergy = false
		}
	}
	c, err := p.temperature(ctx)
	if err := soft(err); err != nil {
		return t, err
	}
	t.TemperatureC = float64(c.Temperature)
	if full {
		limit, err := onDevice(ctx, p, "GetEnforcedPowerLimit", gonvml.Device.GetEnforcedPowerLimit)
		if err := soft(err); err != nil {
			return t, err
		}
		t.PowerLimitW = float64(limit) / 1000
		t.SMMaxMHz, err = onDevice(ctx, p, "GetMaxClockInfo", func(d gonvml.Device) (uint32, gonvml.Return) { return d.GetMaxClockInfo(gonvml.CLOCK_SM) })
		if err := soft(err); err != nil {
			return t, err
		}
		m, err := onDevice(ctx, p, "GetMemoryInfo", gonvml.Device.GetMemoryInfo)
		if err := soft(err); err != nil {
			return t, err
		}
		t.MemTotal, t.MemUse = m.Total, m.Used
	}
	p.mu.Lock()
	p.tel, p.telRead = t, true
	p.mu.Unlock()
	return t, nil
}

// MIGActivity is a GPU instance's activity over the time between two GPM
// samples, as fractions of the instance (SM) and of its memory bandwidth.
type MIGActivity struct {
	SM, DRAM float64
}

// migSamples are one GPU instance's two GPM samples, reused: the last
// one taken and a spare for the next. A sample that a call abandoned at
// its deadline may still use is dropped (set to nil), never reused nor
// freed.
type migSamples struct {
	last, spare gonvml.GpmSample
	have        bool // last holds a sample
}

// MIGActivity samples the GPU instances gis with GPM and returns, for
// each that was sampled before, its activity since then. GPM needs Hopper
// or newer: elsewhere it fails with gpu.ErrNotSupported.
func (p *Probe) MIGActivity(ctx context.Context, gis []int) (map[int]MIGActivity, error) {
	ctx, release, herr := p.b.hold(ctx, "MIGActivity")
	if herr != nil {
		return nil, herr
	}
	defer release()
	d, err := p.device(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	checked, supported := p.gpmChecked, p.gpmSupported
	p.mu.Unlock()
	if !checked {
		sup, err := call(ctx, p.b, "GpmQueryDeviceSupport", func() (gonvml.GpmSupport, gonvml.Return) { return p.b.lib.GpmQueryDeviceSupport(d) })
		if err != nil {
			return nil, fmt.Errorf("GPU %s: GPM: %w", p.uuid, err)
		}
		supported = sup.IsSupportedDevice != 0
		p.mu.Lock()
		p.gpmChecked, p.gpmSupported = true, supported
		p.mu.Unlock()
	}
	if !supported {
		return nil, fmt.Errorf("GPU %s: GPM: %w", p.uuid, gpu.ErrNotSupported)
	}
	out := map[int]MIGActivity{}
	want := map[int]bool{}
	for _, gi := range gis {
		want[gi] = true
		p.mu.Lock()
		ms := p.gpm[gi]
		if ms == nil {
			ms = &migSamples{}
			p.gpm[gi] = ms
		}
		p.mu.Unlock()
		if ms.spare == nil {
			s, err := call(ctx, p.b, "GpmSampleAlloc", p.b.lib.GpmSampleAlloc)
			if err != nil {
				return nil, fmt.Errorf("GPU %s: GPM sample: %w", p.uuid, err)
			}
			ms.spare = s
		}
		s, err := p.gpmMigSampleGet(ctx, d, gi, ms.spare)
		ms.spare = s // nil when the call did not return in time
		if err != nil {
			if errors.Is(err, gpu.ErrInvalid) || errors.Is(err, gpu.ErrNotFound) {
				ms.have = false
				continue // the GPU instance went away
			}
			return nil, fmt.Errorf("GPU %s: GPM sample of GI %d: %w", p.uuid, gi, err)
		}
		prev, had := ms.last, ms.have
		ms.last, ms.spare, ms.have = s, prev, true
		if !had {
			continue
		}
		p.mu.Lock()
		m := p.metrics
		p.metrics = nil
		p.mu.Unlock()
		if m == nil {
			m = new(gonvml.GpmMetricsGetType)
		}
		m.Version, m.NumMetrics, m.Sample1, m.Sample2 = gonvml.GPM_METRICS_GET_VERSION, 2, prev, s
		m.Metrics[0] = gonvml.GpmMetric{MetricId: uint32(gonvml.GPM_METRIC_SM_UTIL)}
		m.Metrics[1] = gonvml.GpmMetric{MetricId: uint32(gonvml.GPM_METRIC_DRAM_BW_UTIL)}
		m, err = p.gpmMetricsGet(ctx, m)
		if m == nil {
			// The call may still read both samples and write into m.
			ms.last, ms.spare, ms.have = nil, nil, false
		}
		if err != nil {
			return nil, fmt.Errorf("GPU %s: GPM metrics of GI %d: %w", p.uuid, gi, err)
		}
		a := MIGActivity{}
		if m.Metrics[0].NvmlReturn == uint32(gonvml.SUCCESS) {
			a.SM = m.Metrics[0].Value / 100
		}
		if m.Metrics[1].NvmlReturn == uint32(gonvml.SUCCESS) {
			a.DRAM = m.Metrics[1].Value / 100
		}
		out[gi] = a
		p.mu.Lock()
		p.metrics = m
		p.mu.Unlock()
	}
	p.mu.Lock()
	for gi, ms := range p.gpm {
		if !want[gi] {
			for _, s := range []gonvml.GpmSample{ms.last, ms.spare} {
				if s != nil {
					_ = s.Free()
				}
			}
			delete(p.gpm, gi)
		}
	}
	p.mu.Unlock()
	return out, nil
}

// gpmMigSampleGet takes a GPM sample of GPU instance gi into s and hands s
// back, unless the call did not return in time: it may still write into
// s, so s is then the call's, and the result nil.
func (p *Probe) gpmMigSampleGet(ctx context.Context, d gonvml.Device, gi int, s gonvml.GpmSample) (gonvml.GpmSample, error) {
	if err := ctx.Err(); err != nil {
		return s, err // not called: s is still the caller's
	}
	return call(ctx, p.b, "GpmMigSampleGet", func() (gonvml.GpmSample, gonvml.Return) { return s, p.b.lib.GpmMigSampleGet(d, gi, s) })
}

// gpmMetricsGet runs GpmMetricsGet on m and hands m back, unless the call
// did not return in time: it may still write into m and read m's samples,
// so they are then the call's, and the result nil.
func (p *Probe) gpmMetricsGet(ctx context.Context, m *gonvml.GpmMetricsGetType) (*gonvml.GpmMetricsGetType, error) {
	if err := ctx.Err(); err != nil {
		return m, err // not called: m is still the caller's
	}
	return call(ctx, p.b, "GpmMetricsGet", func() (*gonvml.GpmMetricsGetType, gonvml.Return) { return m, p.b.lib.GpmMetricsGet(m) })
}

// MIGMemory returns, per GPU instance id, the memory of its MIG devices
// (total, used) as NVML's MIG device handles report it.
func (p *Probe) MIGMemory(ctx context.Context) (map[int][2]uint64, error) {
	ctx, release, herr := p.b.hold(ctx, "MIGMemory")
	if herr != nil {
		return nil, herr
	}
	defer release()
	n, err := onDevice(ctx, p, "GetMaxMigDeviceCount", gonvml.Device.GetMaxMigDeviceCount)
	if err != nil {
		return nil, err
	}
	out := map[int][2]uint64{}
	for i := 0; i < n; i++ {
		md, err := onDevice(ctx, p, "GetMigDeviceHandleByIndex", func(d gonvml.Device) (gonvml.Device, gonvml.Return) { return d.GetMigDeviceHandleByIndex(i) })
		if errors.Is(err, gpu.ErrNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		gi, err := call(ctx, p.b, "GetGpuInstanceId", md.GetGpuInstanceId)
		if err != nil {
			return nil, fmt.Errorf("GPU %s: MIG device %d: %w", p.uuid, i, err)
		}
		if _, seen := out[gi]; seen {
			continue // another compute instance of the same GPU instance
		}
		m, err := call(ctx, p.b, "GetMemoryInfo", md.GetMemoryInfo)
		if err != nil {
			return nil, fmt.Errorf("GPU %s: MIG device %d memory: %w", p.uuid, i, err)
		}
		out[gi] = [2]uint64{m.Total, m.Used}
	}
	return out, nil
}

// SetObserver replaces the hook told of every NVML call (metrics start
// after the backend is built). The hook is read without a lock: call it
// before the backend is shared between goroutines, as the daemon does
// while it starts.
func (b *Backend) SetObserver(o Observer) { b.observe = o }

// Observer returns the hook in place (nil: none).
func (b *Backend) Observer() Observer { return b.observe }

// TemperatureReader is how a Device that is not the NVML library's own
// (the simulator's) serves nvmlDeviceGetTemperatureV: go-nvml's
// GetTemperatureV returns a handler bound to the library's device type,
// which no other Device can make, so the backend asks for this first.
type TemperatureReader interface {
	// TemperatureV1 answers as GetTemperatureV().V1() does: the GPU
	// sensor's reading in °C.
	TemperatureV1() (gonvml.Temperature, gonvml.Return)
}

// temperature reads the GPU die's temperature (nvmlDeviceGetTemperatureV,
// version 1, whose zero sensor type is NVML_TEMPERATURE_GPU).
func (p *Probe) temperature(ctx context.Context) (gonvml.Temperature, error) {
	return onDevice(ctx, p, "GetTemperatureV", func(d gonvml.Device) (gonvml.Temperature, gonvml.Return) {
		if r, ok := d.(TemperatureReader); ok {
			return r.TemperatureV1()
		}
		if err := p.b.symbol("nvmlDeviceGetTemperatureV"); err != nil {
			return gonvml.Temperature{}, gonvml.ERROR_NOT_SUPPORTED
		}
		return d.GetTemperatureV().V1()
	})
}
