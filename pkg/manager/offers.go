package manager

import (
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// ProfilePassthrough asks for a whole GPU.
const ProfilePassthrough = "passthrough"

// offer is one way to satisfy a profile name on one GPU model.
type offer struct {
	kind  store.InstanceKind
	model *profile.Model
	gi    *profile.GPUInstanceProfile // mig, mig-vgpu
	// ci is a compute instance smaller than its GPU instance ("1c.3g.40gb");
	// nil for one covering the GPU instance ("3g.40gb", "3c.3g.40gb").
	ci  *profile.ComputeInstanceProfile
	typ *profile.VGPUType // vgpu, mig-vgpu
}

// vram is what the instance takes of the tenant's VRAM quota.
func (o offer) vram() uint64 {
	switch o.kind {
	case store.KindMIG:
		if o.ci != nil {
			return tenant.ComputeInstanceVRAMBytes(o.gi.MemoryMiB<<20, o.ci.Slices, o.gi.ComputeSlices)
		}
		return o.gi.MemoryMiB << 20
	case store.KindPassthrough:
		return o.model.MemoryMiB << 20
	}
	return o.typ.FramebufferMiB << 20
}

// compute is the instance's entitled compute in milli-GPU (docs/metrics.md,
// "Shares: the definitions"): MIG slices (the compute instance's own) over the grid's
// compute slices; a time-sliced vGPU 1000 over its type's maximum (its
// FIXED_SHARE); a whole GPU 1000.
func (o offer) compute() uint64 {
	switch o.kind {
	case store.KindMIG:
		if o.ci != nil {
			return tenant.MIGComputeMilli(o.ci.Slices, o.model.MIG.ComputeSlices)
		}
		return tenant.MIGComputeMilli(o.gi.ComputeSlices, o.model.MIG.ComputeSlices)
	case store.KindMIGVGPU:
		return tenant.MIGComputeMilli(o.gi.ComputeSlices, o.model.MIG.ComputeSlices) / uint64(max(1, o.typ.MaxPerGPUInstance))
	case store.KindVGPU:
		return tenant.TimeSlicedComputeMilli(o.typ.MaxInstances)
	}
	return tenant.PassthroughComputeMilli
}

// name is the profile's canonical name on its model.
func (o offer) name() string {
	switch o.kind {
	case store.KindMIG:
		if o.ci != nil {
			return profile.ComputeInstanceName(o.ci.Slices, o.gi)
		}
		return o.gi.Name
	case store.KindPassthrough:
		return ProfilePassthrough
	}
	return o.typ.Name
}

// offersFor turns a profile name into offers. Accepted names:
//
//	3g.40gb                      a MIG profile, on every model that has it
//	1c.3g.40gb                   a compute instance of 1 slice in a 3g.40gb
//	                             GPU instance (3c.3g.40gb is 3g.40gb)
//	H100-3g.40gb                 the same, on models whose name starts with H100
//	H100-SXM5-80GB/3g.40gb       the same, on one catalog model
//	H100XM-3-40C, NVIDIA L4-4Q   a vGPU type (MIG-backed or time-sliced)
//	passthrough                  a whole GPU (MODEL/passthrough for one model)
func (m *Manager) offersFor(name string) ([]offer, error) {
	raw := strings.TrimSpace(name)
	if raw == "" {
		return nil, fail(ErrInvalidArgument, nil, "no profile given (run `vgpuctl profiles` for the list)")
	}
	if raw != name {
		// The name is recorded as given: " 3g.40gb" must not become a
		// profile of its own in records and metrics.
		return nil, fail(ErrInvalidArgument, nil, "profile %s has surrounding spaces", QuoteArg(name))
	}
	models := m.catalog().Models()
	want := raw
	if mod, rest, ok := strings.Cut(raw, "/"); ok {
		md, found := m.catalog().Model(mod)
		if !found {
			return nil, fail(ErrInvalidArgument, nil, "unknown GPU model %q in profile %q (known: %s)", mod, raw, m.modelNames())
		}
		models, want = []*profile.Model{md}, rest
	}
	var out []offer
	for _, md := range models {
		out = append(out, offersOn(md, want)...)
	}
	if len(out) == 0 {
		// "H100-3g.40gb": a model-name prefix and a MIG profile.
		if i := strings.Index(want, "-"); i > 0 {
			prefix, gi := strings.ToLower(want[:i]), want[i+1:]
			for _, md := range models {
				if strings.HasPrefix(strings.ToLower(md.Name), prefix) {
					out = append(out, migOffers(md, gi)...)
				}
			}
		}
	}
	if len(out) == 0 {
		if err := unknownComputeInstance(models, raw, want); err != nil {
			return nil, err
		}
		return nil, fail(ErrInvalidArgument, nil, "unknown profile %q: not a MIG profile, vGPU type or %q of any GPU model in the catalog (run `vgpuctl profiles`)", raw, ProfilePassthrough)
	}
	return out, nil
}

func offersOn(md *profile.Model, name string) []offer {
	if name == ProfilePassthrough {
		return []offer{{kind: store.KindPassthrough, model: md}}
	}
	out := migOffers(md, name)
	if t, ok := md.VGPUTypeByName(name); ok {
		o := offer{kind: store.KindVGPU, model: md, typ: t}
		if t.MIGBacked() {
			o.kind = store.KindMIGVGPU
			// The catalog's validation makes sure the profile exists.
			o.gi, _ = md.GPUInstanceProfileByID(*t.GPUInstanceProfile)
		}
		out = append(out, o)
	}
	return out
}

// migOffers: a GPU-instance profile ("3g.40gb") or a compute-instance
// profile ("1c.3g.40gb") of md. A compute instance covering its GPU
// instance ("3c.3g.40gb") is the GPU-instance profile itself, as
// nvidia-smi names it.
func migOffers(md *profile.Model, name string) []offer {
	if p, ok := md.GPUInstanceProfileByName(name); ok {
		return []offer{{kind: store.KindMIG, model: md, gi: p}}
	}
	if p, c, ok := md.ComputeInstanceByName(name); ok {
		o := offer{kind: store.KindMIG, model: md, gi: p}
		if c.Slices < p.ComputeSlices {
			o.ci = c
		}
		return []offer{o}
	}
	return nil
}

// unknownComputeInstance explains a compute-instance name whose GPU
// instance exists but does not offer that size ("4c.3g.40gb"): the sizes
// it offers. nil when the name is not of that kind.
func unknownComputeInstance(models []*profile.Model, raw, want string) error {
	slices, giName, ok := profile.ParseComputeInstanceName(want)
	if !ok {
		return nil
	}
	for _, md := range models {
		gi, found := md.GPUInstanceProfileByName(giName)
		if !found {
			continue
		}
		var sizes []string
		for _, c := range md.ComputeInstanceProfiles(gi.ComputeSlices) {
			sizes = append(sizes, profile.ComputeInstanceName(c.Slices, gi))
		}
		return fail(ErrInvalidArgument, nil, "unknown profile %q: a %s GPU instance has no compute instance of %d slices; it offers %s",
			raw, gi.Name, slices, strings.Join(sizes, ", "))
	}
	return nil
}

func (m *Manager) modelNames() string {
	var names []string
	for _, md := range m.catalog().Models() {
		names = append(names, md.Name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// ProfileInfo describes one profile a GPU model offers, for `vgpuctl profiles`.
type ProfileInfo struct {
	Model        string `json:"model"`
	Name         string `json:"name"`
	Kind         string `json:"kind"`
	VRAMBytes    uint64 `json:"vramBytes"`
	ComputeMilli uint64 `json:"computeMilli"`
	MaxPerGPU    int    `json:"maxPerGPU"`
	Flows        string `json:"flows,omitempty"`
	// GPUInstance is, for a compute instance narrower than its GPU
	// instance ("1c.3g.40gb"), the GPU-instance profile it is carved in
	// ("3g.40gb"), and PerGPUInstance how many of it one GPU instance
	// holds. ComputeSlices are a MIG profile's compute slices (the
	// compute instance's own for one).
	GPUInstance    string `json:"gpuInstance,omitempty"`
	PerGPUInstance int    `json:"perGPUInstance,omitempty"`
	ComputeSlices  int    `json:"computeSlices,omitempty"`
}

// Profiles lists every profile of the catalog models present on this host
// (every catalog model when the host has none).
func (m *Manager) Profiles() []ProfileInfo {
	present := map[string]bool{}
	for _, g := range m.Inventory().GPUs {
		present[g.Model] = true
	}
	var out []ProfileInfo
	for _, md := range m.catalog().Models() {
		if len(present) > 0 && !present[md.Name] {
			continue
		}
		var offers []offer
		if md.MIG != nil {
			for i := range md.MIG.GPUInstanceProfiles {
				p := &md.MIG.GPUInstanceProfiles[i]
				offers = append(offers, offer{kind: store.KindMIG, model: md, gi: p})
				for _, c := range md.ComputeInstanceProfiles(p.ComputeSlices) {
					if c.Slices < p.ComputeSlices {
						c := c
						offers = append(offers, offer{kind: store.KindMIG, model: md, gi: p, ci: &c})
					}
				}
			}
		}
		if md.VGPU != nil {
			for i := range md.VGPU.Types {
				offers = append(offers, offersOn(md, md.VGPU.Types[i].Name)...)
			}
		}
		offers = append(offers, offer{kind: store.KindPassthrough, model: md})
		for _, o := range offers {
			p := ProfileInfo{Model: md.Name, Name: o.name(), Kind: string(o.kind), VRAMBytes: o.vram(), ComputeMilli: o.compute(), MaxPerGPU: 1}
			switch {
			case o.typ != nil:
				p.MaxPerGPU = o.typ.MaxInstances
				p.Flows = strings.Join(flowsOf(md, o.typ), ",")
			case o.ci != nil:
				p.MaxPerGPU = o.gi.MaxInstances * o.ci.MaxInstances
				p.GPUInstance, p.PerGPUInstance, p.ComputeSlices = o.gi.Name, o.ci.MaxInstances, o.ci.Slices
			case o.gi != nil:
				p.MaxPerGPU = o.gi.MaxInstances
				if o.kind == store.KindMIG {
					p.ComputeSlices = o.gi.ComputeSlices
				}
			}
			out = append(out, p)
		}
	}
	return out
}

func flowsOf(md *profile.Model, t *profile.VGPUType) []string {
	if len(t.Flows) > 0 {
		return t.Flows
	}
	return md.VGPU.Flows
}
