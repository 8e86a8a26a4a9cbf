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
