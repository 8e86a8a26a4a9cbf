package fleet

import (
	"strings"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// The classes and traits every host shares.
const (
	// SliceClass is the MIG slot grid of one GPU, consumed by every MIG
	// allocation with its profile's slot count.
	SliceClass = "CUSTOM_VGPUD_MIG_SLICE"
	// FramebufferClass is the framebuffer, in MiB, of a time-sliced GPU in
	// heterogeneous vGPU mode, consumed by every vGPU there with its
	// type's framebuffer. MiB, the driver's own unit, keeps the amounts
	// exact (types are not all whole GiB) and totals far below
	// Placement's 2^31 limit (an H200 is about 143,000 MiB).
	FramebufferClass = "CUSTOM_VGPUD_VGPU_FB_MIB"
	// GPUClass is the GPU itself, published on every GPU provider with
	// the same total (GPUUnits) whatever the GPU's mode: a whole GPU
	// takes all of it, every other instance one unit, so that Placement
	// itself refuses a whole GPU together with anything else on the GPU.
	GPUClass = "CUSTOM_VGPUD_GPU"
	// GPUUnits is GPUClass's total on every GPU: the most instances the
	// catalog lets any GPU hold (profile.MaxInstancesPerGPU; a catalog with
	// a model holding more is refused at start and reload), so the one unit
	// each takes never binds before the GPU's own room does.
	GPUUnits     = profile.MaxInstancesPerGPU
	TraitManaged = "CUSTOM_VGPUD_MANAGED"
	// ConsumerType is the consumer_type of the allocations vgpud writes.
	ConsumerType = "INSTANCE"
)

// namespace seeds the derived provider UUIDs (a fixed random UUID: changing
// it would orphan every published tree).
var namespace = uuid.MustParse("4f0b8f7e-2f55-4c1e-9a52-7d1b0c9e6a3d")

// norm upper-cases s and turns every run of other characters than A-Z and
// 0-9 into one underscore: Placement's custom names allow only those.
func norm(s string) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToUpper(s) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			under = false
			continue
		}
		if !under && b.Len() > 0 {
			b.WriteByte('_')
			under = true
		}
	}
	return strings.TrimRight(b.String(), "_")
}

// ClassName is the resource class of a profile: CUSTOM_VGPUD_MIG_ and the
// MIG profile (1g.10gb → CUSTOM_VGPUD_MIG_1G_10GB), or CUSTOM_VGPUD_ and the
// vGPU type without its "NVIDIA " prefix (NVIDIA L4-4Q → CUSTOM_VGPUD_L4_4Q).
//
// A MIG profile's "-me" (without media engines, as in Blackwell's
// 1g.24gb-me) becomes _NO_ME, so that it stays apart from "+me" (with
// them: 1g.24gb+me → CUSTOM_VGPUD_MIG_1G_24GB_ME): Placement must count the
// two profiles apart.
func ClassName(kind store.InstanceKind, profile string) string {
	if kind == store.KindMIG {
		return "CUSTOM_VGPUD_MIG_" + norm(strings.ReplaceAll(profile, "-", ".no."))
	}
	return "CUSTOM_VGPUD_" + norm(strings.TrimPrefix(profile, "NVIDIA "))
}

// RootUUID is the host's root provider UUID when none is configured.
func RootUUID(host string) string {
	return uuid.NewSHA1(namespace, []byte("host:"+host)).String()
}

// GPUProviderUUID is the UUID of a GPU's provider under top.
func GPUProviderUUID(top, pci string) string {
	return uuid.NewSHA1(namespace, []byte(top+"/gpu:"+strings.ToLower(pci))).String()
}

// GPUProviderName is the name Nova gives a pGPU provider:
// <host>_pci_0000_41_00_0.
func GPUProviderName(host, pci string) string {
	r := strings.NewReplacer(":", "_", ".", "_")
	return host + "_pci_" + r.Replace(strings.ToLower(pci))
}

// madeHere reports whether p is a GPU provider vgpud made under top: its
// UUID is the one GPUProviderUUID derives from top and the PCI address its
// name carries. Such a provider is vgpud's with or without TraitManaged: a
// pass cut between creating it and writing its traits (a reload, a stop, a
// crash) leaves it without them.
func madeHere(top string, p placementapi.Provider) bool {
	i := strings.LastIndex(p.Name, "_pci_")
	if i < 0 {
		return false
	}
	f := strings.Split(p.Name[i+len("_pci_"):], "_")
	if len(f) != 4 {
		return false
	}
	return p.UUID == GPUProviderUUID(top, f[0]+":"+f[1]+":"+f[2]+"."+f[3])
}

// traitsOf are a GPU provider's traits.
func traitsOf(g gpuUnits) []string {
	t := []string{TraitManaged, "CUSTOM_VGPUD_MODEL_" + norm(g.Model)}
	switch {
	case g.MIG:
		t = append(t, "CUSTOM_VGPUD_FLOW_MIG")
	case g.Flavour == gpu.FlavourVFIO:
		t = append(t, "CUSTOM_VGPUD_FLOW_VFIO")
	case g.Flavour == gpu.FlavourMdev:
		t = append(t, "CUSTOM_VGPUD_FLOW_MDEV")
	}
	if g.Heterogeneous {
		t = append(t, "CUSTOM_VGPUD_HETEROGENEOUS")
	}
	return t
}
