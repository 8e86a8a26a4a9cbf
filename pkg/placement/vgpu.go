package placement

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/profile"
)

// VGPUTypeCap is what one time-sliced vGPU type takes on its GPU model.
type VGPUTypeCap struct {
	// Max instances per GPU in homogeneous mode.
	Max int
	// MaxMixed per GPU in heterogeneous mode; 0 means Max.
	MaxMixed       int
	FramebufferMiB uint64
}

func (c VGPUTypeCap) mixedMax() int {
	if c.MaxMixed > 0 {
		return c.MaxMixed
	}
	return c.Max
}

// VGPUHost is one GPU in time-sliced vGPU mode.
type VGPUHost struct {
	// ID is the GPU UUID.
	ID    string
	Model string
	// Types are the time-sliced types the GPU offers, by name.
	Types map[string]VGPUTypeCap
	// Current is the number of vGPUs the GPU holds, per type.
	Current map[string]int
	// Tenants is the number of vGPUs on the GPU per tenant, for affinity.
	Tenants map[string]int
	// Heterogeneous: mixed-size mode is on, so types of different sizes share
	// the GPU within its framebuffer and each type's mixed maximum. Otherwise
	// the first vGPU locks the GPU to its type.
	Heterogeneous bool
	MemoryMiB     uint64
	// Unavailable: lost, passed through whole, or in MIG mode.
	Unavailable bool
}

// VGPURequest asks for one time-sliced vGPU.
type VGPURequest struct {
	// Type is the vGPU type name, e.g. "H100XM-20C".
	Type string
	// GPU, when set, is the only GPU (UUID) considered.
	GPU string
	// Models, when set, restricts the choice to these catalog models.
	Models   []string
	Tenant   string
	Affinity Affinity
	// Wanted are demand hints: how many more vGPUs of each type are still
	// expected (excluding this request). Empty GPUs are chosen so that these
	// stay creatable.
	Wanted map[string]int
}

// VGPUDecision is the GPU chosen for a vGPU.
type VGPUDecision struct {
	GPU string
	// Reason says in one line why this GPU won.
	Reason string
}

// VGPUTypes returns the time-sliced vGPU types of a catalog model, the
// Types of a VGPUHost of that model. MIG-backed types are left out: they
// live in GPU instances, which Place chooses.
func VGPUTypes(m *profile.Model) map[string]VGPUTypeCap {
	if m == nil || m.VGPU == nil {
		return nil
	}
	out := map[string]VGPUTypeCap{}
	for i := range m.VGPU.Types {
		t := &m.VGPU.Types[i]
		if t.MIGBacked() {
			continue
		}
		out[t.Name] = VGPUTypeCap{Max: t.MaxInstances, MaxMixed: t.MaxInstancesMixed, FramebufferMiB: t.FramebufferMiB}
	}
	return out
}

// vgpuRoom is how many more vGPUs of type t the host can take now.
func vgpuRoom(h *VGPUHost, t string) int {
	c, ok := h.Types[t]
	if !ok || h.Unavailable {
		return 0
	}
	total := 0
	var fbUsed uint64
	for name, n := range h.Current {
		total += n
		fbUsed += uint64(n) * h.Types[name].FramebufferMiB
	}
	if !h.Heterogeneous {
		switch {
		case total == 0:
			return c.Max
		case h.Current[t] == total:
			return max(0, c.Max-total)
		default:
			return 0
		}
	}
	left := c.mixedMax() - h.Current[t]
	if h.MemoryMiB > 0 && c.FramebufferMiB > 0 {
		byFB := 0
		if fbUsed < h.MemoryMiB {
			byFB = int((h.MemoryMiB - fbUsed) / c.FramebufferMiB)
		}
		left = min(left, byFB)
	}
	return max(0, left)
}

