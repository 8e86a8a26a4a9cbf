package manager

import (
	"context"
	"errors"

	"github.com/vgpud/vgpud/pkg/virt"
)

// Moving a running VM with its vGPU: the destination reports what its
// libvirt runs (MigrationTarget), the source checks those versions and its
// own against what moving a VFIO device's state needs before anything is
// carved on the destination (PrecheckOutgoingLive), then, once the
// destination prepared its instance, runs libvirt's peer-to-peer live
// migration with the definitions rewritten for the destination's device
// (MigrateOutgoingLive).

// LiveVirt is what a live move needs from libvirt (pkg/virt's Conn and
// Lazy).
type LiveVirt interface {
	HostVersions(ctx context.Context) (virt.HostVersions, error)
	PrecheckLive(ctx context.Context, ref string, dst virt.HostVersions) error
	MigrateLive(ctx context.Context, ref string, m virt.LiveMigration) error
}

// liveVirt is this host's libvirt connection, when it moves running VMs.
func (m *Manager) liveVirt() (LiveVirt, error) {
	lv, ok := m.lv().(LiveVirt)
	if !ok {
		return nil, fail(ErrBackendFailure, nil, "this vgpud has no libvirt connection that moves running VMs")
	}
	return lv, nil
}

// MigrationTarget reports this (the destination) host's versions, which
// the source checks before a live move.
func (m *Manager) MigrationTarget(ctx context.Context) (virt.HostVersions, error) {
	lv, err := m.liveVirt()
	if err != nil {
		return virt.HostVersions{}, err
	}
	v, err := lv.HostVersions(ctx)
	if err != nil {
		return v, classifyVirt(err, "read this host's libvirt, QEMU and kernel versions")
	}
	return v, nil
}

// PrecheckOutgoingLive refuses, with ErrConflict wrapping
// virt.ErrLiveMigrationRefused and naming each reason, a live move of the
// VM of instance id when it runs with its vGPU and this host or the
// destination (dst) is too old to move a VFIO device's state. It changes
// nothing: it comes before MigrationSource and PrepareIncoming. A VM
// that is shut off is ErrConflict: it moves offline.
func (m *Manager) PrecheckOutgoingLive(ctx context.Context, id string, dst virt.HostVersions) error {
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	rec, att, err := m.instanceAndAttachment(id)
	if err != nil {
		return err
	}
	if att == nil {
		return fail(ErrInvalidArgument, nil, "instance %s is attached to no VM; there is no VM to move", rec.UUID)
	}
	lv, err := m.liveVirt()
	if err != nil {
		return err
	}
	off, err := m.shutOff(ctx, att)
	if err != nil {
		return err
	}
	if off {
		return fail(ErrConflict, nil, "VM %s is shut off: move it without --live (its definition moves offline)", att.Domain)
	}
	if err := lv.PrecheckLive(ctx, att.Domain, dst); err != nil {
		return classifyMigrationVirt(err, "move VM %s live", att.Domain)
	}
	return nil
}

// LiveOutgoing says where MigrateOutgoingLive moves the VM.
type LiveOutgoing struct {
	// Device is the destination's device (PrepareIncoming's answer).
	Device string
	// DestURI is the destination's libvirt URI as this host's libvirtd
	// reaches it; MigrateURI QEMU's data channel ("": the destination's
	// hostname).
	DestURI, MigrateURI string
	// Dest is the destination's versions (MigrationTarget).
	Dest       virt.HostVersions
	KeepSource bool
}

// MigrateOutgoingLive moves the running VM of instance id (a migration
// under way: MigrationSource) to the destination with libvirt's
// peer-to-peer live migration, its definitions naming the destination's
// device. libvirt checks the versions again and refuses as
// PrecheckOutgoingLive does; a failed migration leaves the VM running
// here.
func (m *Manager) MigrateOutgoingLive(ctx context.Context, id string, o LiveOutgoing) error {
	if o.DestURI == "" {
		return fail(ErrInvalidArgument, nil, "no destination libvirt URI")
	}
	x, err := m.OutgoingDomainXML(ctx, id, o.Device)
	if err != nil {
		return err
	}
	done, err := m.begin()
	if err != nil {
		return err
	}
	defer done()
	_, _, p, err := m.outgoingOf(id)
	if err != nil {
		return err
	}
	lv, err := m.liveVirt()
	if err != nil {
		return err
	}
	err = lv.MigrateLive(ctx, p.Domain, virt.LiveMigration{DestURI: o.DestURI, MigrateURI: o.MigrateURI,
		DestXML: x.Live, PersistXML: x.Persistent, Dest: o.Dest, KeepSource: o.KeepSource})
	if errors.Is(err, virt.ErrMigrationInterrupted) {
		return fail(ErrBackendFailure, err, "move VM %s live: look it up on both hosts before anything else", p.Domain)
	}
	if err != nil {
		return classifyMigrationVirt(err, "move VM %s live", p.Domain)
	}
	m.log.Info("migration: VM moved live", "vm", p.Domain, "to", o.DestURI)
	return nil
}
