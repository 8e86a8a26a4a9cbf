package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

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
	// Unclaim drops the claim of an instance whose create failed (or the
	// allocation of an instance destroyed where Settle is not called). It
	// must not block: the fleet's sync finishes what it cannot do at once.
	Unclaim(instance string)
	// Adopt reads the allocation a scheduler wrote for consumer; it
	// changes nothing. Errors wrap ErrNotFound (no allocation),
	// ErrInvalidArgument (it is for another host or is malformed) or
	// ErrBackendFailure (the fleet did not answer).
	Adopt(ctx context.Context, consumer string) (FleetClaim, error)
	// Complete writes into an adopted allocation marked Incomplete the
	// shared units its claim takes (a whole GPU's slices or framebuffer,
	// which a scheduler cannot know to ask for); the manager calls it once
	// the request has passed the admission's checks. Errors wrap
	// ErrNoCapacity (claimed meanwhile), ErrNotFound (the allocation was
	// deleted) or ErrBackendFailure.
	Complete(ctx context.Context, c FleetClaim) error
	// Settle brings GPU gpu's part of the fleet up to date right after an
	// operation changed it, before the operation returns: the allocation
	// of removed (an instance just destroyed; "" for none) goes and the
	// GPU's capacity is published again. It must not fail or block the
	// operation for long: what it cannot do the fleet's sync does, and
	// the error says what that is (the operation stands; its caller is
	// told that Placement lags).
	Settle(ctx context.Context, gpu, removed string) error
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
	// Slices are the slot-grid units the instance holds: its GPU
	// instance's size for a MIG instance and a MIG-backed vGPU alone in
	// its GPU instance, the whole grid for a whole GPU in MIG mode, else 0
	// (fleetSlices).
	Slices int
	// FramebufferMiB is what the instance takes of a GPU's shared
	// framebuffer in heterogeneous vGPU mode (a whole GPU all of it), else 0.
	FramebufferMiB uint64
	// Incomplete marks an adopted allocation that lacks the shared units
	// above (see Fleet.Complete).
	Incomplete bool
	// Unconfirmed marks the create of a fleet scheduler's consumer that has
	// not finished: its allocation is the scheduler's to write or delete,
	// and the fleet never writes it back (a scheduler that gave up deleted
	// it on purpose).
	Unconfirmed bool
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
	// For an adopted create: the manager, the GPU and the profile the
	// allocation names, which a stale refusal reports.
	m       *Manager
	gpu     gpu.GPU
	profile string
}

// end drops a claim the failed create wrote and names a refused adopted
// create as stale (ErrStaleClaim), with this host's GPU and what took the
// room there. A nil op passes err through.
func (op *fleetOp) end(err error) error {
	if op == nil || err == nil {
		return err
	}
	if op.claimed {
		op.f.Unclaim(op.instance)
	}
	if op.adopted && errors.Is(err, ErrNoCapacity) {
		return fail(ErrStaleClaim, err, "the fleet's allocation for %s is stale: GPU %s (%s) no longer has room for %s: %s; delete the allocation and try another candidate",
			op.instance, op.gpu.PCI, op.gpu.Model, op.profile, op.m.roomTaken(op.gpu.UUID, op.instance, err))
	}
	return err
}

