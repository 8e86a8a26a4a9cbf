package manager

import (
	"context"
	"errors"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// CreateRequest asks for one instance.
type CreateRequest struct {
	// UUID is the instance's identity. Set it to make retries idempotent: a
	// second Create with the same UUID and request returns the first result.
	UUID    string
	Tenant  string
	Profile string
	// GPU optionally pins the GPU (UUID, PCI address or index).
	GPU      string
	Affinity placement.Affinity
	// Wanted are demand hints for time-sliced vGPUs: how many more of each
	// type (by name) the caller will ask for after this request. An empty
	// GPU is then chosen so that they stay creatable (a homogeneous GPU
	// locks to its first type). Declarative apply sets it.
	Wanted map[string]int
	// PlacementConsumer is the consumer UUID of an allocation a fleet
	// scheduler wrote in Placement for this instance: the create carves
	// what that allocation names, or is refused (fleet.go). It becomes
	// the instance's UUID.
	PlacementConsumer string
}

// Create admits and carves one instance. Admission (tenant quota and host
// capacity) is atomic with every other request: the decision is recorded,
// with an intent, before the admission lock is released. A failure at any
// step undoes the finished ones; the host is left as it was.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (store.Instance, error) {
	done, err := m.beginCarving()
	if err != nil {
		return store.Instance{}, err
	}
	defer done()
	if err := tenant.ValidateName(req.Tenant); err != nil {
		return store.Instance{}, classify(err, "tenant")
	}
	if req.UUID == "" {
		req.UUID = req.PlacementConsumer // "" unless a fleet scheduler claimed
	}
	if req.UUID != "" {
		if req.UUID, err = instanceUUID(req.UUID); err != nil {
			return store.Instance{}, err
		}
		if err := m.refuseForeignUUID(ctx, req.UUID); err != nil {
			return store.Instance{}, err
		}
	} else {
		req.UUID = uuid.NewString()
	}
	offers, err := m.offersFor(req.Profile)
	if err != nil {
		return store.Instance{}, err
	}
	req.Profile = canonicalProfile(req.Profile, offers) // "01c.3g.40gb" is recorded as "1c.3g.40gb"
	claim, err := m.fleetBegin(ctx, &req, offers)
	if err != nil {
		return store.Instance{}, err
	}
	started := m.now()
	intent := uuid.NewString()
	defer m.inflight.add(intent, req.UUID)()
	// From the admission's event to the settle's end: the fleet's pass
	// the events start finds the GPU published by the settle.
	defer m.fleetExpect(ctx)()
	rec, existing, err := m.admitCreate(ctx, req, offers, intent, claim.decided())
	if err != nil || existing {
		return rec, claim.end(ctx, err)
	}
	m.crash(CrashCreateIntent)
	rec, err = m.carve(ctx, rec, intent, started)
	if err == nil && claim != nil && claim.adopted {
		if err := m.fleetKeep(ctx, rec); err != nil {
			return store.Instance{}, err
		}
	}
	if err == nil {
		// A scheduler's next look at the fleet sees the room this took.
		m.fleetSettle(ctx, rec.GPUUUID, "")
	}
	return rec, claim.end(ctx, err)
}

// admitCreate admits req under the admission lock and records it with its
// intent. prior is the decision the create's claim was written for (nil:
// none): taken again when nothing it was made from changed meanwhile.
func (m *Manager) admitCreate(ctx context.Context, req CreateRequest, offers []offer, intent string, prior *basis) (store.Instance, bool, error) {
	m.admit.Lock()
	defer m.admit.Unlock()
	var rec store.Instance
	existing := false
	err := m.db.Update(func(tx *store.Tx) error {
		if prev, err := tx.Instance(req.UUID); err == nil {
			if prev.Tenant != req.Tenant || prev.Profile != req.Profile {
				return fail(ErrConflict, nil, "instance %s exists with tenant %s and profile %s; use another UUID", prev.UUID, prev.Tenant, prev.Profile)
			}
			if prev.State == store.StateCreating {
				return fail(ErrBusy, nil, "instance %s is still being created; retry shortly", prev.UUID)
			}
			rec, existing = prev, true
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		b, err := m.admissibleFrom(tx, req, offers, prior)
		if err != nil {
			return err
		}
		rec = m.record(req, b.d)
		if err := tx.PutInstance(&rec); err != nil {
			return err
		}
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpCreate, Instance: rec.UUID, Started: m.now()})
	})
	if err != nil {
		return store.Instance{}, false, classify(err, "create %s for tenant %s", req.Profile, req.Tenant)
	}
	if !existing {
		m.log.Info("admitted", "instance", rec.UUID, "tenant", rec.Tenant, "profile", rec.Profile, "gpu", rec.GPUPCI, "kind", rec.Kind)
		// The record (state creating) holds its slot and quota from now:
		// readers see it at once.
		m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
	}
	return rec, existing, nil
}

