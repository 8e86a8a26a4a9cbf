// Package profile owns the GPU catalog: per GPU model, its PCI identity,
// memory, MIG slot grid with every GPU- and compute-instance profile, and the
// vGPU types the host driver offers. The catalog is YAML (schema version
// "v1"), embedded from profiles/ and overridable from a directory.
//
// The simulator and the real backends' planning read the same catalog, so a
// simulated H100 has the real H100's table. It imports nothing from vgpud.
//
// Imports: nothing from vgpud.
package profile

// SchemaVersion is the only catalog schema this build reads.
const SchemaVersion = "v1"

// Creation flows for vGPUs (see the host-interfaces reference, sections 1 and 2).
const (
	// FlowMdev is the legacy mediated-device flow: write a UUID into
	// mdev_supported_types/<type>/create.
	FlowMdev = "mdev"
	// FlowVFIO is the vendor-specific VFIO flow: write a type id into an
	// SR-IOV VF's nvidia/current_vgpu_type.
	FlowVFIO = "vfio"
)

// vGPU series (licence editions).
const (
	SeriesQ = "Q" // RTX vWS
	SeriesB = "B" // vPC
	SeriesA = "A" // vApps
	SeriesC = "C" // vCS / AI Enterprise compute
)

// Model is one GPU model's catalog entry: one YAML file.
type Model struct {
	// Version is the schema version; it must be SchemaVersion.
	Version string `json:"version"`
	// Name is the catalog key, e.g. "H100-SXM5-80GB".
	Name string `json:"name"`
	// Product is the name NVML's Device.GetName reports, e.g. "NVIDIA H100 80GB HBM3".
	Product string `json:"product"`
	// Architecture, lower case: turing, ampere, ada, hopper, blackwell.
	Architecture string `json:"architecture"`
	// PCIDeviceIDs are the PCI device ids ("0x2330") that identify the model.
	PCIDeviceIDs []string `json:"pciDeviceIDs"`
	// MemoryMiB is the nominal framebuffer (80 GiB = 81920); vGPU type sizes add up to it.
	MemoryMiB uint64 `json:"memoryMiB"`
	// UsableMemoryMiB is what NVML's GetMemoryInfo reports as total.
	UsableMemoryMiB uint64 `json:"usableMemoryMiB"`
	// SMs is the number of streaming multiprocessors.
	SMs int `json:"sms"`
	// MIG is nil for GPUs without MIG.
	MIG *MIG `json:"mig,omitempty"`
	// VGPU is nil for GPUs the vGPU manager does not support.
	VGPU *VGPU `json:"vgpu,omitempty"`
	// Unconfirmed names the fields of this entry whose values are inferred,
	// not confirmed by a primary source.
	Unconfirmed []string `json:"unconfirmed,omitempty"`
	// Notes is free text for operators.
	Notes string `json:"notes,omitempty"`

	// source is the file the model was read from, for error messages.
	source string
}

// Source returns the file the model was loaded from.
func (m *Model) Source() string { return m.source }

// MIG is a model's MIG slot grid and profiles.
type MIG struct {
	// MemorySlices is the number of placement units (8 on A100/H100/H200/B200,
	// 4 on A30, 12 on RTX PRO 6000 Blackwell).
	MemorySlices int `json:"memorySlices"`
	// ComputeSlices is the number of compute slices (7 on A100/H100).
	ComputeSlices int `json:"computeSlices"`
	// GPUInstanceProfiles lists every GPU-instance profile.
	GPUInstanceProfiles []GPUInstanceProfile `json:"gpuInstanceProfiles"`
	// ComputeInstanceProfiles lists, per GPU-instance compute-slice count, the
	// compute-instance profiles that fit in such a GPU instance.
	ComputeInstanceProfiles []ComputeInstanceSet `json:"computeInstanceProfiles"`
	Unconfirmed             []string             `json:"unconfirmed,omitempty"`
}

// GPUInstanceProfile is one MIG GPU-instance profile.
type GPUInstanceProfile struct {
	// ID is the real profile ID that nvidia-smi prints and the driver takes (19, 14, 9, ...).
	ID int `json:"id"`
	// Index is the NVML profile index constant (GPU_INSTANCE_PROFILE_*), 0..17.
	Index int `json:"index"`
	// Name without the "MIG " prefix, e.g. "3g.40gb".
	Name string `json:"name"`
	// ComputeSlices is the number of compute slices (the "3" of 3g).
	ComputeSlices int `json:"computeSlices"`
	// Size is the number of memory slices (placement units) an instance occupies.
	Size int `json:"size"`
	// Placements are the legal start slots.
	Placements []int `json:"placements"`
	// MaxInstances on an empty GPU.
	MaxInstances int    `json:"maxInstances"`
	MemoryMiB    uint64 `json:"memoryMiB"`
	SMs          int    `json:"sms"`
	CopyEngines  int    `json:"copyEngines"`
	Decoders     int    `json:"decoders"`
	Encoders     int    `json:"encoders"`
	JPEGs        int    `json:"jpegs"`
	OFAs         int    `json:"ofas"`
	// Media marks a "+me" style profile limited by the single set of media engines.
	Media bool `json:"media,omitempty"`
	// Graphics marks a "+gfx" profile that can host graphics (Q/B/A) vGPUs.
	Graphics    bool     `json:"graphics,omitempty"`
	Unconfirmed []string `json:"unconfirmed,omitempty"`
}

