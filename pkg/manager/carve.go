package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// undoTimeout bounds undo work when the caller's context is gone.
const undoTimeout = 2 * time.Minute

// carveStep names one host step of a carve. A create records each step it
// finished in its intent (store.Intent.Steps), so the values are stored
// in the database and must never change; a release undoes the steps in
// reverse.
type carveStep string

const (
	// stepGI: the GPU instance was created.
	stepGI carveStep = "gi"
	// stepCI: the compute instance was created.
	stepCI carveStep = "ci"
	// stepVGPU: the vGPU was created (a VF's type set, or an mdev made).
	stepVGPU carveStep = "vgpu"
	// stepMdevWrite: the mdev's create is about to be written, no mdev with
	// its UUID having been found: an mdev with the record's UUID is the
	// record's after a crash or a timeout only with this step
	// (ownership.go). It marks, and releases nothing by itself.
	stepMdevWrite carveStep = "mdev-write"
)

// carve performs the admitted record's steps on the host.
func (m *Manager) carve(ctx context.Context, rec store.Instance, intent string, started time.Time) (store.Instance, error) {
	l := m.gpuLock(rec.GPUUUID)
	l.Lock()
	defer l.Unlock()
	steps := map[carveStep]bool{}
	save := func(step carveStep) error {
		steps[step] = true
		rec.Updated = m.now()
		return m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutInstance(&rec); err != nil {
				return err
			}
			return tx.AppendStep(intent, string(step))
		})
	}
	err := m.carveSteps(ctx, &rec, save)
	if err == nil {
		m.crash(CrashCreateCommit)
		rec.State, rec.Updated = store.StateReady, m.now()
		err = m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutInstance(&rec); err != nil {
				return err
			}
			return tx.DeleteIntent(intent)
		})
	}
	defer m.refreshGPU(context.WithoutCancel(ctx), rec.GPUUUID)
	if err == nil {
		m.log.Info("created", "instance", rec.UUID, "tenant", rec.Tenant, "profile", rec.Profile, "gpu", rec.GPUPCI,
			"gi", rec.GIID, "vf", rec.VF, "mdev", rec.MdevUUID)
		m.emit(Event{Kind: EventInstanceAdded, ID: rec.UUID})
		m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "create", Took: m.now().Sub(started)})
		return rec, nil
	}
	cerr := classify(err, "create %s on GPU %s", rec.Profile, rec.GPUPCI)
	m.log.Warn("create failed", "instance", rec.UUID, "profile", rec.Profile, "gpu", rec.GPUPCI, "err", err)
	m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "create", Detail: Message(cerr), Took: m.now().Sub(started)})
	if !timedOut(ctx, err) {
		m.undoCarve(rec, intent, steps, err)
		return store.Instance{}, cerr
	}
	// A driver or sysfs call outran the deadline and may still land: the
	// caller is answered now, and the undo waits for the host in the
	// background (the record, its quota and its slot stay until then).
	rec.Reason, rec.Updated = "create did not finish in time; vgpud takes it away once the driver answers", m.now()
	if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&rec) }); err != nil {
		m.log.Error("record the pending undo", "instance", rec.UUID, "err", err)
	}
	letGo := m.inflight.add(intent, rec.UUID)
	m.background(func() {
		defer letGo()
		l := m.gpuLock(rec.GPUUUID)
		l.Lock()
		m.undoCarve(rec, intent, steps, err)
		l.Unlock()
		m.refreshGPU(context.Background(), rec.GPUUUID)
		m.emit(Event{Kind: EventInstanceRemoved, ID: rec.UUID})
	})
	return store.Instance{}, cerr
}

// timedOut: an operation failed because a host call outran its deadline
// or the caller gave up, so a call may still be running.
func timedOut(ctx context.Context, err error) bool {
	return errors.Is(err, gpu.ErrTimeout) || ctx.Err() != nil
}

// undoCarve takes away what a failed carve left on the host and drops its
// record and intent. If that fails the record is failed and the intent
// stays: reconcile finishes the undo. The caller holds the GPU's lock.
func (m *Manager) undoCarve(rec store.Instance, intent string, steps map[carveStep]bool, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	parts, uerr := m.carvedParts(ctx, &rec, steps, cause)
	if uerr == nil {
		uerr = m.release(ctx, &rec, func(s carveStep) bool { return parts[s] }, false)
	}
	if uerr != nil {
		rec.State, rec.Reason = store.StateFailed, fmt.Sprintf("create failed (%v) and undo failed (%v)", cause, uerr)
		if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&rec) }); err != nil {
			// The intent stays all the same, and reconcile works from it.
			m.log.Error("record the failed undo", "instance", rec.UUID, "err", err)
		}
		m.log.Error("undo after failed create; reconcile finishes it", "instance", rec.UUID, "err", uerr)
		return
	}
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.DeleteInstance(rec.UUID); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		m.log.Error("drop record after undo", "instance", rec.UUID, "err", err)
	}
}

