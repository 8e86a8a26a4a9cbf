package tenant

// Entitled compute per instance, in milli-GPU (see docs/metrics.md,
// "Shares: the definitions"). Every helper rounds down, so the entitlements of instances that
// fill a GPU never add up to more than the GPU (seven 1/7 MIG slices give
// 7 × 142 = 994, not 1001), and admission against a compute quota never
// counts an instance as more than it gets.

// PassthroughComputeMilli is the entitlement of a whole GPU handed to one VM.
const PassthroughComputeMilli uint64 = 1000

// MIGComputeMilli is a MIG instance's entitlement: its GPU instance's
// compute slices over the GPU's compute-slice grid, times 1000, rounded
// down (3 of 7 slices is 428). MIG isolates compute in hardware, so this is
// what the instance gets whatever its neighbours do. Arguments out of range
// (grid not positive, slices negative or above grid) give 0: a bad catalog
// entry then entitles nothing rather than more than a GPU.
func MIGComputeMilli(giComputeSlices, gridComputeSlices int) uint64 {
	if gridComputeSlices <= 0 || giComputeSlices < 0 || giComputeSlices > gridComputeSlices {
		return 0
	}
	return uint64(giComputeSlices) * 1000 / uint64(gridComputeSlices)
}

// TimeSlicedComputeMilli is a time-sliced vGPU's entitlement under the
// FIXED_SHARE scheduler: 1000 over the vGPU type's maximum instances per
// GPU, rounded down (a type with 3 per GPU gets 333). A non-positive
// maximum gives 0.
func TimeSlicedComputeMilli(maxInstances int) uint64 {
	if maxInstances <= 0 {
		return 0
	}
	return 1000 / uint64(maxInstances)
}

// ComputeInstanceVRAMBytes is what a compute instance takes of its
// tenant's VRAM quota: its GPU instance's memory in proportion to its
// compute slices, rounded down (a 1c.3g.40gb costs a third of the
// 3g.40gb). Compute instances share their GPU instance's memory, so a GPU
// instance filled with them costs, to the byte or less, what the GPU
// instance costs whole. Arguments out of range give 0, as for
// MIGComputeMilli.
func ComputeInstanceVRAMBytes(giMemoryBytes uint64, ciSlices, giSlices int) uint64 {
	if giSlices <= 0 || ciSlices < 0 || ciSlices > giSlices {
		return 0
	}
	return giMemoryBytes * uint64(ciSlices) / uint64(giSlices)
}
