package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// Fleet is what the manager needs from a fleet-wide inventory (pkg/fleet
// over OpenStack Placement): a claim taken before carving, so that a local
// create and a fleet scheduler's claim cannot both win the last slices, and
// the allocation a scheduler wrote for a create it sends.
type Fleet interface {
	// Claim records in the fleet that c.Instance takes c.Profile on
	// c.GPU. An error wrapping ErrNoCapacity means the fleet has given
	// that capacity away; any other error means the fleet could not be
	// asked, and the create goes on (the fleet's sync writes it later).
	Claim(ctx context.Context, c FleetClaim) error
	// Unclaim drops the claim of an instance whose create failed. It must
	// not block: the fleet's sync finishes what it cannot do at once.
	Unclaim(instance string)
	// Adopt reads the allocation a scheduler wrote for consumer. Errors
	// wrap ErrNotFound (no allocation), ErrInvalidArgument (it is for
	// another host or is malformed) or ErrBackendFailure (the fleet did
	// not answer).
	Adopt(ctx context.Context, consumer string) (FleetClaim, error)
}

// FleetClaim is one instance's share of one GPU, as the fleet holds it.
type FleetClaim struct {
	Instance string
	// GPU is the GPU's UUID.
	GPU string
	// Profile is the canonical profile name on the GPU's model (a MIG
	// profile name such as 3g.40gb, or a vGPU type name).
	Profile string
	Kind    store.InstanceKind
	// Slices are the slot-grid units a MIG instance covers (0 otherwise).
	Slices int
}

type fleetHolder struct{ f Fleet }

// SetFleet sets (or, with nil, drops) the fleet; the daemon calls it at
// start and on reload.
func (m *Manager) SetFleet(f Fleet) {
	if f == nil {
		m.fleet.Store(nil)
		return
	}
	m.fleet.Store(&fleetHolder{f: f})
}

func (m *Manager) fleetOf() Fleet {
	if h := m.fleet.Load(); h != nil {
		return h.f
	}
	return nil
}

// fleetOp is one create's claim; its end settles it with the create's result.
type fleetOp struct {
	f        Fleet
	instance string
	claimed  bool // a claim this create wrote (dropped when it fails)
	adopted  bool // a scheduler's allocation (never dropped here)
}

// end drops a claim the failed create wrote and names a refused adopted
// create as stale. A nil op passes err through.
func (op *fleetOp) end(err error) error {
	if op == nil || err == nil {
		return err
	}
	if op.claimed {
		op.f.Unclaim(op.instance)
	}
	if op.adopted && errors.Is(err, ErrNoCapacity) {
		return fmt.Errorf("the fleet's allocation for %s is stale (the host no longer has that room; delete the allocation and try another candidate): %w", op.instance, err)
	}
	return err
}

// fleetBegin adopts the scheduler's allocation of a request that names
// one (pinning the request to its GPU), or claims, for a local create, the
// capacity the admission is about to take. It changes nothing on the host.
func (m *Manager) fleetBegin(ctx context.Context, req *CreateRequest, offers []offer) (*fleetOp, error) {
	f := m.fleetOf()
	if req.PlacementConsumer != "" {
		return m.fleetAdopt(ctx, f, req, offers)
	}
	if f == nil || m.instanceExists(req.UUID) {
		return nil, nil
	}
	var d decision
	err := m.db.View(func(tx *store.Tx) error {
		// The claim names the GPU the admission will pin: choose it among
		// the offers the tenant may take, as the admission does.
		t, err := tx.Tenant(req.Tenant)
		if err != nil {
			return err
		}
		mine, err := allowed(t.Tenant, offers, req.Profile)
		if err != nil {
			return err
		}
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		d, err = m.decide(s, mine, *req)
		return err
	})
	if err != nil || (d.o.kind != store.KindMIG && d.o.kind != store.KindVGPU) || d.o.ci != nil {
		// The admission gives the refusal its proper message; kinds the
		// fleet does not publish (compute instances narrower than their
		// GPU instance among them: claimOf) are not claimed.
		return nil, nil
	}
	c := FleetClaim{Instance: req.UUID, GPU: d.g.UUID, Profile: d.o.name(), Kind: d.o.kind, Slices: m.slicesOf(d.g.Model, d.o)}
	if err := f.Claim(ctx, c); err != nil {
		if errors.Is(err, ErrNoCapacity) {
			return nil, fail(ErrNoCapacity, err, "the fleet has given the last room for %s on GPU %s away; retry or choose another GPU", c.Profile, d.g.PCI)
		}
		m.log.Warn("fleet claim not written; the sync writes it later", "instance", req.UUID, "err", err)
		return nil, nil
	}
	// The claim names this GPU: the admission must carve there.
	req.GPU = d.g.UUID
	return &fleetOp{f: f, instance: req.UUID, claimed: true}, nil
}

