package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// Scheduler capabilities the simulated driver reports. The ranges are not
// published per GPU; these are inferred from the RmPVMRL registry key
// (time slices of 1..30 ms).
// invalidID is NVML's INVALID_GPU_INSTANCE_ID and INVALID_GPU_INSTANCE_PROFILE_ID.
const invalidID = 0xFFFFFFFF

const (
	minTimesliceNs     = 1_000_000
	maxTimesliceNs     = 30_000_000
	defaultTimesliceNs = 2_000_000
	minARRFrequency    = 1
	maxARRFrequency    = 960
	minARRAvgFactor    = 1
	maxARRAvgFactor    = 60
)

// --- type discovery ---

func (d *device) GetSupportedVgpus() ([]nvml.VgpuTypeId, nvml.Return) {
	var ids []int
	ret := d.read("GetSupportedVgpus", func(_ *state, g *gpuState) nvml.Return {
		if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		for _, t := range g.model.VGPU.Types {
			if g.model.HasFlow(&t, g.Flavour) {
				ids = append(ids, t.ID)
			}
		}
		return nvml.SUCCESS
	})
	return d.typeHandles(ids), ret
}

func (d *device) GetCreatableVgpus() ([]nvml.VgpuTypeId, nvml.Return) {
	var ids []int
	ret := d.read("GetCreatableVgpus", func(st *state, g *gpuState) nvml.Return {
		if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		for _, t := range creatableTypes(g, st.Spec.Options) {
			ids = append(ids, t.ID)
		}
		return nvml.SUCCESS
	})
	return d.typeHandles(ids), ret
}

func (d *device) typeHandles(ids []int) []nvml.VgpuTypeId {
	out := make([]nvml.VgpuTypeId, 0, len(ids))
	for _, id := range ids {
		out = append(out, &vgpuType{VgpuTypeId: baseVgpuType, l: d.l, id: uint32(id)})
	}
	return out
}

