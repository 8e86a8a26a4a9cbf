package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// Moving a shut-off VM's domain between two vgpud hosts, each vgpud
// acting on its own libvirt only (docs/operations.md, "Moving VMs"): the
// source rewrites the domain's persistent definition for the device the
// destination prepared (OutgoingDomainXML), the destination defines it
// (DefineIncomingDomain), the source undefines its own
// (UndefineOutgoingDomain). Each call belongs to a migration under way
// (MigrationSource's intent on the source, PrepareIncoming's on the
// destination) and touches only that migration's domain.

// vfAddrRE is a VF's PCI address, domain:bus:slot.function.
var vfAddrRE = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)

// MigrationVirt is what moving a domain needs from libvirt (pkg/virt's
// Conn and Lazy).
type MigrationVirt interface {
	DestinationXML(ctx context.Context, ref string, from, to virt.Hostdev, toInstance string) (virt.MigrationXML, error)
	DefineMigrated(ctx context.Context, persistXML string) (virt.Domain, error)
	UndefineMigrated(ctx context.Context, ref string) error
}

// migrationVirt is this host's libvirt connection, when it moves domains.
func (m *Manager) migrationVirt() (Virt, MigrationVirt, error) {
	v := m.lv()
	mv, ok := v.(MigrationVirt)
	if v == nil || !ok {
		return nil, nil, fail(ErrBackendFailure, nil, "this vgpud has no libvirt connection that moves domains")
	}
	return v, mv, nil
}

// outgoingOf reads the outgoing migration of instance id, refused when
// none is under way.
func (m *Manager) outgoingOf(id string) (string, store.Instance, outgoingPayload, error) {
	u, err := instanceUUID(id)
	if err != nil {
		return "", store.Instance{}, outgoingPayload{}, err
	}
	it, rec, missing, err := m.migrationOf(store.OpOutgoing, u)
	if err != nil {
		return u, rec, outgoingPayload{}, err
	}
	if it == nil || missing {
		return u, rec, outgoingPayload{}, fail(ErrConflict, nil, "instance %s is not moving to another host (run MigrationSource first)", u)
	}
	var p outgoingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by MigrationSource
	return u, rec, p, nil
}

// OutgoingDomainXML rewrites the moving VM's persistent definition (and
// its live one when it runs) for the destination: its vGPU hostdev names
// device, the device PrepareIncoming answered on the destination (an
// mdev's UUID, or a VF's PCI address).
func (m *Manager) OutgoingDomainXML(ctx context.Context, id, device string) (virt.MigrationXML, error) {
	done, err := m.begin()
	if err != nil {
		return virt.MigrationXML{}, err
	}
	defer done()
	u, rec, p, err := m.outgoingOf(id)
	if err != nil {
		return virt.MigrationXML{}, err
	}
	_, mv, err := m.migrationVirt()
	if err != nil {
		return virt.MigrationXML{}, err
	}
	from, err := m.hostdevOf(rec, false, false)
	if err != nil {
		return virt.MigrationXML{}, err
	}
	to := from
	switch {
	case from.Kind == virt.Mdev:
		if _, err := instanceUUID(device); err != nil {
			return virt.MigrationXML{}, fail(ErrInvalidArgument, err, "device %q: an mdev vGPU moves to an mdev UUID", device)
		}
		to.MdevUUID = strings.ToLower(device)
	default:
		if !vfAddrRE.MatchString(device) {
			return virt.MigrationXML{}, fail(ErrInvalidArgument, nil, "device %q: a VF vGPU moves to a VF's PCI address (0000:81:00.4)", device)
		}
		to.PCI = strings.ToLower(device)
	}
	x, err := mv.DestinationXML(ctx, p.Domain, from, to, u)
	if err != nil {
		return virt.MigrationXML{}, classifyMigrationVirt(err, "rewrite VM %s for the destination", p.Domain)
	}
	return x, nil
}

// UndefineOutgoingDomain undefines, on the source, the shut-off VM that
// moved to the destination (its NVRAM and TPM state stay). Refused while
// the VM runs here; a VM already gone is fine.
func (m *Manager) UndefineOutgoingDomain(ctx context.Context, id string) error {
	end, err := m.migrationCall()
	if err != nil {
		return err
	}
	defer end()
	_, _, p, err := m.outgoingOf(id)
	if err != nil {
		return err
	}
	v, mv, err := m.migrationVirt()
	if err != nil {
		return err
	}
	here, running, err := p.here(ctx, v)
	switch {
	case err != nil:
		return classifyVirt(err, "ask libvirt where VM %s is", p.Domain)
	case !here:
		return nil
	case running:
		return fail(ErrBusy, nil, "VM %s runs on this host: shut it down to move it offline, or move it live", p.Domain)
	}
	return classifyMigrationVirt(mv.UndefineMigrated(ctx, p.Domain), "undefine VM %s", p.Domain)
}

