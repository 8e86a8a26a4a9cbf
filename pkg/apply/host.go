package apply

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Manager is what apply needs of *manager.Manager: reads of the host and
// the operations a change set is made of. Errors carry the manager's
// sentinels (manager.ErrNotFound, ErrBusy, ...), which Execute keeps.
type Manager interface {
	GPUs() ([]manager.GPUView, error)
	// AllInstances lists every instance of the host.
	AllInstances() ([]manager.InstanceView, error)
	Tenants() ([]manager.TenantView, error)
	// Profiles lists the profiles of the models present on the host.
	Profiles() []manager.ProfileInfo
	DefineTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error)
	UpdateTenant(ctx context.Context, t tenant.Tenant) (store.Tenant, error)
	UndefineTenant(ctx context.Context, name string, force bool) error
	SetMIGMode(ctx context.Context, id string, on bool) error
	// MIGResetPlan says what a MIG mode change takes beyond the driver's
	// call: nil, the GPU reset's steps, or why it is refused
	// (manager.ErrBusy).
	MIGResetPlan(ctx context.Context, id string, on bool) ([]string, error)
	SetGPUScheduler(ctx context.Context, id string, r manager.SchedulerRequest) (manager.SchedulerView, error)
	SetGPUInstanceScheduler(ctx context.Context, id string, gi int, r manager.SchedulerRequest) (manager.GPUInstanceSchedulerView, error)
	// HasGPUInstanceScheduler says whether GPUs of a catalog model have
	// per-GPU-instance vGPU schedulers (Blackwell GB20x).
	HasGPUInstanceScheduler(model string) bool
	Create(ctx context.Context, req manager.CreateRequest) (store.Instance, error)
	// Destroy of an unknown instance is manager.ErrNotFound.
	Destroy(ctx context.Context, id string, opts manager.DestroyOptions) error
}

// host is what Diff read of the host.
type host struct {
	// giSched are the models with per-GPU-instance schedulers.
	giSched  map[string]bool
	gpus     []manager.GPUView
	insts    []manager.InstanceView
	tenants  map[string]manager.TenantView
	profiles map[string][]manager.ProfileInfo // by model
	// migReset answers Manager.MIGResetPlan; resetSteps are its answers
	// for the change set's MIG mode changes, by GPU UUID (the dry run
	// lists them).
	migReset   func(id string, on bool) ([]string, error)
	resetSteps map[string][]string
}

func readHost(m Manager) (*host, error) {
	h := &host{tenants: map[string]manager.TenantView{}, profiles: map[string][]manager.ProfileInfo{}, resetSteps: map[string][]string{}}
	h.migReset = func(id string, on bool) ([]string, error) { return m.MIGResetPlan(context.Background(), id, on) }
	var err error
	if h.gpus, err = m.GPUs(); err != nil {
		return nil, err
	}
	sort.Slice(h.gpus, func(i, j int) bool { return h.gpus[i].PCI < h.gpus[j].PCI })
	h.giSched = map[string]bool{}
	for _, g := range h.gpus {
		h.giSched[g.Model] = m.HasGPUInstanceScheduler(g.Model)
	}
	if h.insts, err = m.AllInstances(); err != nil {
		return nil, err
	}
	ts, err := m.Tenants()
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		h.tenants[t.Name] = t
	}
	for _, p := range m.Profiles() {
		h.profiles[p.Model] = append(h.profiles[p.Model], p)
	}
	return h, nil
}

// resolve finds a profile name on a model, accepting what the manager
// accepts: "3g.40gb", "H100-SXM5-80GB/3g.40gb", "H100-3g.40gb",
// "NVIDIA L4-4Q", "passthrough", and a compute instance in any spelling
// ("01c.3g.40gb" is "1c.3g.40gb"; "3c.3g.40gb", as wide as its GPU
// instance, is "3g.40gb"). p.Name is the one canonical name. why says what
// did not match.
func (h *host) resolve(model, name string) (p manager.ProfileInfo, why string, ok bool) {
	raw := strings.TrimSpace(name)
	want := raw
	if mod, rest, found := strings.Cut(raw, "/"); found {
		if mod != model {
			return p, fmt.Sprintf("%q is a profile of model %s, not of %s", raw, mod, model), false
		}
		want = rest
	}
	want = profile.TypeName(want)
	list := h.profiles[model]
	if q, ok := match(list, want); ok {
		return q, "", true
	}
	// "H100-3g.40gb": a model-name prefix and a MIG profile.
	if i := strings.Index(want, "-"); i > 0 && strings.HasPrefix(strings.ToLower(model), strings.ToLower(want[:i])) {
		if q, ok := match(list, want[i+1:]); ok && q.Kind == string(store.KindMIG) {
			return q, "", true
		}
	}
	return p, fmt.Sprintf("%q is not a MIG profile, vGPU type or %q of %s (run `vgpuctl profiles`)", raw, manager.ProfilePassthrough, model), false
}