// admissible is the admission's decision for req, recording nothing: the
// tenant, the offers it may use, the placement and its quota.
func (m *Manager) admissible(tx *store.Tx, req CreateRequest, offers []offer) (decision, error) {
	b, err := m.admissibleFrom(tx, req, offers, nil)
	if err != nil {
		return decision{}, err
	}
	return b.d, nil
}

// admissibleFrom is admissible, taking prior's placement again when prior
// was decided from exactly what tx and the host show now (a create's claim
// decided where to carve before the admission lock). The tenant, the
// offers it may use and its quota are checked all the same. It returns
// the decision with what it was made from.
func (m *Manager) admissibleFrom(tx *store.Tx, req CreateRequest, offers []offer, prior *basis) (*basis, error) {
	t, err := tx.Tenant(req.Tenant)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fail(ErrNotFound, err, "tenant %s does not exist; define it with `vgpuctl tenant define %s`", req.Tenant, req.Tenant)
	}
	if err != nil {
		return nil, err
	}
	mine, err := allowed(t.Tenant, offers, req.Profile)
	if err != nil {
		return nil, err
	}
	s, err := m.snapshot(tx)
	if err != nil {
		return nil, err
	}
	b := &basis{tenant: t, s: s, cat: m.catalog()}
	if prior.holds(b) {
		b.d = prior.d
	} else {
		m.decisions.Add(1)
		if b.d, err = m.decide(s, mine, req); err != nil {
			return nil, err
		}
	}
	vram, compute, n := s.usage(req.Tenant)
	if err := t.Admit(tenant.Usage{VRAMBytes: vram, ComputeMilli: compute, Instances: n},
		tenant.Request{VRAMBytes: b.d.o.vram(), ComputeMilli: b.d.o.compute(), Model: b.d.o.model.Name, Profile: b.d.o.name()}); err != nil {
		return nil, classify(err, "admit %s for tenant %s", req.Profile, req.Tenant)
	}
	return b, nil
}

// allowed keeps the offers a tenant may use.
func allowed(t tenant.Tenant, offers []offer, requested string) ([]offer, error) {
	var out []offer
	var lastErr error
	for _, o := range offers {
		err := t.Admit(tenant.Usage{}, tenant.Request{Model: o.model.Name, Profile: o.name()})
		if errors.Is(err, tenant.ErrNotAllowed) {
			// The profile may be allowed under the name it was asked by.
			if err2 := t.Admit(tenant.Usage{}, tenant.Request{Model: o.model.Name, Profile: requested}); !errors.Is(err2, tenant.ErrNotAllowed) {
				out = append(out, o)
				continue
			}
			lastErr = err
			continue
		}
		out = append(out, o)
	}
	if len(out) == 0 && lastErr != nil {
		return nil, classify(lastErr, "profile %s", requested)
	}
	return out, nil
}

func (m *Manager) record(req CreateRequest, d decision) store.Instance {
	r := store.Instance{
		UUID: req.UUID, Tenant: req.Tenant, Kind: d.o.kind, Profile: req.Profile, Model: d.o.model.Name,
		GPUUUID: d.g.UUID, GPUPCI: d.g.PCI,
		GIProfileID: -1, GIStart: -1, GIID: -1, CIProfileID: -1, CIID: -1,
		VRAMBytes: d.o.vram(), ComputeMilli: d.o.compute(), State: store.StateCreating,
		Reason: d.reason, Created: m.now(), Updated: m.now(),
		FleetConsumer: req.PlacementConsumer != "",
	}
	if d.o.gi != nil {
		r.GIProfileID, r.GISize = d.o.gi.ID, d.o.gi.Size
		r.GIStart = d.start
		if d.shared != nil {
			r.GIStart, r.GIID = d.shared.GIStart, d.shared.GIID
		}
	}
	if d.o.ci != nil {
		r.CIProfileID, r.CIStart, r.CISlices = d.o.ci.ID, d.ciStart, d.o.ci.Slices
	}
	if d.o.typ != nil {
		r.TypeID, r.TypeName = d.o.typ.ID, d.o.typ.Name
		switch {
		case d.vf != "":
			r.Flow, r.VF = store.FlowVFIO, d.vf
		case d.parent != "":
			r.Flow, r.MdevParent, r.MdevUUID = store.FlowMdev, d.parent, req.UUID
		}
	}
	return r
}