// DefineIncomingDomain defines, on the destination, the moving VM's
// persistent definition as the source rewrote it (OutgoingDomainXML):
// it must be the VM PrepareIncoming was for, and name the instance's
// device (libvirt validates the rest).
func (m *Manager) DefineIncomingDomain(ctx context.Context, id, persistXML string) error {
	u, err := instanceUUID(id)
	if err != nil {
		return err
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(persistXML); err != nil {
		return fail(ErrInvalidArgument, err, "the VM's definition does not parse")
	}
	end, err := m.migrationCall()
	if err != nil {
		return err
	}
	defer end()
	it, rec, missing, err := m.migrationOf(store.OpIncoming, u)
	if err != nil {
		return err
	}
	if it == nil || missing {
		return fail(ErrConflict, nil, "no VM is moving in with instance %s (run PrepareIncoming first)", u)
	}
	var p incomingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by PrepareIncoming
	if def.Name != p.VM || (p.DomainUUID != "" && !strings.EqualFold(def.UUID, p.DomainUUID)) {
		return fail(ErrInvalidArgument, nil, "the definition is of VM %s (%s); instance %s was prepared for VM %s (%s)", def.Name, def.UUID, u, p.VM, p.DomainUUID)
	}
	h, err := m.hostdevOf(rec, false, false)
	if err != nil {
		return err
	}
	if !namesDevice(&def, h) {
		return fail(ErrInvalidArgument, nil, "the definition of VM %s does not name instance %s's device %s", def.Name, u, hostDevice(rec))
	}
	_, mv, err := m.migrationVirt()
	if err != nil {
		return err
	}
	// Recorded before the define: an abort then undefines a VM whose
	// define succeeded but whose answer was lost.
	p.Defined = true
	payload, _ := json.Marshal(p) // plain data: cannot fail
	if err := m.db.Update(func(tx *store.Tx) error {
		x, err := tx.Intent(it.ID)
		if err != nil {
			return err
		}
		x.Payload = payload
		return tx.PutIntent(x)
	}); err != nil {
		return classify(err, "record the define of VM %s", def.Name)
	}
	if _, err := mv.DefineMigrated(ctx, persistXML); err != nil {
		return classifyMigrationVirt(err, "define VM %s", def.Name)
	}
	m.log.Info("migration: VM defined here", "instance", u, "vm", def.Name)
	return nil
}

// namesDevice reports whether def holds hostdev h.
func namesDevice(def *libvirtxml.Domain, h virt.Hostdev) bool {
	if def.Devices == nil {
		return false
	}
	for i := range def.Devices.Hostdevs {
		x := &def.Devices.Hostdevs[i]
		switch {
		case h.Kind == virt.Mdev && x.SubsysMDev != nil && x.SubsysMDev.Source != nil && x.SubsysMDev.Source.Address != nil:
			if strings.EqualFold(x.SubsysMDev.Source.Address.UUID, h.MdevUUID) {
				return true
			}
		case h.Kind != virt.Mdev && x.SubsysPCI != nil && x.SubsysPCI.Source != nil && x.SubsysPCI.Source.Address != nil:
			a := x.SubsysPCI.Source.Address
			if a.Domain != nil && a.Bus != nil && a.Slot != nil && a.Function != nil &&
				strings.EqualFold(fmt.Sprintf("%04x:%02x:%02x.%x", *a.Domain, *a.Bus, *a.Slot, *a.Function), h.PCI) {
				return true
			}
		}
	}
	return false
}

// classifyMigrationVirt names libvirt's refusals of a domain's move.
func classifyMigrationVirt(err error, format string, args ...any) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, virt.ErrBadDestXML):
		return fail(ErrInvalidArgument, err, format, args...)
	case errors.Is(err, virt.ErrDomainRunning):
		return fail(ErrBusy, err, format, args...)
	case errors.Is(err, virt.ErrUndefineRefused):
		// What holds the domain (its snapshots) is the operator's to
		// remove: libvirt's words name it.
		why := err.Error()
		var le *virt.LibvirtError
		if errors.As(err, &le) {
			why = le.Message
		}
		return fail(ErrConflict, err, format+": %s", append(args, why)...)
	case errors.Is(err, virt.ErrLiveMigrationRefused):
		// The reasons are what the operator acts on (which end, which
		// version): the message carries them, not only the log.
		why := err.Error()
		var pe *virt.PrecheckError
		if errors.As(err, &pe) {
			why = pe.Error()
		}
		return fail(ErrConflict, err, format+": %s", append(args, why)...)
	}
	return classifyVirt(err, format, args...)
}

// UndefineIncomingDomain undefines, on the destination, the shut-off VM
// DefineIncomingDomain defined here for instance id, before the move is
// given up (AbortIncoming, which refuses while the VM is defined here with
// the instance's device). Call it only once the source kept the VM
// (CancelOutgoing succeeded there): otherwise the VM would be defined
// nowhere. A VM that runs here is ErrBusy; one never defined by
// DefineIncomingDomain, or gone, is left alone.
func (m *Manager) UndefineIncomingDomain(ctx context.Context, id string) error {
	u, err := instanceUUID(id)
	if err != nil {
		return err
	}
	end, err := m.migrationCall()
	if err != nil {
		return err
	}
	defer end()
	it, _, _, err := m.migrationOf(store.OpIncoming, u)
	if err != nil {
		return err
	}
	if it == nil {
		return fail(ErrConflict, nil, "no VM is moving in with instance %s (committed, aborted, or never prepared)", u)
	}
	var p incomingPayload
	_ = json.Unmarshal(it.Payload, &p) // written by PrepareIncoming
	if !p.Defined {
		return nil
	}
	v, mv, err := m.migrationVirt()
	if err != nil {
		return err
	}
	here, running, err := outgoingPayload{Domain: p.VM, DomainUUID: p.DomainUUID}.here(ctx, v)
	switch {
	case err != nil:
		return classifyVirt(err, "ask libvirt about VM %s", p.VM)
	case !here:
		return nil
	case running:
		return fail(ErrBusy, nil, "VM %s runs on this host: it is not a definition to give back", p.VM)
	}
	if err := mv.UndefineMigrated(ctx, p.VM); err != nil {
		return classifyMigrationVirt(err, "undefine VM %s, which did not move here", p.VM)
	}
	m.log.Info("migration: VM's definition given back", "instance", u, "vm", p.VM)
	return nil
}
