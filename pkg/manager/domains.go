package manager

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// reconcileAttachments drops attachment records of VMs that are gone or no
// longer hold the device (a VM undefined while vgpud did not watch gets the
// undefine policy), re-points VMs whose device moved, and keeps each
// record's live flag true to the VM.
func (m *Manager) reconcileAttachments(ctx context.Context, rep *ReconcileReport) {
	var atts []store.Attachment
	var recs map[string]store.Instance
	if err := m.db.View(func(tx *store.Tx) error {
		var err error
		if atts, err = tx.Attachments(); err != nil {
			return err
		}
		all, err := tx.Instances()
		recs = map[string]store.Instance{}
		for _, r := range all {
			recs[r.UUID] = r
		}
		return err
	}); err != nil {
		// The pass goes on with what was read (the domains' side needs no
		// list); what was not read waits for the next pass.
		m.log.Warn("read attachments", "err", err)
	}
	m.confMu.RLock()
	policy := m.undefinePolicy
	m.confMu.RUnlock()
	var release []string
	for _, a := range atts {
		if m.inflight.busy(a.Instance) {
			continue // an attach or detach in flight records it itself
		}
		if ctx.Err() != nil {
			rep.Pending = append(rep.Pending, "attachments: libvirt pass ran out of time")
			break
		}
		if m.checkAttachment(ctx, a, recs[a.Instance], rep) && policy == "release" {
			release = append(release, a.Instance)
		}
	}
	m.reconcileDomains(ctx, rep)
	m.releaseUndefined(ctx, release, rep)
}

// checkAttachment checks one attachment record against its VM: missing
// vgpud metadata is written again, the live flag follows the VM, a VM
// whose device moved is re-pointed, and a record the VM no longer backs is
// forgotten. gone: the VM is gone and the record was forgotten.
func (m *Manager) checkAttachment(ctx context.Context, a store.Attachment, r store.Instance, rep *ReconcileReport) (gone bool) {
	h, err := m.hostdevOf(r, false, false)
	if err != nil {
		// No device to look for in the VM (the instance has no record, or
		// none that can be attached): nothing to check.
		return false
	}
	held, err := m.lv().Attached(ctx, a.Domain)
	if errors.Is(err, virt.ErrDomainNotFound) {
		return m.forgetAttachment(a, fmt.Sprintf("VM %s is gone", a.Domain), rep)
	}
	if err != nil {
		m.log.Warn("read VM devices", "vm", a.Domain, "err", err)
		return false
	}
	found, live, meta, stale := false, false, false, []virt.Hostdev{}
	for _, x := range held {
		switch {
		case x.Config && sameDevice(x.Hostdev, h):
			found, live, meta = true, x.Live, x.MetadataConfig && x.Instance == a.Instance
		case x.Instance == a.Instance && x.Config:
			stale = append(stale, x.Hostdev)
		}
	}
	if found {
		if !meta {
			// The device is there without vgpud's metadata entry (an
			// attach interrupted by an older vgpud): write it.
			if _, err := m.lv().Attach(ctx, a.Domain, h, a.Instance); err != nil {
				m.log.Warn("restore vgpud metadata of VM", "vm", a.Domain, "instance", a.Instance, "err", err)
			} else {
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s metadata restored", a.Instance, a.Domain))
			}
		}
		if live != a.Live {
			m.setLive(a, live)
		}
		return false
	}
	if len(stale) > 0 {
		// The device moved (another VF after a reboot): re-point the VM.
		for _, old := range stale {
			if err := m.lv().Detach(ctx, a.Domain, old, a.Instance); err != nil {
				// The attach below still gives the VM its device.
				m.log.Warn("take the old device of a moved instance out of VM", "vm", a.Domain, "instance", a.Instance, "err", err)
			}
		}
		if _, err := m.lv().Attach(ctx, a.Domain, h, a.Instance); err != nil {
			m.log.Warn("re-point VM at moved device", "vm", a.Domain, "instance", a.Instance, "err", err)
			return false
		}
		rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s re-pointed", a.Instance, a.Domain))
		return false
	}
	m.forgetAttachment(a, fmt.Sprintf("VM %s no longer holds it", a.Domain), rep)
	return false
}

// forgetAttachment drops an attachment unless an operation took the
// instance meanwhile (it writes the record itself), and says whether it
// did.
func (m *Manager) forgetAttachment(a store.Attachment, why string, rep *ReconcileReport) bool {
	if m.inflight.busy(a.Instance) {
		return false
	}
	if err := m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(a.Instance) }); err != nil {
		m.log.Warn("forget attachment", "instance", a.Instance, "vm", a.Domain, "err", err)
		return false
	}
	rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: %s", a.Instance, why))
	m.emit(Event{Kind: EventInstanceChanged, ID: a.Instance})
	return true
}

// releaseUndefined destroys the instances of VMs that were undefined while
// vgpud did not watch (the "release" undefine policy).
func (m *Manager) releaseUndefined(ctx context.Context, ids []string, rep *ReconcileReport) {
	for _, id := range ids {
		if err := m.Destroy(ctx, id, DestroyOptions{}); err != nil && !errors.Is(err, ErrNotFound) {
			m.log.Warn("release instance of a VM undefined while vgpud did not watch", "instance", id, "err", err)
			rep.Pending = append(rep.Pending, fmt.Sprintf("release %s: %s", id, Message(err)))
			continue
		}
		m.log.Info("released instance of a VM undefined while vgpud did not watch", "instance", id)
	}
}

