package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// device is a simulated nvml.Device, keyed by its index on this host.
type device struct {
	*mock.Device
	l   *lib
	h   *Host
	idx int
}

var _ nvml.Device = (*device)(nil)

func (h *Host) device(l *lib, i int) *device {
	return &device{Device: baseDevice, l: l, h: h, idx: i}
}

// read runs a read-only device call.
func (d *device) read(op string, fn func(st *state, g *gpuState) nvml.Return) nvml.Return {
	if !d.l.initialized() {
		return nvml.ERROR_UNINITIALIZED
	}
	return d.h.call(op, d.idx, false, func(st *state, g *gpuState) (bool, nvml.Return) { return false, fn(st, g) })
}

// write runs a device call that may change the state.
func (d *device) write(op string, fn func(st *state, g *gpuState) (bool, nvml.Return)) nvml.Return {
	if !d.l.initialized() {
		return nvml.ERROR_UNINITIALIZED
	}
	return d.h.call(op, d.idx, true, fn)
}

func (d *device) GetIndex() (int, nvml.Return) {
	ret := d.read("GetIndex", func(*state, *gpuState) nvml.Return { return nvml.SUCCESS })
	return d.idx, ret
}

func (d *device) GetName() (string, nvml.Return) {
	var s string
	ret := d.read("GetName", func(_ *state, g *gpuState) nvml.Return { s = g.model.Product; return nvml.SUCCESS })
	return s, ret
}

func (d *device) GetUUID() (string, nvml.Return) {
	var s string
	ret := d.read("GetUUID", func(_ *state, g *gpuState) nvml.Return { s = g.UUID; return nvml.SUCCESS })
	return s, ret
}

func (d *device) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	var p nvml.PciInfo
	ret := d.read("GetPciInfo", func(_ *state, g *gpuState) nvml.Return {
		a, _ := gpu.ParsePCI(g.PCI)
		p.Domain, p.Bus, p.Device = a.Domain, uint32(a.Bus), uint32(a.Device)
		id, _ := pciDeviceID(g.model)
		p.PciDeviceId = uint32(id)<<16 | 0x10de
		p.PciSubSystemId = 0x16c110de
		// NVML prints an 8-digit domain.
		copyCString(p.BusId[:], "0000"+g.PCI)
		copyCString(p.BusIdLegacy[:], g.PCI)
		return nvml.SUCCESS
	})
	return p, ret
}

func (d *device) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	var m nvml.Memory
	ret := d.read("GetMemoryInfo", func(_ *state, g *gpuState) nvml.Return {
		m.Total = g.model.UsableMemoryMiB << 20
		var used uint64
		for _, v := range g.vgpus() {
			if t := g.typeOf(v); t != nil {
				used += t.FramebufferMiB << 20
			}
		}
		if used > m.Total {
			used = m.Total
		}
		m.Used, m.Free = used, m.Total-used
		return nvml.SUCCESS
	})
	return m, ret
}

func (d *device) GetVirtualizationMode() (nvml.GpuVirtualizationMode, nvml.Return) {
	var mode nvml.GpuVirtualizationMode
	ret := d.read("GetVirtualizationMode", func(_ *state, g *gpuState) nvml.Return {
		mode = nvml.GPU_VIRTUALIZATION_MODE_NONE
		if g.Flavour != string(gpu.FlavourNone) {
			mode = nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU
		}
		return nvml.SUCCESS
	})
	return mode, ret
}

func (d *device) GetHostVgpuMode() (nvml.HostVgpuMode, nvml.Return) {
	var mode nvml.HostVgpuMode
	ret := d.read("GetHostVgpuMode", func(_ *state, g *gpuState) nvml.Return {
		if g.Flavour == string(gpu.FlavourNone) {
			return nvml.ERROR_NOT_SUPPORTED
		}
		mode = nvml.HOST_VGPU_MODE_NON_SRIOV
		if g.model.VGPU.SRIOVVFs > 0 {
			mode = nvml.HOST_VGPU_MODE_SRIOV
		}
		return nvml.SUCCESS
	})
	return mode, ret
}

// --- MIG mode ---

func (d *device) GetMigMode() (int, int, nvml.Return) {
	var cur, pend int
	ret := d.read("GetMigMode", func(_ *state, g *gpuState) nvml.Return {
		if g.model.MIG == nil {
			return nvml.ERROR_NOT_SUPPORTED
		}
		cur, pend = boolMode(g.MIGCurrent), boolMode(g.MIGPending)
		return nvml.SUCCESS
	})
	return cur, pend, ret
}

// SetMigMode follows reference 3.5: disabling with GPU instances fails IN_USE;
// a change on a GPU with VFs enabled, vGPUs, or on a host whose driver needs
// a reset stays pending with activation status IN_USE / RESET_REQUIRED.
func (d *device) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	activation := nvml.SUCCESS
	ret := d.write("SetMigMode", func(st *state, g *gpuState) (bool, nvml.Return) {
		if g.model.MIG == nil {
			return false, nvml.ERROR_NOT_SUPPORTED
		}
		if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		want := mode == nvml.DEVICE_MIG_ENABLE
		if g.MIGCurrent == want && g.MIGPending == want {
			return false, nvml.SUCCESS
		}
		if !want && len(g.GIs) > 0 {
			return false, nvml.ERROR_IN_USE
		}
		g.MIGPending = want
		switch {
		case g.VFsEnabled || len(g.vgpus()) > 0:
			activation = nvml.ERROR_IN_USE
		case st.Spec.Options.MIGModeNeedsReset:
			activation = nvml.ERROR_RESET_REQUIRED
		default:
			g.MIGCurrent = want
			if want {
				g.Heterogeneous = false
			}
		}
		return true, nvml.SUCCESS
	})
	return activation, ret
}

