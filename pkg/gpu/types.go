// Package gpu holds vgpud's domain types for physical GPUs and what is carved
// out of them (MIG GPU and compute instances, vGPUs on mediated devices or
// SR-IOV virtual functions), as discovery reports them. The backends
// (pkg/gpu/nvml, pkg/gpu/sysfs) fill them; the manager, placement, share and
// metrics packages read them. It imports nothing from vgpud.
//
// GPUs are keyed by PCI address and UUID, never by an NVML index alone: the
// index is kept for display and changes when a GPU falls off the bus.
//
// Imports: nothing from vgpud.
package gpu

// Flavour is how the host's vGPU manager creates vGPUs on a GPU.
type Flavour string

const (
	// FlavourNone: no vGPU manager (MIG only, or nothing).
	FlavourNone Flavour = "none"
	// FlavourMdev: legacy mediated devices under /sys/class/mdev_bus.
	FlavourMdev Flavour = "mdev"
	// FlavourVFIO: vendor-specific VFIO on SR-IOV virtual functions.
	FlavourVFIO Flavour = "vfio"
)

// State is a GPU's state as vgpud reports it (manager.GPUView, the D-Bus
// GPU State property, the metrics, share accounting). Discovery does not
// set it: the manager derives it from the GPU (Lost), the faults it
// recorded and the records on the GPU. The values are API: the D-Bus
// property and the JSON "state" field carry them as they are.
type State string

const (
	// StateOK: in service.
	StateOK State = "ok"
	// StateLost: the GPU fell off the bus (GPU.Lost).
	StateLost State = "lost"
	// StateFailed: out of service after a critical XID or a fault, until
	// it is reset, the host reboots or an operator clears it.
	StateFailed State = "failed"
	// StatePassthrough: given whole to a VM.
	StatePassthrough State = "passthrough"
)

// Inventory is everything discovery found on the host.
type Inventory struct {
	Driver DriverInfo `json:"driver"`
	GPUs   []GPU      `json:"gpus"`
}

// DriverInfo describes the NVIDIA driver as NVML reports it.
type DriverInfo struct {
	Version     string `json:"version"`
	NVMLVersion string `json:"nvmlVersion"`
}