// roomTaken says what holds GPU gpuUUID now, for a stale claim's message:
// the GPU's state when it is unavailable, else the instances carved there
// (other than instance), else (a claim Placement holds, not carved yet;
// fragmented slots) the refusal's own words.
func (m *Manager) roomTaken(gpuUUID, instance string, refusal error) string {
	var out string
	// A store that cannot be read leaves out empty: the refusal's own
	// words are the message then, and the create is refused either way.
	_ = m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		g := m.gpuOf(s, gpuUUID)
		if g == nil {
			out = "the GPU is gone"
			return nil
		}
		if why := s.unavailable(g); why != "" {
			out = "the GPU is " + why
			return nil
		}
		var held []string
		for _, r := range s.byGPU[gpuUUID] {
			if r.UUID != instance {
				held = append(held, fmt.Sprintf("%s %s (tenant %s)", r.Profile, r.UUID, r.Tenant))
			}
		}
		sort.Strings(held)
		const most = 4
		if n := len(held); n > most {
			held = append(held[:most], fmt.Sprintf("%d more", n-most))
		}
		if len(held) > 0 {
			out = "it holds " + strings.Join(held, ", ")
		}
		return nil
	})
	if out == "" {
		out = Message(refusal)
	}
	return out
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
		// The claim names the GPU the admission will pin: the admission's
		// own decision, without recording it.
		var err error
		d, err = m.admissible(tx, *req, offers)
		return err
	})
	if err != nil || d.o.ci != nil {
		// The admission gives the refusal its proper message; compute
		// instances narrower than their GPU instance are not published
		// (claimOf) and so not claimed.
		return nil, nil
	}
	c := FleetClaim{Instance: req.UUID, GPU: d.g.UUID, Profile: d.o.name(), Kind: d.o.kind,
		Slices: m.fleetSlices(d.g, d.o), FramebufferMiB: m.fleetFramebuffer(d.g, d.o)}
	if err := f.Claim(ctx, c); err != nil {
		if errors.Is(err, ErrNoCapacity) {
			return nil, fail(ErrNoCapacity, err, "the fleet has given the last room for %s on GPU %s away; retry or choose another GPU", c.Profile, d.g.PCI)
		}
		m.log.Warn("fleet claim not written; the sync writes it later", "instance", req.UUID, "err", err)
		notePlacementBehind(ctx, fmt.Sprintf("allocation not written before carving (%s); the sync writes it", Message(err)))
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
	if req.GPU != "" {
		// An explicit GPU and the scheduler's allocation must agree: the
		// allocation is what Placement counts, so carving elsewhere would
		// leave the two apart.
		pinned, err := m.gpuByAnyID(req.GPU)
		if err != nil {
			return nil, err
		}
		if pinned.UUID != g.UUID {
			return nil, fail(ErrInvalidArgument, nil, "the allocation of consumer %s is on GPU %s (%s), not on the requested GPU %s (%s); drop --gpu or claim that GPU", req.UUID, g.PCI, g.Model, pinned.PCI, pinned.Model)
		}
	}
	ok := false
	for _, o := range offers {
		if o.model.Name == g.Model && o.name() == c.Profile && o.kind == c.Kind && m.fleetSlices(&g, o) == c.Slices {
			ok = true
		}
	}
	if !ok {
		return nil, fail(ErrInvalidArgument, nil, "the allocation of consumer %s is for %s (%d slices) on GPU %s; the request asks %s", req.UUID, c.Profile, c.Slices, g.PCI, req.Profile)
	}
	req.GPU = g.UUID
	op := &fleetOp{f: f, instance: req.UUID, adopted: true, m: m, gpu: g, profile: c.Profile}
	if !c.Incomplete {
		return op, nil
	}
	// Completing writes to the fleet: only for a request the admission
	// would take now, so that a refused create changes nothing there.
	err = m.db.View(func(tx *store.Tx) error {
		_, err := m.admissible(tx, *req, offers)
		return err
	})
	if err != nil {
		return nil, op.end(classify(err, "create %s for tenant %s", req.Profile, req.Tenant))
	}
	if err := f.Complete(ctx, c); err != nil {
		return nil, op.end(classify(err, "complete the allocation of consumer %s", req.UUID))
	}
	return op, nil
}

// fleetConfirms says why a fleet scheduler's create must not be kept
// ("" when it may): the scheduler's allocation is the truth, and a
// scheduler that saw the create fail or time out may have deleted it and
// placed the same consumer elsewhere. Only an allocation that still names
// the record's GPU and profile confirms it. unknown says the fleet could
// not be asked (none configured, Placement not answering).
func (m *Manager) fleetConfirms(ctx context.Context, rec *store.Instance) (why string, unknown bool) {
	f := m.fleetOf()
	if f == nil {
		return "no fleet is configured to confirm the scheduler's allocation", true
	}
	want, ok := m.claimOf(rec)
	if !ok {
		return "the record names no profile the fleet publishes", false
	}
	c, err := f.Adopt(ctx, rec.UUID)
	if err != nil {
		return Message(err), !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalidArgument)
	}
	if c.GPU != rec.GPUUUID || c.Profile != want.Profile || c.Kind != want.Kind {
		return fmt.Sprintf("the allocation now names %s on GPU %s, not %s on GPU %s", c.Profile, c.GPU, want.Profile, rec.GPUPCI), false
	}
	return "", false
}

