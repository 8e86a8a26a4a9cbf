package manager

import (
	"context"
	"strings"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// WatchVirt follows libvirt's domain events until ctx ends: an undefined
// VM's instances are released (policy "release") or detached in the record
// only ("keep"); a started VM gets its devices checked and re-created by
// reconcile if a reboot lost them. Every event is published as a VMEvent.
func (m *Manager) WatchVirt(ctx context.Context, policy string) {
	if m.lv() == nil {
		return
	}
	m.confMu.Lock()
	m.undefinePolicy = policy
	m.confMu.Unlock()
	for ev := range m.lv().Events(ctx) {
		m.emit(Event{Kind: EventVM, ID: ev.UUID, Op: ev.Kind.String(), Detail: ev.Domain})
		switch ev.Kind {
		case virt.Undefined:
			m.domainUndefined(ctx, ev, policy)
		case virt.Stopped:
			m.domainStopped(ev)
			m.retryEvery(ctx)
		case virt.Started, virt.Reconnected:
			if _, err := m.Reconcile(ctx); err != nil {
				m.log.Warn("reconcile after VM event", "event", ev.Kind, "vm", ev.Domain, "err", err)
			}
		}
	}
}

// domainStopped marks a stopped VM's attachments not live: its instances
// may move again (defragment).
func (m *Manager) domainStopped(ev virt.Event) {
	var changed []string
	err := m.db.Update(func(tx *store.Tx) error {
		all, err := tx.Attachments()
		if err != nil {
			return err
		}
		for _, a := range all {
			if a.Live && (a.DomainUUID == ev.UUID || (ev.UUID == "" && strings.EqualFold(a.Domain, ev.Domain))) {
				a.Live = false
				if err := tx.PutAttachment(a); err != nil {
					return err
				}
				changed = append(changed, a.Instance)
			}
		}
		return nil
	})
	if err != nil {
		m.log.Warn("record that a VM stopped", "vm", ev.Domain, "err", err)
	}
	for _, id := range changed {
		m.emit(Event{Kind: EventInstanceChanged, ID: id})
	}
}

// domainUndefined drops the attachments of an undefined VM and, under the
// "release" policy, destroys their instances.
func (m *Manager) domainUndefined(ctx context.Context, ev virt.Event, policy string) {
	var atts []store.Attachment
	if err := m.db.View(func(tx *store.Tx) error {
		all, err := tx.Attachments()
		for _, a := range all {
			if a.DomainUUID == ev.UUID || (ev.UUID == "" && strings.EqualFold(a.Domain, ev.Domain)) {
				atts = append(atts, a)
			}
		}
		return err
	}); err != nil {
		// Attachments not read here are the libvirt pass's: the next
		// reconcile finds their VM gone and applies the policy.
		m.log.Error("read attachments of undefined VM", "vm", ev.Domain, "err", err)
	}
	for _, a := range atts {
		if err := m.db.Update(func(tx *store.Tx) error { return tx.DeleteAttachment(a.Instance) }); err != nil {
			m.log.Error("forget attachment of undefined VM", "instance", a.Instance, "err", err)
			continue
		}
		m.log.Info("VM undefined: attachment dropped", "vm", a.Domain, "instance", a.Instance, "policy", policy)
		if policy == "release" {
			if err := m.Destroy(ctx, a.Instance, DestroyOptions{}); err != nil {
				m.log.Error("release instance of undefined VM", "instance", a.Instance, "err", err)
			}
		} else {
			m.emit(Event{Kind: EventInstanceChanged, ID: a.Instance})
		}
	}
}
