package sim

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// vGPU migration's three NVML calls (nvml.h: nvmlVgpuInstanceGetMetadata,
// nvmlDeviceGetVgpuMetadata, nvmlGetVgpuCompatibility) with the rules of
// NVIDIA's vGPU user guide ("Migrating a VM Configured with vGPU"): the
// same physical GPU type, the same MIG configuration for a MIG-backed
// vGPU, the same ECC setting, compatible host and guest drivers. The
// driver's opaque data are, here, the JSON below; only this simulator
// reads them, as only the driver reads its own.

// vmOpaque is a vGPU's opaque metadata.
type vmOpaque struct {
	Sim    string `json:"sim"` // "vgpu": tells a vGPU blob from a GPU's
	Model  string `json:"model"`
	Branch string `json:"branch"`
	ECC    bool   `json:"ecc"`
	Type   int    `json:"type"`
	// GIProfile is the GPU-instance profile of a MIG-backed vGPU, -1
	// otherwise.
	GIProfile int `json:"giProfile"`
}

// pgpuOpaque is a GPU's opaque metadata.
type pgpuOpaque struct {
	Sim    string `json:"sim"` // "pgpu"
	Model  string `json:"model"`
	Branch string `json:"branch"`
	ECC    bool   `json:"ecc"`
	MIG    bool   `json:"mig"`
	Live   bool   `json:"live"`
}

// branch is a driver version's branch ("580" of "580.65.05").
func branch(version string) string {
	b, _, _ := strings.Cut(version, ".")
	return b
}

// vgpuVersion is the vGPU software version number of a branch (the
// guest-driver range a host supports is its own branch's here).
func vgpuVersion(version string) uint32 {
	n, _ := strconv.Atoi(branch(version))
	return uint32(n)
}