func (m *Manager) fleetAdopt(ctx context.Context, f Fleet, req *CreateRequest, offers []offer) (*fleetOp, error) {
	u, err := uuid.Parse(req.PlacementConsumer)
	if err != nil {
		return nil, fail(ErrInvalidArgument, err, "placement consumer %q is not a UUID", req.PlacementConsumer)
	}
	if u.String() != req.UUID {
		return nil, fail(ErrInvalidArgument, nil, "placement consumer %s differs from instance UUID %s; the consumer is the instance", u, req.UUID)
	}
	if f == nil {
		return nil, fail(ErrInvalidArgument, nil, "this host is not configured for Placement (fleet in vgpud.yaml); create without a placement consumer")
	}
	if m.instanceExists(req.UUID) {
		return nil, nil // a retry: admission returns the instance
	}
	for _, o := range offers {
		if o.ci != nil && o.name() == req.Profile {
			return nil, fail(ErrInvalidArgument, nil, "compute-instance profile %s is not published to Placement (its GPU instance's slices are reserved there); create it without a placement consumer", req.Profile)
		}
	}
	c, err := f.Adopt(ctx, req.UUID)
	if err != nil {
		return nil, classify(err, "adopt the allocation of consumer %s", req.UUID)
	}
	g, err := m.gpuByAnyID(c.GPU)
	if err != nil {
		return nil, fail(ErrInvalidArgument, err, "the allocation of consumer %s names GPU %s, which this host does not have", req.UUID, c.GPU)
	}
	ok := false
	for _, o := range offers {
		if o.model.Name == g.Model && o.name() == c.Profile && o.kind == c.Kind && m.slicesOf(g.Model, o) == c.Slices {
			ok = true
		}
	}
	if !ok {
		return nil, fail(ErrInvalidArgument, nil, "the allocation of consumer %s is for %s (%d slices) on GPU %s; the request asks %s", req.UUID, c.Profile, c.Slices, g.PCI, req.Profile)
	}
	req.GPU = g.UUID
	return &fleetOp{f: f, instance: req.UUID, adopted: true}, nil
}

func (m *Manager) instanceExists(id string) bool {
	err := m.db.View(func(tx *store.Tx) error {
		_, err := tx.Instance(id)
		return err
	})
	return err == nil
}

// slicesOf is how many slot-grid units offer o covers on model (0 for
// offers that take no GPU instance).
func (m *Manager) slicesOf(model string, o offer) int {
	if o.gi == nil {
		return 0
	}
	if g := m.grid(model); g != nil {
		if p, ok := g.Profile(o.gi.Name); ok {
			return p.Size
		}
	}
	return 0
}

// FleetGPU is one GPU as the fleet sees it: what is carved on it and how
// many more of each profile vgpud would accept there now.
type FleetGPU struct {
	UUID, PCI, Model string
	State            gpu.State
	// MIG is MIG mode on; Flavour the vGPU creation flow; Heterogeneous
	// the time-sliced mode.
	MIG           bool
	Flavour       gpu.Flavour
	Heterogeneous bool
	// Slices is the slot grid's size on a MIG GPU; Unclaimable the slots
	// held by what the fleet cannot see as allocations (foreign GPU
	// instances, MIG-backed vGPUs).
	Slices, Unclaimable int
	// FramebufferMiB is the framebuffer the vGPU types share on a
	// time-sliced GPU in heterogeneous mode (0 otherwise: in homogeneous
	// mode the per-type maximum alone bounds the GPU).
	FramebufferMiB uint64
	Classes        []FleetClass
	Instances      []FleetClaim
}

// FleetClass is one profile carvable on a GPU and how many more fit now.
type FleetClass struct {
	Profile string
	Kind    store.InstanceKind
	Slices  int
	Room    int
	// FramebufferMiB is what one instance takes of the GPU's shared
	// framebuffer (heterogeneous vGPU mode only, else 0).
	FramebufferMiB uint64
}

