package manager

import (
	"errors"
	"fmt"
	"maps"
	"sort"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// snapshot is what an admission decision sees: the host as last
// discovered, and every instance record (those being created hold their
// slots before the host shows them).
type snapshot struct {
	inv    gpu.Inventory
	recs   []store.Instance
	atts   map[string]store.Attachment
	failed map[string]string
	byGPU  map[string][]*store.Instance
	// switching are GPUs whose MIG mode is being changed (SetMIGMode).
	switching map[string]bool
}

func (m *Manager) snapshot(tx *store.Tx) (*snapshot, error) {
	recs, err := tx.Instances()
	if err != nil {
		return nil, err
	}
	atts, err := tx.Attachments()
	if err != nil {
		return nil, err
	}
	s := &snapshot{inv: m.Inventory(), recs: recs, atts: map[string]store.Attachment{}, byGPU: map[string][]*store.Instance{}}
	for _, a := range atts {
		s.atts[a.Instance] = a
	}
	for i := range s.recs {
		r := &s.recs[i]
		s.byGPU[r.GPUUUID] = append(s.byGPU[r.GPUUUID], r)
	}
	m.invMu.RLock()
	s.failed = map[string]string{}
	for k, v := range m.failedGPUs {
		s.failed[k] = v.Why
	}
	s.switching = maps.Clone(m.switching)
	m.invMu.RUnlock()
	return s, nil
}

// passthroughOn returns the record reserving g whole, if any.
func (s *snapshot) passthroughOn(uuid string) *store.Instance {
	for _, r := range s.byGPU[uuid] {
		if r.Kind == store.KindPassthrough {
			return r
		}
	}
	return nil
}

// giRecords returns the records living on the GPU instance at (start,
// profile) of a GPU.
func (s *snapshot) giRecords(uuid string, start, profileID int) []*store.Instance {
	var out []*store.Instance
	for _, r := range s.byGPU[uuid] {
		if (r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU) && r.GIStart == start && r.GIProfileID == profileID {
			out = append(out, r)
		}
	}
	return out
}

// movable: not attached to a running VM (a live attachment), not in flight.
func (s *snapshot) movable(r *store.Instance) bool {
	if r.State != store.StateReady {
		return false
	}
	a, ok := s.atts[r.UUID]
	return !ok || !a.Live
}

// state is g's service state, by the one precedence every view uses: lost
// (it does not answer), then failed (why says why), then passed through
// whole, else ok.
func (s *snapshot) state(g *gpu.GPU) (st gpu.State, why string) {
	switch {
	case g.Lost:
		return gpu.StateLost, ""
	case s.failed[g.UUID] != "":
		return gpu.StateFailed, s.failed[g.UUID]
	case s.passthroughOn(g.UUID) != nil:
		return gpu.StatePassthrough, ""
	}
	return gpu.StateOK, ""
}

// unavailable says why a GPU takes no new instance, or "".
func (s *snapshot) unavailable(g *gpu.GPU) string {
	switch st, why := s.state(g); st {
	case gpu.StateLost:
		return "lost"
	case gpu.StateFailed:
		return "failed: " + why
	case gpu.StatePassthrough:
		return "passed through whole"
	}
	if s.switching[g.UUID] {
		return "its MIG mode is being changed"
	}
	return ""
}

// migPool is the placement view of the MIG-capable GPUs (migGPU).
func (m *Manager) migPool(s *snapshot) []placement.GPU {
	var out []placement.GPU
	for i := range s.inv.GPUs {
		if pg, ok := m.migGPU(s, &s.inv.GPUs[i]); ok {
			out = append(out, pg)
		}
	}
	return out
}

// migGPU is the placement view of g if it is MIG-capable with a slot grid
// (unavailable unless MIG is on and g takes new instances). GPU instances
// the host shows and no record explains are foreign: they occupy their
// slices and are never moved.
func (m *Manager) migGPU(s *snapshot, g *gpu.GPU) (placement.GPU, bool) {
	grid := m.grid(g.Model)
	if grid == nil || !g.MIG.Capable {
		return placement.GPU{}, false
	}
	pg := placement.GPU{ID: g.UUID, Model: g.Model, Grid: grid, Unavailable: !g.MIG.Enabled || s.unavailable(g) != ""}
	matched := map[string]bool{}
	for _, gi := range g.MIG.Instances {
		recs := s.giRecords(g.UUID, gi.Placement.Start, gi.ProfileID)
		slot := placement.Slot{Start: gi.Placement.Start, Size: gi.Placement.Size, ProfileID: gi.ProfileID}
		if len(recs) == 0 {
			slot.Instance, slot.Foreign = fmt.Sprintf("foreign-gi-%d@%s", gi.ID, g.PCI), true
		} else {
			slot.Instance, slot.Tenant = recs[0].UUID, recs[0].Tenant
			slot.Movable = len(recs) == 1 && s.movable(recs[0])
			for _, r := range recs {
				matched[r.UUID] = true
			}
		}
		pg.Used = append(pg.Used, slot)
	}
	// Records whose GPU instance the host does not show (being created,
	// or lost in a reboot and not yet re-created) keep their slots.
	seen := map[[2]int]bool{}
	for _, r := range s.byGPU[g.UUID] {
		if matched[r.UUID] || (r.Kind != store.KindMIG && r.Kind != store.KindMIGVGPU) || r.GISize <= 0 {
			continue
		}
		k := [2]int{r.GIStart, r.GIProfileID}
		if seen[k] {
			continue
		}
		seen[k] = true
		pg.Used = append(pg.Used, placement.Slot{Start: r.GIStart, Size: r.GISize, ProfileID: r.GIProfileID, Instance: r.UUID, Tenant: r.Tenant})
	}
	return pg, true
}

// vgpuHosts is the placement view of the GPUs that take time-sliced vGPUs
// (vgpuHost).
func (m *Manager) vgpuHosts(s *snapshot) []placement.VGPUHost {
	var out []placement.VGPUHost
	for i := range s.inv.GPUs {
		if h, ok := m.vgpuHost(s, &s.inv.GPUs[i]); ok {
			out = append(out, h)
		}
	}
	return out
}

// vgpuHost is the placement view of g if its catalog model has vGPU types
// and g a vGPU creation flow (unavailable in MIG mode or when g takes no
// new instance). Its Types are the time-sliced types of g's flow.
func (m *Manager) vgpuHost(s *snapshot, g *gpu.GPU) (placement.VGPUHost, bool) {
	md, ok := m.catalog().Model(g.Model)
	if !ok || md.VGPU == nil || g.VGPU.Flavour == gpu.FlavourNone || g.VGPU.Flavour == "" {
		return placement.VGPUHost{}, false
	}
	h := placement.VGPUHost{ID: g.UUID, Model: g.Model, Types: map[string]placement.VGPUTypeCap{},
		Current: map[string]int{}, Tenants: map[string]int{}, Heterogeneous: g.VGPU.Heterogeneous, MemoryMiB: md.MemoryMiB,
		Unavailable: g.MIG.Enabled || s.unavailable(g) != ""}
	for name, c := range placement.VGPUTypes(md) {
		if t, ok := md.VGPUTypeByName(name); ok && md.HasFlow(t, string(g.VGPU.Flavour)) {
			h.Types[name] = c
		}
	}
	for _, d := range s.devices(g, md) {
		if d.typ == nil || d.typ.MIGBacked() {
			continue
		}
		h.Current[d.typ.Name]++
		if d.rec != nil {
			h.Tenants[d.rec.Tenant]++
		}
	}
	return h, true
}

// device is one vGPU the host shows or a record promises.
type device struct {
	typ *profile.VGPUType
	rec *store.Instance
	// vf or mdev identify it on the host ("" while it is only promised).
	vf, mdev string
}

// devices joins the host's vGPUs (VF types, mdevs) with the records.
func (s *snapshot) devices(g *gpu.GPU, md *profile.Model) []device {
	var out []device
	matched := map[string]bool{}
	// A record explains the VF it holds, and the mdev with its UUID on
	// its parent with its type (one elsewhere is another's: sameMdev).
	recFor := func(vf string, mdev *gpu.Mdev) *store.Instance {
		for _, r := range s.byGPU[g.UUID] {
			if (vf != "" && r.VF == vf) || (mdev != nil && r.Flow == store.FlowMdev && sameMdev(mdev, r)) {
				return r
			}
		}
		return nil
	}
	for _, vf := range g.VGPU.VFs {
		if vf.Type == 0 {
			continue
		}
		t, _ := md.VGPUTypeByID(vf.Type) // nil: a type the catalog lacks (unknown to callers)
		r := recFor(vf.PCI, nil)
		if r != nil {
			matched[r.UUID] = true
		}
		out = append(out, device{typ: t, rec: r, vf: vf.PCI})
	}
	for i := range g.VGPU.Mdevs {
		mv := &g.VGPU.Mdevs[i]
		t, _ := md.VGPUTypeByID(mv.Type) // nil: a type the catalog lacks
		r := recFor("", mv)
		if r != nil {
			matched[r.UUID] = true
		}
		out = append(out, device{typ: t, rec: r, mdev: mv.UUID})
	}
	for _, r := range s.byGPU[g.UUID] {
		if matched[r.UUID] || (r.Kind != store.KindVGPU && r.Kind != store.KindMIGVGPU) {
			continue
		}
		t, _ := md.VGPUTypeByID(r.TypeID) // nil: a type the catalog lacks
		out = append(out, device{typ: t, rec: r})
	}
	return out
}

// freeVF picks the lowest VF of g with no vGPU and no record holding it.
func (s *snapshot) freeVF(g *gpu.GPU) (string, bool) {
	held := map[string]bool{}
	for _, r := range s.byGPU[g.UUID] {
		if r.VF != "" {
			held[r.VF] = true
		}
	}
	vfs := append([]gpu.VF(nil), g.VGPU.VFs...)
	sort.Slice(vfs, func(i, j int) bool { return vfs[i].PCI < vfs[j].PCI })
	for _, vf := range vfs {
		if vf.Type == 0 && !held[vf.PCI] {
			return vf.PCI, true
		}
	}
	return "", false
}

// freeMdevParent picks the mdev parent for a new mdev of typeID: the PF on
// GPUs whose PF is the parent, else the lowest VF parent with no mdev and
// no record holding it.
func (s *snapshot) freeMdevParent(g *gpu.GPU, typeID int) (string, bool) {
	held := map[string]int{}
	for _, r := range s.byGPU[g.UUID] {
		if r.MdevParent != "" {
			held[r.MdevParent]++
		}
	}
	for _, mv := range g.VGPU.Mdevs {
		held[mv.Parent]++
	}
	for _, p := range g.VGPU.MdevParents {
		has := false
		for _, t := range p.Types {
			has = has || t.ID == typeID
		}
		if !has {
			continue
		}
		if p.PCI == g.PCI || held[p.PCI] == 0 {
			return p.PCI, true
		}
	}
	return "", false
}

// carved reports whether anything lives on g (for passthrough).
func (s *snapshot) carved(g *gpu.GPU) bool {
	if len(s.byGPU[g.UUID]) > 0 || len(g.MIG.Instances) > 0 || len(g.VGPU.Mdevs) > 0 {
		return true
	}
	for _, vf := range g.VGPU.VFs {
		if vf.Type != 0 {
			return true
		}
	}
	return false
}

// usage sums a tenant's records.
func (s *snapshot) usage(name string) (vram, compute, n uint64) {
	for _, r := range s.recs {
		if r.Tenant == name {
			vram += r.VRAMBytes
			compute += r.ComputeMilli
			n++
		}
	}
	return vram, compute, n
}

// freeDevices counts the VFs or mdev parents of g that could take one more
// vGPU of typeID (a PF parent takes many: the type's own limit applies).
func (s *snapshot) freeDevices(g *gpu.GPU, typeID int) int {
	held := map[string]bool{}
	for _, r := range s.byGPU[g.UUID] {
		held[r.VF], held[r.MdevParent] = true, true
	}
	for _, mv := range g.VGPU.Mdevs {
		held[mv.Parent] = true
	}
	n := 0
	switch g.VGPU.Flavour {
	case gpu.FlavourVFIO:
		for _, vf := range g.VGPU.VFs {
			if vf.Type == 0 && !held[vf.PCI] {
				n++
			}
		}
	case gpu.FlavourMdev:
		for _, p := range g.VGPU.MdevParents {
			if p.PCI == g.PCI {
				return int(^uint(0) >> 1)
			}
			for _, t := range p.Types {
				if t.ID == typeID && !held[p.PCI] {
					n++
				}
			}
		}
	}
	return n
}

// InstanceView is an instance with its attachment.
type InstanceView struct {
	store.Instance
	Attachment *store.Attachment `json:"attachment,omitempty"`
}

// AllInstances lists every instance on the host with its attachment.
// Listing everything has a method of its own, so that no caller can reach
// every instance by passing an empty or missing tenant name.
func (m *Manager) AllInstances() ([]InstanceView, error) {
	out, err := m.instanceViews(func(tx *store.Tx) ([]store.Instance, error) { return tx.Instances() })
	if err != nil {
		return nil, classify(err, "list instances")
	}
	return out, nil
}

// TenantInstances lists the instances of one tenant. An invalid name is
// ErrInvalidArgument and a tenant the host does not have ErrNotFound:
// never all instances.
func (m *Manager) TenantInstances(name string) ([]InstanceView, error) {
	if err := tenant.ValidateName(name); err != nil {
		return nil, classify(err, "tenant")
	}
	out, err := m.instanceViews(func(tx *store.Tx) ([]store.Instance, error) { return tx.InstancesOf(name) })
	if errors.Is(err, store.ErrNotFound) {
		return nil, noTenant(name, err)
	}
	if err != nil {
		return nil, classify(err, "list the instances of tenant %s", name)
	}
	return out, nil
}

// knownTenant checks that name is a valid tenant name (ErrInvalidArgument)
// of a tenant the host has (ErrNotFound).
func (m *Manager) knownTenant(name string) error {
	if err := tenant.ValidateName(name); err != nil {
		return classify(err, "tenant")
	}
	err := m.db.View(func(tx *store.Tx) error { _, err := tx.Tenant(name); return err })
	if errors.Is(err, store.ErrNotFound) {
		return noTenant(name, err)
	}
	return classify(err, "read tenant %s", name)
}

// noTenant is the refusal for a tenant name the host does not know.
func noTenant(name string, cause error) error {
	return fail(ErrNotFound, cause, "no tenant %s on this host (run `vgpuctl tenant list`; define it with `vgpuctl tenant define %s`)", name, name)
}

func (m *Manager) instanceViews(read func(*store.Tx) ([]store.Instance, error)) ([]InstanceView, error) {
	var out []InstanceView
	err := m.db.View(func(tx *store.Tx) error {
		recs, err := read(tx)
		if err != nil {
			return err
		}
		atts, err := tx.Attachments()
		if err != nil {
			return err
		}
		byInst := map[string]store.Attachment{}
		for _, a := range atts {
			byInst[a.Instance] = a
		}
		for _, r := range recs {
			v := InstanceView{Instance: r}
			if a, ok := byInst[r.UUID]; ok {
				v.Attachment = &a
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}

// instanceAndAttachment reads an instance record by UUID with its
// attachment (nil when it is not attached to a VM).
func (m *Manager) instanceAndAttachment(id string) (store.Instance, *store.Attachment, error) {
	var rec store.Instance
	u, err := uuid.Parse(id)
	if err != nil {
		return rec, nil, fail(ErrInvalidArgument, err, "instance %s is not an instance UUID (run `vgpuctl list`)", QuoteArg(id))
	}
	if u == uuid.Nil {
		return rec, nil, fail(ErrInvalidArgument, nil, "instance %s is the nil UUID, which names no instance (run `vgpuctl list`)", u)
	}
	id = u.String()
	var att *store.Attachment
	err = m.db.View(func(tx *store.Tx) error {
		r, err := tx.Instance(id)
		if err != nil {
			return err
		}
		rec = r
		a, err := tx.Attachment(id)
		if err == nil {
			att = &a
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return rec, nil, fail(ErrNotFound, err, "no instance %s (run `vgpuctl list`)", id)
	}
	if err != nil {
		return rec, nil, classify(err, "read instance %s", id)
	}
	return rec, att, nil
}

// Instance returns one instance record.
func (m *Manager) Instance(id string) (store.Instance, error) {
	rec, _, err := m.instanceAndAttachment(id)
	return rec, err
}