// fleetKeep checks, once a fleet scheduler's create has carved, that the
// scheduler still holds its allocation here: one that gave up meanwhile
// (deleted it, maybe placed the consumer elsewhere) gets the instance
// undone and the create refused, so that no instance nobody owns is left
// on the host. A fleet that does not answer keeps the instance (the
// allocation was read at the create's start).
func (m *Manager) fleetKeep(ctx context.Context, rec store.Instance) error {
	why, unknown := m.fleetConfirms(ctx, &rec)
	if why == "" || unknown {
		return nil
	}
	m.log.Warn("a fleet create is undone: its scheduler's allocation was deleted or moved while it ran", "instance", rec.UUID, "gpu", rec.GPUPCI, "why", why)
	if err := m.Destroy(ctx, rec.UUID, DestroyOptions{}); err != nil && !errors.Is(err, ErrNotFound) {
		return fail(ErrStaleClaim, err, "the fleet's allocation for %s went while the create ran (%s), and undoing the instance failed", rec.UUID, why)
	}
	return fail(ErrStaleClaim, nil, "the fleet's allocation for %s went while the create ran (%s); the instance was undone on GPU %s (%s): place it again", rec.UUID, why, rec.GPUPCI, rec.Model)
}

// fleetSettle tells the fleet, if there is one, that an operation changed
// GPU gpu (and destroyed instance removed, when not ""). Inside reconcile
// (settleLater), which holds the admission lock, it waits for no fleet
// call: the removal is left to the fleet's next pass, which makes it
// without grace.
func (m *Manager) fleetSettle(ctx context.Context, gpu, removed string) {
	f := m.fleetOf()
	switch {
	case f == nil:
	case ctx.Value(settleLaterKey{}) != nil:
		if removed != "" {
			f.Unclaim(removed)
		}
	default:
		if err := f.Settle(ctx, gpu, removed); err != nil {
			notePlacementBehind(ctx, fmt.Sprintf("Placement not brought up to date before returning (%s); the sync's next pass does it", Message(err)))
		}
	}
}

type settleLaterKey struct{}

// settleLater marks ctx as reconcile's: fleetSettle then calls nothing
// that may wait on the fleet.
func settleLater(ctx context.Context) context.Context {
	return context.WithValue(ctx, settleLaterKey{}, true)
}

// HasInstance reports whether id is an instance of this host now.
func (m *Manager) HasInstance(id string) bool { return m.instanceExists(id) }

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

// fleetSlices is how many slot-grid units an instance of offer o on g
// consumes in the fleet: a MIG instance and a MIG-backed vGPU alone in its
// GPU instance its GPU instance's size; a whole GPU in MIG mode every slot.
// vGPUs of types that share a GPU instance consume none: one GPU
// instance's slots cannot be split among its vGPUs in whole units, so the
// fleet view reserves them once (FleetGPU.Unclaimable).
func (m *Manager) fleetSlices(g *gpu.GPU, o offer) int {
	switch o.kind {
	case store.KindMIG:
		return m.slicesOf(g.Model, o)
	case store.KindMIGVGPU:
		if o.typ.MaxPerGPUInstance <= 1 {
			return m.slicesOf(g.Model, o)
		}
	case store.KindPassthrough:
		if gr := m.grid(g.Model); gr != nil && g.MIG.Enabled {
			return gr.Slices
		}
	}
	return 0
}

// fleetFramebuffer is what an instance of offer o on g takes of g's shared
// framebuffer (sharedFramebuffer): a time-sliced vGPU its type's
// framebuffer, a whole GPU all of it; else 0.
func (m *Manager) fleetFramebuffer(g *gpu.GPU, o offer) uint64 {
	all := m.sharedFramebuffer(g.Model, g.VGPU.Flavour, g.MIG.Enabled, g.VGPU.Heterogeneous)
	switch {
	case all == 0:
		return 0
	case o.kind == store.KindVGPU:
		return o.typ.FramebufferMiB
	case o.kind == store.KindPassthrough:
		return all
	}
	return 0
}

// sharedFramebuffer is the framebuffer, in MiB, the fleet publishes as
// shared by what a time-sliced GPU holds (0 on a MIG GPU or one without a
// vGPU flow), so that Placement itself refuses a whole GPU together with
// any vGPU on it, and vGPUs whose framebuffer exceeds the GPU together. In
// heterogeneous mode it is the GPU's memory, the bound the engine applies
// (placement.VGPURoom); in homogeneous mode the most any one type fills
// (its per-GPU maximum times its framebuffer), so that it never binds a
// type before the type's own maximum does.
func (m *Manager) sharedFramebuffer(model string, flavour gpu.Flavour, mig, het bool) uint64 {
	md, ok := m.catalog().Model(model)
	if !ok || mig || md.VGPU == nil || flavour == gpu.FlavourNone || flavour == "" {
		return 0
	}
	if het {
		return md.MemoryMiB
	}
	var most uint64
	for i := range md.VGPU.Types {
		t := &md.VGPU.Types[i]
		if !t.MIGBacked() && md.HasFlow(t, string(flavour)) {
			most = max(most, uint64(t.MaxInstances)*t.FramebufferMiB)
		}
	}
	return most
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
	// instances, compute instances narrower than their GPU instance, GPU
	// instances whose vGPUs share them).
	Slices, Unclaimable int
	// FramebufferMiB is the framebuffer the vGPUs and a whole GPU share on
	// a time-sliced GPU (sharedFramebuffer; 0 on a MIG GPU).
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
		for i := range s.inv.GPUs {
			if g := &s.inv.GPUs[i]; g.Model != "" {
				out = append(out, m.fleetGPU(s, g))
			}
		}
		return nil
	})
	if err != nil {
		return nil, classify(err, "fleet view")
	}
	return out, nil
}

