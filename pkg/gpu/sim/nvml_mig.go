package sim

import (
	"sort"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/profile"
)

// The NVML calls of MIG: a device's MIG mode and GPU instances, the GPU
// and compute instance handles, and the MIG device handles through which
// a host reads a compute instance as a device.

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

// giProfileOnMIG is giProfileFromInfo on a GPU whose MIG mode is on: the
// calls about existing or creatable GPU instances are NOT_SUPPORTED
// otherwise.
func giProfileOnMIG(g *gpuState, info *nvml.GpuInstanceProfileInfo) (*profile.GPUInstanceProfile, nvml.Return) {
	p, r := giProfileFromInfo(g, info)
	if r != nvml.SUCCESS {
		return nil, r
	}
	if !g.MIGCurrent {
		return nil, nvml.ERROR_NOT_SUPPORTED
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
		p, r := giProfileOnMIG(g, info)
		if r != nvml.SUCCESS {
			return r
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
		p, r := giProfileOnMIG(g, info)
		if r != nvml.SUCCESS {
			return r
		}
		for _, x := range g.GIs {
			if x.ProfileID == p.ID {
				ids = append(ids, x.ID)
			}
		}
		return nvml.SUCCESS
	})
	return handles(ids, ret, func(id int) nvml.GpuInstance { return d.gpuInstance(id) })
}

