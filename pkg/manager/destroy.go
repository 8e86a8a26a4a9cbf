package manager

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/store"
)

// DestroyOptions modify Destroy.
type DestroyOptions struct {
	// Detach first detaches the instance from its VM; without it an
	// attached instance is refused.
	Detach bool
}

// Destroy releases an instance from the host and forgets it. An attached
// instance is refused with ErrBusy unless opts.Detach. A second Destroy of
// the same UUID returns ErrNotFound and changes nothing.
func (m *Manager) Destroy(ctx context.Context, id string, opts DestroyOptions) error {
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	rec, att, err := m.instanceAndAttachment(id)
	if err != nil {
		return err
	}
	if att != nil {
		if !opts.Detach {
			return fail(ErrBusy, nil, "instance %s is attached to VM %s; detach it first (`vgpuctl detach %s %s`) or destroy with --detach", rec.UUID, att.Domain, att.Domain, rec.UUID)
		}
		if err := m.Detach(ctx, rec.UUID); err != nil {
			return err
		}
	}
	intent := uuid.NewString()
	defer m.inflight.add(intent, rec.UUID)()
	started := m.now()
	m.admit.Lock()
	err = m.db.Update(func(tx *store.Tx) error {
		r, err := tx.Instance(rec.UUID)
		if err != nil {
			return err
		}
		if r.State == store.StateCreating {
			return fail(ErrBusy, nil, "instance %s is being created; retry when it is ready", r.UUID)
		}
		if _, err := tx.Attachment(r.UUID); err == nil {
			return fail(ErrBusy, nil, "instance %s was attached meanwhile; detach it first", r.UUID)
		}
		if err := busy(tx, r.UUID); err != nil {
			return err
		}
		r.State, r.Updated = store.StateDestroying, m.now()
		if err := tx.PutInstance(&r); err != nil {
			return err
		}
		rec = r
		return tx.PutIntent(store.Intent{ID: intent, Op: store.OpDestroy, Instance: r.UUID, Started: m.now()})
	})
	m.admit.Unlock()
	if err != nil {
		return classify(err, "destroy %s", id)
	}
	m.crash(CrashDestroyStart)
	defer m.fleetExpect(ctx)()
	err = m.finishDestroy(ctx, rec, intent, started)
	switch {
	case err == nil:
	case timedOut(ctx, err):
		// A release call may still land: answer now, put the instance back
		// once the host has quiesced (the intent stays held until then).
		letGo := m.inflight.add(intent, rec.UUID)
		m.background(func() {
			defer letGo()
			m.putBack(context.Background(), rec, intent, "destroy")
		})
	default:
		// The caller is told the destroy failed, so the instance must stay:
		// put back what the release took and drop the intent (a crash in
		// between is rolled forward by reconcile instead).
		m.putBack(context.WithoutCancel(ctx), rec, intent, "destroy")
	}
	return err
}

// putBack brings an instance back to ready after an operation (what) failed
// half-way: once the host has quiesced, the parts the operation removed are
// carved again, as reconcile does after a reboot, and the operation's
// intent is dropped. If that fails too the record is failed, with the
// reason, and reconcile keeps trying. When the host does not quiesce (a
// driver call hangs) the intent stays for reconcile.
func (m *Manager) putBack(ctx context.Context, rec store.Instance, intent, what string) {
	ctx, cancel := context.WithTimeout(ctx, undoTimeout)
	defer cancel()
	if err := m.quiesce(ctx); err != nil {
		// A call that outran its deadline may still land: what the host
		// holds is unknown, so the operation is left to reconcile (its
		// intent stays).
		rec.State, rec.Reason, rec.Updated = store.StateFailed, what+" did not finish (the driver did not answer); reconcile resolves it", m.now()
		if err := m.db.Update(func(tx *store.Tx) error { return tx.PutInstance(&rec) }); err != nil {
			m.log.Error("record the unfinished "+what, "instance", rec.UUID, "err", err)
		}
		m.log.Warn(what+" failed and the host has not quiesced; reconcile resolves it", "instance", rec.UUID, "err", err)
		m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
		return
	}
	m.refreshGPU(ctx, rec.GPUUUID)
	rec.State, rec.Reason = store.StateReady, ""
	l := m.gpuLock(rec.GPUUUID)
	restored := func() error {
		g := m.hostGPU(rec.GPUUUID)
		if g == nil || g.Lost {
			return fail(ErrGPULost, nil, "GPU %s is gone", rec.GPUPCI)
		}
		gi, ci, vg := m.present(&rec)
		if complete(&rec, gi, ci, vg) {
			return nil
		}
		l.Lock()
		defer l.Unlock()
		return m.recreate(ctx, &rec, g, gi, ci)
	}()
	if restored != nil {
		rec.State, rec.Reason = store.StateFailed, what+" failed and the instance could not be restored: "+Message(restored)
	}
	rec.Updated = m.now()
	if err := m.db.Update(func(tx *store.Tx) error {
		if err := tx.PutInstance(&rec); err != nil {
			return err
		}
		return tx.DeleteIntent(intent)
	}); err != nil {
		m.log.Error("record the undone "+what, "instance", rec.UUID, "err", err)
	}
	m.refreshGPU(ctx, rec.GPUUUID)
	m.log.Warn(what+" failed; instance kept", "instance", rec.UUID, "state", rec.State, "reason", rec.Reason)
	m.emit(Event{Kind: EventInstanceChanged, ID: rec.UUID})
}

// finishDestroy releases the record's devices and drops it with its intent.
func (m *Manager) finishDestroy(ctx context.Context, rec store.Instance, intent string, started time.Time) error {
	l := m.gpuLock(rec.GPUUUID)
	l.Lock()
	err := m.release(ctx, &rec, func(carveStep) bool { return true }, true)
	var forgot error
	if err == nil {
		// The record goes while the GPU's lock is still held (GPU lock,
		// then a store transaction: the documented order). A sharer of
		// its GPU instance (compute instances, MIG-backed vGPUs) released
		// at the same moment then finds it gone and destroys the GPU
		// instance, where both would otherwise see the other's record and
		// leave the GPU instance behind.
		forgot = m.db.Update(func(tx *store.Tx) error {
			if err := tx.DeleteInstance(rec.UUID); err != nil {
				return err
			}
			return tx.DeleteIntent(intent)
		})
	}
	l.Unlock()
	// Read the GPU again before anyone is told (events, the fleet): what
	// they read of it then is what the destroy left.
	m.refreshGPU(context.WithoutCancel(ctx), rec.GPUUUID)
	if err != nil {
		m.emit(Event{Kind: EventOperationFailed, ID: rec.UUID, Op: "destroy", Detail: Message(err), Took: m.now().Sub(started)})
		return err
	}
	if forgot != nil {
		return classify(forgot, "forget instance %s", rec.UUID)
	}
	m.log.Info("destroyed", "instance", rec.UUID, "tenant", rec.Tenant, "gpu", rec.GPUPCI)
	m.dropPinAfterDestroy(rec)
	m.emit(Event{Kind: EventInstanceRemoved, ID: rec.UUID})
	m.emit(Event{Kind: EventOperationDone, ID: rec.UUID, Op: "destroy", Took: m.now().Sub(started)})
	// Destroy removes the allocation, as create claims first: a
	// scheduler's next look at the fleet sees the room this freed.
	// An instance released after its VM moved away holds it under the
	// migration's consumer.
	m.fleetSettle(ctx, rec.GPUUUID, fleetConsumer(&rec))
	return nil
}