// ComputeInstanceSet is the list of compute-instance profiles available in a
// GPU instance with GISlices compute slices.
type ComputeInstanceSet struct {
	GISlices int                      `json:"giSlices"`
	Profiles []ComputeInstanceProfile `json:"profiles"`
}

// ComputeInstanceProfile is one compute-instance profile inside a GPU instance.
type ComputeInstanceProfile struct {
	// ID is both the NVML index constant and the real ID (they are equal for CIs).
	ID int `json:"id"`
	// Slices is the number of compute slices the CI uses.
	Slices int `json:"slices"`
	// MaxInstances inside one GPU instance.
	MaxInstances int      `json:"maxInstances"`
	Unconfirmed  []string `json:"unconfirmed,omitempty"`
}

// VGPU describes the vGPU manager's support for a model.
type VGPU struct {
	// Flows are the creation flows the host driver offers on this model.
	Flows []string `json:"flows"`
	// SRIOVVFs is sriov_totalvfs of the physical function; 0 for non-SR-IOV GPUs.
	SRIOVVFs int `json:"sriovVFs"`
	// TypePrefix is the vGPU type name prefix, e.g. "H100XM" in "NVIDIA H100XM-3-40C".
	TypePrefix string `json:"typePrefix"`
	// Heterogeneous says the GPU supports mixed-size time-sliced vGPUs.
	Heterogeneous bool `json:"heterogeneous,omitempty"`
	// Types lists every vGPU type.
	Types       []VGPUType `json:"types"`
	Unconfirmed []string   `json:"unconfirmed,omitempty"`
}

// VGPUType is one vGPU type.
type VGPUType struct {
	// ID is the numeric type id (nvidia-<ID>, current_vgpu_type, NVML VgpuTypeId).
	// Ids are driver-branch specific: real hosts resolve types by name.
	ID int `json:"id"`
	// Name without the "NVIDIA " prefix, e.g. "H100XM-3-40C".
	Name string `json:"name"`
	// Series is Q, B, A or C.
	Series         string `json:"series"`
	FramebufferMiB uint64 `json:"framebufferMiB"`
	// MaxInstances per GPU in homogeneous mode (for MIG-backed types: over all GIs).
	MaxInstances int `json:"maxInstances"`
	// MaxInstancesMixed per GPU in heterogeneous mode; 0 means "same as MaxInstances".
	MaxInstancesMixed int `json:"maxInstancesMixed,omitempty"`
	// GPUInstanceProfile is the real GI profile ID a MIG-backed type needs;
	// nil for time-sliced types.
	GPUInstanceProfile *int `json:"gpuInstanceProfile,omitempty"`
	// MaxPerGPUInstance is how many of this type one GI hosts (MIG-backed only).
	MaxPerGPUInstance int `json:"maxPerGPUInstance,omitempty"`
	// Flows overrides the model's flows for this type; empty means the model's.
	Flows []string `json:"flows,omitempty"`
	// Display: heads, frame-rate limit and max resolution ("WxH"); zero values
	// take the series defaults (see DisplayDefaults).
	NumHeads      int      `json:"numHeads,omitempty"`
	FrameRate     int      `json:"frameRateLimit,omitempty"`
	MaxResolution string   `json:"maxResolution,omitempty"`
	Unconfirmed   []string `json:"unconfirmed,omitempty"`
}

// MIGBacked reports whether the type lives inside a MIG GPU instance.
func (t *VGPUType) MIGBacked() bool { return t.GPUInstanceProfile != nil }

// MixedMax returns the per-GPU maximum in heterogeneous mode.
func (t *VGPUType) MixedMax() int {
	if t.MaxInstancesMixed > 0 {
		return t.MaxInstancesMixed
	}
	return t.MaxInstances
}

