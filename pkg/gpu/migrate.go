package gpu

import "strings"

// A vGPU moves between hosts with its VM when NVML says the destination GPU
// can take it: the source's vGPU metadata (nvmlVgpuInstanceGetMetadata,
// read while the VM runs) and the destination GPU's (nvmlDeviceGetVgpuMetadata)
// go to nvmlGetVgpuCompatibility, which answers in which VM states the vGPU
// may move there and, when in none, what limits it. The metadata are the
// driver's: vgpud carries them as opaque bytes (VGPUMetadata, PGPUMetadata)
// from one host to the other and never reads them.

// VGPUMetadata is a running vGPU's nvmlVgpuMetadata_t as nvml.h lays it
// out (the fixed fields, then opaqueDataSize bytes of the driver's data).
type VGPUMetadata []byte

// PGPUMetadata is a GPU's nvmlVgpuPgpuMetadata_t, laid out the same way.
type PGPUMetadata []byte

// VMCompatibility is nvmlVgpuVmCompatibility_t: the VM states in which a
// vGPU may move to a GPU, a bit mask.
type VMCompatibility uint32

// nvml.h's NVML_VGPU_VM_COMPATIBILITY_* values.
const (
	CompatNone      VMCompatibility = 0
	CompatCold      VMCompatibility = 1 // the VM powered off
	CompatHibernate VMCompatibility = 2 // the VM hibernated
	CompatSleep     VMCompatibility = 4 // the VM asleep
	CompatLive      VMCompatibility = 8 // the VM running: live migration
)

// String names the states, "none" for none.
func (c VMCompatibility) String() string {
	if c == CompatNone {
		return "none"
	}
	var out []string
	for _, s := range []struct {
		bit  VMCompatibility
		name string
	}{{CompatCold, "cold"}, {CompatHibernate, "hibernate"}, {CompatSleep, "sleep"}, {CompatLive, "live"}} {
		if c&s.bit != 0 {
			out = append(out, s.name)
		}
	}
	return strings.Join(out, ",")
}

// CompatLimit is nvmlVgpuPgpuCompatibilityLimitCode_t: what keeps a vGPU
// from moving to a GPU, a bit mask.
type CompatLimit uint32

// nvml.h's NVML_VGPU_COMPATIBILITY_LIMIT_* values.
const (
	LimitNone        CompatLimit = 0
	LimitHostDriver  CompatLimit = 1
	LimitGuestDriver CompatLimit = 2
	LimitGPU         CompatLimit = 4
	LimitOther       CompatLimit = 0x80000000
)

// String names the limits, "none" for none.
func (l CompatLimit) String() string {
	if l == LimitNone {
		return "none"
	}
	var out []string
	for _, s := range []struct {
		bit  CompatLimit
		name string
	}{{LimitHostDriver, "host driver"}, {LimitGuestDriver, "guest driver"}, {LimitGPU, "GPU"}, {LimitOther, "other"}} {
		if l&s.bit != 0 {
			out = append(out, s.name)
		}
	}
	return strings.Join(out, ",")
}

// Compatibility is nvmlVgpuPgpuCompatibility_t.
type Compatibility struct {
	VM    VMCompatibility `json:"vm"`
	Limit CompatLimit     `json:"limit"`
}

// VGPURef finds a running vGPU among a GPU's active ones: by its mdev UUID
// on mdev hosts; on vendor-VFIO hosts, whose vGPUs have no mdev, by the VM
// that has it open and its type (and GPU instance for a MIG-backed one).
type VGPURef struct {
	MdevUUID    string
	VMID        string
	Type        int
	GPUInstance int // -1: any
}