// fill is how full the host is, 0..1: framebuffer in heterogeneous mode,
// the locked type's count in homogeneous mode.
func fill(h *VGPUHost) float64 {
	total := 0
	var fbUsed uint64
	locked := ""
	for name, n := range h.Current {
		if n > 0 {
			total += n
			fbUsed += uint64(n) * h.Types[name].FramebufferMiB
			locked = name
		}
	}
	if total == 0 {
		return 0
	}
	if h.Heterogeneous && h.MemoryMiB > 0 {
		return float64(fbUsed) / float64(h.MemoryMiB)
	}
	if m := h.Types[locked].Max; m > 0 {
		return float64(total) / float64(m)
	}
	return 1
}

// totalVGPUs is the number of vGPUs the GPU holds, of any type.
func totalVGPUs(h *VGPUHost) int {
	n := 0
	for _, c := range h.Current {
		n += c
	}
	return n
}

// vgpuCand is a host with room and its score.
type vgpuCand struct {
	idx    int
	h      *VGPUHost
	aff    int
	tier   int     // 0 runs the type, 1 runs other types, 2 empty
	fill   float64 // higher first in tiers 0 and 1
	unmet  uint64  // framebuffer of wanted vGPUs that become uncreatable
	lost   uint64  // framebuffer of wanted-type room lost
	before int
}

// PlaceVGPU chooses the GPU for a time-sliced vGPU. In order: the tenant's
// affinity; a GPU already running this type with room, fullest first; a
// heterogeneous GPU running other types, fullest first; an empty GPU. Within
// each group the GPU whose loss hurts the wanted types least wins: the
// framebuffer of wanted vGPUs that would no longer fit anywhere, then the
// framebuffer of wanted-type room lost; pool order breaks ties. Locking an
// empty homogeneous GPU removes all its room for every other type, which is
// what the wanted hints weigh.
//
// Errors: ErrNoSuchGPU, ErrUnknownProfile (no host offers the type),
// ErrNoCapacity (saying which types still have room).
func PlaceVGPU(hosts []VGPUHost, r VGPURequest) (VGPUDecision, error) {
	if r.GPU != "" {
		found := false
		for i := range hosts {
			found = found || hosts[i].ID == r.GPU
		}
		if !found {
			return VGPUDecision{}, fmt.Errorf("GPU %s is not among %d vGPU hosts: %w", r.GPU, len(hosts), ErrNoSuchGPU)
		}
	}
	// Pool room per wanted type, before this request.
	capBefore := map[string]int{}
	fbOf := map[string]uint64{}
	for i := range hosts {
		h := &hosts[i]
		for w := range r.Wanted {
			if c, ok := h.Types[w]; ok {
				capBefore[w] += vgpuRoom(h, w)
				fbOf[w] = c.FramebufferMiB
			}
		}
	}
	wantedNames := sortedKeys(r.Wanted)
	known := false
	var cands []vgpuCand
	for i := range hosts {
		h := &hosts[i]
		if r.GPU != "" && h.ID != r.GPU {
			continue
		}
		if len(r.Models) > 0 && !contains(r.Models, h.Model) {
			continue
		}
		if _, ok := h.Types[r.Type]; !ok {
			continue
		}
		known = true
		n := vgpuRoom(h, r.Type)
		if n == 0 {
			continue
		}
		c := vgpuCand{idx: i, h: h, fill: fill(h), before: n}
		switch {
		case h.Current[r.Type] > 0:
			c.tier = 0
		case totalVGPUs(h) > 0:
			c.tier = 1
		default:
			c.tier = 2
		}
		if r.Tenant != "" {
			switch r.Affinity {
			case AffinitySpread:
				c.aff = h.Tenants[r.Tenant]
			case AffinityPack:
				c.aff = -h.Tenants[r.Tenant]
			}
		}
		c.unmet, c.lost = vgpuHurt(h, r.Type, wantedNames, r.Wanted, capBefore, fbOf)
		cands = append(cands, c)
	}
	if !known {
		where := "no GPU in the fleet offers it"
		if r.GPU != "" {
			where = "GPU " + r.GPU + " does not offer it"
		} else if len(r.Models) > 0 {
			where = "no GPU of model " + strings.Join(r.Models, ", ") + " on this host offers it"
		}
		return VGPUDecision{}, fmt.Errorf("vGPU type %q: %s: %w", r.Type, where, ErrUnknownProfile)
	}
	if len(cands) == 0 {
		return VGPUDecision{}, vgpuRefusal(hosts, &r)
	}
	sort.SliceStable(cands, func(a, b int) bool {
		x, y := &cands[a], &cands[b]
		if x.aff != y.aff {
			return x.aff < y.aff
		}
		if x.tier != y.tier {
			return x.tier < y.tier
		}
		if x.tier < 2 && x.fill != y.fill {
			return x.fill > y.fill
		}
		if x.unmet != y.unmet {
			return x.unmet < y.unmet
		}
		if x.lost != y.lost {
			return x.lost < y.lost
		}
		return x.idx < y.idx
	})
	c := cands[0]
	var why string
	switch c.tier {
	case 0:
		why = fmt.Sprintf("already runs %d %s with room for %d more (fullest such GPU)", c.h.Current[r.Type], r.Type, c.before)
	case 1:
		why = fmt.Sprintf("heterogeneous, %.0f%% of its framebuffer in use (fullest GPU with room)", 100*c.fill)
	default:
		lock := "heterogeneous, stays open to other types"
		if !c.h.Heterogeneous {
			lock = "locks to " + r.Type
		}
		why = fmt.Sprintf("empty GPU (%s); wanted vGPUs left without room: %d MiB, wanted room lost: %d MiB (least of %d candidates)",
			lock, c.unmet, c.lost, len(cands))
	}
	if r.Tenant != "" && r.Affinity != AffinityNone {
		why = fmt.Sprintf("%s: tenant %s has %d here; %s", r.Affinity, r.Tenant, c.h.Tenants[r.Tenant], why)
	}
	return VGPUDecision{GPU: c.h.ID, Reason: fmt.Sprintf("%s on %s: %s", r.Type, c.h.ID, why)}, nil
}