// FleetGPUByUUID is one GPU of FleetView, read alone (a claim's or a
// settle's look at the GPU it concerns). ErrNotFound: the host has no GPU
// gpuUUID (or one of no known model).
func (m *Manager) FleetGPUByUUID(gpuUUID string) (FleetGPU, error) {
	var out FleetGPU
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		g := m.gpuOf(s, gpuUUID)
		if g == nil || g.Model == "" {
			return fail(ErrNotFound, nil, "no GPU %s on this host", gpuUUID)
		}
		out = m.fleetGPU(s, g)
		return nil
	})
	if err != nil {
		return FleetGPU{}, classify(err, "fleet view of GPU %s", gpuUUID)
	}
	return out, nil
}

// fleetGPU is g as the fleet sees it: its shape (as last seen while it
// answered), state, instances, and a class per profile its mode offers
// with the room roomOn gives.
func (m *Manager) fleetGPU(s *snapshot, g *gpu.GPU) FleetGPU {
	sh := m.shapes.of(g, s)
	fg := FleetGPU{UUID: g.UUID, PCI: g.PCI, Model: g.Model, MIG: sh.mig, Flavour: sh.flavour, Heterogeneous: sh.het}
	fg.State, _ = s.state(g)
	if gr := m.grid(g.Model); gr != nil && fg.MIG {
		fg.Slices = gr.Slices
	}
	fg.FramebufferMiB = m.sharedFramebuffer(g.Model, sh.flavour, fg.MIG, fg.Heterogeneous)
	for _, r := range s.byGPU[g.UUID] {
		if c, ok := m.claimOf(r); ok {
			if fg.FramebufferMiB > 0 {
				c.FramebufferMiB = m.recordFramebuffer(r, fg.FramebufferMiB)
			}
			fg.Instances = append(fg.Instances, c)
		}
	}
	sort.Slice(fg.Instances, func(a, b int) bool { return fg.Instances[a].Instance < fg.Instances[b].Instance })
	rm := m.roomOn(s, g)
	if pg, ok := m.migGPU(s, g); ok && fg.MIG {
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
		// A GPU that takes no MIG instance now publishes no MIG profile.
		for _, p := range pg.Grid.Profiles {
			if n, ok := rm[roomKey{store.KindMIG, p.Name}]; ok {
				fg.Classes = append(fg.Classes, FleetClass{Profile: p.Name, Kind: store.KindMIG, Slices: p.Size, Room: n})
			}
		}
		for _, t := range m.migBackedTypes(g) {
			c := FleetClass{Profile: t.Name, Kind: store.KindMIGVGPU, Room: rm[roomKey{store.KindMIGVGPU, t.Name}]}
			if t.MaxPerGPUInstance <= 1 {
				p, _ := m.giProfile(g.Model, *t.GPUInstanceProfile)
				c.Slices = p.Size
			}
			fg.Classes = append(fg.Classes, c)
		}
	}
	if h, ok := m.vgpuHost(s, g); ok && !fg.MIG {
		var vc []FleetClass
		for name, tc := range h.Types {
			c := FleetClass{Profile: name, Kind: store.KindVGPU, Room: rm[roomKey{store.KindVGPU, name}]}
			if fg.FramebufferMiB > 0 {
				c.FramebufferMiB = tc.FramebufferMiB
			}
			vc = append(vc, c)
		}
		sort.Slice(vc, func(a, b int) bool { return vc[a].Profile < vc[b].Profile })
		fg.Classes = append(fg.Classes, vc...)
	}
	m.passthroughClass(g, &fg, rm)
	return fg
}

