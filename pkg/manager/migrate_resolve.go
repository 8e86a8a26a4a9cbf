package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// A migration's intent left by a crash (or by calls that never came back
// within MigrationHold) is resolved by where libvirt has the VM, so that
// its attachment ends on one host: libvirt's migration (with
// VIR_MIGRATE_PERSIST_DEST and VIR_MIGRATE_UNDEFINE_SOURCE) ends with the
// domain defined on the destination and undefined on the source when it
// succeeded, and the other way round when it failed.
//
//   - source (outgoing): the domain is gone from this host: the VM left,
//     the instance and its attachment are released; the domain is here
//     with libvirt's outgoing migration job on it: the VM is still moving
//     (a live migration runs on the source until its switchover), the
//     intent and the migration consumer stay and a later pass asks again;
//     the domain is here with no such job (in any state): the VM stayed,
//     the instance is kept.
//   - destination (incoming): the domain is here and its definition names
//     the instance's device: the VM arrived, its attachment is recorded;
//     otherwise the instance is released.
//
// Until libvirt answers the intent stays, reported pending.

// libvirtFor is the libvirt connection a resolution asks, or why there is
// none yet.
func (m *Manager) libvirtFor(what string) (Virt, error) {
	v := m.lv()
	if v == nil || !virtReady(v) {
		return nil, fail(ErrBackendFailure, nil, "libvirt is not connected: where the VM is decides the %s migration", what)
	}
	return v, nil
}

// MigrationJobs reads a domain's current libvirt job (pkg/virt's Conn and
// Lazy). A libvirt connection without it moves no VM live, so a domain
// still here has stayed.
type MigrationJobs interface {
	MigrationProgress(ctx context.Context, ref string) (virt.MigrationProgress, error)
}

// stillMoving says whether libvirt's outgoing migration of domain runs:
// until it ends, the VM may yet leave, and the destination holds the
// instance's consumer.
func stillMoving(ctx context.Context, v Virt, domain string) (bool, error) {
	j, ok := v.(MigrationJobs)
	if !ok {
		return false, nil
	}
	p, err := j.MigrationProgress(ctx, domain)
	if err != nil {
		return false, fmt.Errorf("ask libvirt for VM %s's job: %w", domain, err)
	}
	return p.Outgoing(), nil
}

// resolveOutgoing resolves the source's half of a migration.
func (m *Manager) resolveOutgoing(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	var p outgoingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by MigrationSource
	if missing {
		m.fleetForget(p.Consumer)
		return m.dropIntent(it.ID)
	}
	v, err := m.libvirtFor("outgoing")
	if err != nil {
		return err
	}
	// Under the admission lock: a libvirtd that does not answer must not
	// hold every admission.
	lctx, cancel := context.WithTimeout(ctx, libvirtProbe)
	here, running, err := p.here(lctx, v)
	moving := false
	if err == nil && here && running {
		// Only a running domain migrates live (libvirt refuses to
		// report a shut-off one's job); an offline move has no job.
		moving, err = stillMoving(lctx, v, p.Domain)
	}
	cancel()
	if err != nil {
		return fmt.Errorf("ask libvirt where VM %s is: %w", p.Domain, err)
	}
	if moving {
		// Kept as it is: the migration's own calls (or a later pass once
		// libvirt's job ended) end it.
		return fail(ErrBusy, nil, "VM %s is still moving to another host (libvirt's migration job runs)", p.Domain)
	}
	if !here {
		m.log.Info("migration cut off: the VM left this host; instance released", "instance", rec.UUID, "vm", p.Domain)
		if err := m.releaseMigrated(ctx, it, rec, false, "outgoing", true); err != nil {
			return err
		}
		rep.Finished = append(rep.Finished, rec.UUID)
		return nil
	}
	m.log.Info("migration cut off: the VM stayed on this host; instance kept", "instance", rec.UUID, "vm", p.Domain)
	moved, err := m.keepOutgoing(it, rec.UUID)
	if err != nil {
		return err
	}
	// The next pass removes the migration's allocation and writes the
	// instance's (reconcile waits on no fleet call).
	m.fleetForget(moved)
	rep.Undone = append(rep.Undone, rec.UUID)
	return nil
}

// resolveIncoming resolves the destination's half of a migration.
func (m *Manager) resolveIncoming(ctx context.Context, it store.Intent, rec store.Instance, missing bool, rep *ReconcileReport) error {
	if missing {
		return m.dropIntent(it.ID)
	}
	if rec.State == store.StateCreating {
		return fail(ErrBusy, nil, "the create of instance %s is not resolved yet", rec.UUID)
	}
	v, err := m.libvirtFor("incoming")
	if err != nil {
		return err
	}
	var p incomingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by PrepareIncoming
	a, holds := store.Attachment{}, false
	if rec.State == store.StateReady {
		lctx, cancel := context.WithTimeout(ctx, libvirtProbe) // under the admission lock
		a, holds, err = m.arrived(lctx, v, rec, p)
		cancel()
		if err != nil && !errors.Is(err, virt.ErrDomainNotFound) {
			return fmt.Errorf("ask libvirt whether VM %s came: %w", p.VM, err)
		}
	}
	if holds {
		if err := m.db.Update(func(tx *store.Tx) error {
			if err := tx.PutAttachment(a); err != nil {
				return err
			}
			return tx.DeleteIntent(it.ID)
		}); err != nil {
			return err
		}
		m.log.Info("migration cut off: the VM arrived; attachment recorded", "instance", rec.UUID, "vm", a.Domain)
		rep.Finished = append(rep.Finished, rec.UUID)
		return nil
	}
	m.log.Info("migration cut off: the VM did not arrive; instance released", "instance", rec.UUID, "vm", p.VM)
	if err := m.releaseMigrated(ctx, it, rec, false, "incoming", true); err != nil {
		return err
	}
	rep.Undone = append(rep.Undone, rec.UUID)
	return nil
}