func cstr(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

func (st *state) gpuSpec(g *gpuState) GPUSpec {
	if i := slices.Index(st.GPUs, g); i >= 0 && i < len(st.Spec.GPUs) {
		return st.Spec.GPUs[i]
	}
	return GPUSpec{}
}

// GetMetadata: NOT_FOUND unless a VM has the vGPU open (reference: NVML
// knows a vGPU instance only while it is active).
func (v *vgpuInstance) GetMetadata() (nvml.VgpuMetadata, nvml.Return) {
	var m nvml.VgpuMetadata
	if !v.l.initialized() {
		return m, nvml.ERROR_UNINITIALIZED
	}
	if v.handle == 0 {
		return m, nvml.ERROR_INVALID_ARGUMENT
	}
	ret := v.l.h.call("VgpuInstanceGetMetadata", -1, false, func(st *state, _ *gpuState) (bool, nvml.Return) {
		for _, g := range st.GPUs {
			for _, x := range g.vgpus() {
				if x.Handle != v.handle || x.VM == "" {
					continue
				}
				if g.Lost {
					return false, nvml.ERROR_GPU_IS_LOST
				}
				o := vmOpaque{Sim: "vgpu", Model: g.Model, Branch: branch(st.Spec.Driver.Version), ECC: !st.gpuSpec(g).ECCOff, Type: x.Type, GIProfile: -1}
				if t := g.typeOf(x); t != nil && t.GPUInstanceProfile != nil {
					o.GIProfile = *t.GPUInstanceProfile
				}
				m.Version, m.Revision = 1, 1
				cstr(m.HostDriverVersion[:], st.Spec.Driver.Version)
				cstr(m.GuestDriverVersion[:], st.Spec.Driver.Version)
				m.GuestVgpuVersion = vgpuVersion(st.Spec.Driver.Version)
				// A struct of strings, ints and bools always marshals.
				m.OpaqueData, _ = json.Marshal(o)
				m.OpaqueDataSize = uint32(len(m.OpaqueData))
				return false, nvml.SUCCESS
			}
		}
		return false, nvml.ERROR_NOT_FOUND
	})
	return m, ret
}

func (l *lib) VgpuInstanceGetMetadata(v nvml.VgpuInstance) (nvml.VgpuMetadata, nvml.Return) {
	if v == nil {
		return nvml.VgpuMetadata{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return v.GetMetadata()
}

// GetVgpuMetadata: NOT_SUPPORTED on a GPU that hosts no vGPU ("vGPU is not
// supported by the system", nvml.h).
func (d *device) GetVgpuMetadata() (nvml.VgpuPgpuMetadata, nvml.Return) {
	var m nvml.VgpuPgpuMetadata
	ret := d.read("DeviceGetVgpuMetadata", func(st *state, g *gpuState) nvml.Return {
		if r := vgpuHost(g); r != nvml.SUCCESS {
			return r
		}
		spec := st.gpuSpec(g)
		o := pgpuOpaque{Sim: "pgpu", Model: g.Model, Branch: branch(st.Spec.Driver.Version), ECC: !spec.ECCOff, MIG: g.MIGCurrent, Live: !spec.NoLiveMigration}
		m.Version, m.Revision = 1, 1
		cstr(m.HostDriverVersion[:], st.Spec.Driver.Version)
		n := vgpuVersion(st.Spec.Driver.Version)
		m.HostSupportedVgpuRange = nvml.VgpuVersion{MinVersion: n, MaxVersion: n}
		m.OpaqueData, _ = json.Marshal(o)
		m.OpaqueDataSize = uint32(len(m.OpaqueData))
		return nvml.SUCCESS
	})
	return m, ret
}

func (l *lib) DeviceGetVgpuMetadata(d nvml.Device) (nvml.VgpuPgpuMetadata, nvml.Return) {
	if d == nil {
		return nvml.VgpuPgpuMetadata{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return d.GetVgpuMetadata()
}

// vgpuHost: NOT_SUPPORTED where the GPU hosts no vGPU.
func vgpuHost(g *gpuState) nvml.Return {
	if g.model.VGPU == nil || g.Flavour == string(gpu.FlavourNone) {
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

// GetVgpuCompatibility: INVALID_ARGUMENT for a missing argument (nvml.h)
// and for metadata that are not the driver's; otherwise the VM states in
// which the vGPU may move to the GPU, or none with what limits it.
func (l *lib) GetVgpuCompatibility(vm *nvml.VgpuMetadata, pg *nvml.VgpuPgpuMetadata) (nvml.VgpuPgpuCompatibility, nvml.Return) {
	var c nvml.VgpuPgpuCompatibility
	if !l.initialized() {
		return c, nvml.ERROR_UNINITIALIZED
	}
	if vm == nil || pg == nil {
		return c, nvml.ERROR_INVALID_ARGUMENT
	}
	var vo vmOpaque
	var po pgpuOpaque
	if json.Unmarshal(vm.OpaqueData, &vo) != nil || vo.Sim != "vgpu" || json.Unmarshal(pg.OpaqueData, &po) != nil || po.Sim != "pgpu" {
		return c, nvml.ERROR_INVALID_ARGUMENT
	}
	ret := l.h.call("GetVgpuCompatibility", -1, false, func(*state, *gpuState) (bool, nvml.Return) { return false, nvml.SUCCESS })
	if ret != nvml.SUCCESS {
		return c, ret
	}
	var limit uint32
	if vo.Model != po.Model || vo.ECC != po.ECC || (vo.GIProfile >= 0) != po.MIG {
		limit |= uint32(nvml.VGPU_COMPATIBILITY_LIMIT_GPU)
	}
	if vo.Branch != po.Branch {
		limit |= uint32(nvml.VGPU_COMPATIBILITY_LIMIT_HOST_DRIVER)
	}
	if r := pg.HostSupportedVgpuRange; vm.GuestVgpuVersion < r.MinVersion || vm.GuestVgpuVersion > r.MaxVersion {
		limit |= uint32(nvml.VGPU_COMPATIBILITY_LIMIT_GUEST_DRIVER)
	}
	if limit != 0 {
		c.CompatibilityLimitCode = limit
		return c, nvml.SUCCESS
	}
	c.VgpuVmCompatibility = uint32(nvml.VGPU_VM_COMPATIBILITY_COLD | nvml.VGPU_VM_COMPATIBILITY_HIBERNATE | nvml.VGPU_VM_COMPATIBILITY_SLEEP)
	if po.Live {
		c.VgpuVmCompatibility |= uint32(nvml.VGPU_VM_COMPATIBILITY_LIVE)
	} else {
		c.CompatibilityLimitCode = 0x80000000 // NVML_VGPU_COMPATIBILITY_LIMIT_OTHER (go-nvml declares it int32)
	}
	return c, nvml.SUCCESS
}
