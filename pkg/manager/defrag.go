package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// DefragResult is what Defragment found, and did when applied.
type DefragResult struct {
	Moves []placement.Move `json:"moves"`
	// GPU and Start are where the request fits once the moves are done.
	GPU     string `json:"gpu"`
	Start   int    `json:"start"`
	Applied bool   `json:"applied"`
}

// movePayload is a move's plan: where the instance was and where it goes.
// Reconcile uses it after a crash to take away whatever the host holds at
// the placement the record does not name.
type movePayload struct {
	FromGPU   string `json:"fromGPU"`
	FromPCI   string `json:"fromPCI"`
	FromStart int    `json:"fromStart"`
	FromVF    string `json:"fromVF,omitempty"`
	ToGPU     string `json:"toGPU"`
	ToPCI     string `json:"toPCI"`
	ToStart   int    `json:"toStart"`
	ToVF      string `json:"toVF,omitempty"`
}

// Defragment says which moves of movable MIG instances (not attached to a
// running VM) would admit a request refused for fragmentation, and with
// apply performs them: each instance is destroyed and re-created at its new
// placement with the same identity, and the config of a VM it is attached
// to is updated. A failure moves the instances back, in reverse order.
func (m *Manager) Defragment(ctx context.Context, req CreateRequest, apply bool) (DefragResult, error) {
	begin := m.begin
	if apply {
		begin = m.beginCarving
	}
	done, err := begin()
	if err != nil {
		return DefragResult{}, err
	}
	defer done()
	// The same checks as Create: moves made for a request that could
	// never be admitted (a tenant or GPU that does not exist) would be
	// churn for nothing.
	if err := m.knownTenant(req.Tenant); err != nil {
		return DefragResult{}, err
	}
	if req.GPU != "" {
		if _, err := m.gpuByAnyID(req.GPU); err != nil {
			return DefragResult{}, err
		}
	}
	offers, err := m.offersFor(req.Profile)
	if err != nil {
		return DefragResult{}, err
	}
	m.admit.Lock()
	defer m.admit.Unlock()
	var res DefragResult
	var s *snapshot
	err = m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err })
	if err != nil {
		return res, classify(err, "defragment")
	}
	moves, d, err := m.defragPlan(s, offers, req)
	if err != nil {
		return res, classify(err, "defragment for %s", req.Profile)
	}
	res.Moves, res.GPU, res.Start = moves, d.GPU, d.Start
	if !apply || len(moves) == 0 {
		return res, nil
	}
	var moved []placement.Move
	for _, mv := range moves {
		if err := m.move(ctx, mv); err != nil {
			m.log.Warn("defragment move failed; moving back", "move", mv.String(), "err", err)
			for i := len(moved) - 1; i >= 0; i-- {
				back := moved[i]
				back.FromGPU, back.FromStart, back.ToGPU, back.ToStart = back.ToGPU, back.ToStart, back.FromGPU, back.FromStart
				if berr := m.move(context.WithoutCancel(ctx), back); berr != nil {
					m.log.Error("move back after failed defragment", "move", back.String(), "err", berr)
				}
			}
			return res, err
		}
		moved = append(moved, mv)
	}
	res.Applied = true
	return res, nil
}

// move re-creates one instance at a new placement with the same identity:
// release the old placement, carve the new one, re-point the config of a
// stopped VM it is attached to. A failure at any step takes away what the
// new placement got and carves the old one again; a crash is resolved by
// reconcile from the intent's plan.
func (m *Manager) move(ctx context.Context, mv placement.Move) error {
	rec, att, err := m.instanceAndAttachment(mv.Instance)
	if err != nil {
		return err
	}
	if rec.State != store.StateReady || (rec.Kind != store.KindMIG && rec.Kind != store.KindMIGVGPU) {
		return fail(ErrBusy, nil, "instance %s is %s %s and cannot move", rec.UUID, rec.State, rec.Kind)
	}
	if att != nil {
		if err := m.stoppedVM(ctx, rec.UUID, att); err != nil {
			return err
		}
	}
	to := m.hostGPU(mv.ToGPU)
	if to == nil {
		return fail(ErrNotFound, nil, "GPU %s is gone", mv.ToGPU)
	}
	old := rec
	next := rec
	next.GPUUUID, next.GPUPCI, next.GIStart, next.GIID, next.CIID = to.UUID, to.PCI, mv.ToStart, -1, -1
	if next.Kind == store.KindMIGVGPU && to.UUID != old.GPUUUID {
		if err := m.pickDevice(&next, to); err != nil {
			return err
		}
	}
	intent := uuid.NewString()
	defer m.inflight.add(intent, rec.UUID)()
	// Marshal cannot fail: the plan is strings and ints.
	payload, _ := json.Marshal(movePayload{FromGPU: old.GPUUUID, FromPCI: old.GPUPCI, FromStart: old.GIStart, FromVF: old.VF,
		ToGPU: next.GPUUUID, ToPCI: next.GPUPCI, ToStart: next.GIStart, ToVF: next.VF})
	if err := m.db.Update(func(tx *store.Tx) error {
		r, err := tx.Instance(rec.UUID)
		if err != nil {
			return err
		}
		if r != rec {
			return fail(ErrConflict, nil, "instance %s changed meanwhile; plan again", rec.UUID)
		}
		if err := busy(tx, rec.UUID); err != nil {
			return err
		}
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpMove, Instance: rec.UUID, Payload: payload, Started: m.now()})
	}); err != nil {
		return classify(err, "move %s", rec.UUID)
	}
	undo := context.WithoutCancel(ctx)
	l := m.gpuLock(old.GPUUUID)
	l.Lock()
	err = m.release(ctx, &rec, func(carveStep) bool { return true }, false)
	l.Unlock()
	m.refreshGPU(undo, old.GPUUUID)
	if err != nil {
		m.putBack(undo, old, intent, "move")
		return classify(err, "move %s: release it at %s:%d", rec.UUID, old.GPUPCI, old.GIStart)
	}
	m.crash(CrashMoveRelease)
	steps := map[carveStep]bool{}
	l = m.gpuLock(next.GPUUUID)
	l.Lock()
	err = m.carveSteps(ctx, &next, func(step carveStep) error {
		steps[step] = true
		return m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&next) })
	})
	l.Unlock()
	m.refreshGPU(undo, next.GPUUUID)
	if err == nil {
		m.crash(CrashMoveCarve)
		err = m.repoint(ctx, att, old, next)
	}
	if err != nil {
		m.unmove(undo, att, old, next, steps, intent, err)
		return classify(err, "move %s to %s:%d", rec.UUID, to.PCI, mv.ToStart)
	}
	next.Updated = m.now()
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.PutInstance(&next); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		return classify(err, "record move of %s", rec.UUID)
	}
	m.log.Info("moved", "instance", rec.UUID, "from", fmt.Sprintf("%s:%d", old.GPUPCI, old.GIStart), "to", fmt.Sprintf("%s:%d", next.GPUPCI, next.GIStart))
	m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
	return nil
}