// carvedParts says which parts of a failed carve the host holds: the steps
// recorded as done, and whatever the host shows once the calls that outran
// their deadline have returned (a step whose call timed out, or whose save
// failed, may have happened all the same). An mdev with the record's UUID
// counts only if the carve wrote its create and the kernel did not answer
// that it existed (cause): another's mdev is never taken away.
func (m *Manager) carvedParts(ctx context.Context, rec *store.Instance, steps map[carveStep]bool, cause error) (map[carveStep]bool, error) {
	if err := m.quiesce(ctx); err != nil {
		return nil, err
	}
	m.refreshGPU(ctx, rec.GPUUUID)
	gi, ci, vg := m.present(rec)
	vg = vg && mdevMayBeOurs(rec, steps[stepMdevWrite], cause)
	return map[carveStep]bool{stepGI: steps[stepGI] || gi, stepCI: steps[stepCI] || ci, stepVGPU: steps[stepVGPU] || vg}, nil
}

// carveSteps runs the host steps of a record, saving after each.
func (m *Manager) carveSteps(ctx context.Context, rec *store.Instance, save func(carveStep) error) error {
	// A record sharing a GPU instance (several vGPUs or compute instances
	// in one) has its GIID from admission: the GI is another record's step.
	// A compute instance admitted beside a record still being created
	// learns it here, or makes the GPU instance itself (giBeside).
	if rec.Kind == store.KindMIG && rec.CISlices > 0 && rec.GIID < 0 {
		id, ok, err := m.giBeside(rec)
		if err != nil {
			return err
		}
		if ok {
			rec.GIID = id
		}
	}
	if (rec.Kind == store.KindMIG || rec.Kind == store.KindMIGVGPU) && rec.GIID < 0 {
		gi, err := m.mig.CreateGPUInstance(ctx, rec.GPUUUID, rec.GIProfileID, rec.GIStart)
		if err != nil {
			return err
		}
		rec.GIID = gi.ID
		if err := save(stepGI); err != nil {
			return err
		}
		m.crash(CrashCreateGI)
	}
	if rec.Kind == store.KindMIG {
		ciProfile, ciStart := ciArgs(rec)
		ci, err := m.mig.CreateComputeInstance(ctx, rec.GPUUUID, rec.GIID, ciProfile, ciStart)
		if err != nil {
			return err
		}
		rec.CIID, rec.CIProfileID = ci.ID, ci.ProfileID
		if err := save(stepCI); err != nil {
			return err
		}
		m.crash(CrashCreateCI)
	}
	if rec.Kind == store.KindVGPU || rec.Kind == store.KindMIGVGPU {
		create := m.createVGPU
		if rec.Flow == store.FlowMdev {
			create = func(ctx context.Context, rec *store.Instance) error { return m.createMdev(ctx, rec, save) }
		}
		if err := create(ctx, rec); err != nil {
			return err
		}
		if err := save(stepVGPU); err != nil {
			return err
		}
		m.crash(CrashCreateVGPU)
		if rec.Kind == store.KindMIGVGPU {
			if err := m.checkGI(ctx, rec); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Manager) createVGPU(ctx context.Context, rec *store.Instance) error {
	vf, typeID, parent, mdev := rec.VF, rec.TypeID, rec.MdevParent, rec.MdevUUID
	switch rec.Flow {
	case store.FlowVFIO:
		return m.sysfsCall(ctx, func() error { return m.vgpu.SetVFType(vf, typeID) })
	case store.FlowMdev:
		return m.sysfsCall(ctx, func() error { return m.vgpu.CreateMdev(parent, typeID, mdev) })
	}
	return fail(ErrBackendFailure, nil, "instance %s has no VF or mdev parent", rec.UUID)
}

// checkGI verifies the driver put a MIG-backed vGPU on the GPU instance
// vgpud chose (the driver picks the GI itself, reference 2.7).
func (m *Manager) checkGI(ctx context.Context, rec *store.Instance) error {
	flow, vfAddr, mdev := rec.Flow, rec.VF, rec.MdevUUID
	got, err := sysfsRead(ctx, m, func() (int, error) {
		switch flow {
		case store.FlowVFIO:
			vf, err := m.vgpu.VF(vfAddr)
			return vf.GPUInstance, err
		case store.FlowMdev:
			md, err := m.vgpu.Mdev(mdev)
			return md.GPUInstance, err
		}
		return -1, nil
	})
	if err != nil {
		return err
	}
	if got >= 0 && got != rec.GIID {
		return fail(ErrConflict, nil, "the driver put the vGPU on GPU instance %d, not on %d that vgpud made for it; destroy the unused GPU instances vgpud did not create and retry", got, rec.GIID)
	}
	return nil
}
