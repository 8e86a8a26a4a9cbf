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
	var list []gonvml.VgpuInstance
	if err := p.call(ctx, "GetActiveVgpus", func(d gonvml.Device) (r gonvml.Return) { list, r = d.GetActiveVgpus(); return }); err != nil {
		return 0, err
	}
	return len(list), nil
}

// ActiveVGPUs lists the GPU's running vGPUs with their framebuffer use.
// A vGPU whose VM stops between the list and its queries is left out.
func (p *Probe) ActiveVGPUs(ctx context.Context) ([]VGPU, error) {
	var list []gonvml.VgpuInstance
	if err := p.call(ctx, "GetActiveVgpus", func(d gonvml.Device) (r gonvml.Return) { list, r = d.GetActiveVgpus(); return }); err != nil {
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
		if err := p.b.do(ctx, "VgpuInstanceGetUUID", func() (r gonvml.Return) { x.UUID, r = v.GetUUID(); return }); err != nil {
			if gone(err) {
				continue
			}
			return nil, fmt.Errorf("GPU %s: vGPU %d: %w", p.uuid, h, err)
		}
		if err := p.b.do(ctx, "VgpuInstanceGetMdevUUID", func() (r gonvml.Return) { x.MdevUUID, r = v.GetMdevUUID(); return }); err != nil && !errors.Is(err, gpu.ErrNotSupported) {
			if gone(err) {
				continue
			}
			return nil, fmt.Errorf("GPU %s: vGPU %d mdev: %w", p.uuid, h, err)
		}
		if err := p.b.do(ctx, "VgpuInstanceGetVmID", func() (r gonvml.Return) { x.VMID, _, r = v.GetVmID(); return }); err != nil && !gone(err) {
			return nil, fmt.Errorf("GPU %s: vGPU %d VM: %w", p.uuid, h, err)
		}
		var t gonvml.VgpuTypeId
		if err := p.b.do(ctx, "VgpuInstanceGetType", func() (r gonvml.Return) { t, r = v.GetType(); return }); err == nil && t != nil {
			x.TypeID = int(t.GetID())
		}
		if err := p.b.do(ctx, "VgpuInstanceGetFbUsage", func() (r gonvml.Return) { x.FBUsed, r = v.GetFbUsage(); return }); err != nil && !gone(err) {
			return nil, fmt.Errorf("GPU %s: vGPU %d framebuffer: %w", p.uuid, h, err)
		}
		var gi int
		if err := p.b.do(ctx, "VgpuInstanceGetGpuInstanceId", func() (r gonvml.Return) { gi, r = v.GetGpuInstanceId(); return }); err == nil && gi >= 0 && uint32(gi) != invalidID {
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
	var vt gonvml.ValueType
	var raw []gonvml.VgpuInstanceUtilizationSample
	err := p.call(ctx, "GetVgpuUtilization", func(d gonvml.Device) (r gonvml.Return) { vt, raw, r = d.GetVgpuUtilization(since); return })
	if errors.Is(err, gpu.ErrNotFound) {
		return nil, since, nil
	}
	if err != nil {
		return nil, since, err
	}
	out := make([]UtilSample, 0, len(raw))
	last := since
	for _, s := range raw {
		out = append(out, UtilSample{Handle: s.VgpuInstance, Time: s.TimeStamp, SM: sampleValue(vt, s.SmUtil) / 100, Mem: sampleValue(vt, s.MemUtil) / 100})
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
	var c Clocks
	if err := p.call(ctx, "GetCurrentClocksEventReasons", func(d gonvml.Device) (r gonvml.Return) { c.Reasons, r = d.GetCurrentClocksEventReasons(); return }); err != nil {
		return c, err
	}
	if err := p.call(ctx, "GetClockInfo", func(d gonvml.Device) (r gonvml.Return) { c.SMMHz, r = d.GetClockInfo(gonvml.CLOCK_SM); return }); err != nil {
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
		var u gonvml.Utilization
		err := p.call(ctx, "GetUtilizationRates", func(d gonvml.Device) (r gonvml.Return) { u, r = d.GetUtilizationRates(); return })
		if err == nil {
			t.HasUtil, t.Util, t.MemUtil = true, float64(u.Gpu)/100, float64(u.Memory)/100
		} else if err := soft(err); err != nil {
			return t, err
		} else {
			t.HasUtil = false
		}
	}
	var mw uint32
	if err := soft(p.call(ctx, "GetPowerUsage", func(d gonvml.Device) (r gonvml.Return) { mw, r = d.GetPowerUsage(); return })); err != nil {
		return t, err
	}
	t.PowerW = float64(mw) / 1000
	if full || t.HasEnergy {
		var mj uint64
		err := p.call(ctx, "GetTotalEnergyConsumption", func(d gonvml.Device) (r gonvml.Return) { mj, r = d.GetTotalEnergyConsumption(); return })
		if err == nil {
			t.HasEnergy, t.EnergyJ = true, float64(mj)/1000
		} else if err := soft(err); err != nil {
			return t, err
		} else {
			t.HasEnergy = false
		}
	}
	var c uint32
	if err := soft(p.call(ctx, "GetTemperature", func(d gonvml.Device) (r gonvml.Return) { c, r = d.GetTemperature(gonvml.TEMPERATURE_GPU); return })); err != nil {
		return t, err
	}
	t.TemperatureC = float64(c)
	if full {
		var limit uint32
		if err := soft(p.call(ctx, "GetEnforcedPowerLimit", func(d gonvml.Device) (r gonvml.Return) { limit, r = d.GetEnforcedPowerLimit(); return })); err != nil {
			return t, err
		}
		t.PowerLimitW = float64(limit) / 1000
		if err := soft(p.call(ctx, "GetMaxClockInfo", func(d gonvml.Device) (r gonvml.Return) { t.SMMaxMHz, r = d.GetMaxClockInfo(gonvml.CLOCK_SM); return })); err != nil {
			return t, err
		}
		var m gonvml.Memory
		if err := soft(p.call(ctx, "GetMemoryInfo", func(d gonvml.Device) (r gonvml.Return) { m, r = d.GetMemoryInfo(); return })); err != nil {
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
// one taken and a spare for the next.
type migSamples struct {
	last, spare gonvml.GpmSample
	have        bool
}

// MIGActivity samples the GPU instances gis with GPM and returns, for
// each that was sampled before, its activity since then. GPM needs Hopper
// or newer: elsewhere it fails with gpu.ErrNotSupported.
func (p *Probe) MIGActivity(ctx context.Context, gis []int) (map[int]MIGActivity, error) {
	d, err := p.device(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	checked, supported := p.gpmChecked, p.gpmSupported
	p.mu.Unlock()
	if !checked {
		var sup gonvml.GpmSupport
		if err := p.b.do(ctx, "GpmQueryDeviceSupport", func() (r gonvml.Return) { sup, r = p.b.lib.GpmQueryDeviceSupport(d); return }); err != nil {
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
		for _, s := range []*gonvml.GpmSample{&ms.last, &ms.spare} {
			if *s == nil {
				if err := p.b.do(ctx, "GpmSampleAlloc", func() (r gonvml.Return) { *s, r = p.b.lib.GpmSampleAlloc(); return }); err != nil {
					return nil, fmt.Errorf("GPU %s: GPM sample: %w", p.uuid, err)
				}
			}
		}
		if err := p.b.do(ctx, "GpmMigSampleGet", func() gonvml.Return { return p.b.lib.GpmMigSampleGet(d, gi, ms.spare) }); err != nil {
			if errors.Is(err, gpu.ErrInvalid) || errors.Is(err, gpu.ErrNotFound) {
				ms.have = false
				continue // the GPU instance went away
			}
			return nil, fmt.Errorf("GPU %s: GPM sample of GI %d: %w", p.uuid, gi, err)
		}
		prev, had := ms.last, ms.have
		ms.last, ms.spare, ms.have = ms.spare, ms.last, true
		if !had {
			continue
		}
		m := gonvml.GpmMetricsGetType{Version: gonvml.GPM_METRICS_GET_VERSION, NumMetrics: 2, Sample1: prev, Sample2: ms.last}
		m.Metrics[0].MetricId = uint32(gonvml.GPM_METRIC_SM_UTIL)
		m.Metrics[1].MetricId = uint32(gonvml.GPM_METRIC_DRAM_BW_UTIL)
		if err := p.b.do(ctx, "GpmMetricsGet", func() gonvml.Return { return p.b.lib.GpmMetricsGet(&m) }); err != nil {
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

// MIGMemory returns, per GPU instance id, the memory of its MIG devices
// (total, used) as NVML's MIG device handles report it.
func (p *Probe) MIGMemory(ctx context.Context) (map[int][2]uint64, error) {
	var n int
	if err := p.call(ctx, "GetMaxMigDeviceCount", func(d gonvml.Device) (r gonvml.Return) { n, r = d.GetMaxMigDeviceCount(); return }); err != nil {
		return nil, err
	}
	out := map[int][2]uint64{}
	for i := 0; i < n; i++ {
		var md gonvml.Device
		err := p.call(ctx, "GetMigDeviceHandleByIndex", func(d gonvml.Device) (r gonvml.Return) { md, r = d.GetMigDeviceHandleByIndex(i); return })
		if errors.Is(err, gpu.ErrNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		var gi int
		if err := p.b.do(ctx, "GetGpuInstanceId", func() (r gonvml.Return) { gi, r = md.GetGpuInstanceId(); return }); err != nil {
			return nil, fmt.Errorf("GPU %s: MIG device %d: %w", p.uuid, i, err)
		}
		if _, seen := out[gi]; seen {
			continue // another compute instance of the same GPU instance
		}
		var m gonvml.Memory
		if err := p.b.do(ctx, "GetMemoryInfo", func() (r gonvml.Return) { m, r = md.GetMemoryInfo(); return }); err != nil {
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
