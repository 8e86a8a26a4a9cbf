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
	ctx, release, herr := b.hold(ctx, "Devices")
	if herr != nil {
		return nil, herr
	}
	defer release()
	n, err := call(ctx, b, "DeviceGetCount", b.lib.DeviceGetCount)
	if err != nil {
		return nil, fmt.Errorf("count GPUs: %w", err)
	}
	out := make([]gpu.GPU, 0, n)
	for i := 0; i < n; i++ {
		d, err := call(ctx, b, "DeviceGetHandleByIndex", func() (gonvml.Device, gonvml.Return) { return b.lib.DeviceGetHandleByIndex(i) })
		if err != nil {
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
	ctx, release, herr := b.hold(ctx, "Describe")
	if herr != nil {
		return gpu.GPU{}, herr
	}
	defer release()
	d, err := b.device(ctx, uuid)
	if err != nil {
		return gpu.GPU{}, err
	}
	idx, err := call(ctx, b, "GetIndex", d.GetIndex)
	if err != nil {
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
	var err error
	if g.UUID, err = call(ctx, b, "GetUUID", d.GetUUID); err != nil {
		if ctx.Err() != nil {
			return g, ctx.Err()
		}
		soft("uuid", err)
		return g, nil
	}
	pci, err := call(ctx, b, "GetPciInfo", d.GetPciInfo)
	if soft("pci", err) {
		return g, ctx.Err()
	}
	if addr, err := gpu.NormalizePCI(cString(pci.BusId[:])); err == nil {
		g.PCI = addr
	} else {
		soft("pci", err)
	}
	g.PCIDeviceID = uint16(pci.PciDeviceId >> 16)
	g.Product, err = call(ctx, b, "GetName", d.GetName)
	if soft("name", err) {
		return g, ctx.Err()
	}
	if m, ok := b.catalog().Identify(g.PCIDeviceID, g.Product); ok {
		g.Model = m.Name
	}
	mem, err := call(ctx, b, "GetMemoryInfo", d.GetMemoryInfo)
	if !soft("memory", err) {
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
	cur, pend, err := call2(ctx, b, "GetMigMode", d.GetMigMode)
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
		info, err := call(ctx, b, "GetGpuInstanceProfileInfo", func() (gonvml.GpuInstanceProfileInfo, gonvml.Return) { return d.GetGpuInstanceProfileInfo(idx) })
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
		pls, err := call(ctx, b, "GetGpuInstancePossiblePlacements", func() ([]gonvml.GpuInstancePlacement, gonvml.Return) {
			return d.GetGpuInstancePossiblePlacements(&info)
		})
		if soft("placements "+p.Name, err) {
			return
		}
		for _, pl := range pls {
			p.Placements = append(p.Placements, gpu.Range{Start: int(pl.Start), Size: int(pl.Size)})
		}
		if g.MIG.Enabled {
			p.RemainingFree, err = call(ctx, b, "GetGpuInstanceRemainingCapacity", func() (int, gonvml.Return) {
				return d.GetGpuInstanceRemainingCapacity(&info)
			})
			if soft("remaining "+p.Name, err) {
				return
			}
			gis, err := call(ctx, b, "GetGpuInstances", func() ([]gonvml.GpuInstance, gonvml.Return) { return d.GetGpuInstances(&info) })
			if soft("instances "+p.Name, err) {
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
	info, err := call(ctx, b, "GpuInstanceGetInfo", h.GetInfo)
	if err != nil {
		return gpu.GPUInstance{}, err
	}
	gi := gpu.GPUInstance{ID: int(info.Id), ProfileID: int(info.ProfileId), Profile: name,
		Placement: gpu.Range{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}}
	for idx := 0; idx < gonvml.COMPUTE_INSTANCE_PROFILE_COUNT; idx++ {
		cinfo, err := call(ctx, b, "GetComputeInstanceProfileInfo", func() (gonvml.ComputeInstanceProfileInfo, gonvml.Return) {
			return h.GetComputeInstanceProfileInfo(idx, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		})
		if errors.Is(err, gpu.ErrNotSupported) || errors.Is(err, gpu.ErrInvalid) {
			continue
		}
		if err != nil {
			return gi, err
		}
		cis, err := call(ctx, b, "GetComputeInstances", func() ([]gonvml.ComputeInstance, gonvml.Return) { return h.GetComputeInstances(&cinfo) })
		if err != nil {
			return gi, err
		}
		for _, c := range cis {
			ci, err := call(ctx, b, "ComputeInstanceGetInfo", c.GetInfo)
			if err != nil {
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
	types, err := call(ctx, b, "GetSupportedVgpus", d.GetSupportedVgpus)
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
	creatable, err := call(ctx, b, "GetCreatableVgpus", d.GetCreatableVgpus)
	if soft("creatable vGPU types", err) {
		return
	}
	for _, t := range creatable {
		g.VGPU.Creatable = append(g.VGPU.Creatable, int(t.GetID()))
	}
	if hm, err := call(ctx, b, "GetVgpuHeterogeneousMode", d.GetVgpuHeterogeneousMode); err == nil {
		g.VGPU.Heterogeneous = hm.Mode == 1
	}
	active, err := call(ctx, b, "GetActiveVgpus", d.GetActiveVgpus)
	if soft("active vGPUs", err) {
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
	var err error
	if vt.Name, err = call(ctx, b, "VgpuTypeGetName", t.GetName); err != nil {
		return vt, err
	}
	if vt.Class, err = call(ctx, b, "VgpuTypeGetClass", t.GetClass); err != nil {
		return vt, err
	}
	if vt.FramebufferBytes, err = call(ctx, b, "VgpuTypeGetFramebufferSize", t.GetFramebufferSize); err != nil {
		return vt, err
	}
	if vt.MaxInstances, err = call(ctx, b, "VgpuTypeGetMaxInstances", func() (int, gonvml.Return) { return t.GetMaxInstances(d) }); err != nil {
		return vt, err
	}
	gip, err := call(ctx, b, "VgpuTypeGetGpuInstanceProfileId", t.GetGpuInstanceProfileId)
	if err != nil {
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
	var err error
	if a.UUID, err = call(ctx, b, "VgpuInstanceGetUUID", v.GetUUID); err != nil {
		return a, err
	}
	t, err := call(ctx, b, "VgpuInstanceGetType", v.GetType)
	if err != nil {
		return a, err
	}
	a.Type = int(t.GetID())
	a.MdevUUID, err = call(ctx, b, "VgpuInstanceGetMdevUUID", v.GetMdevUUID)
	if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
		return a, err
	}
	if a.VMID, _, err = call2(ctx, b, "VgpuInstanceGetVmID", v.GetVmID); err != nil {
		return a, err
	}
	if a.FbUsed, err = call(ctx, b, "VgpuInstanceGetFbUsage", v.GetFbUsage); err != nil {
		return a, err
	}
	gi, err := call(ctx, b, "VgpuInstanceGetGpuInstanceId", v.GetGpuInstanceId)
	if err != nil {
		return a, err
	}
	if gi >= 0 && gi != invalidID {
		a.GPUInstance = gi
	}
	return a, nil
}
