package nvml

import (
	"context"
	"errors"
	"fmt"
	"sort"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// Devices enumerates every GPU with what NVML says of it: identity, memory,
// MIG mode, GPU-instance profiles with their legal placements, GPU and
// compute instances, and vGPU types and active vGPUs. A GPU that fails a
// query is still listed, with the failure in its Errors (and Lost set for
// GPU_IS_LOST), so one bad GPU does not hide the others.
func (b *Backend) Devices(ctx context.Context) ([]gpu.GPU, error) {
	var n int
	if err := b.do(ctx, "DeviceGetCount", func() (r gonvml.Return) { n, r = b.lib.DeviceGetCount(); return }); err != nil {
		return nil, fmt.Errorf("count GPUs: %w", err)
	}
	out := make([]gpu.GPU, 0, n)
	for i := 0; i < n; i++ {
		var d gonvml.Device
		if err := b.do(ctx, "DeviceGetHandleByIndex", func() (r gonvml.Return) { d, r = b.lib.DeviceGetHandleByIndex(i); return }); err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		g, err := b.describe(ctx, i, d)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// Describe returns the NVML view of the GPU with uuid.
func (b *Backend) Describe(ctx context.Context, uuid string) (gpu.GPU, error) {
	d, err := b.device(ctx, uuid)
	if err != nil {
		return gpu.GPU{}, err
	}
	var idx int
	if err := b.do(ctx, "GetIndex", func() (r gonvml.Return) { idx, r = d.GetIndex(); return }); err != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, k := range b.known {
			if k.UUID == uuid {
				k.Lost, k.Errors = errors.Is(err, gpu.ErrGPULost), []string{err.Error()}
				return k, nil
			}
		}
		return gpu.GPU{UUID: uuid, Lost: errors.Is(err, gpu.ErrGPULost), Errors: []string{err.Error()}}, nil
	}
	return b.describe(ctx, idx, d)
}

func (b *Backend) describe(ctx context.Context, i int, d gonvml.Device) (gpu.GPU, error) {
	g, err := b.describeDevice(ctx, i, d)
	b.mu.Lock()
	defer b.mu.Unlock()
	if g.Lost {
		if k, ok := b.known[i]; ok && (g.UUID == "" || g.UUID == k.UUID) {
			g.UUID, g.PCI, g.Product, g.Model, g.PCIDeviceID, g.MemoryBytes = k.UUID, k.PCI, k.Product, k.Model, k.PCIDeviceID, k.MemoryBytes
		}
	} else if g.UUID != "" && g.PCI != "" {
		b.known[i] = gpu.GPU{Index: i, UUID: g.UUID, PCI: g.PCI, Product: g.Product, Model: g.Model, PCIDeviceID: g.PCIDeviceID, MemoryBytes: g.MemoryBytes}
	}
	return g, err
}

func (b *Backend) describeDevice(ctx context.Context, i int, d gonvml.Device) (gpu.GPU, error) {
	g := gpu.GPU{Index: i, NUMANode: -1}
	// soft records a per-GPU failure; only a context error aborts discovery.
	soft := func(what string, err error) bool {
		if err == nil {
			return false
		}
		if errors.Is(err, gpu.ErrGPULost) {
			g.Lost = true
		}
		g.Errors = append(g.Errors, fmt.Sprintf("%s: %v", what, err))
		return true
	}
	if err := b.do(ctx, "GetUUID", func() (r gonvml.Return) { g.UUID, r = d.GetUUID(); return }); err != nil {
		if ctx.Err() != nil {
			return g, ctx.Err()
		}
		soft("uuid", err)
		return g, nil
	}
	var pci gonvml.PciInfo
	if soft("pci", b.do(ctx, "GetPciInfo", func() (r gonvml.Return) { pci, r = d.GetPciInfo(); return })) {
		return g, ctx.Err()
	}
	if addr, err := gpu.NormalizePCI(cString(pci.BusId[:])); err == nil {
		g.PCI = addr
	} else {
		soft("pci", err)
	}
	g.PCIDeviceID = uint16(pci.PciDeviceId >> 16)
	if soft("name", b.do(ctx, "GetName", func() (r gonvml.Return) { g.Product, r = d.GetName(); return })) {
		return g, ctx.Err()
	}
	if m, ok := b.catalog().Identify(g.PCIDeviceID, g.Product); ok {
		g.Model = m.Name
	}
	var mem gonvml.Memory
	if !soft("memory", b.do(ctx, "GetMemoryInfo", func() (r gonvml.Return) { mem, r = d.GetMemoryInfo(); return })) {
		g.MemoryBytes = mem.Total
	}
	if g.Lost {
		return g, ctx.Err()
	}
	b.describeMIG(ctx, d, &g, soft)
	b.describeVGPU(ctx, d, &g, soft)
	return g, ctx.Err()
}

func (b *Backend) describeMIG(ctx context.Context, d gonvml.Device, g *gpu.GPU, soft func(string, error) bool) {
	var cur, pend int
	err := b.do(ctx, "GetMigMode", func() (r gonvml.Return) { cur, pend, r = d.GetMigMode(); return })
	if errors.Is(err, gpu.ErrNotSupported) {
		return
	}
	if soft("mig mode", err) {
		return
	}
	g.MIG.Capable = true
	g.MIG.Enabled = cur == gonvml.DEVICE_MIG_ENABLE
	g.MIG.Pending = pend == gonvml.DEVICE_MIG_ENABLE
	model, _ := b.catalog().Model(g.Model)
	for idx := 0; idx < gonvml.GPU_INSTANCE_PROFILE_COUNT; idx++ {
		var info gonvml.GpuInstanceProfileInfo
		err := b.do(ctx, "GetGpuInstanceProfileInfo", func() (r gonvml.Return) { info, r = d.GetGpuInstanceProfileInfo(idx); return })
		if errors.Is(err, gpu.ErrNotSupported) || errors.Is(err, gpu.ErrInvalid) {
			continue
		}
		if soft(fmt.Sprintf("GI profile index %d", idx), err) {
			return
		}
		p := gpu.GIProfile{Index: idx, ID: int(info.Id), Slices: int(info.SliceCount), MaxInstances: int(info.InstanceCount),
			MemoryMiB: info.MemorySizeMB, SMs: int(info.MultiprocessorCount), CopyEngines: int(info.CopyEngineCount),
			Decoders: int(info.DecoderCount), Encoders: int(info.EncoderCount), JPEGs: int(info.JpegCount), OFAs: int(info.OfaCount)}
		if model != nil {
			if cp, ok := model.GPUInstanceProfileByID(p.ID); ok {
				p.Name = cp.Name
			}
		}
		var pls []gonvml.GpuInstancePlacement
		if soft("placements "+p.Name, b.do(ctx, "GetGpuInstancePossiblePlacements", func() (r gonvml.Return) {
			pls, r = d.GetGpuInstancePossiblePlacements(&info)
			return
		})) {
			return
		}
		for _, pl := range pls {
			p.Placements = append(p.Placements, gpu.Range{Start: int(pl.Start), Size: int(pl.Size)})
		}
		if g.MIG.Enabled {
			err := b.do(ctx, "GetGpuInstanceRemainingCapacity", func() (r gonvml.Return) {
				p.RemainingFree, r = d.GetGpuInstanceRemainingCapacity(&info)
				return
			})
			if soft("remaining "+p.Name, err) {
				return
			}
			var gis []gonvml.GpuInstance
			if soft("instances "+p.Name, b.do(ctx, "GetGpuInstances", func() (r gonvml.Return) { gis, r = d.GetGpuInstances(&info); return })) {
				return
			}
			for _, h := range gis {
				gi, err := b.readGI(ctx, h, p.Name)
				if soft("instance", err) {
					return
				}
				g.MIG.Instances = append(g.MIG.Instances, gi)
			}
		}
		g.MIG.Profiles = append(g.MIG.Profiles, p)
	}
	sort.Slice(g.MIG.Instances, func(i, j int) bool { return g.MIG.Instances[i].Placement.Start < g.MIG.Instances[j].Placement.Start })
}

func (b *Backend) readGI(ctx context.Context, h gonvml.GpuInstance, name string) (gpu.GPUInstance, error) {
	var info gonvml.GpuInstanceInfo
	if err := b.do(ctx, "GpuInstanceGetInfo", func() (r gonvml.Return) { info, r = h.GetInfo(); return }); err != nil {
		return gpu.GPUInstance{}, err
	}
	gi := gpu.GPUInstance{ID: int(info.Id), ProfileID: int(info.ProfileId), Profile: name,
		Placement: gpu.Range{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}}
	for idx := 0; idx < gonvml.COMPUTE_INSTANCE_PROFILE_COUNT; idx++ {
		var cinfo gonvml.ComputeInstanceProfileInfo
		err := b.do(ctx, "GetComputeInstanceProfileInfo", func() (r gonvml.Return) {
			cinfo, r = h.GetComputeInstanceProfileInfo(idx, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			return
		})
		if errors.Is(err, gpu.ErrNotSupported) || errors.Is(err, gpu.ErrInvalid) {
			continue
		}
		if err != nil {
			return gi, err
		}
		var cis []gonvml.ComputeInstance
		if err := b.do(ctx, "GetComputeInstances", func() (r gonvml.Return) { cis, r = h.GetComputeInstances(&cinfo); return }); err != nil {
			return gi, err
		}
		for _, c := range cis {
			var ci gonvml.ComputeInstanceInfo
			if err := b.do(ctx, "ComputeInstanceGetInfo", func() (r gonvml.Return) { ci, r = c.GetInfo(); return }); err != nil {
				return gi, err
			}
			gi.Compute = append(gi.Compute, gpu.ComputeInstance{ID: int(ci.Id), ProfileID: int(ci.ProfileId),
				Placement: gpu.Range{Start: int(ci.Placement.Start), Size: int(ci.Placement.Size)}})
		}
	}
	sort.Slice(gi.Compute, func(i, j int) bool { return gi.Compute[i].ID < gi.Compute[j].ID })
	return gi, nil
}

func (b *Backend) describeVGPU(ctx context.Context, d gonvml.Device, g *gpu.GPU, soft func(string, error) bool) {
	var types []gonvml.VgpuTypeId
	err := b.do(ctx, "GetSupportedVgpus", func() (r gonvml.Return) { types, r = d.GetSupportedVgpus(); return })
	if errors.Is(err, gpu.ErrNotSupported) {
		return
	}
	if soft("supported vGPU types", err) {
		return
	}
	for _, t := range types {
		vt, err := b.vgpuType(ctx, d, t)
		if soft("vGPU type", err) {
			return
		}
		g.VGPU.Supported = append(g.VGPU.Supported, vt)
	}
	var creatable []gonvml.VgpuTypeId
	if soft("creatable vGPU types", b.do(ctx, "GetCreatableVgpus", func() (r gonvml.Return) { creatable, r = d.GetCreatableVgpus(); return })) {
		return
	}
	for _, t := range creatable {
		g.VGPU.Creatable = append(g.VGPU.Creatable, int(t.GetID()))
	}
	var hm gonvml.VgpuHeterogeneousMode
	if err := b.do(ctx, "GetVgpuHeterogeneousMode", func() (r gonvml.Return) { hm, r = d.GetVgpuHeterogeneousMode(); return }); err == nil {
		g.VGPU.Heterogeneous = hm.Mode == 1
	}
	var active []gonvml.VgpuInstance
	if soft("active vGPUs", b.do(ctx, "GetActiveVgpus", func() (r gonvml.Return) { active, r = d.GetActiveVgpus(); return })) {
		return
	}
	for _, v := range active {
		a, err := b.activeVGPU(ctx, v)
		if errors.Is(err, gpu.ErrNotFound) {
			continue // the VM stopped meanwhile
		}
		if soft("active vGPU", err) {
			return
		}
		g.VGPU.Active = append(g.VGPU.Active, a)
	}
}

func (b *Backend) vgpuType(ctx context.Context, d gonvml.Device, t gonvml.VgpuTypeId) (gpu.VGPUType, error) {
	vt := gpu.VGPUType{ID: int(t.GetID()), GPUInstanceProfile: -1}
	if err := b.do(ctx, "VgpuTypeGetName", func() (r gonvml.Return) { vt.Name, r = t.GetName(); return }); err != nil {
		return vt, err
	}
	if err := b.do(ctx, "VgpuTypeGetClass", func() (r gonvml.Return) { vt.Class, r = t.GetClass(); return }); err != nil {
		return vt, err
	}
	if err := b.do(ctx, "VgpuTypeGetFramebufferSize", func() (r gonvml.Return) { vt.FramebufferBytes, r = t.GetFramebufferSize(); return }); err != nil {
		return vt, err
	}
	if err := b.do(ctx, "VgpuTypeGetMaxInstances", func() (r gonvml.Return) { vt.MaxInstances, r = t.GetMaxInstances(d); return }); err != nil {
		return vt, err
	}
	var gip uint32
	if err := b.do(ctx, "VgpuTypeGetGpuInstanceProfileId", func() (r gonvml.Return) { gip, r = t.GetGpuInstanceProfileId(); return }); err != nil {
		return vt, err
	}
	if gip != invalidID {
		vt.GPUInstanceProfile = int(gip)
	}
	return vt, nil
}

// invalidID is NVML's INVALID_GPU_INSTANCE_ID / _PROFILE_ID.
const invalidID = 0xFFFFFFFF

func (b *Backend) activeVGPU(ctx context.Context, v gonvml.VgpuInstance) (gpu.ActiveVGPU, error) {
	a := gpu.ActiveVGPU{GPUInstance: -1}
	if err := b.do(ctx, "VgpuInstanceGetUUID", func() (r gonvml.Return) { a.UUID, r = v.GetUUID(); return }); err != nil {
		return a, err
	}
	var t gonvml.VgpuTypeId
	if err := b.do(ctx, "VgpuInstanceGetType", func() (r gonvml.Return) { t, r = v.GetType(); return }); err != nil {
		return a, err
	}
	a.Type = int(t.GetID())
	err := b.do(ctx, "VgpuInstanceGetMdevUUID", func() (r gonvml.Return) { a.MdevUUID, r = v.GetMdevUUID(); return })
	if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
		return a, err
	}
	if err := b.do(ctx, "VgpuInstanceGetVmID", func() (r gonvml.Return) { a.VMID, _, r = v.GetVmID(); return }); err != nil {
		return a, err
	}
	if err := b.do(ctx, "VgpuInstanceGetFbUsage", func() (r gonvml.Return) { a.FbUsed, r = v.GetFbUsage(); return }); err != nil {
		return a, err
	}
	var gi int
	if err := b.do(ctx, "VgpuInstanceGetGpuInstanceId", func() (r gonvml.Return) { gi, r = v.GetGpuInstanceId(); return }); err != nil {
		return a, err
	}
	if gi >= 0 && gi != invalidID {
		a.GPUInstance = gi
	}
	return a, nil
}