// handles makes the handles of the instances ids once the call that found
// them (ret) succeeded, outside the host's lock: a handle names an
// instance and reads it at each call.
func handles[T any](ids []int, ret nvml.Return, handle func(id int) T) ([]T, nvml.Return) {
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	out := make([]T, 0, len(ids))
	for _, id := range ids {
		out = append(out, handle(id))
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

// --- GPU instance handles ---

// gpuInstance is a handle to a simulated GPU instance. Like a real handle
// it goes stale when the instance is destroyed: calls then fail with
// INVALID_ARGUMENT.
type gpuInstance struct {
	*mock.GpuInstance
	d  *device
	id int
}

var _ nvml.GpuInstance = (*gpuInstance)(nil)

func (d *device) gpuInstance(id int) *gpuInstance {
	return &gpuInstance{GpuInstance: baseGPUInstance, d: d, id: id}
}

// liveGI is the GPU instance id of g that a handle names: INVALID_ARGUMENT
// once it is destroyed or MIG mode is off.
func liveGI(g *gpuState, id int) (*gi, nvml.Return) {
	x := g.giByID(id)
	if x == nil || !g.MIGCurrent {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return x, nvml.SUCCESS
}

func (x *gpuInstance) read(op string, fn func(g *gpuState, gi *gi) nvml.Return) nvml.Return {
	return x.d.read(op, func(_ *state, g *gpuState) nvml.Return {
		gi, r := liveGI(g, x.id)
		if r != nvml.SUCCESS {
			return r
		}
		return fn(g, gi)
	})
}

func (x *gpuInstance) write(op string, fn func(g *gpuState, gi *gi) (bool, nvml.Return)) nvml.Return {
	return x.d.write(op, func(_ *state, g *gpuState) (bool, nvml.Return) {
		gi, r := liveGI(g, x.id)
		if r != nvml.SUCCESS {
			return false, r
		}
		return fn(g, gi)
	})
}

func (x *gpuInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	var info nvml.GpuInstanceInfo
	ret := x.read("GpuInstanceGetInfo", func(_ *gpuState, gi *gi) nvml.Return {
		info = nvml.GpuInstanceInfo{Device: x.d, Id: uint32(gi.ID), ProfileId: uint32(gi.ProfileID),
			Placement: nvml.GpuInstancePlacement{Start: uint32(gi.Start), Size: uint32(gi.Size)}}
		return nvml.SUCCESS
	})
	return info, ret
}

// Destroy fails with IN_USE while compute instances or vGPUs live on the GI.
func (x *gpuInstance) Destroy() nvml.Return {
	return x.write("GpuInstanceDestroy", func(g *gpuState, gi *gi) (bool, nvml.Return) {
		if len(gi.CIs) > 0 || len(g.vgpusOnGI(gi.ID)) > 0 {
			return false, nvml.ERROR_IN_USE
		}
		for i, y := range g.GIs {
			if y.ID == gi.ID {
				g.GIs = append(g.GIs[:i], g.GIs[i+1:]...)
				break
			}
		}
		return true, nvml.SUCCESS
	})
}

func giProfileOf(g *gpuState, x *gi) *profile.GPUInstanceProfile {
	p, _ := g.model.GPUInstanceProfileByID(x.ProfileID)
	return p
}

// ciProfile resolves a compute-instance profile index inside a GI.
func ciProfile(g *gpuState, x *gi, idx int) (*profile.ComputeInstanceProfile, nvml.Return) {
	if idx < 0 || idx >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p := giProfileOf(g, x)
	for _, c := range g.model.ComputeInstanceProfiles(p.ComputeSlices) {
		if c.ID == idx {
			c := c
			return &c, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_SUPPORTED
}

// ciProfileFromInfo resolves the profile a caller passes by info.Id.
func ciProfileFromInfo(g *gpuState, x *gi, info *nvml.ComputeInstanceProfileInfo) (*profile.ComputeInstanceProfile, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return ciProfile(g, x, int(info.Id))
}

func ciInfo(g *gpuState, x *gi, c *profile.ComputeInstanceProfile) nvml.ComputeInstanceProfileInfo {
	p := giProfileOf(g, x)
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(c.ID), SliceCount: uint32(c.Slices), InstanceCount: uint32(c.MaxInstances),
		MultiprocessorCount:   uint32(p.SMs * c.Slices / p.ComputeSlices),
		SharedCopyEngineCount: uint32(p.CopyEngines), SharedDecoderCount: uint32(p.Decoders),
		SharedEncoderCount: uint32(p.Encoders), SharedJpegCount: uint32(p.JPEGs), SharedOfaCount: uint32(p.OFAs),
	}
}

func (x *gpuInstance) GetComputeInstanceProfileInfo(idx, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	var info nvml.ComputeInstanceProfileInfo
	ret := x.read("GetComputeInstanceProfileInfo", func(g *gpuState, gi *gi) nvml.Return {
		if eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ERROR_NOT_SUPPORTED
		}
		c, r := ciProfile(g, gi, idx)
		if r != nvml.SUCCESS {
			return r
		}
		info = ciInfo(g, gi, c)
		return nvml.SUCCESS
	})
	return info, ret
}

// ciStarts are the legal starts of a CI of size slices in a GI of n
// compute slices: the catalog's rule, which the allocator follows too.
func ciStarts(n, size int) []int { return profile.ComputeInstanceStarts(n, size) }

func (x *gpuInstance) GetComputeInstancePossiblePlacements(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
	var out []nvml.ComputeInstancePlacement
	ret := x.read("GetComputeInstancePossiblePlacements", func(g *gpuState, gi *gi) nvml.Return {
		c, r := ciProfileFromInfo(g, gi, info)
		if r != nvml.SUCCESS {
			return r
		}
		for _, s := range ciStarts(giProfileOf(g, gi).ComputeSlices, c.Slices) {
			out = append(out, nvml.ComputeInstancePlacement{Start: uint32(s), Size: uint32(c.Slices)})
		}
		return nvml.SUCCESS
	})
	return out, ret
}

func (x *gpuInstance) GetComputeInstanceRemainingCapacity(info *nvml.ComputeInstanceProfileInfo) (int, nvml.Return) {
	n := 0
	ret := x.read("GetComputeInstanceRemainingCapacity", func(g *gpuState, gi *gi) nvml.Return {
		c, r := ciProfileFromInfo(g, gi, info)
		if r != nvml.SUCCESS {
			return r
		}
		n = ciRemaining(g, gi, c)
		return nvml.SUCCESS
	})
	return n, ret
}

func ciFree(gi *gi, start, size int) bool {
	for _, y := range gi.CIs {
		if start < y.Start+y.Size && y.Start < start+size {
			return false
		}
	}
	return true
}

// ciCount is how many compute instances of profile c the GI holds.
func ciCount(gi *gi, c *profile.ComputeInstanceProfile) int {
	n := 0
	for _, y := range gi.CIs {
		if y.ProfileID == c.ID {
			n++
		}
	}
	return n
}

func ciRemaining(g *gpuState, gi *gi, c *profile.ComputeInstanceProfile) int {
	if len(g.vgpusOnGI(gi.ID)) > 0 {
		return 0 // the vGPU manager's GI takes no compute instance (createCI)
	}
	count := ciCount(gi, c)
	n := 0
	for _, s := range ciStarts(giProfileOf(g, gi).ComputeSlices, c.Slices) {
		if ciFree(gi, s, c.Slices) {
			n++
		}
	}
	if left := c.MaxInstances - count; n > left {
		n = left
	}
	return n
}

func (x *gpuInstance) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	return x.createCI("CreateComputeInstance", info, nil)
}

func (x *gpuInstance) CreateComputeInstanceWithPlacement(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	if pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return x.createCI("CreateComputeInstanceWithPlacement", info, pl)
}

func (x *gpuInstance) createCI(op string, info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	id := -1
	ret := x.write(op, func(g *gpuState, gi *gi) (bool, nvml.Return) {
		c, r := ciProfileFromInfo(g, gi, info)
		if r != nvml.SUCCESS {
			return false, r
		}
		// A GPU instance the vGPU manager hosts vGPUs on is the vGPU
		// manager's: no compute instance serves the host beside them
		// (the converse of rules.go refusing a vGPU on a GI with CIs).
		// IN_USE as for Destroy with a vGPU on the GI (reference 3.7; inferred).
		if len(g.vgpusOnGI(gi.ID)) > 0 {
			return false, nvml.ERROR_IN_USE
		}
		if ciCount(gi, c) >= c.MaxInstances {
			return false, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		starts := ciStarts(giProfileOf(g, gi).ComputeSlices, c.Slices)
		start := -1
		if pl != nil {
			legal := false
			for _, s := range starts {
				legal = legal || s == int(pl.Start)
			}
			if !legal || int(pl.Size) != c.Slices {
				return false, nvml.ERROR_INVALID_ARGUMENT
			}
			if !ciFree(gi, int(pl.Start), c.Slices) {
				return false, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			start = int(pl.Start)
		} else {
			for _, s := range starts {
				if ciFree(gi, s, c.Slices) {
					start = s
					break
				}
			}
			if start < 0 {
				return false, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
		}
		used := map[int]bool{}
		for _, y := range gi.CIs {
			used[y.ID] = true
		}
		id = 0
		for used[id] {
			id++
		}
		gi.CIs = append(gi.CIs, &ci{ID: id, ProfileID: c.ID, Start: start, Size: c.Slices})
		sort.Slice(gi.CIs, func(i, j int) bool { return gi.CIs[i].ID < gi.CIs[j].ID })
		return true, nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return x.computeInstance(id), nvml.SUCCESS
}

func (x *gpuInstance) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	var ids []int
	ret := x.read("GetComputeInstances", func(g *gpuState, gi *gi) nvml.Return {
		c, r := ciProfileFromInfo(g, gi, info)
		if r != nvml.SUCCESS {
			return r
		}
		for _, y := range gi.CIs {
			if y.ProfileID == c.ID {
				ids = append(ids, y.ID)
			}
		}
		return nvml.SUCCESS
	})
	return handles(ids, ret, func(id int) nvml.ComputeInstance { return x.computeInstance(id) })
}

func (x *gpuInstance) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	ret := x.read("GetComputeInstanceById", func(_ *gpuState, gi *gi) nvml.Return {
		if gi.ciByID(id) == nil {
			return nvml.ERROR_NOT_FOUND
		}
		return nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return x.computeInstance(id), nvml.SUCCESS
}

// computeInstance is a handle to a simulated compute instance.
type computeInstance struct {
	*mock.ComputeInstance
	gi *gpuInstance
	id int
}

var _ nvml.ComputeInstance = (*computeInstance)(nil)

func (x *gpuInstance) computeInstance(id int) *computeInstance {
	return &computeInstance{ComputeInstance: baseCompute, gi: x, id: id}
}

func (c *computeInstance) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	var info nvml.ComputeInstanceInfo
	ret := c.gi.read("ComputeInstanceGetInfo", func(_ *gpuState, gi *gi) nvml.Return {
		y := gi.ciByID(c.id)
		if y == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		info = nvml.ComputeInstanceInfo{Device: c.gi.d, GpuInstance: c.gi, Id: uint32(y.ID), ProfileId: uint32(y.ProfileID),
			Placement: nvml.ComputeInstancePlacement{Start: uint32(y.Start), Size: uint32(y.Size)}}
		return nvml.SUCCESS
	})
	return info, ret
}

func (c *computeInstance) Destroy() nvml.Return {
	return c.gi.write("ComputeInstanceDestroy", func(_ *gpuState, gi *gi) (bool, nvml.Return) {
		for i, y := range gi.CIs {
			if y.ID == c.id {
				gi.CIs = append(gi.CIs[:i], gi.CIs[i+1:]...)
				return true, nvml.SUCCESS
			}
		}
		return false, nvml.ERROR_INVALID_ARGUMENT
	})
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
		x, r := liveGI(g, m.gi)
		if r != nvml.SUCCESS {
			return r
		}
		if x.ciByID(m.ci) == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return fn(st, g, x)
	})
}

// check is a call that only needs the handle to be live.
func (m *migDevice) check(op string) nvml.Return {
	return m.read(op, func(*state, *gpuState, *gi) nvml.Return { return nvml.SUCCESS })
}

func (m *migDevice) IsMigDeviceHandle() (bool, nvml.Return) {
	return true, m.check("IsMigDeviceHandle")
}

func (m *migDevice) GetGpuInstanceId() (int, nvml.Return) {
	return m.gi, m.check("GetGpuInstanceId")
}

func (m *migDevice) GetComputeInstanceId() (int, nvml.Return) {
	return m.ci, m.check("GetComputeInstanceId")
}

func (m *migDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	return m.d, m.check("GetDeviceHandleFromMigDeviceHandle")
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