// vgpuHurt weighs placing type t on h against the wanted types: the
// framebuffer of wanted vGPUs that the pool could no longer create, and the
// framebuffer of wanted-type room h loses.
func vgpuHurt(h *VGPUHost, t string, names []string, wanted, capBefore map[string]int, fbOf map[string]uint64) (unmet, lost uint64) {
	if len(wanted) == 0 {
		return 0, 0
	}
	after := *h
	after.Current = make(map[string]int, len(h.Current)+1)
	for k, v := range h.Current {
		after.Current[k] = v
	}
	after.Current[t]++
	for _, w := range names {
		want := wanted[w]
		if want <= 0 {
			continue
		}
		if _, ok := h.Types[w]; !ok {
			continue
		}
		b, a := vgpuRoom(h, w), vgpuRoom(&after, w)
		if b <= a {
			continue
		}
		capAfter := capBefore[w] - (b - a)
		short := max(0, want-capAfter) - max(0, want-capBefore[w])
		unmet += uint64(short) * fbOf[w]
		lost += uint64(min(b-a, want)) * fbOf[w]
	}
	return unmet, lost
}

func vgpuRefusal(hosts []VGPUHost, r *VGPURequest) error {
	free := map[string]int{}
	n := 0
	for i := range hosts {
		h := &hosts[i]
		if h.Unavailable || (len(r.Models) > 0 && !contains(r.Models, h.Model)) || (r.GPU != "" && h.ID != r.GPU) {
			continue
		}
		if _, ok := h.Types[r.Type]; !ok {
			continue
		}
		n++
		for t := range h.Types {
			if k := vgpuRoom(h, t); k > 0 {
				free[t] += k
			}
		}
	}
	var parts []string
	for _, t := range sortedKeys(free) {
		parts = append(parts, fmt.Sprintf("%s×%d", t, free[t]))
	}
	instead := "nothing"
	if len(parts) > 0 {
		instead = strings.Join(parts, ", ")
	}
	return fmt.Errorf("vGPU type %s fits on none of %d GPUs offering it; creatable now: %s: %w", r.Type, n, instead, ErrNoCapacity)
}
