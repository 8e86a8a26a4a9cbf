package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// resolveLeftover resolves a taken intent if it is still on disk: one
// that is gone was completed by its operation after Intents was read.
func (m *Manager) resolveLeftover(ctx context.Context, it store.Intent, rep *ReconcileReport) error {
	err := m.db.View(func(tx *store.Tx) error { _, err := tx.Intent(it.ID); return err })
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return m.resolveIntent(ctx, it, rep)
}

// resolveIntent resolves one intent a crash left, by the kind of its
// operation, against the record it names (missing: the record is gone).
func (m *Manager) resolveIntent(ctx context.Context, it store.Intent, rep *ReconcileReport) error {
	if it.Op == store.OpMIGMode {
		return m.resolveMIGMode(ctx, it, rep)
	}
	var rec store.Instance
	err := m.db.View(func(tx *store.Tx) (err error) { rec, err = tx.Instance(it.Instance); return err })
	missing := errors.Is(err, store.ErrNotFound)
	if err != nil && !missing {
		return err
	}
	switch it.Op {
	case store.OpCreate:
		return m.resolveCreate(ctx, it, rec, missing, rep)
	case store.OpDestroy:
		return m.resolveDestroy(ctx, it, rec, missing, rep)
	case store.OpAttach, store.OpDetach:
		return m.resolveAttach(ctx, it, rec, missing, rep)
	case store.OpMove:
		return m.resolveMove(ctx, it, rec, missing, rep)
	case store.OpCreateAttach:
		return m.resolveCreateAttach(ctx, it, rec, missing, rep)
	case store.OpOutgoing:
		return m.resolveOutgoing(ctx, it, rec, missing, rep)
	case store.OpIncoming:
		return m.resolveIncoming(ctx, it, rec, missing, rep)
	}
	// No operation of the manager writes any other kind (the store allows
	// OpReconcile): such an intent names nothing to resolve.
	return m.dropIntent(it.ID)
}

// dropIntent deletes a resolved intent.
func (m *Manager) dropIntent(id string) error {
	return m.db.Update(func(tx *store.Tx) error { return tx.DeleteIntent(id) })
}

// resolveCreate commits a create whose parts are all on the host (for a
// fleet scheduler's consumer, only while its allocation still names it:
// fleetConfirms), and otherwise releases the parts it finds (by placement and device: a crash
// can fall between a driver call and its record) and drops the record.
func (m *Manager) resolveCreate(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	if missing {
		return m.dropIntent(it.ID)
	}
	gi, ci, vg := m.present(&rec)
	// An mdev with the record's UUID that the create never wrote is
	// another's: it neither completes the record nor is released with it.
	vg = vg && mdevMayBeOurs(&rec, intentWrote(it), nil)
	done := complete(&rec, gi, ci, vg)
	if done && rec.FleetConsumer {
		if why, _ := m.fleetConfirms(ctx, &rec); why != "" {
			m.log.Warn("a fleet create cut off is undone: its scheduler's allocation does not confirm it", "instance", rec.UUID, "gpu", rec.GPUPCI, "why", why)
			done = false
		}
	}
	if done {
		rec.State, rec.Updated = store.StateReady, m.now()
		if err := m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutInstance(&rec); err != nil {
				return err
			}
			return tx.DeleteIntent(it.ID)
		}); err != nil {
			return err
		}
		rep.Finished = append(rep.Finished, rec.UUID)
		m.emit(Event{Kind: EventInstanceAdded, ID: rec.UUID})
		return nil
	}
	parts := map[carveStep]bool{stepGI: gi, stepCI: ci, stepVGPU: vg}
	// Under the GPU's lock, as every other release: an on-demand reconcile
	// runs beside creates that may be carving on the same GPU.
	l := m.gpuLock(rec.GPUUUID)
	l.Lock()
	err := m.release(ctx, &rec, func(s carveStep) bool { return parts[s] }, false)
	l.Unlock()
	if err != nil {
		return err
	}
	m.refreshGPU(ctx, rec.GPUUUID)
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.DeleteInstance(rec.UUID); err != nil {
			return err
		}
		return tx.DeleteIntent(it.ID)
	}); err != nil {
		return err
	}
	rep.Undone = append(rep.Undone, rec.UUID)
	return nil
}

// resolveDestroy finishes a destroy.
func (m *Manager) resolveDestroy(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	if missing {
		return m.dropIntent(it.ID)
	}
	m.present(&rec)
	if err := m.finishDestroy(ctx, rec, it.ID, it.Started); err != nil {
		return err
	}
	rep.Finished = append(rep.Finished, rec.UUID)
	return nil
}

// resolveAttach resolves an attach or a detach against the domain's XML;
// it waits (ErrBusy) while libvirt is not connected yet.
func (m *Manager) resolveAttach(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	var p attachPayload
	if err := json.Unmarshal(it.Payload, &p); err != nil {
		// A payload that cannot be read names no domain, so libvirt cannot
		// be asked: the intent is dropped below, and the libvirt pass
		// checks the instance's attachment against the domains.
		m.log.Warn("read the VM of an interrupted attach or detach", "intent", it.ID, "op", it.Op, "instance", it.Instance, "err", err)
	}
	if v := m.lv(); v != nil && !virtReady(v) {
		// Resolved once libvirt is connected (it reconciles again).
		return fail(ErrBusy, nil, "libvirt is not connected yet")
	}
	if !missing && m.lv() != nil && p.Domain != "" {
		if err := m.resolveAgainstDomain(ctx, rec, p, it.Op == store.OpAttach); err != nil {
			return err
		}
	}
	if err := m.dropIntent(it.ID); err != nil {
		return err
	}
	rep.Finished = append(rep.Finished, it.Instance)
	return nil
}

