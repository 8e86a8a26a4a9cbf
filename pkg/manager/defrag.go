package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// DefragResult is what Defragment found, and did when applied.
type DefragResult struct {
	Moves []placement.Move `json:"moves"`
	// GPU and Start are where the request fits once the moves are done.
	GPU     string `json:"gpu"`
	Start   int    `json:"start"`
	Applied bool   `json:"applied"`
}

type movePayload struct {
	FromGPU   string `json:"fromGPU"`
	FromPCI   string `json:"fromPCI"`
	FromStart int    `json:"fromStart"`
	FromVF    string `json:"fromVF,omitempty"`
}

// Defragment says which moves of movable MIG instances (not attached to a
// running VM) would admit a request refused for fragmentation, and with
// apply performs them: each instance is destroyed and re-created at its new
// placement with the same identity, and the config of a VM it is attached
// to is updated. A failure moves the instances back, in reverse order.
func (m *Manager) Defragment(ctx context.Context, req CreateRequest, apply bool) (DefragResult, error) {
	done, err := m.begin()
	if err != nil {
		return DefragResult{}, err
	}
	defer done()
	if apply {
		if why := m.Degraded(); why != "" {
			return DefragResult{}, fail(ErrBusy, nil, "carving is disabled: %s", why)
		}
	}
	offers, err := m.resolve(req.Profile)
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

// move re-creates one instance at a new placement with the same identity.
func (m *Manager) move(ctx context.Context, mv placement.Move) error {
	rec, att, err := m.instanceAndAttachment(mv.Instance)
	if err != nil {
		return err
	}
	if rec.State != store.StateReady || (rec.Kind != store.KindMIG && rec.Kind != store.KindMIGVGPU) {
		return fail(ErrBusy, nil, "instance %s is %s %s and cannot move", rec.UUID, rec.State, rec.Kind)
	}
	if att != nil {
		if att.Live {
			return fail(ErrBusy, nil, "instance %s is in use by running VM %s and never moves", rec.UUID, att.Domain)
		}
		if m.lv() != nil {
			if dom, err := m.lv().Domain(ctx, att.Domain); err == nil && dom.Running {
				return fail(ErrBusy, nil, "instance %s is attached to running VM %s and never moves", rec.UUID, att.Domain)
			}
		}
	}
	to := m.hostGPU(mv.ToGPU)
	if to == nil {
		return fail(ErrNotFound, nil, "GPU %s is gone", mv.ToGPU)
	}
	intent := uuid.NewString()
	defer m.live.add(intent, rec.UUID)()
	payload, _ := json.Marshal(movePayload{FromGPU: rec.GPUUUID, FromPCI: rec.GPUPCI, FromStart: rec.GIStart, FromVF: rec.VF})
	if err := m.db.Update(func(tx *store.Tx) error {
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpMove, Instance: rec.UUID, Payload: payload, Started: m.now()})
	}); err != nil {
		return classify(err, "move %s", rec.UUID)
	}
	old := rec
	l := m.gpuLock(rec.GPUUUID)
	l.Lock()
	err = m.release(ctx, &rec, func(string) bool { return true }, false)
	l.Unlock()
	m.refreshGPU(ctx, old.GPUUUID)
	if err != nil {
		_ = m.db.Update(func(tx *store.Tx) error { return tx.DeleteIntent(intent) })
		return err
	}
	rec.GPUUUID, rec.GPUPCI, rec.GIStart, rec.GIID, rec.CIID = to.UUID, to.PCI, mv.ToStart, -1, -1
	if rec.Kind == store.KindMIGVGPU && to.UUID != old.GPUUUID {
		if err := m.pickDevice(&rec, to); err != nil {
			return err
		}
	}
	l = m.gpuLock(rec.GPUUUID)
	l.Lock()
	err = m.carveSteps(ctx, &rec, func(string) error {
		return m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&rec) })
	})
	l.Unlock()
	m.refreshGPU(ctx, rec.GPUUUID)
	if err != nil {
		// Put it back where it was.
		_ = m.release(ctx, &rec, func(string) bool { return true }, false)
		back := old
		back.GIID, back.CIID = -1, -1
		if berr := m.carveSteps(ctx, &back, func(string) error { return nil }); berr != nil {
			back.State, back.Reason = store.StateFailed, fmt.Sprintf("move failed (%v) and so did moving back (%v)", err, berr)
		}
		_ = m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutInstance(&back); err != nil {
				return err
			}
			return tx.DeleteIntent(intent)
		})
		m.refreshGPU(ctx, old.GPUUUID)
		return classify(err, "move %s to %s:%d", rec.UUID, to.PCI, mv.ToStart)
	}
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.PutInstance(&rec); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		return classify(err, "record move of %s", rec.UUID)
	}
	if att != nil && m.lv() != nil && rec.VF != old.VF {
		oldH, _ := m.hostdevOf(old, false)
		newH, _ := m.hostdevOf(rec, false)
		if err := m.lv().Detach(ctx, att.Domain, oldH, rec.UUID); err != nil && !errors.Is(err, ErrNotFound) {
			m.log.Warn("update VM config after move", "vm", att.Domain, "err", err)
		}
		if _, err := m.lv().Attach(ctx, att.Domain, newH, rec.UUID); err != nil {
			m.log.Warn("update VM config after move", "vm", att.Domain, "err", err)
		}
	}
	m.log.Info("moved", "instance", rec.UUID, "from", fmt.Sprintf("%s:%d", old.GPUPCI, old.GIStart), "to", fmt.Sprintf("%s:%d", rec.GPUPCI, rec.GIStart))
	m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
	return nil
}
