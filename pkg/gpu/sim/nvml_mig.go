package sim

import (
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/vgpud/vgpud/pkg/profile"
)

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

func (x *gpuInstance) read(op string, fn func(g *gpuState, gi *gi) nvml.Return) nvml.Return {
	return x.d.read(op, func(_ *state, g *gpuState) nvml.Return {
		gi := g.giByID(x.id)
		if gi == nil || !g.MIGCurrent {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return fn(g, gi)
	})
}

func (x *gpuInstance) write(op string, fn func(g *gpuState, gi *gi) (bool, nvml.Return)) nvml.Return {
	return x.d.write(op, func(_ *state, g *gpuState) (bool, nvml.Return) {
		gi := g.giByID(x.id)
		if gi == nil || !g.MIGCurrent {
			return false, nvml.ERROR_INVALID_ARGUMENT
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

// ciStarts are the legal starts of a CI of size slices in a GI of n compute slices.
func ciStarts(n, size int) []int {
	var out []int
	for s := 0; s+size <= n; s += size {
		out = append(out, s)
	}
	return out
}

func (x *gpuInstance) GetComputeInstancePossiblePlacements(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
	var out []nvml.ComputeInstancePlacement
	ret := x.read("GetComputeInstancePossiblePlacements", func(g *gpuState, gi *gi) nvml.Return {
		if info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		c, r := ciProfile(g, gi, int(info.Id))
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
		if info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		c, r := ciProfile(g, gi, int(info.Id))
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

func ciRemaining(g *gpuState, gi *gi, c *profile.ComputeInstanceProfile) int {
	count := 0
	for _, y := range gi.CIs {
		if y.ProfileID == c.ID {
			count++
		}
	}
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
		if info == nil {
			return false, nvml.ERROR_INVALID_ARGUMENT
		}
		c, r := ciProfile(g, gi, int(info.Id))
		if r != nvml.SUCCESS {
			return false, r
		}
		count := 0
		for _, y := range gi.CIs {
			if y.ProfileID == c.ID {
				count++
			}
		}
		if count >= c.MaxInstances {
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
	return &computeInstance{ComputeInstance: baseCompute, gi: x, id: id}, nvml.SUCCESS
}

func (x *gpuInstance) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	var ids []int
	ret := x.read("GetComputeInstances", func(g *gpuState, gi *gi) nvml.Return {
		if info == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		c, r := ciProfile(g, gi, int(info.Id))
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
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	out := make([]nvml.ComputeInstance, 0, len(ids))
	for _, id := range ids {
		out = append(out, &computeInstance{ComputeInstance: baseCompute, gi: x, id: id})
	}
	return out, nvml.SUCCESS
}

func (x *gpuInstance) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	ret := x.read("GetComputeInstanceById", func(_ *gpuState, gi *gi) nvml.Return {
		for _, y := range gi.CIs {
			if y.ID == id {
				return nvml.SUCCESS
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return &computeInstance{ComputeInstance: baseCompute, gi: x, id: id}, nvml.SUCCESS
}

// computeInstance is a handle to a simulated compute instance.
type computeInstance struct {
	*mock.ComputeInstance
	gi *gpuInstance
	id int
}

var _ nvml.ComputeInstance = (*computeInstance)(nil)

func (c *computeInstance) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	var info nvml.ComputeInstanceInfo
	ret := c.gi.read("ComputeInstanceGetInfo", func(_ *gpuState, gi *gi) nvml.Return {
		for _, y := range gi.CIs {
			if y.ID == c.id {
				info = nvml.ComputeInstanceInfo{Device: c.gi.d, GpuInstance: c.gi, Id: uint32(y.ID), ProfileId: uint32(y.ProfileID),
					Placement: nvml.ComputeInstancePlacement{Start: uint32(y.Start), Size: uint32(y.Size)}}
				return nvml.SUCCESS
			}
		}
		return nvml.ERROR_INVALID_ARGUMENT
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
