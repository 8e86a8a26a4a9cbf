// Package placement is vgpud's allocator: given the pool of GPUs (their slot maps) and a
// request, it chooses the GPU and the start slot of a MIG GPU instance, the
// GPU instance and start of a compute instance inside one (compute.go), the
// GPU of a time-sliced vGPU, and, when a MIG request is refused for
// fragmentation, the moves of movable instances that would admit it. It is
// pure: no I/O, no NVML, no clock, no state between calls; callers pass the
// pool as it is and apply the decision themselves. The manager imports it;
// it imports only pkg/profile (to build grids from the catalog).
//
// # Legality
//
// A GPU instance of profile P fits at start s iff s is one of P's starts,
// [s, s+size) overlaps no existing instance, and the GPU holds fewer than
// P's per-GPU maximum (1 for +me profiles): the rule the driver applies to
// CreateGpuInstanceWithPlacement, which otherwise returns
// INSUFFICIENT_RESOURCES. Unavailable GPUs (lost, passed through whole, MIG
// off) are never chosen; foreign instances (not created by vgpud) occupy
// their slices and count against their profile's limit like any other.
//
// # Scoring (Place)
//
// Every legal (GPU, start) is a candidate. Candidates are compared in this
// order, the first difference deciding:
//
//  1. Tenant affinity, when the request names a tenant and asks for it:
//     Spread prefers GPUs holding fewer of the tenant's instances, Pack more.
//  2. Room lost, largest profile first. For each profile of the GPU's grid,
//     ordered by size, then compute slices, then instance limit (so 7g
//     before 4g before 3g before 2g before 1g.20gb before 1g.10gb before
//     1g.10gb+me on H100), the loss is how many fewer instances of it the GPU
//     could still take once the request sits there, each profile counted on
//     its own and within its instance limit. The vectors are compared
//     lexicographically: losing the room for one 7g outweighs any loss of
//     smaller room, losing a 4g slot outweighs any 3g loss, and so on. Only
//     the chosen GPU changes, so this is also the change in the pool-wide
//     count of creatable instances per profile: the largest profiles stay
//     creatable as long as possible.
//  3. A GPU already in use over an empty one (bin packing: empty GPUs are
//     the only home of whole-GPU profiles), then the fuller GPU (best fit, so
//     lightly used GPUs drain and become empty).
//  4. Pool order, then the lowest start.
//
// On an empty H100 this puts a 3g.40gb at start 4 (start 0 would also take
// the only 4g.40gb slot) and a first 1g.10gb at start 6: every start costs
// the 7g and one 3g slot, and start 6 alone keeps the 4g.40gb and all three
// 2g.20gb slots.
//
// The lexicographic order was chosen by measurement (bench/placement):
// a slice-weighted sum of losses, losses weighted by how scarce each
// profile's room is in the pool, and best-fit before room loss were within
// noise of it or worse, and it is the easiest to explain in Decision.Reason.
//
// # Defragmentation
//
// Defragment answers a request refused with ErrFragmented: the pool has
// enough free slices but no GPU has a legal start. It looks for the fewest
// moves of movable instances (not attached to a running VM; never foreign
// ones) that clear a slot for the request, preferring moves within a GPU,
// and returns the moves in an order in which each one is legal when it runs.
// A move is a destroy and a re-create with the same identity elsewhere.
//
// # Time-sliced vGPUs
//
// PlaceVGPU chooses a GPU for a time-sliced vGPU. A homogeneous GPU locks to
// the type of its first vGPU; a heterogeneous one mixes types within its
// framebuffer and each type's mixed maximum. It prefers a GPU already
// running the type with room (fullest first), then a heterogeneous GPU in
// use, then the empty GPU whose loss hurts the wanted types (demand hints)
// least.
//
// Imports: pkg/profile.
package placement