// reconcileDomains looks from libvirt's side: vgpud metadata in a domain
// that no attachment record explains. A VM whose config holds the device of
// an instance with no attachment record (the record was lost) gets the
// record back; a stopped VM that names an instance vgpud no longer has is
// cleared of it (the device is gone, and the VM would not start); anything
// else is reported, not touched.
func (m *Manager) reconcileDomains(ctx context.Context, rep *ReconcileReport) {
	doms, err := m.lv().Domains(ctx)
	if err != nil {
		m.log.Warn("list VMs", "err", err)
		return
	}
	// Read after the forward pass, which changed records; operations that
	// end meanwhile are checked again before anything is taken away.
	atts := map[string]store.Attachment{}
	recs := map[string]store.Instance{}
	if err := m.db.View(func(tx *store.Tx) error {
		all, err := tx.Attachments()
		if err != nil {
			return err
		}
		for _, a := range all {
			atts[a.Instance] = a
		}
		rs, err := tx.Instances()
		for _, r := range rs {
			recs[r.UUID] = r
		}
		return err
	}); err != nil {
		m.log.Warn("read attachments", "err", err)
		return
	}
	for _, d := range doms {
		if ctx.Err() != nil {
			rep.Pending = append(rep.Pending, "VMs: libvirt pass ran out of time")
			return
		}
		// The devices vgpud's records give this VM: never taken away here,
		// whatever stale metadata names them.
		var mine []virt.Hostdev
		for id, a := range atts {
			if a.DomainUUID == d.UUID || a.Domain == d.Name {
				if h, err := m.hostdevOf(recs[id], false, false); err == nil {
					mine = append(mine, h)
				}
			}
		}
		held, err := m.lv().Attached(ctx, d.Name)
		if err != nil {
			if !errors.Is(err, virt.ErrDomainNotFound) {
				m.log.Warn("read VM devices", "vm", d.Name, "err", err)
			}
			continue
		}
		for _, x := range held {
			if x.Instance == "" || m.inflight.busy(x.Instance) {
				continue
			}
			a, attached := atts[x.Instance]
			if attached && (a.DomainUUID == d.UUID || a.Domain == d.Name) {
				continue // the forward pass checked it
			}
			r, exists := recs[x.Instance]
			switch {
			case exists && !attached && x.Config:
				h, err := m.hostdevOf(r, false, false)
				if err != nil || !sameDevice(h, x.Hostdev) {
					rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s names it with another device; left alone", x.Instance, d.Name))
					continue
				}
				a := store.Attachment{Instance: r.UUID, Domain: d.Name, DomainUUID: d.UUID, URI: m.lv().URI(), Live: x.Live, Created: m.now()}
				if err := m.db.Update(func(tx *store.Tx) error { return tx.PutAttachment(a) }); err != nil {
					m.log.Warn("record attachment found in VM", "vm", d.Name, "instance", r.UUID, "err", err)
					continue
				}
				atts[r.UUID] = a
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s holds it; attachment recorded", r.UUID, d.Name))
				m.emit(Event{Kind: EventInstanceChanged, ID: r.UUID})
			case !exists && slices.ContainsFunc(mine, func(h virt.Hostdev) bool { return sameDevice(h, x.Hostdev) }):
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: gone; VM %s names it on a device another instance holds; left alone", x.Instance, d.Name))
			case !exists:
				// Only while nothing else runs: an attach in flight may be
				// giving this very device to another instance.
				if _, err := m.Instance(x.Instance); !(errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidArgument)) || !m.inflight.idle() {
					continue
				}
				dom, err := m.lv().Domain(ctx, d.Name)
				if err != nil || dom.Running {
					rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: running VM %s names an instance vgpud does not have; left alone", x.Instance, d.Name))
					continue
				}
				if err := m.lv().Detach(ctx, d.Name, x.Hostdev, x.Instance); err != nil {
					m.log.Warn("clear a gone instance from VM", "vm", d.Name, "instance", x.Instance, "err", err)
					continue
				}
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: gone; cleared from VM %s", x.Instance, d.Name))
			default:
				rep.Attachments = append(rep.Attachments, fmt.Sprintf("%s: VM %s names it, but vgpud has it attached to %s; left alone", x.Instance, d.Name, a.Domain))
			}
		}
	}
}

// setLive records whether an attachment is live in its running VM.
func (m *Manager) setLive(a store.Attachment, live bool) {
	err := m.db.Update(func(tx *store.Tx) error {
		cur, err := tx.Attachment(a.Instance)
		if err != nil || cur.Domain != a.Domain {
			return err
		}
		cur.Live = live
		return tx.PutAttachment(cur)
	})
	if err != nil {
		m.log.Warn("record live state of attachment", "instance", a.Instance, "vm", a.Domain, "err", err)
		return
	}
	m.emit(Event{Kind: EventInstanceChanged, ID: a.Instance})
}

// Domains lists the VMs of this host's libvirt (name, UUID, whether each
// runs), for a caller choosing one to attach to. Bounded by ctx; with
// libvirt not configured, or not answering, refused by name.
func (m *Manager) Domains(ctx context.Context) ([]virt.Domain, error) {
	v := m.lv()
	if v == nil {
		return nil, fail(ErrBackendFailure, nil, "list VMs: libvirt is not configured for this daemon (libvirtSocket in vgpud.yaml)")
	}
	ds, err := v.Domains(ctx)
	if err != nil {
		return nil, classifyVirt(err, "list VMs")
	}
	return ds, nil
}