// stoppedVM refuses to move an instance unless its VM is known to be
// stopped (or gone): an instance behind a running VM never moves, and one
// whose VM cannot be asked is treated as running.
func (m *Manager) stoppedVM(ctx context.Context, id string, att *store.Attachment) error {
	if att.Live {
		return fail(ErrBusy, nil, "instance %s is in use by running VM %s and never moves", id, att.Domain)
	}
	v := m.lv()
	if v == nil || !virtReady(v) {
		return fail(ErrBusy, nil, "instance %s is attached to VM %s and libvirt is not connected to confirm it is stopped; it stays", id, att.Domain)
	}
	dom, err := v.Domain(ctx, att.Domain)
	switch {
	case errors.Is(err, virt.ErrDomainNotFound):
		return nil
	case err != nil:
		return fail(ErrBusy, err, "instance %s is attached to VM %s, which libvirt could not confirm is stopped; it stays", id, att.Domain)
	case dom.Running:
		return fail(ErrBusy, nil, "instance %s is attached to running VM %s and never moves", id, att.Domain)
	}
	return nil
}

// repoint makes a stopped VM's config name a moved instance's new device
// (a MIG-backed vGPU on another GPU has another VF).
func (m *Manager) repoint(ctx context.Context, att *store.Attachment, old, next store.Instance) error {
	if att == nil || m.lv() == nil {
		return nil
	}
	oldH, err := m.hostdevOf(old, false, false)
	if err != nil {
		return err
	}
	newH, err := m.hostdevOf(next, false, false)
	if err != nil || sameDevice(oldH, newH) {
		return err
	}
	if err := m.lv().Detach(ctx, att.Domain, oldH, old.UUID); err != nil && !errors.Is(err, virt.ErrDomainNotFound) {
		return classifyVirt(err, "take the old device of %s out of VM %s", old.UUID, att.Domain)
	}
	if _, err := m.lv().Attach(ctx, att.Domain, newH, next.UUID); err != nil && !errors.Is(err, virt.ErrDomainNotFound) {
		return classifyVirt(err, "give the moved %s to VM %s", next.UUID, att.Domain)
	}
	return nil
}

// unmove undoes a move that failed after the old placement was released:
// what the new placement got is taken away, the old one carved again, and
// the VM's config pointed back at it.
func (m *Manager) unmove(ctx context.Context, att *store.Attachment, old, next store.Instance, steps map[carveStep]bool, intent string, cause error) {
	uctx, cancel := context.WithTimeout(ctx, undoTimeout)
	defer cancel()
	parts, err := m.carvedParts(uctx, &next, steps, cause)
	if err == nil {
		l := m.gpuLock(next.GPUUUID)
		l.Lock()
		err = m.release(uctx, &next, func(s carveStep) bool { return parts[s] }, false)
		l.Unlock()
		m.refreshGPU(uctx, next.GPUUUID)
	}
	if err != nil {
		// The new placement may still hold parts: the intent stays, so
		// reconcile takes them away (from the plan) and restores the record.
		m.log.Error("undo a failed move; reconcile finishes it", "instance", old.UUID, "err", err)
		return
	}
	if att != nil && m.lv() != nil {
		// Errors are dropped: a plain MIG instance has no device (both
		// fail, the empty devices compare equal, and nothing is
		// re-pointed), and a MIG-backed vGPU always has one.
		oldH, _ := m.hostdevOf(old, false, false)
		newH, _ := m.hostdevOf(next, false, false) // dropped as above
		if !sameDevice(oldH, newH) {
			if err := m.lv().Detach(uctx, att.Domain, newH, next.UUID); err != nil && !errors.Is(err, virt.ErrDomainNotFound) {
				m.log.Warn("take the new device out of VM after a failed move", "vm", att.Domain, "instance", old.UUID, "err", err)
			}
			if _, err := m.lv().Attach(uctx, att.Domain, oldH, old.UUID); err != nil && !errors.Is(err, virt.ErrDomainNotFound) {
				m.log.Warn("point VM back at the unmoved device; reconcile re-points it", "vm", att.Domain, "instance", old.UUID, "err", err)
			}
		}
	}
	back := old
	back.GIID, back.CIID = -1, -1
	back.Generation = next.Generation // the record holds next now
	m.putBack(uctx, back, intent, "move")
}
