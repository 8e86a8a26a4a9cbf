package manager

import (
	"context"
	"errors"
	"fmt"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// The pins of GPU instances that are gone. A pin is kept by its GPU
// instance's profile and placement so that it outlives what takes the GPU
// instance without vgpud meaning it to go (a reboot, a GPU reset, a driver
// reload: restore re-creates the GPU instance there and the pin is set
// again). What vgpud itself ends for good ends the pin with it: the
// destroy that takes a GPU instance away (its last instance destroyed) and
// MIG turned off on the GPU drop the pins there, each with a log line and
// an event. A pin left without its GPU instance otherwise (the GPU
// instance destroyed behind vgpud's back) stays pending, shown with GPU
// instance -1, and an operator drops it by the id its GPU instance last
// had (SetGPUInstanceScheduler, adaptive).

// dropGISchedulerPins drops the pins of GPU g that drop selects, in one
// store transaction, and says so for each (why: what took its GPU
// instance). It returns the pins dropped.
func (m *Manager) dropGISchedulerPins(g gpu.GPU, drop func(store.GPUInstanceScheduler) bool, why string) ([]store.GPUInstanceScheduler, error) {
	var gone []store.GPUInstanceScheduler
	err := m.db.Update(func(tx *store.Tx) error {
		gone = nil
		st, err := tx.GPU(g.UUID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		kept := st.GPUInstanceSchedulers[:0:0]
		for _, p := range st.GPUInstanceSchedulers {
			if drop(p) {
				gone = append(gone, p)
			} else {
				kept = append(kept, p)
			}
		}
		if len(gone) == 0 {
			return nil
		}
		st.GPUInstanceSchedulers = kept
		return tx.PutGPU(st)
	})
	if err != nil {
		return nil, classify(err, "drop the GPU instance scheduler pins of GPU %s", g.PCI)
	}
	for _, p := range gone {
		m.gischeds.set(giKey(g.UUID, p.ProfileID, p.Start), "")
		what := fmt.Sprintf("GPU %s %s: scheduler pin (%s) dropped: %s", g.PCI, pinName(p), schedString(gpu.VGPUScheduler{Policy: p.Policy, Timeslice: p.Timeslice}), why)
		m.log.Info("GPU instance scheduler pin dropped", "gpu", g.PCI, "gpuInstance", pinID(p), "profileID", p.ProfileID, "start", p.Start, "why", why)
		m.emit(Event{Kind: EventPolicySwitched, ID: g.UUID, Op: SchedAdaptive, Detail: what})
	}
	if len(gone) > 0 {
		m.emit(Event{Kind: EventGPUChanged, ID: g.UUID})
	}
	return gone, nil
}

// pinID is the id a pin's GPU instance last had; -1 when not recorded.
func pinID(p store.GPUInstanceScheduler) int {
	if p.GPUInstance == nil {
		return -1
	}
	return *p.GPUInstance
}

// pinName names a pin's GPU instance in messages.
func pinName(p store.GPUInstanceScheduler) string {
	if p.GPUInstance == nil {
		return fmt.Sprintf("GPU instance of profile id %d at %d", p.ProfileID, p.Start)
	}
	return fmt.Sprintf("GPU instance %d (profile id %d at %d)", *p.GPUInstance, p.ProfileID, p.Start)
}

// dropPinsAfterMIGOff drops every GPU-instance pin of g once vgpud has
// turned its MIG mode off: no GPU instance is left for them, and none
// comes back (no record of vgpud's was on the GPU).
func (m *Manager) dropPinsAfterMIGOff(g gpu.GPU) {
	if _, err := m.dropGISchedulerPins(g, func(store.GPUInstanceScheduler) bool { return true }, "MIG was turned off on the GPU"); err != nil {
		m.log.Warn("drop the GPU instance scheduler pins after MIG off", "gpu", g.PCI, "err", err)
	}
}

// dropPinAfterDestroy drops the pin of the GPU instance rec held once a
// destroy of rec has left no GPU instance at its placement (the GPU
// instance went with it). Read after the GPU is re-read.
func (m *Manager) dropPinAfterDestroy(rec store.Instance) {
	if rec.Kind != store.KindMIG && rec.Kind != store.KindMIGVGPU {
		return
	}
	g := m.hostGPU(rec.GPUUUID)
	if g == nil || g.Lost {
		return
	}
	if _, there := giAt(*g, rec.GIProfileID, rec.GIStart); there && g.MIG.Enabled {
		return // shared with another record: the GPU instance stays
	}
	_, err := m.dropGISchedulerPins(*g, func(p store.GPUInstanceScheduler) bool {
		return p.ProfileID == rec.GIProfileID && p.Start == rec.GIStart
	}, fmt.Sprintf("its GPU instance was destroyed with instance %s", rec.UUID))
	if err != nil {
		m.log.Warn("drop the scheduler pin of a destroyed GPU instance", "gpu", rec.GPUPCI, "instance", rec.UUID, "err", err)
	}
}

// dropGonePin drops, for SetGPUInstanceScheduler, the pin of GPU g whose
// GPU instance was giID and is gone: the pins that recorded that id and
// have no GPU instance at their placement now. NotFound when there is
// none.
func (m *Manager) dropGonePin(_ context.Context, g gpu.GPU, giID int) (GPUInstanceSchedulerView, error) {
	gone, err := m.dropGISchedulerPins(g, func(p store.GPUInstanceScheduler) bool {
		if p.GPUInstance == nil || *p.GPUInstance != giID {
			return false
		}
		_, there := giAt(g, p.ProfileID, p.Start)
		return !there || !g.MIG.Enabled
	}, "dropped by the operator (its GPU instance is gone)")
	if err != nil {
		return GPUInstanceSchedulerView{}, err
	}
	if len(gone) == 0 {
		return GPUInstanceSchedulerView{}, fail(ErrNotFound, nil, "GPU %s has no GPU instance %d and no scheduler pin of a GPU instance %d that is gone (vgpuctl gpu show %s lists them)", g.PCI, giID, giID, g.PCI)
	}
	p := gone[0]
	v := GPUInstanceSchedulerView{GPUInstance: -1, ProfileID: p.ProfileID, Start: p.Start, Size: p.Size, SchedulerView: SchedulerView{Mode: SchedAdaptive}}
	if md := m.model(g.Model); md != nil {
		if gp, ok := md.GPUInstanceProfileByID(p.ProfileID); ok {
			v.Profile = gp.Name
		}
	}
	return v, nil
}

// dropIfGone is SetGPUInstanceScheduler's drop of a pin whose GPU
// instance giID is not on GPU g now; gone is false when the GPU has that
// GPU instance (the ordinary path drops its pin) or, on a GPU without
// per-GPU-instance schedulers, no pin at all (the ordinary path refuses
// it by name).
func (m *Manager) dropIfGone(ctx context.Context, g gpu.GPU, giID int) (GPUInstanceSchedulerView, bool, error) {
	l := m.gpuLock(g.UUID)
	l.Lock()
	defer l.Unlock()
	if h := m.hostGPU(g.UUID); h != nil {
		g = *h
	}
	if g.MIG.Enabled && !g.Lost {
		for _, x := range g.MIG.Instances {
			if x.ID == giID {
				return GPUInstanceSchedulerView{}, false, nil
			}
		}
	}
	if md := m.model(g.Model); md == nil || !md.GPUInstanceScheduler() {
		var st store.GPU
		err := m.db.View(func(tx *store.Tx) (err error) { st, err = tx.GPU(g.UUID); return err })
		if err != nil || len(st.GPUInstanceSchedulers) == 0 {
			return GPUInstanceSchedulerView{}, false, nil
		}
	}
	v, err := m.dropGonePin(ctx, g, giID)
	return v, true, err
}

// notePinID records id as the GPU instance of pin p of GPU g (the GPU
// instance re-created at its placement has a new id, or the pin is of an
// older version), so that the pin is named by it once that GPU instance
// is gone. A failed write is tried again at the next pass.
func (m *Manager) notePinID(g gpu.GPU, p store.GPUInstanceScheduler, id int) {
	err := m.db.Update(func(tx *store.Tx) error {
		st, err := tx.GPU(g.UUID)
		if err != nil {
			return err
		}
		for i, q := range st.GPUInstanceSchedulers {
			if q.ProfileID == p.ProfileID && q.Start == p.Start {
				st.GPUInstanceSchedulers[i].GPUInstance = &id
			}
		}
		return tx.PutGPU(st)
	})
	if err != nil {
		m.log.Warn("record the GPU instance of a scheduler pin", "gpu", g.PCI, "gpuInstance", id, "err", err)
	}
}