// match finds name among a model's profiles: by its name, by its name in
// another case, or as a compute instance spelled otherwise than
// nvidia-smi spells it.
func match(list []manager.ProfileInfo, name string) (manager.ProfileInfo, bool) {
	for _, q := range list {
		if q.Name == name {
			return q, true
		}
	}
	for _, q := range list {
		if strings.EqualFold(q.Name, name) {
			return q, true
		}
	}
	n, gi, ok := profile.ParseComputeInstanceName(strings.TrimPrefix(name, "MIG "))
	if !ok {
		return manager.ProfileInfo{}, false
	}
	for _, q := range list {
		if q.Kind != string(store.KindMIG) || q.ComputeSlices != n {
			continue
		}
		// A compute instance of that size in gi, or gi itself when it
		// has that many compute slices.
		if q.GPUInstance == gi || (q.GPUInstance == "" && q.Name == gi) {
			return q, true
		}
	}
	return manager.ProfileInfo{}, false
}

// profileOf is the canonical profile name of an existing instance.
func (h *host) profileOf(r store.Instance) string {
	if p, _, ok := h.resolve(r.Model, r.Profile); ok && p.Kind == string(r.Kind) {
		return p.Name
	}
	switch {
	case r.TypeName != "":
		return r.TypeName
	case r.Kind == store.KindPassthrough:
		return manager.ProfilePassthrough
	}
	return r.Profile
}

// entryGPU is the GPU a gpu entry names, counting a numeric one in the
// entry's index order.
func (h *host) entryGPU(e *LayoutEntry) (manager.GPUView, bool) {
	if e.IndexOrder != IndexPCI {
		return h.findGPU(e.GPU)
	}
	n, err := strconv.Atoi(e.GPU)
	if err != nil || n < 0 {
		return manager.GPUView{}, false
	}
	// vgpu-device-manager numbers the host's GPUs (physical functions)
	// in PCI address order: domain, bus, device, function.
	byPCI := slices.Clone(h.gpus)
	slices.SortStableFunc(byPCI, func(a, b manager.GPUView) int { return cmp.Compare(pciOrder(a.PCI), pciOrder(b.PCI)) })
	if n >= len(byPCI) {
		return manager.GPUView{}, false
	}
	return byPCI[n], true
}

// pciOrder is a PCI address as one number, in address order; an address
// that does not parse sorts last.
func pciOrder(s string) uint64 {
	a, err := gpu.ParsePCI(s)
	if err != nil {
		return math.MaxUint64
	}
	return uint64(a.Domain)<<24 | uint64(a.Bus)<<16 | uint64(a.Device)<<8 | uint64(a.Function)
}

func (h *host) findGPU(id string) (manager.GPUView, bool) {
	for _, g := range h.gpus {
		if g.UUID == id || g.PCI == id || fmt.Sprint(g.Index) == id {
			return g, true
		}
	}
	if norm, err := gpu.NormalizePCI(id); err == nil {
		for _, g := range h.gpus {
			if g.PCI == norm {
				return g, true
			}
		}
	}
	return manager.GPUView{}, false
}

// foreignLeft counts the devices on g that no record explains.
func foreignLeft(g manager.GPUView, insts []manager.InstanceView) int {
	gis, vfs, mdevs := map[[2]int]bool{}, map[string]bool{}, map[string]bool{}
	for _, in := range insts {
		if in.GPUUUID != g.UUID {
			continue
		}
		gis[[2]int{in.GIStart, in.GIProfileID}] = true
		vfs[in.VF] = true
		mdevs[in.MdevUUID] = true
	}
	n := 0
	for _, gi := range g.MIG.Instances {
		if !gis[[2]int{gi.Placement.Start, gi.ProfileID}] {
			n++
		}
	}
	for _, vf := range g.VGPU.VFs {
		if vf.Type != 0 && !vfs[vf.PCI] {
			n++
		}
	}
	for _, md := range g.VGPU.Mdevs {
		if !mdevs[md.UUID] {
			n++
		}
	}
	return n
}