func boolMode(b bool) int {
	if b {
		return nvml.DEVICE_MIG_ENABLE
	}
	return nvml.DEVICE_MIG_DISABLE
}

// --- GPU instances ---

func (d *device) GetGpuInstanceProfileInfo(idx int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	var info nvml.GpuInstanceProfileInfo
	ret := d.read("GetGpuInstanceProfileInfo", func(_ *state, g *gpuState) nvml.Return {
		p, r := giProfileByIndex(g, idx)
		if r != nvml.SUCCESS {
			return r
		}
		info = giInfo(p)
		return nvml.SUCCESS
	})
	return info, ret
}

func giProfileByIndex(g *gpuState, idx int) (*profile.GPUInstanceProfile, nvml.Return) {
	if idx < 0 || idx >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if g.model.MIG == nil {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := g.model.GPUInstanceProfileByIndex(idx)
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	return p, nvml.SUCCESS
}

func giInfo(p *profile.GPUInstanceProfile) nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id: uint32(p.ID), IsP2pSupported: 0, SliceCount: uint32(p.ComputeSlices), InstanceCount: uint32(p.MaxInstances),
		MultiprocessorCount: uint32(p.SMs), CopyEngineCount: uint32(p.CopyEngines), DecoderCount: uint32(p.Decoders),
		EncoderCount: uint32(p.Encoders), JpegCount: uint32(p.JPEGs), OfaCount: uint32(p.OFAs), MemorySizeMB: p.MemoryMiB,
	}
}

// giProfileFromInfo resolves the profile a caller passes by info.Id (the
// real id, as the C API does).
func giProfileFromInfo(g *gpuState, info *nvml.GpuInstanceProfileInfo) (*profile.GPUInstanceProfile, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if g.model.MIG == nil {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := g.model.GPUInstanceProfileByID(int(info.Id))
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return p, nvml.SUCCESS
}

func (d *device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	var out []nvml.GpuInstancePlacement
	ret := d.read("GetGpuInstancePossiblePlacements", func(_ *state, g *gpuState) nvml.Return {
		p, r := giProfileFromInfo(g, info)
		if r != nvml.SUCCESS {
			return r
		}
		for _, s := range p.Placements {
			out = append(out, nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.Size)})
		}
		return nvml.SUCCESS
	})
	return out, ret
}

func (d *device) GetGpuInstanceRemainingCapacity(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
	n := 0
	ret := d.read("GetGpuInstanceRemainingCapacity", func(_ *state, g *gpuState) nvml.Return {
		p, r := giProfileFromInfo(g, info)
		if r != nvml.SUCCESS {
			return r
		}
		if !g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		n = giRemaining(g, p)
		return nvml.SUCCESS
	})
	return n, ret
}

func (d *device) CreateGpuInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	return d.createGI("CreateGpuInstance", info, nil)
}

func (d *device) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	if pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return d.createGI("CreateGpuInstanceWithPlacement", info, pl)
}

func (d *device) createGI(op string, info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	id := -1
	ret := d.write(op, func(_ *state, g *gpuState) (bool, nvml.Return) {
		p, r := giProfileFromInfo(g, info)
		if r != nvml.SUCCESS {
			return false, r
		}
		start := 0
		if pl != nil {
			if int(pl.Size) != p.Size {
				return false, nvml.ERROR_INVALID_ARGUMENT
			}
			start = int(pl.Start)
		}
		x, r := giCreate(g, p, start, pl != nil)
		if r != nvml.SUCCESS {
			return false, r
		}
		id = x.ID
		return true, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return d.gpuInstance(id), nvml.SUCCESS
}

func (d *device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	var ids []int
	ret := d.read("GetGpuInstances", func(_ *state, g *gpuState) nvml.Return {
		p, r := giProfileFromInfo(g, info)
		if r != nvml.SUCCESS {
			return r
		}
		if !g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		for _, x := range g.GIs {
			if x.ProfileID == p.ID {
				ids = append(ids, x.ID)
			}
		}
		return nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	out := make([]nvml.GpuInstance, 0, len(ids))
	for _, id := range ids {
		out = append(out, d.gpuInstance(id))
	}
	return out, nvml.SUCCESS
}

func (d *device) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	ret := d.read("GetGpuInstanceById", func(_ *state, g *gpuState) nvml.Return {
		if g.model.MIG == nil || !g.MIGCurrent {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if g.giByID(id) == nil {
			return nvml.ERROR_NOT_FOUND
		}
		return nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return d.gpuInstance(id), nvml.SUCCESS
}

func (d *device) GetMaxMigDeviceCount() (int, nvml.Return) {
	n := 0
	ret := d.read("GetMaxMigDeviceCount", func(_ *state, g *gpuState) nvml.Return {
		if g.model.MIG == nil {
			return nvml.ERROR_NOT_SUPPORTED
		}
		n = g.model.MIG.ComputeSlices
		return nvml.SUCCESS
	})
	return n, ret
}

func pciDeviceID(m *profile.Model) (uint16, bool) {
	if len(m.PCIDeviceIDs) == 0 {
		return 0, false
	}
	var v uint16
	for _, c := range m.PCIDeviceIDs[0][2:] {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= uint16(c - '0')
		case c >= 'a' && c <= 'f':
			v |= uint16(c-'a') + 10
		case c >= 'A' && c <= 'F':
			v |= uint16(c-'A') + 10
		}
	}
	return v, true
}

func copyCString(dst []int8, s string) {
	for i := 0; i < len(dst)-1 && i < len(s); i++ {
		dst[i] = int8(s[i])
	}
}
