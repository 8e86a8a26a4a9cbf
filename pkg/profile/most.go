package profile

import "errors"

// MaxInstancesPerGPU is the most instances (MIG instances, compute
// instances, vGPUs) a model may let one GPU hold at once. The fleet
// publishes one unit of its GPU class per instance out of a fixed total of
// this many, which a whole GPU's flavor asks in full (docs/fleet.md, "The
// model"), so a model holding more would see Placement refuse the
// claims beyond it: the catalog refuses such a model instead.
const MaxInstancesPerGPU = 64

// ErrTooManyInstances is wrapped (with ErrInvalid) by the error of a model
// one GPU of which can hold more than MaxInstancesPerGPU instances.
var ErrTooManyInstances = errors.New("more instances per GPU than the fleet's GPU class holds")

// MostInstances is a bound on the instances one GPU of m holds at once, in
// any mode: every time-sliced or MIG-backed type's own per-GPU maximum
// (homogeneous and heterogeneous), and on a MIG GPU the compute instances
// (one per compute slice at most) plus the most GPU instances the grid
// holds each holding the most vGPUs any MIG-backed type puts in one (a
// GPU's GPU instances hold compute instances or vGPUs, so their sum bounds
// any mix).
func (m *Model) MostInstances() int {
	// Each term is capped before it is combined, so a hostile catalog
	// cannot overflow the sum.
	const ceiling = MaxInstancesPerGPU + 1
	most, perGI := 1, 1
	if m.VGPU != nil {
		for i := range m.VGPU.Types {
			t := &m.VGPU.Types[i]
			most = max(most, min(ceiling, t.MaxInstances), min(ceiling, t.MixedMax()))
			perGI = max(perGI, min(ceiling, t.MaxPerGPUInstance))
		}
	}
	if m.MIG != nil {
		gis := 0
		for _, p := range m.MIG.GPUInstanceProfiles {
			gis = max(gis, min(ceiling, p.MaxInstances))
		}
		most = max(most, min(ceiling, m.MIG.ComputeSlices)+gis*perGI)
	}
	return most
}