// passthroughClass adds the whole-GPU class to fg, with its room (1 on a
// GPU the admission would pass through now: available, nothing carved). A
// whole GPU also takes every slot of a MIG GPU and all the framebuffer of
// a GPU in heterogeneous mode, so that Placement itself refuses a whole
// GPU together with anything carved on it.
func (m *Manager) passthroughClass(g *gpu.GPU, fg *FleetGPU, rm room) {
	if _, ok := m.catalog().Model(fg.Model); !ok {
		return
	}
	c := FleetClass{Profile: ProfilePassthrough, Kind: store.KindPassthrough, FramebufferMiB: fg.FramebufferMiB,
		Room: rm[roomKey{store.KindPassthrough, ProfilePassthrough}]}
	if fg.MIG {
		c.Slices = fg.Slices
	}
	fg.Classes = append(fg.Classes, c)
	for i := range fg.Instances {
		if fg.Instances[i].Kind == store.KindPassthrough {
			fg.Instances[i].Slices = c.Slices
		}
	}
}

// claimOf is what record r holds in the fleet's terms. Compute instances
// narrower than their GPU instance are not published: their GPU instance's
// slots count as unclaimable (reserved on the slice class) once, however
// many share it. A whole GPU's slices are filled in by fleetView, which
// knows whether the GPU is in MIG mode.
func (m *Manager) claimOf(r *store.Instance) (FleetClaim, bool) {
	c := FleetClaim{Instance: r.UUID, GPU: r.GPUUUID, Kind: r.Kind, Unconfirmed: r.FleetConsumer && r.State == store.StateCreating}
	switch r.Kind {
	case store.KindMIG:
		if r.CISlices > 0 {
			return FleetClaim{}, false
		}
		p, ok := m.giProfile(r.Model, r.GIProfileID)
		c.Profile, c.Slices = p.Name, p.Size
		return c, ok
	case store.KindMIGVGPU:
		md, _ := m.catalog().Model(r.Model) // nil for a model the catalog lacks
		if md == nil || r.TypeName == "" {
			return FleetClaim{}, false
		}
		t, ok := md.VGPUTypeByID(r.TypeID)
		if !ok {
			return FleetClaim{}, false
		}
		c.Profile = t.Name
		if t.MaxPerGPUInstance <= 1 {
			p, ok := m.giProfile(r.Model, r.GIProfileID)
			if !ok {
				return FleetClaim{}, false
			}
			c.Slices = p.Size
		}
		return c, true
	case store.KindVGPU:
		c.Profile = r.TypeName
		return c, r.TypeName != ""
	case store.KindPassthrough:
		c.Profile = ProfilePassthrough
		return c, true
	}
	return FleetClaim{}, false
}

// giProfile is the GPU-instance profile id of model's slot grid.
func (m *Manager) giProfile(model string, id int) (placement.Profile, bool) {
	if g := m.grid(model); g != nil {
		for _, p := range g.Profiles {
			if p.ID == id {
				return p, true
			}
		}
	}
	return placement.Profile{}, false
}

// recordFramebuffer is what record r takes of its GPU's shared framebuffer
// (all MiB for a whole GPU).
func (m *Manager) recordFramebuffer(r *store.Instance, all uint64) uint64 {
	switch r.Kind {
	case store.KindPassthrough:
		return all
	case store.KindVGPU:
		if md, ok := m.catalog().Model(r.Model); ok {
			if t, ok := md.VGPUTypeByID(r.TypeID); ok {
				return t.FramebufferMiB
			}
		}
	}
	return 0
}

// fleetShape is what of a GPU's modes its allocations depend on.
type fleetShape struct {
	mig, het bool
	flavour  gpu.Flavour
}

// shapeMemory keeps each GPU's shape as last discovered while it
// answered: discovery of a lost GPU knows its identity but not its modes,
// and its allocations (a whole GPU's slices, a vGPU's framebuffer) must
// keep the shape they were written with, or the sync would rewrite them
// on a provider that is fully reserved.
type shapeMemory struct {
	mu   sync.Mutex
	last map[string]fleetShape
}

func (sm *shapeMemory) of(g *gpu.GPU, s *snapshot) fleetShape {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if sm.last == nil {
		sm.last = map[string]fleetShape{}
	}
	if !g.Lost {
		sh := fleetShape{mig: g.MIG.Enabled, het: g.VGPU.Heterogeneous, flavour: g.VGPU.Flavour}
		sm.last[g.UUID] = sh
		return sh
	}
	if sh, ok := sm.last[g.UUID]; ok {
		return sh
	}
	// Lost since before this process started: its records tell MIG mode.
	sh := fleetShape{mig: g.MIG.Enabled, het: g.VGPU.Heterogeneous, flavour: g.VGPU.Flavour}
	for _, r := range s.byGPU[g.UUID] {
		if r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU {
			sh.mig = true
		}
	}
	return sh
}