// resolveMove resolves a move from its plan (clearOtherPlacement).
func (m *Manager) resolveMove(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	if missing {
		return m.dropIntent(it.ID)
	}
	if err := m.clearOtherPlacement(ctx, rec, it.Payload); err != nil {
		return err
	}
	if err := m.dropIntent(it.ID); err != nil {
		return err
	}
	// restore (later in this pass) carves whatever the record's own
	// placement lacks.
	rep.Finished = append(rep.Finished, rec.UUID)
	return nil
}

// clearOtherPlacement resolves a move a crash interrupted: the record names
// the placement it holds (old or new), and whatever the host shows at the
// other one, unless another record explains it, is taken away.
func (m *Manager) clearOtherPlacement(ctx context.Context, rec store.Instance, payload []byte) error {
	var p movePayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return fmt.Errorf("move plan of %s: %w", rec.UUID, err)
	}
	other := rec
	if rec.GPUUUID == p.ToGPU && rec.GIStart == p.ToStart {
		other.GPUUUID, other.GPUPCI, other.GIStart, other.VF = p.FromGPU, p.FromPCI, p.FromStart, p.FromVF
	} else {
		other.GPUUUID, other.GPUPCI, other.GIStart, other.VF = p.ToGPU, p.ToPCI, p.ToStart, p.ToVF
	}
	other.GIID, other.CIID = -1, -1
	g := m.hostGPU(other.GPUUUID)
	if g == nil || g.Lost {
		return nil // nothing to take away there
	}
	gi, ci, vg := m.present(&other)
	var s *snapshot
	if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
		return err
	}
	for _, r := range s.giRecords(other.GPUUUID, other.GIStart, other.GIProfileID) {
		if r.UUID != rec.UUID {
			gi, ci = false, false // another record's GPU instance
		}
	}
	for _, r := range s.byGPU[other.GPUUUID] {
		if other.VF != "" && r.VF == other.VF {
			vg = false // the record's own VF, or another record's
		}
	}
	if other.Flow == store.FlowMdev {
		vg = false // an mdev keeps its UUID: it is the record's own
	}
	if !gi && !ci && !vg {
		return nil
	}
	l := m.gpuLock(other.GPUUUID)
	l.Lock()
	defer l.Unlock()
	parts := map[carveStep]bool{stepGI: gi, stepCI: ci, stepVGPU: vg}
	m.dirty[other.GPUUUID] = true
	return m.release(ctx, &other, func(s carveStep) bool { return parts[s] }, false)
}

// resolveCreateAttach resolves a create-and-attach a crash interrupted (its
// create and attach intents, resolved first, resolved each half): an
// instance it made that is not attached is destroyed, as the call would
// have done.
func (m *Manager) resolveCreateAttach(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	if missing {
		return m.dropIntent(it.ID)
	}
	attached := false
	var destroy string
	err := m.db.Update(func(tx *store.Tx) error {
		if _, err := tx.Attachment(rec.UUID); err == nil {
			attached = true
			return tx.DeleteIntent(it.ID)
		}
		r, err := tx.Instance(rec.UUID)
		if err != nil {
			return err
		}
		r.State, r.Updated = store.StateDestroying, m.now()
		if err := tx.PutInstance(&r); err != nil {
			return err
		}
		destroy = uuid.NewString()
		if err := tx.PutIntent(store.Intent{ID: destroy, Op: store.OpDestroy, Instance: r.UUID, Started: m.now()}); err != nil {
			return err
		}
		return tx.DeleteIntent(it.ID)
	})
	if err != nil || attached {
		return err
	}
	if err := m.finishDestroy(ctx, rec, destroy, it.Started); err != nil {
		return err
	}
	rep.Undone = append(rep.Undone, rec.UUID)
	return nil
}

// resolveAgainstDomain finishes an attach (record what libvirt holds) or a detach
// (remove it from libvirt and the record) that a crash interrupted.
func (m *Manager) resolveAgainstDomain(ctx context.Context, rec store.Instance, p attachPayload, attach bool) error {
	h, err := m.hostdevOf(rec, p.Display, p.RamFB)
	if err != nil {
		return err
	}
	dom, err := m.lv().Domain(ctx, p.Domain)
	if errors.Is(err, virt.ErrDomainNotFound) {
		return m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(rec.UUID) })
	}
	if err != nil {
		return err
	}
	if !attach {
		if err := m.lv().Detach(ctx, dom.Name, h, rec.UUID); err != nil {
			return err
		}
		return m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(rec.UUID) })
	}
	held, err := m.lv().Attached(ctx, dom.Name)
	if err != nil {
		return err
	}
	for _, a := range held {
		if a.Config && sameDevice(a.Hostdev, h) {
			if !a.MetadataConfig || a.Instance != rec.UUID {
				// Attach again (idempotent): it writes the metadata entry
				// an interrupted attach may lack.
				if _, err := m.lv().Attach(ctx, dom.Name, h, rec.UUID); err != nil {
					return err
				}
			}
			return m.db.Update(func(tx *store.Tx) error {
				return tx.PutAttachment(store.Attachment{Instance: rec.UUID, Domain: dom.Name, DomainUUID: dom.UUID, URI: m.lv().URI(), Live: a.Live, Created: m.now()})
			})
		}
	}
	// The attach never reached the config: clear any metadata it left.
	return m.lv().Detach(ctx, dom.Name, h, rec.UUID)
}
