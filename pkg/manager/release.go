package manager

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// release takes an instance off the host, in the reverse order of its
// creation: the vGPU, the compute instance, then the GPU instance unless
// another record shares it. done says which creation steps finished (all,
// for a destroy). Every step is idempotent and checks that what it removes
// is still the record's, so a stale release cannot take another tenant's
// device. destroy selects the destroy crash points.
func (m *Manager) release(ctx context.Context, r *store.Instance, done func(carveStep) bool, destroy bool) error {
	point := func(p string) {
		if destroy {
			m.crash(p)
		}
	}
	if (r.Kind == store.KindVGPU || r.Kind == store.KindMIGVGPU) && done(stepVGPU) {
		if err := m.releaseVGPU(ctx, r); err != nil {
			return err
		}
		point(CrashDestroyVGPU)
	}
	if r.Kind == store.KindMIG && done(stepCI) && r.CIID >= 0 {
		if err := m.mig.DestroyComputeInstance(ctx, r.GPUUUID, r.GIID, r.CIID); err != nil {
			return releaseFailed(err, "destroy compute instance %d of GPU instance %d", r.CIID, r.GIID)
		}
		point(CrashDestroyCI)
	}
	if (r.Kind == store.KindMIG || r.Kind == store.KindMIGVGPU) && done(stepGI) && r.GIID >= 0 {
		shared, err := m.giShared(r)
		if err != nil {
			return err
		}
		if !shared {
			if ok, err := m.giIsOurs(ctx, r); err != nil {
				return err
			} else if ok {
				if err := m.mig.DestroyGPUInstance(ctx, r.GPUUUID, r.GIID); err != nil {
					return releaseFailed(err, "destroy GPU instance %d", r.GIID)
				}
			}
		}
		point(CrashDestroyGI)
	}
	return nil
}

// releaseFailed names a failed release step. The driver calling a
// recorded instance an invalid argument is no fault of the caller's (the
// record is vgpud's): the host changed under the step (a reboot or reset
// took the instance and another now has its id), so it is Busy, to retry
// once reconcile has caught up.
func releaseFailed(err error, format string, args ...any) error {
	if errors.Is(err, gpu.ErrInvalid) {
		return fail(ErrBusy, err, "%s: the driver no longer knows it as recorded (the GPU was reset or the host rebooted meanwhile); retry once vgpud has reconciled (vgpuctl reconcile)", fmt.Sprintf(format, args...))
	}
	return classify(err, format, args...)
}

func (m *Manager) releaseVGPU(ctx context.Context, r *store.Instance) error {
	switch r.Flow {
	case store.FlowVFIO:
		addr := r.VF
		vf, err := sysfsRead(ctx, m, func() (gpu.VF, error) { return m.vgpu.VF(addr) })
		if err != nil {
			return classify(err, "read VF %s", r.VF)
		}
		if vf.Type != 0 && vf.Type != r.TypeID {
			m.log.Warn("VF holds another vGPU type; leaving it alone", "vf", r.VF, "type", vf.Type, "instance", r.UUID)
			return nil
		}
		return m.retryBusy(ctx, func() error { return m.vgpu.ClearVF(addr) }, "clear VF "+addr)
	case store.FlowMdev:
		mdev := r.MdevUUID
		md, err := sysfsRead(ctx, m, func() (gpu.Mdev, error) { return m.vgpu.Mdev(mdev) })
		if err == nil && !sameMdev(&md, r) {
			// An mdev with the record's UUID on another parent or of
			// another type is not the record's (its own is gone).
			m.log.Warn("an mdev with the instance's UUID is another's; leaving it alone", "mdev", mdev, "parent", md.Parent, "type", md.Type, "instance", r.UUID)
			return nil
		}
		return m.retryBusy(ctx, func() error { return m.vgpu.RemoveMdev(mdev) }, "remove mdev "+mdev)
	}
	return nil
}

// retryBusy retries a release the driver refuses while QEMU still holds the
// device (EPERM/EBUSY right after a VM stops), up to the BusyRetry budget.
func (m *Manager) retryBusy(ctx context.Context, fn func() error, what string) error {
	deadline := m.now().Add(m.retry)
	delay := 100 * time.Millisecond
	for {
		err := m.sysfsCall(ctx, fn)
		if err == nil {
			return nil
		}
		if !errors.Is(err, gpu.ErrInUse) || m.now().After(deadline) {
			return classify(err, "%s", what)
		}
		select {
		case <-ctx.Done():
			return classify(fmt.Errorf("%w: %w", err, ctx.Err()), "%s", what)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// giShared reports whether another record lives on r's GPU instance.
func (m *Manager) giShared(r *store.Instance) (bool, error) {
	shared := false
	err := m.db.View(func(tx *store.Tx) error {
		recs, err := tx.Instances()
		if err != nil {
			return err
		}
		for _, x := range recs {
			if x.UUID != r.UUID && x.GPUUUID == r.GPUUUID && x.GIID == r.GIID && x.GIStart == r.GIStart &&
				(x.Kind == store.KindMIG || x.Kind == store.KindMIGVGPU) {
				shared = true
			}
		}
		return nil
	})
	return shared, err
}

// giIsOurs checks the host still shows r's GPU instance at its placement:
// after a reboot the same id may belong to another instance.
func (m *Manager) giIsOurs(ctx context.Context, r *store.Instance) (bool, error) {
	g, err := m.disc.GPU(ctx, r.GPUUUID)
	if err != nil {
		return false, classify(err, "read GPU %s", r.GPUPCI)
	}
	if g.Lost {
		return false, fail(ErrGPULost, nil, "GPU %s is lost; its instances are released when it returns", r.GPUPCI)
	}
	for _, gi := range g.MIG.Instances {
		if gi.ID == r.GIID {
			if gi.ProfileID == r.GIProfileID && gi.Placement.Start == r.GIStart {
				return true, nil
			}
			m.log.Warn("GPU instance id now belongs to another instance; leaving it alone", "gi", r.GIID, "instance", r.UUID)
			return false, nil
		}
	}
	return false, nil
}