// GPU is one physical GPU (a PCI physical function).
type GPU struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	PCI         string `json:"pci"`
	Product     string `json:"product"`
	Model       string `json:"model,omitempty"`
	PCIDeviceID uint16 `json:"pciDeviceID"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// KernelDriver is the driver bound to the function in sysfs ("nvidia", "vfio-pci").
	KernelDriver string `json:"kernelDriver,omitempty"`
	NUMANode     int    `json:"numaNode"`
	// Lost is set when NVML reports GPU_IS_LOST (the GPU fell off the bus).
	Lost bool `json:"lost,omitempty"`
	// Errors lists what discovery could not read on this GPU, with the cause.
	Errors []string `json:"errors,omitempty"`
	MIG    MIG      `json:"mig"`
	VGPU   VGPU     `json:"vgpu"`
}

// MIG is a GPU's MIG mode, profiles and instances.
type MIG struct {
	Capable bool `json:"capable"`
	Enabled bool `json:"enabled"`
	// Pending is the mode the GPU takes after the next reset.
	Pending bool `json:"pending"`
	// Profiles are the GPU-instance profiles NVML reports, with their legal placements.
	Profiles  []GIProfile   `json:"profiles,omitempty"`
	Instances []GPUInstance `json:"instances,omitempty"`
}

// GIProfile is one GPU-instance profile as NVML reports it.
type GIProfile struct {
	// Index is the NVML profile index constant; ID the real profile ID.
	Index int `json:"index"`
	ID    int `json:"id"`
	// Name comes from the catalog (NVML's v1 struct has none); "" if unknown.
	Name          string  `json:"name,omitempty"`
	Slices        int     `json:"slices"`
	MaxInstances  int     `json:"maxInstances"`
	MemoryMiB     uint64  `json:"memoryMiB"`
	SMs           int     `json:"sms"`
	CopyEngines   int     `json:"copyEngines"`
	Decoders      int     `json:"decoders"`
	Encoders      int     `json:"encoders"`
	JPEGs         int     `json:"jpegs"`
	OFAs          int     `json:"ofas"`
	Placements    []Range `json:"placements"`
	RemainingFree int     `json:"remaining"`
}

// Range is a placement: Size slots from Start.
type Range struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is the first slot after the range.
func (r Range) End() int { return r.Start + r.Size }

// Overlaps reports whether two ranges share a slot.
func (r Range) Overlaps(o Range) bool { return r.Start < o.End() && o.Start < r.End() }

// GPUInstance is a MIG GPU instance.
type GPUInstance struct {
	ID        int               `json:"id"`
	ProfileID int               `json:"profileID"`
	Profile   string            `json:"profile,omitempty"`
	Placement Range             `json:"placement"`
	Compute   []ComputeInstance `json:"computeInstances,omitempty"`
	// VGPUs counts the vGPUs living on this GPU instance.
	VGPUs int `json:"vgpus,omitempty"`
}

// ComputeInstance is a MIG compute instance inside a GPU instance.
type ComputeInstance struct {
	ID        int   `json:"id"`
	ProfileID int   `json:"profileID"`
	Placement Range `json:"placement"`
}

// VGPU is what a GPU offers and holds of vGPUs.
type VGPU struct {
	Flavour Flavour `json:"flavour"`
	// SRIOV: sriov_totalvfs and sriov_numvfs of the physical function.
	TotalVFs      int  `json:"totalVFs,omitempty"`
	NumVFs        int  `json:"numVFs,omitempty"`
	Heterogeneous bool `json:"heterogeneous,omitempty"`
	// Supported are all vGPU types of the GPU; Creatable the ids creatable now (NVML).
	Supported []VGPUType `json:"supported,omitempty"`
	Creatable []int      `json:"creatable,omitempty"`
	// VFs are the SR-IOV virtual functions (vendor-VFIO flavour, or mdev parents on SR-IOV GPUs).
	VFs []VF `json:"vfs,omitempty"`
	// MdevParents are the mdev_bus parents belonging to this GPU (the PF or its VFs).
	MdevParents []MdevParent `json:"mdevParents,omitempty"`
	// Mdevs are the mediated devices created on this GPU's parents.
	Mdevs []Mdev `json:"mdevs,omitempty"`
	// Active are the vGPUs NVML reports as active (a VM has them open).
	Active []ActiveVGPU `json:"active,omitempty"`
}

// VGPUType is one vGPU type as NVML reports it.
type VGPUType struct {
	ID                 int    `json:"id"`
	Name               string `json:"name"`
	Class              string `json:"class,omitempty"`
	FramebufferBytes   uint64 `json:"framebufferBytes"`
	MaxInstances       int    `json:"maxInstances"`
	GPUInstanceProfile int    `json:"gpuInstanceProfile"` // -1 for time-sliced types
}

// VF is one SR-IOV virtual function of a GPU.
type VF struct {
	PCI string `json:"pci"`
	// Type is current_vgpu_type (0: no vGPU).
	Type int `json:"type"`
	// Creatable are the type ids creatable_vgpu_types lists now.
	Creatable []int `json:"creatable,omitempty"`
	// GPUInstance and Placement are set when a vGPU exists and the driver exposes them; -1 otherwise.
	GPUInstance int `json:"gpuInstance"`
	Placement   int `json:"placement"`
	IOMMUGroup  int `json:"iommuGroup"`
}

// MdevParent is a device under /sys/class/mdev_bus with its supported types.
type MdevParent struct {
	PCI   string     `json:"pci"`
	Types []MdevType `json:"types"`
}

// MdevType is one mdev_supported_types entry.
type MdevType struct {
	// Dir is the directory name, "nvidia-<id>".
	Dir                string `json:"dir"`
	ID                 int    `json:"id"`
	Name               string `json:"name"`
	Available          int    `json:"available"`
	DeviceAPI          string `json:"deviceAPI"`
	NumHeads           int    `json:"numHeads"`
	FrameRateLimit     int    `json:"frameRateLimit"`
	FramebufferMiB     uint64 `json:"framebufferMiB"`
	MaxResolution      string `json:"maxResolution"`
	MaxInstance        int    `json:"maxInstance"`
	DescriptionUnknown string `json:"descriptionUnknown,omitempty"`
}

// Mdev is one mediated device.
type Mdev struct {
	UUID   string `json:"uuid"`
	Parent string `json:"parent"`
	Type   int    `json:"type"`
	// TypeDir is the mdev_type link's target name ("nvidia-<id>").
	TypeDir     string `json:"typeDir"`
	GPUInstance int    `json:"gpuInstance"`
	// Mdevctl is mdevctl's persistent definition of this mdev, nil when
	// mdevctl defines none (a transient mdev, vgpud's or another tool's).
	Mdevctl *MdevctlDefinition `json:"mdevctl,omitempty"`
	// MdevctlProblem says why the entry of mdevctl's config directory
	// named by this mdev's UUID was skipped (not a regular file, too
	// large, not a definition); "" when there is none or it was read.
	MdevctlProblem string `json:"mdevctlProblem,omitempty"`
}

// MdevctlDefinition is an mdev as mdevctl defines it: a JSON file
// /etc/mdevctl.d/<parent>/<uuid> ({"mdev_type", "start", "attrs"}), one
// line of `mdevctl list --defined`.
type MdevctlDefinition struct {
	UUID   string `json:"uuid"`
	Parent string `json:"parent"`
	// Type is the mdev type as mdevctl names it ("nvidia-558").
	Type string `json:"type"`
	// Start is "auto" (mdevctl creates the mdev when its parent appears,
	// so at every boot) or "manual".
	Start string `json:"start"`
	// File is the definition's path under mdevctl's config directory
	// ("0000:81:00.4/<uuid>"); empty when read from list output.
	File string `json:"file,omitempty"`
}

// ActiveVGPU is a vGPU NVML reports as active.
type ActiveVGPU struct {
	UUID        string `json:"uuid"`
	Type        int    `json:"type"`
	MdevUUID    string `json:"mdevUUID,omitempty"`
	VMID        string `json:"vmID,omitempty"`
	FbUsed      uint64 `json:"fbUsedBytes"`
	GPUInstance int    `json:"gpuInstance"`
}

// ByPCI returns the GPU with PCI address pci.
func (inv *Inventory) ByPCI(pci string) (*GPU, bool) {
	for i := range inv.GPUs {
		if inv.GPUs[i].PCI == pci {
			return &inv.GPUs[i], true
		}
	}
	return nil, false
}

// ByUUID returns the GPU with UUID uuid.
func (inv *Inventory) ByUUID(uuid string) (*GPU, bool) {
	for i := range inv.GPUs {
		if inv.GPUs[i].UUID == uuid {
			return &inv.GPUs[i], true
		}
	}
	return nil, false
}