// FleetView is the host's truth for the fleet: every GPU, its instances and
// its room per profile, from one consistent snapshot.
func (m *Manager) FleetView() ([]FleetGPU, error) {
	var out []FleetGPU
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		out = m.fleetView(s)
		return nil
	})
	if err != nil {
		return nil, classify(err, "fleet view")
	}
	return out, nil
}

func (m *Manager) fleetView(s *snapshot) []FleetGPU {
	byID := map[string]*FleetGPU{}
	var out []FleetGPU
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		if g.Model == "" {
			continue
		}
		fg := FleetGPU{UUID: g.UUID, PCI: g.PCI, Model: g.Model, State: gpu.StateOK, MIG: g.MIG.Enabled, Flavour: g.VGPU.Flavour, Heterogeneous: g.VGPU.Heterogeneous}
		switch {
		case g.Lost:
			fg.State = gpu.StateLost
		case s.failed[g.UUID] != "":
			fg.State = gpu.StateFailed
		case s.passthroughOn(g.UUID) != nil:
			fg.State = gpu.StatePassthrough
		}
		for _, r := range s.byGPU[g.UUID] {
			if c, ok := m.claimOf(r); ok {
				fg.Instances = append(fg.Instances, c)
			}
		}
		sort.Slice(fg.Instances, func(a, b int) bool { return fg.Instances[a].Instance < fg.Instances[b].Instance })
		out = append(out, fg)
	}
	for i := range out {
		byID[out[i].UUID] = &out[i]
	}
	for _, pg := range m.migFleet(s) {
		fg := byID[pg.ID]
		if fg == nil || !fg.MIG {
			continue
		}
		fg.Slices = pg.Grid.Slices
		claimed := 0
		for _, c := range fg.Instances {
			claimed += c.Slices
		}
		used := 0
		for _, sl := range pg.Used {
			used += sl.Size
		}
		fg.Unclaimable = max(0, used-claimed)
		for _, f := range placement.Capacity([]placement.GPU{pg}) {
			p, _ := pg.Grid.Profile(f.Profile) // Capacity names only the grid's own profiles
			fg.Classes = append(fg.Classes, FleetClass{Profile: f.Profile, Kind: store.KindMIG, Slices: p.Size, Room: f.Count})
		}
	}
	for _, h := range m.vgpuHosts(s) {
		fg := byID[h.ID]
		md, _ := m.catalog().Model(h.Model) // vgpuHosts lists only catalog models
		if fg == nil || fg.MIG || md == nil {
			continue
		}
		// The engine bounds heterogeneous mode by the GPU's memory
		// (placement.VGPURoom): the fleet publishes the same rule.
		shared := h.Heterogeneous && h.MemoryMiB > 0
		if shared {
			fg.FramebufferMiB = h.MemoryMiB
		}
		for name, tc := range h.Types {
			t, _ := md.VGPUTypeByName(name) // h.Types holds only md's types
			n := 0
			if !h.Unavailable {
				n = min(placement.VGPURoom(h, name), s.freeDevices(m.gpuOf(s, h.ID), t.ID))
			}
			c := FleetClass{Profile: name, Kind: store.KindVGPU, Room: max(0, n)}
			if shared {
				c.FramebufferMiB = tc.FramebufferMiB
			}
			fg.Classes = append(fg.Classes, c)
		}
		sort.Slice(fg.Classes, func(a, b int) bool { return fg.Classes[a].Profile < fg.Classes[b].Profile })
	}
	return out
}

// claimOf is what record r holds in the fleet's terms; MIG-backed vGPUs,
// whole GPUs and compute instances narrower than their GPU instance are
// not published: the slots they hold count as unclaimable (reserved on
// the slice class), once per GPU instance however many share it.
func (m *Manager) claimOf(r *store.Instance) (FleetClaim, bool) {
	c := FleetClaim{Instance: r.UUID, GPU: r.GPUUUID, Kind: r.Kind}
	switch r.Kind {
	case store.KindMIG:
		if r.CISlices > 0 {
			return FleetClaim{}, false
		}
		g := m.grid(r.Model)
		if g == nil {
			return FleetClaim{}, false
		}
		for _, p := range g.Profiles {
			if p.ID == r.GIProfileID {
				c.Profile, c.Slices = p.Name, p.Size
				return c, true
			}
		}
		return FleetClaim{}, false
	case store.KindVGPU:
		c.Profile = r.TypeName
		return c, r.TypeName != ""
	}
	return FleetClaim{}, false
}