// Display returns heads, frame-rate limit and max resolution, with series defaults.
func (t *VGPUType) Display() (heads, frl int, res string) {
	heads, frl, res = DisplayDefaults(t.Series)
	if t.NumHeads > 0 {
		heads = t.NumHeads
	}
	if t.FrameRate > 0 {
		frl = t.FrameRate
	}
	if t.MaxResolution != "" {
		res = t.MaxResolution
	}
	return heads, frl, res
}

// DisplayDefaults are the per-series values the driver reports in an mdev
// type's description (reference 1.2, 4.1).
func DisplayDefaults(series string) (heads, frl int, res string) {
	switch series {
	case SeriesQ:
		return 4, 60, "7680x4320"
	case SeriesB:
		return 4, 45, "5120x2880"
	case SeriesA:
		return 1, 60, "1280x1024"
	default:
		return 1, 60, "4096x2160"
	}
}

// HasFlow reports whether the type can be created with flow f on model m.
func (m *Model) HasFlow(t *VGPUType, f string) bool {
	flows := t.Flows
	if len(flows) == 0 && m.VGPU != nil {
		flows = m.VGPU.Flows
	}
	for _, x := range flows {
		if x == f {
			return true
		}
	}
	return false
}

// GPUInstanceProfileByID returns the GI profile with real ID id.
func (m *Model) GPUInstanceProfileByID(id int) (*GPUInstanceProfile, bool) {
	if m.MIG == nil {
		return nil, false
	}
	for i := range m.MIG.GPUInstanceProfiles {
		if m.MIG.GPUInstanceProfiles[i].ID == id {
			return &m.MIG.GPUInstanceProfiles[i], true
		}
	}
	return nil, false
}

// GPUInstanceProfileByName returns the GI profile named name ("3g.40gb"; a
// leading "MIG " is ignored).
func (m *Model) GPUInstanceProfileByName(name string) (*GPUInstanceProfile, bool) {
	if m.MIG == nil {
		return nil, false
	}
	name = trimPrefix(name, "MIG ")
	for i := range m.MIG.GPUInstanceProfiles {
		if m.MIG.GPUInstanceProfiles[i].Name == name {
			return &m.MIG.GPUInstanceProfiles[i], true
		}
	}
	return nil, false
}

// GPUInstanceProfileByIndex returns the GI profile with NVML index constant idx.
func (m *Model) GPUInstanceProfileByIndex(idx int) (*GPUInstanceProfile, bool) {
	if m.MIG == nil {
		return nil, false
	}
	for i := range m.MIG.GPUInstanceProfiles {
		if m.MIG.GPUInstanceProfiles[i].Index == idx {
			return &m.MIG.GPUInstanceProfiles[i], true
		}
	}
	return nil, false
}

// ComputeInstanceProfiles returns the CI profiles of a GI with giSlices compute slices.
func (m *Model) ComputeInstanceProfiles(giSlices int) []ComputeInstanceProfile {
	if m.MIG == nil {
		return nil
	}
	for _, s := range m.MIG.ComputeInstanceProfiles {
		if s.GISlices == giSlices {
			return s.Profiles
		}
	}
	return nil
}

// VGPUTypeByID returns the vGPU type with numeric id.
func (m *Model) VGPUTypeByID(id int) (*VGPUType, bool) {
	if m.VGPU == nil {
		return nil, false
	}
	for i := range m.VGPU.Types {
		if m.VGPU.Types[i].ID == id {
			return &m.VGPU.Types[i], true
		}
	}
	return nil, false
}

// VGPUTypeByName returns the vGPU type named name; the "NVIDIA " or "GRID "
// prefix the driver prints is ignored.
func (m *Model) VGPUTypeByName(name string) (*VGPUType, bool) {
	if m.VGPU == nil {
		return nil, false
	}
	name = TypeName(name)
	for i := range m.VGPU.Types {
		if m.VGPU.Types[i].Name == name {
			return &m.VGPU.Types[i], true
		}
	}
	return nil, false
}

// TypeName is a vGPU type's name without the "NVIDIA " or "GRID " prefix
// the driver prints ("NVIDIA L4-4Q" → "L4-4Q"), as the catalog names it.
func TypeName(name string) string {
	return trimPrefix(trimPrefix(name, "NVIDIA "), "GRID ")
}

func trimPrefix(s, p string) string {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// GPUInstanceScheduler reports whether the GPU time-slices the vGPUs of
// one GPU instance with a scheduler of that GPU instance (NVML's
// nvmlGpuInstance*VgpuScheduler*_v2, "for Blackwell GB20x or newer"):
// Blackwell GPUs with graphics GPU-instance profiles, whose vGPU types
// share a GPU instance. Other GPUs have only the device-level scheduler.
func (m *Model) GPUInstanceScheduler() bool {
	return m.Architecture == "blackwell" && m.hasGraphicsProfiles()
}
