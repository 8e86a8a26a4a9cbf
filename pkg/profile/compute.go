package profile

import (
	"regexp"
	"strconv"
	"strings"
)

// ciNameRE is a compute-instance profile name as nvidia-smi and mig-parted
// write it: "<c>c." and the GPU-instance profile's name ("1c.3g.40gb",
// "1c.1g.10gb+me").
var ciNameRE = regexp.MustCompile(`^([0-9]+)c\.([0-9]+g\.[0-9]+gb(\+me|\+me\.all|-me|\+gfx)?)$`)

// ParseComputeInstanceName splits a compute-instance profile name
// "<c>c.<GI profile>" into its compute-slice count and GPU-instance
// profile name. ok is false for any other form (a plain "3g.40gb" among
// them: that names the compute instance covering the whole GPU instance,
// which is the GPU-instance profile's own name).
func ParseComputeInstanceName(name string) (slices int, gi string, ok bool) {
	m := ciNameRE.FindStringSubmatch(name)
	if m == nil {
		return 0, "", false
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n <= 0 {
		return 0, "", false
	}
	return n, m[2], true
}

// ComputeInstanceName is the name nvidia-smi gives a compute instance of
// slices compute slices inside a GPU instance of profile gi: the GPU
// instance's own name for the one that covers it whole ("3g.40gb"),
// "<c>c.<gi>" for the others ("1c.3g.40gb").
func ComputeInstanceName(slices int, gi *GPUInstanceProfile) string {
	if slices == gi.ComputeSlices {
		return gi.Name
	}
	return strconv.Itoa(slices) + "c." + gi.Name
}

// ComputeInstanceProfileBySlices returns the compute-instance profile of
// slices compute slices in a GPU instance of profile gi.
func (m *Model) ComputeInstanceProfileBySlices(gi *GPUInstanceProfile, slices int) (*ComputeInstanceProfile, bool) {
	if m.MIG == nil || gi == nil {
		return nil, false
	}
	for i := range m.MIG.ComputeInstanceProfiles {
		s := &m.MIG.ComputeInstanceProfiles[i]
		if s.GISlices != gi.ComputeSlices {
			continue
		}
		for j := range s.Profiles {
			if s.Profiles[j].Slices == slices {
				return &s.Profiles[j], true
			}
		}
	}
	return nil, false
}

// ComputeInstanceByName resolves a compute-instance profile name
// ("1c.3g.40gb") on the model: the GPU-instance profile and the
// compute-instance profile inside it. A leading "MIG " is ignored.
func (m *Model) ComputeInstanceByName(name string) (*GPUInstanceProfile, *ComputeInstanceProfile, bool) {
	slices, giName, ok := ParseComputeInstanceName(strings.TrimPrefix(name, "MIG "))
	if !ok {
		return nil, nil, false
	}
	gi, ok := m.GPUInstanceProfileByName(giName)
	if !ok {
		return nil, nil, false
	}
	ci, ok := m.ComputeInstanceProfileBySlices(gi, slices)
	if !ok {
		return nil, nil, false
	}
	return gi, ci, true
}

// ComputeInstanceStarts are the legal starts, in compute slices, of a
// compute instance of size slices inside a GPU instance of giSlices
// compute slices: aligned to its own size, as the driver's
// GetComputeInstancePossiblePlacements lists them (a 2-slice instance in a
// 4-slice GPU instance at 0 and 2). The simulator creates compute
// instances by this rule and the allocator places them by it.
func ComputeInstanceStarts(giSlices, size int) []int {
	if size <= 0 {
		return nil
	}
	var out []int
	for s := 0; s+size <= giSlices; s += size {
		out = append(out, s)
	}
	return out
}
