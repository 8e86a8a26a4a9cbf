// Package fleet keeps OpenStack Placement true for this host's GPUs and
// turns Placement allocations into claims the manager honours
// (docs/fleet.md). Placement is the fleet's shared state; the host stays
// the authority: every pass publishes what the manager's FleetView says
// and removes what it does not.
//
// The model: a root provider for the host (or an existing parent provider
// given by UUID, never modified), one child per GPU named
// <host>_pci_<domain>_<bus>_<slot>_<function> as Nova names its pGPU
// providers, with UUIDs derived from the root and the PCI address so that
// they are stable across restarts and database loss. On each GPU one class
// per carvable profile (names.go) whose total is the instances it holds
// plus the room vgpud's own placement engine has for it now (on MIG GPUs,
// by default, only the part every mix of claims can have together:
// carvable.go), and on MIG
// GPUs CUSTOM_VGPUD_MIG_SLICE (total: the slot grid) consumed by every MIG
// allocation, because Placement counts each class on its own; on every
// GPU CUSTOM_VGPUD_GPU (GPUUnits), of which a whole GPU takes all and any
// other instance one, so that Placement refuses a whole GPU beside
// anything else at claim time. The units are derived in units.go from
// the manager's host facts.
//
// Placement being slow or down never fails a local operation: claims give
// up after a short deadline (shorter still while Placement was last seen
// not answering), and the sync writes what is missing when Placement
// answers again. One write Placement refuses stalls nothing else: every
// provider and consumer is written on its own, and the refusal is named
// in Status and counted.
//
// A VM moving to another host takes its allocation along as Nova's
// migrations do (move.go): the source's allocation moves to a migration
// consumer in one request, the destination claims the instance before
// carving, and the sync writes a moving instance's allocation under its
// migration consumer, never under the instance's UUID.
//
// The daemon holds one Runner (runner.go): it makes the syncer for the
// settings in force, hands it to the manager, and on a reload replaces it,
// or keeps the running one when the new settings cannot be used.
//
// Imports: pkg/gpu, pkg/manager, pkg/placement, pkg/placementapi,
// pkg/profile, pkg/store.
package fleet
