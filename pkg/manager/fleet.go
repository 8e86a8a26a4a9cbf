package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
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
	// Expect tells the fleet that the operation about to emit its events
	// calls Settle before it returns, so that the fleet's own work those
	// events start waits for the settle (bounded) instead of racing it;
	// done ends that, and may be called more than once.
	Expect() (done func())
	// Stale tells the fleet that the host refused consumer's allocation on
	// GPU gpu as stale, and has it publish the GPU again before the
	// refusal returns: the scheduler deletes that allocation and tries
	// its next candidate, and Placement must not then offer the room the
	// allocation held beside totals the host cannot carve. It must not
	// block for long (bounded as Settle).
	Stale(ctx context.Context, consumer, gpu string)
	// Move moves what consumer from holds on this host's providers to
	// consumer to, in one write (as Nova moves an instance's allocation
	// to its migration's consumer and back). It must not fail the
	// migration: what it cannot do the fleet's sync does (from's
	// allocation goes, to's is written as the records say), and the error
	// says what that is.
	Move(ctx context.Context, from, to string) error
}

// FleetClaim is one instance's share of one GPU, as the fleet holds it:
// what Placement counts it in (slices, shared framebuffer) is the
// fleet's to derive from the GPU.
type FleetClaim struct {
	Instance string
	// GPU is the GPU's UUID.
	GPU string
	// Profile is the canonical profile name on the GPU's model (a MIG
	// profile name such as 3g.40gb, or a vGPU type name).
	Profile string
	Kind    store.InstanceKind
	// Incomplete marks an adopted allocation that lacks the shared units
	// the fleet counts its profile in (see Fleet.Complete).
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
	// basis is the admission's decision the claim was written for.
	basis *basis
	// For an adopted create: the manager, the GPU and the profile the
	// allocation names, which a stale refusal reports.
	m       *Manager
	gpu     gpu.GPU
	profile string
}

// end drops a claim the failed create wrote and names a refused adopted
// create as stale (ErrStaleClaim), with this host's GPU and what took the
// room there, the fleet told first (Fleet.Stale). A nil op passes err
// through.
func (op *fleetOp) end(ctx context.Context, err error) error {
	if op == nil || err == nil {
		return err
	}
	if op.claimed {
		op.f.Unclaim(op.instance)
	}
	if op.adopted && errors.Is(err, ErrNoCapacity) {
		op.f.Stale(ctx, op.instance, op.gpu.UUID)
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
	var b *basis
	err := m.db.View(func(tx *store.Tx) error {
		// The claim names the GPU the admission will pin: the admission's
		// own decision, without recording it.
		var err error
		b, err = m.admissibleFrom(tx, *req, offers, nil)
		return err
	})
	if err != nil || b.d.o.ci != nil {
		// The admission gives the refusal its proper message; compute
		// instances narrower than their GPU instance are not published
		// and so not claimed.
		return nil, nil
	}
	d := b.d
	c := FleetClaim{Instance: req.UUID, GPU: d.g.UUID, Profile: d.o.name(), Kind: d.o.kind}
	if err := f.Claim(ctx, c); err != nil {
		if errors.Is(err, ErrNoCapacity) {
			return nil, fail(ErrNoCapacity, err, "the fleet has given the last room for %s on GPU %s away; retry or choose another GPU", c.Profile, d.g.PCI)
		}
		m.log.Warn("fleet claim not written; the sync writes it later", "instance", req.UUID, "err", err)
		notePlacementBehind(ctx, fmt.Sprintf("allocation not written before carving (%s); the sync writes it", Message(err)))
		return nil, nil
	}
	// The claim names this GPU: the admission must carve there, and takes
	// this decision again unless what it was made from changed.
	req.GPU = d.g.UUID
	return &fleetOp{f: f, instance: req.UUID, claimed: true, basis: b}, nil
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
		if o.model.Name == g.Model && o.name() == c.Profile && o.kind == c.Kind {
			ok = true
		}
	}
	if !ok {
		return nil, fail(ErrInvalidArgument, nil, "the allocation of consumer %s is for %s on GPU %s; the request asks %s", req.UUID, c.Profile, g.PCI, req.Profile)
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
		return nil, op.end(ctx, classify(err, "create %s for tenant %s", req.Profile, req.Tenant))
	}
	if err := f.Complete(ctx, c); err != nil {
		return nil, op.end(ctx, classify(err, "complete the allocation of consumer %s", req.UUID))
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
	// Compute instances narrower than their GPU instance are not published.
	want, ok := m.recordProfile(rec)
	if !ok || (rec.Kind == store.KindMIG && rec.CISlices > 0) {
		return "the record names no profile the fleet publishes", false
	}
	// A scheduler's create waits for a slow Placement longer (Adopt's own
	// bound); a confirmation runs under the admission lock (at start,
	// before READY), and one that Placement does not answer settles
	// nothing more than a short one: it waits as a claim does.
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	c, err := f.Adopt(ctx, rec.UUID)
	if err != nil {
		return Message(err), !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalidArgument)
	}
	if c.GPU != rec.GPUUUID || c.Profile != want || c.Kind != rec.Kind {
		return fmt.Sprintf("the allocation now names %s on GPU %s, not %s on GPU %s", c.Profile, c.GPU, want, rec.GPUPCI), false
	}
	return "", false
}

// confirmTimeout bounds fleetConfirms' read of the scheduler's
// allocation: the default claimTimeout.
const confirmTimeout = 2 * time.Second

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

// fleetExpect tells the fleet, if there is one, that the operation about
// to emit its events settles (fleetSettle) before it returns; the returned
// func ends that. Inside reconcile nothing settles, and nothing is told.
func (m *Manager) fleetExpect(ctx context.Context) (done func()) {
	f := m.fleetOf()
	if f == nil || ctx.Value(settleLaterKey{}) != nil {
		return func() {}
	}
	return f.Expect()
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