func (d *device) VgpuTypeGetMaxInstances(t nvml.VgpuTypeId) (int, nvml.Return) {
	if t == nil {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	return t.GetMaxInstances(d)
}

func (d *device) GetActiveVgpus() ([]nvml.VgpuInstance, nvml.Return) {
	var handles []uint32
	ret := d.read("GetActiveVgpus", func(_ *state, g *gpuState) nvml.Return {
		if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		for _, v := range g.activeVGPUs() {
			handles = append(handles, v.Handle)
		}
		return nvml.SUCCESS
	})
	out := make([]nvml.VgpuInstance, 0, len(handles))
	for _, h := range handles {
		out = append(out, &vgpuInstance{VgpuInstance: baseVgpu, l: d.l, handle: h})
	}
	return out, ret
}

// --- heterogeneous mode ---

func (d *device) GetVgpuHeterogeneousMode() (nvml.VgpuHeterogeneousMode, nvml.Return) {
	var m nvml.VgpuHeterogeneousMode
	ret := d.read("GetVgpuHeterogeneousMode", func(_ *state, g *gpuState) nvml.Return {
		if g.model.VGPU == nil || !g.model.VGPU.Heterogeneous || g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		m.Version = nvml.STRUCT_VERSION(m, 1)
		if g.Heterogeneous {
			m.Mode = 1
		}
		return nvml.SUCCESS
	})
	return m, ret
}

// SetVgpuHeterogeneousMode: NOT_SUPPORTED with MIG on or on GPUs without the
// mode; IN_USE while any vGPU or mdev exists (reference 2.6, 5.1).
func (d *device) SetVgpuHeterogeneousMode(m nvml.VgpuHeterogeneousMode) nvml.Return {
	return d.write("SetVgpuHeterogeneousMode", func(_ *state, g *gpuState) (bool, nvml.Return) {
		if m.Mode > 1 {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if m.Version != nvml.STRUCT_VERSION(m, 1) {
			return false, nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		if g.model.VGPU == nil || !g.model.VGPU.Heterogeneous || g.MIGCurrent {
			return false, nvml.ERROR_NOT_SUPPORTED
		}
		want := m.Mode == 1
		if g.Heterogeneous == want {
			return false, nvml.SUCCESS
		}
		if len(g.vgpus()) > 0 {
			return false, nvml.ERROR_IN_USE
		}
		g.Heterogeneous = want
		return true, nvml.SUCCESS
	})
}

// --- scheduler ---

func (d *device) GetVgpuSchedulerCapabilities() (nvml.VgpuSchedulerCapabilities, nvml.Return) {
	var c nvml.VgpuSchedulerCapabilities
	ret := d.read("GetVgpuSchedulerCapabilities", func(_ *state, g *gpuState) nvml.Return {
		if r := schedSupported(g); r != nvml.SUCCESS {
			return r
		}
		c = nvml.VgpuSchedulerCapabilities{
			SupportedSchedulers: [3]uint32{nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE},
			MaxTimeslice:        maxTimesliceNs, MinTimeslice: minTimesliceNs, IsArrModeSupported: 1,
			MaxFrequencyForARR: maxARRFrequency, MinFrequencyForARR: minARRFrequency,
			MaxAvgFactorForARR: maxARRAvgFactor, MinAvgFactorForARR: minARRAvgFactor,
		}
		return nvml.SUCCESS
	})
	return c, ret
}

// schedSupported: the device-level scheduler exists only for time-sliced
// vGPU GPUs; with MIG enabled it is NOT_SUPPORTED (reference 5.3).
func schedSupported(g *gpuState) nvml.Return {
	if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) || g.MIGCurrent {
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

func (g *gpuState) timeslice() uint32 {
	if g.Sched.TimesliceNs == 0 {
		return defaultTimesliceNs
	}
	return g.Sched.TimesliceNs
}

// engineSupported checks the _v2 calls' engine: the simulator models the
// graphics engine's scheduler; NVENC engines' are NOT_SUPPORTED here, and
// anything that is no engine is an invalid argument.
func engineSupported(engine uint32) nvml.Return {
	switch engine {
	case nvml.VGPU_SCHEDULER_ENGINE_TYPE_GRAPHICS:
		return nvml.SUCCESS
	case nvml.VGPU_SCHEDULER_ENGINE_TYPE_NVENC0, nvml.VGPU_SCHEDULER_ENGINE_TYPE_NVENC1:
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.ERROR_INVALID_ARGUMENT
}

// GetVgpuSchedulerState_v2 reports the policy, ARR's average factor (0
// without ARR) and the time slice in force.
func (d *device) GetVgpuSchedulerState_v2(info nvml.VgpuSchedulerStateInfo_v2) (nvml.VgpuSchedulerStateInfo_v2, nvml.Return) {
	ret := d.read("GetVgpuSchedulerState_v2", func(_ *state, g *gpuState) nvml.Return {
		if r := schedSupported(g); r != nvml.SUCCESS {
			return r
		}
		if r := engineSupported(info.EngineId); r != nvml.SUCCESS {
			return r
		}
		info.SchedulerPolicy, info.Timeslice, info.AvgFactor = g.Sched.Policy, g.timeslice(), 0
		if g.Sched.ARR == nvml.VGPU_SCHEDULER_ARR_ENABLE {
			info.AvgFactor = g.Sched.AvgFactor
		}
		return nvml.SUCCESS
	})
	return info, ret
}

// SetVgpuSchedulerState_v2 is allowed only while no VM with a vGPU runs on
// the GPU (NOT_SUPPORTED otherwise, nvml.h), and validates policy and
// ranges. The call has no time-slice field: the slice is 1 s / frequency
// (0: the default slice); a non-zero average factor turns ARR on, with the
// frequency (0: ARR's lowest) as its rate.
func (d *device) SetVgpuSchedulerState_v2(s *nvml.VgpuSchedulerState_v2) nvml.Return {
	return d.write("SetVgpuSchedulerState_v2", func(_ *state, g *gpuState) (bool, nvml.Return) {
		if r := schedSupported(g); r != nvml.SUCCESS {
			return false, r
		}
		if s == nil {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		if r := engineSupported(s.EngineId); r != nvml.SUCCESS {
			return false, r
		}
		if len(g.activeVGPUs()) > 0 {
			return false, nvml.ERROR_NOT_SUPPORTED
		}
		next, r := schedFromV2(s)
		if r != nvml.SUCCESS {
			return false, r
		}
		if next == g.Sched {
			return false, nvml.SUCCESS
		}
		g.Sched = next
		return true, nvml.SUCCESS
	})
}

// schedFromV2 is the scheduler state a _v2 set asks for, or
// INVALID_ARGUMENT for a policy, factor or slice out of range.
func schedFromV2(s *nvml.VgpuSchedulerState_v2) (sched, nvml.Return) {
	switch s.SchedulerPolicy {
	case nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT, nvml.VGPU_SCHEDULER_POLICY_EQUAL_SHARE, nvml.VGPU_SCHEDULER_POLICY_FIXED_SHARE:
	default:
		return sched{}, nvml.ERROR_INVALID_ARGUMENT
	}
	next := sched{Policy: s.SchedulerPolicy, ARR: nvml.VGPU_SCHEDULER_ARR_DEFAULT}
	if s.AvgFactor != 0 {
		// ARR: its frequency within ARR's range.
		if s.AvgFactor < minARRAvgFactor || s.AvgFactor > maxARRAvgFactor || s.Frequency > maxARRFrequency {
			return sched{}, nvml.ERROR_INVALID_ARGUMENT
		}
		freq := max(s.Frequency, minARRFrequency)
		next.ARR, next.AvgFactor, next.Frequency = nvml.VGPU_SCHEDULER_ARR_ENABLE, s.AvgFactor, freq
		next.TimesliceNs = 1_000_000_000 / freq
		return next, nvml.SUCCESS
	}
	if s.Frequency != 0 {
		// A plain slice: what bounds it is the time slice range the
		// capabilities report (both ends legal), not ARR's frequencies,
		// so 1 ms (1000 Hz) is as legal as the capabilities say.
		ts := 1_000_000_000 / s.Frequency
		if ts < minTimesliceNs || ts > maxTimesliceNs {
			return sched{}, nvml.ERROR_INVALID_ARGUMENT
		}
		next.TimesliceNs = ts
	}
	return next, nvml.SUCCESS
}

// --- vGPU types ---

// vgpuType is a simulated nvml.VgpuTypeId. Type ids are unique over the
// catalog (one driver branch), so the handle finds its model by id.
type vgpuType struct {
	*mock.VgpuTypeId
	l  *lib
	id uint32
}

var _ nvml.VgpuTypeId = (*vgpuType)(nil)

func (t *vgpuType) GetID() uint32 { return t.id }

func (t *vgpuType) info(op string, fn func(m *profile.Model, vt *profile.VGPUType) nvml.Return) nvml.Return {
	if !t.l.initialized() {
		return nvml.ERROR_UNINITIALIZED
	}
	return t.l.h.call(op, -1, false, func(*state, *gpuState) (bool, nvml.Return) {
		m, vt := t.l.h.lookupType(int(t.id))
		if vt == nil {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		return false, fn(m, vt)
	})
}

func (h *Host) lookupType(id int) (*profile.Model, *profile.VGPUType) {
	for _, m := range h.cat.Models() {
		if vt, ok := m.VGPUTypeByID(id); ok {
			return m, vt
		}
	}
	return nil, nil
}

func (t *vgpuType) GetName() (string, nvml.Return) {
	var s string
	ret := t.info("VgpuTypeGetName", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return { s = "NVIDIA " + vt.Name; return nvml.SUCCESS })
	return s, ret
}

// GetClass: Quadro for Q, NVS for B and A, Compute for C (reference 4.1, inferred).
func (t *vgpuType) GetClass() (string, nvml.Return) {
	var s string
	ret := t.info("VgpuTypeGetClass", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		switch vt.Series {
		case profile.SeriesQ:
			s = "Quadro"
		case profile.SeriesC:
			s = "Compute"
		default:
			s = "NVS"
		}
		return nvml.SUCCESS
	})
	return s, ret
}

func (t *vgpuType) GetLicense() (string, nvml.Return) {
	var s string
	ret := t.info("VgpuTypeGetLicense", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		switch vt.Series {
		case profile.SeriesQ:
			s = "Quadro-Virtual-DWS,5.0;GRID-Virtual-WS,2.0;GRID-Virtual-WS-Ext,2.0"
		case profile.SeriesB:
			s = "GRID-Virtual-PC,2.0;Quadro-Virtual-DWS,5.0;GRID-Virtual-WS,2.0;GRID-Virtual-WS-Ext,2.0"
		case profile.SeriesA:
			s = "GRID-Virtual-Apps,3.0"
		default:
			s = "NVIDIA-vComputeServer,9.0;Quadro-Virtual-DWS,5.0"
		}
		return nvml.SUCCESS
	})
	return s, ret
}

func (t *vgpuType) GetFramebufferSize() (uint64, nvml.Return) {
	var n uint64
	ret := t.info("VgpuTypeGetFramebufferSize", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		n = vt.FramebufferMiB << 20
		return nvml.SUCCESS
	})
	return n, ret
}

func (t *vgpuType) GetNumDisplayHeads() (int, nvml.Return) {
	var n int
	ret := t.info("VgpuTypeGetNumDisplayHeads", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return { n, _, _ = vt.Display(); return nvml.SUCCESS })
	return n, ret
}

func (t *vgpuType) GetResolution(head int) (uint32, uint32, nvml.Return) {
	var x, y uint32
	ret := t.info("VgpuTypeGetResolution", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		heads, _, res := vt.Display()
		if head < 0 || head >= heads {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		w, hh, _ := strings.Cut(res, "x")
		a, _ := strconv.Atoi(w)
		b, _ := strconv.Atoi(hh)
		x, y = uint32(a), uint32(b)
		return nvml.SUCCESS
	})
	return x, y, ret
}

func (t *vgpuType) GetFrameRateLimit() (uint32, nvml.Return) {
	var n uint32
	ret := t.info("VgpuTypeGetFrameRateLimit", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		_, frl, _ := vt.Display()
		n = uint32(frl)
		return nvml.SUCCESS
	})
	return n, ret
}

func (t *vgpuType) GetMaxInstancesPerVm() (int, nvml.Return) {
	n := 1
	ret := t.info("VgpuTypeGetMaxInstancesPerVm", func(*profile.Model, *profile.VGPUType) nvml.Return { return nvml.SUCCESS })
	return n, ret
}

func (t *vgpuType) GetGpuInstanceProfileId() (uint32, nvml.Return) {
	n := uint32(invalidID)
	ret := t.info("VgpuTypeGetGpuInstanceProfileId", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		if vt.MIGBacked() {
			n = uint32(*vt.GPUInstanceProfile)
		}
		return nvml.SUCCESS
	})
	return n, ret
}

func (t *vgpuType) GetDeviceID() (uint64, uint64, nvml.Return) {
	var dev, sub uint64
	ret := t.info("VgpuTypeGetDeviceID", func(m *profile.Model, vt *profile.VGPUType) nvml.Return {
		id, _ := pciDeviceID(m)
		dev = uint64(id)<<16 | 0x10de
		sub = uint64(vt.ID)<<16 | 0x10de
		return nvml.SUCCESS
	})
	return dev, sub, ret
}

func (t *vgpuType) GetCapabilities(c nvml.VgpuCapability) (bool, nvml.Return) {
	var ok bool
	ret := t.info("VgpuTypeGetCapabilities", func(_ *profile.Model, vt *profile.VGPUType) nvml.Return {
		switch c {
		case nvml.VGPU_CAP_EXCLUSIVE_SIZE:
			ok = true
		case nvml.VGPU_CAP_EXCLUSIVE_TYPE:
			ok = vt.MIGBacked()
		}
		return nvml.SUCCESS
	})
	return ok, ret
}

// GetMaxInstances on a device: INVALID_ARGUMENT when the type is not one of
// the device's; the heterogeneous maximum when the GPU is in mixed mode.
func (t *vgpuType) GetMaxInstances(dev nvml.Device) (int, nvml.Return) {
	d, ok := dev.(*device)
	if !ok || d.h != t.l.h {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	n := 0
	ret := d.read("VgpuTypeGetMaxInstances", func(_ *state, g *gpuState) nvml.Return {
		vt, ok := g.model.VGPUTypeByID(int(t.id))
		if !ok || !g.model.HasFlow(vt, g.Flavour) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		n = vt.MaxInstances
		if g.Heterogeneous && !vt.MIGBacked() {
			n = vt.MixedMax()
		}
		return nvml.SUCCESS
	})
	return n, ret
}

// --- vGPU instances ---

// vgpuInstance is a simulated nvml.VgpuInstance: a handle NVML knows only
// while a VM has the vGPU open.
type vgpuInstance struct {
	*mock.VgpuInstance
	l      *lib
	handle uint32
}

var _ nvml.VgpuInstance = (*vgpuInstance)(nil)

func (v *vgpuInstance) find(op string, fn func(g *gpuState, x *vgpu, mdevUUID string) nvml.Return) nvml.Return {
	if !v.l.initialized() {
		return nvml.ERROR_UNINITIALIZED
	}
	if v.handle == 0 {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return v.l.h.call(op, -1, false, func(st *state, _ *gpuState) (bool, nvml.Return) {
		for _, g := range st.GPUs {
			for _, m := range g.Mdevs {
				if m.VGPU.Handle == v.handle && m.VGPU.VM != "" {
					return false, lostOr(g, func() nvml.Return { return fn(g, m.VGPU, m.UUID) })
				}
			}
			for _, f := range g.VFs {
				if f.VGPU != nil && f.VGPU.Handle == v.handle && f.VGPU.VM != "" {
					return false, lostOr(g, func() nvml.Return { return fn(g, f.VGPU, "") })
				}
			}
		}
		return false, nvml.ERROR_NOT_FOUND
	})
}

func lostOr(g *gpuState, fn func() nvml.Return) nvml.Return {
	if g.Lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return fn()
}

func (v *vgpuInstance) GetUUID() (string, nvml.Return) {
	var s string
	ret := v.find("VgpuInstanceGetUUID", func(_ *gpuState, x *vgpu, _ string) nvml.Return { s = x.UUID; return nvml.SUCCESS })
	return s, ret
}

// GetMdevUUID is NOT_SUPPORTED for vGPUs on vendor-VFIO virtual functions,
// which have no mdev.
func (v *vgpuInstance) GetMdevUUID() (string, nvml.Return) {
	var s string
	ret := v.find("VgpuInstanceGetMdevUUID", func(_ *gpuState, _ *vgpu, mdev string) nvml.Return {
		if mdev == "" {
			return nvml.ERROR_NOT_SUPPORTED
		}
		s = mdev
		return nvml.SUCCESS
	})
	return s, ret
}

func (v *vgpuInstance) GetVmID() (string, nvml.VgpuVmIdType, nvml.Return) {
	var s string
	ret := v.find("VgpuInstanceGetVmID", func(_ *gpuState, x *vgpu, _ string) nvml.Return { s = x.VM; return nvml.SUCCESS })
	return s, nvml.VGPU_VM_ID_UUID, ret
}

func (v *vgpuInstance) GetType() (nvml.VgpuTypeId, nvml.Return) {
	var id int
	ret := v.find("VgpuInstanceGetType", func(_ *gpuState, x *vgpu, _ string) nvml.Return { id = x.Type; return nvml.SUCCESS })
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return &vgpuType{VgpuTypeId: baseVgpuType, l: v.l, id: uint32(id)}, nvml.SUCCESS
}

func (v *vgpuInstance) GetFbUsage() (uint64, nvml.Return) {
	var n uint64
	ret := v.find("VgpuInstanceGetFbUsage", func(_ *gpuState, x *vgpu, _ string) nvml.Return { n = x.FbUsed; return nvml.SUCCESS })
	return n, ret
}

func (v *vgpuInstance) GetGpuInstanceId() (int, nvml.Return) {
	n := int(invalidID)
	ret := v.find("VgpuInstanceGetGpuInstanceId", func(_ *gpuState, x *vgpu, _ string) nvml.Return {
		if x.GI >= 0 {
			n = x.GI
		}
		return nvml.SUCCESS
	})
	return n, ret
}

// GetFrameRateLimit: the frame-rate limiter runs only under the best-effort
// scheduler; with equal or fixed share it is off (NOT_SUPPORTED).
func (v *vgpuInstance) GetFrameRateLimit() (uint32, nvml.Return) {
	var n uint32
	ret := v.find("VgpuInstanceGetFrameRateLimit", func(g *gpuState, x *vgpu, _ string) nvml.Return {
		if g.Sched.Policy != nvml.VGPU_SCHEDULER_POLICY_BEST_EFFORT || x.GI >= 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		_, frl, _ := g.typeOf(x).Display()
		n = uint32(frl)
		return nvml.SUCCESS
	})
	return n, ret
}

func (v *vgpuInstance) GetVmDriverVersion() (string, nvml.Return) {
	var s string
	ret := v.find("VgpuInstanceGetVmDriverVersion", func(*gpuState, *vgpu, string) nvml.Return { s = "Not Available"; return nvml.SUCCESS })
	return s, ret
}

func (v *vgpuInstance) GetEccMode() (nvml.EnableState, nvml.Return) {
	var s nvml.EnableState
	ret := v.find("VgpuInstanceGetEccMode", func(*gpuState, *vgpu, string) nvml.Return { s = nvml.FEATURE_ENABLED; return nvml.SUCCESS })
	return s, ret
}

func (v *vgpuInstance) String() string { return fmt.Sprintf("vgpu-%d", v.handle) }
