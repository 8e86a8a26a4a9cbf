package virt

import (
	"context"
	"errors"
	"fmt"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// Attach gives hostdev h to a domain and records instance in the domain's
// vgpud metadata: in the persistent config always, and live as well when the
// domain runs. It reports whether the device is live in the guest.
//
// The domain is a name on this connection, or a URI-qualified reference
// ("qemu:///system/vm1"; another URI is ErrOtherHost). Attach is
// idempotent: what libvirt already holds is left alone, so attaching again is
// a no-op and an attach interrupted by a libvirtd restart is finished, not
// doubled, when it is repeated.
//
// Errors (nothing changed in any of these): ErrInvalidHostdev,
// ErrDomainNotFound, ErrOtherHost, ErrNotPersistent, ErrAttachedElsewhere (the
// hostdev or the instance is in another domain), ErrNeedsGraphics,
// ErrLiveAttach (the domain runs and libvirt refused the live attach; the
// config keeps its old content), ErrUnreachable. ErrTimeout leaves the outcome
// unknown; repeat the call.
//
// Attaches and detaches through one Conn that concern the same device or the
// same domain run one after another; others run in parallel.
func (c *Conn) Attach(ctx context.Context, domain string, h Hostdev, instance string) (live bool, err error) {
	h, err = h.normalize()
	if err != nil {
		return false, err
	}
	if instance == "" {
		return false, fmt.Errorf("%w: empty instance id for %s", ErrInvalidHostdev, h)
	}
	name, err := c.parseRef(domain)
	if err != nil {
		return false, err
	}
	doc, err := domainHostdev(h).Marshal()
	if err != nil {
		return false, fmt.Errorf("marshal hostdev %s: %w", h, err)
	}
	defer c.lockFor(h, name)()
	err = c.do(ctx, "attach", func(r *rpc) error {
		var err error
		live, err = c.attach(r, name, h, doc, instance)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("attach %s (instance %s) to %s: %w", h, instance, name, err)
	}
	c.log.Debug("attached", "domain", name, "hostdev", h.String(), "instance", instance, "live", live)
	return live, nil
}

// lockFor serializes, within this Conn, the attaches and detaches that
// could undo each other, and returns the unlock:
//   - per device: two attaches of one device must not both pass the
//     ErrAttachedElsewhere check;
//   - per domain: each operation rewrites the domain's whole vgpud metadata
//     element from the list it read, so two operations on one domain (of
//     different devices) would otherwise drop each other's entry.
//
// The device lock is always taken first, and no one waits for a device
// while holding a domain, so two calls never wait on each other.
func (c *Conn) lockFor(h Hostdev, domain string) (unlock func()) {
	unlockDev := c.locks.lock("hostdev " + h.key())
	unlockDom := c.locks.lock("domain " + domain)
	return func() {
		unlockDom()
		unlockDev()
	}
}

func (c *Conn) attach(r *rpc, name string, h Hostdev, doc, instance string) (bool, error) {
	d, err := r.lookup(name)
	if err != nil {
		return false, err
	}
	st, err := r.state(d)
	if err != nil {
		return false, err
	}
	if !st.persistent {
		return false, fmt.Errorf("domain %s: %w", name, ErrNotPersistent)
	}
	cfg, live, err := r.defs(d, st)
	if err != nil {
		return false, err
	}
	cfgMeta, err := readMetadata(cfg)
	if err != nil {
		return false, err
	}
	liveMeta, err := readMetadata(live)
	if err != nil {
		return false, err
	}

	var flags libvirt.DomainDeviceModifyFlags
	if findHostdev(cfg, h) == nil {
		flags |= libvirt.DomainDeviceModifyConfig
	}
	if st.active && findHostdev(live, h) == nil {
		flags |= libvirt.DomainDeviceModifyLive
	}
	entry := entryFor(instance, h)
	if flags == 0 && cfgMeta.has(entry) && (!st.active || liveMeta.has(entry)) {
		return st.active, nil // already done
	}

	if flags != 0 {
		if h.Display && !hasGraphics(cfg, live, flags) {
			return false, fmt.Errorf("domain %s: %w", name, ErrNeedsGraphics)
		}
		if err := c.checkElsewhere(r, d, h, instance); err != nil {
			return false, err
		}
	}

	// The config's metadata entry first, then the device: a process killed
	// between the two leaves an entry without a device, which a detach
	// (what the manager's reconcile does with an unfinished attach whose
	// device is not there) clears. The other order would leave a device in
	// the domain that vgpud's metadata does not record.
	//
	// The live entry comes after the live attach: the config's entry
	// already records the instance (Attached reads both definitions), and
	// a refused live attach then leaves the live definition untouched.
	// libvirt keeps an empty <metadata/> once the last element in it is
	// removed, so undoing a live entry could not give the live XML back
	// as it was.
	cfgWant := cfgMeta.with(entry)
	liveWant := liveMeta
	if st.active {
		liveWant = liveMeta.with(entry)
	}
	if flags == 0 {
		return st.active, r.writeMetadata(d, cfgMeta, cfgWant, liveMeta, liveWant, st)
	}
	if err := r.writeMetadata(d, cfgMeta, cfgWant, liveMeta, liveMeta, st); err != nil {
		return false, err
	}
	// One call for config and live: libvirt's QEMU driver saves the new
	// config only after the live attach succeeded, so a refused live attach
	// leaves the config as it was.
	if err := r.attachDevice(d, doc, flags); err != nil {
		if !refused(err) {
			return false, err // broken connection or timeout: outcome unknown
		}
		c.undoConfigEntry(r, d, h, cfg, cfgMeta, cfgWant, st)
		if flags&libvirt.DomainDeviceModifyLive != 0 {
			return false, fmt.Errorf("domain %s: %w: %w", name, ErrLiveAttach, err)
		}
		return false, fmt.Errorf("domain %s: attach to config: %w", name, err)
	}
	if err := r.writeMetadata(d, cfgWant, cfgWant, liveMeta, liveWant, st); err != nil {
		// The device is in the guest and the config's entry records it; a
		// repeated Attach (or reconcile) writes the live entry.
		c.log.Warn("record a live attach in the live metadata failed", "domain", d.Name, "hostdev", h.String(), "err", err)
	}
	return st.active, nil
}

// undoConfigEntry keeps "nothing changed" after libvirt refused an attach:
// the config's metadata is put back as it was, and an empty <metadata/>
// that libvirt leaves in a config that had none is dropped. If that fails
// too, the entry without a device is what a crash would have left, and a
// detach clears it.
func (c *Conn) undoConfigEntry(r *rpc, d libvirt.Domain, h Hostdev, cfg *libvirtxml.Domain, was, now metadata, st domState) {
	if err := r.writeMetadata(d, now, was, nil, nil, domState{persistent: st.persistent}); err != nil {
		c.log.Warn("undo metadata of a refused attach failed", "domain", d.Name, "hostdev", h.String(), "err", err)
		return
	}
	if cfg != nil && cfg.Metadata == nil {
		if err := r.dropEmptyMetadata(d); err != nil {
			c.log.Warn("drop the empty metadata a refused attach left", "domain", d.Name, "hostdev", h.String(), "err", err)
		}
	}
}

// hasGraphics reports whether the definitions that will receive the device
// have a graphics device, which display='on' needs.
func hasGraphics(cfg, live *libvirtxml.Domain, flags libvirt.DomainDeviceModifyFlags) bool {
	has := func(d *libvirtxml.Domain) bool { return d != nil && d.Devices != nil && len(d.Devices.Graphics) > 0 }
	if flags&libvirt.DomainDeviceModifyConfig != 0 && !has(cfg) {
		return false
	}
	if flags&libvirt.DomainDeviceModifyLive != 0 && !has(live) {
		return false
	}
	return true
}

// checkElsewhere returns ErrAttachedElsewhere when another domain's config or
// live definition holds h or its metadata names instance.
func (c *Conn) checkElsewhere(r *rpc, self libvirt.Domain, h Hostdev, instance string) error {
	doms, err := call(r, func(l *libvirt.Libvirt) ([]libvirt.Domain, error) {
		ds, _, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
		return ds, err
	})
	if err != nil {
		return fmt.Errorf("list domains: %w", err)
	}
	for _, d := range doms {
		if d.UUID == self.UUID {
			continue
		}
		// ID is -1 for a domain that is not running.
		sides := []bool{true}
		if d.ID > 0 {
			sides = append(sides, false)
		}
		for _, inactive := range sides {
			def, err := r.def(d, inactive)
			if errors.Is(err, ErrDomainNotFound) {
				break // undefined meanwhile
			}
			if err != nil {
				return err
			}
			if findHostdev(def, h) != nil {
				return fmt.Errorf("%w: %s is in domain %s", ErrAttachedElsewhere, h, d.Name)
			}
			m, err := readMetadata(def)
			if err != nil {
				return err
			}
			if m.names(instance) {
				return fmt.Errorf("%w: instance %s is recorded in domain %s", ErrAttachedElsewhere, instance, d.Name)
			}
		}
	}
	return nil
}

// Detach takes hostdev h out of a domain and drops the metadata entry for
// instance (and any entry for h): live first, waiting for libvirt's
// device-removed event up to DetachTimeout, then from the config. Detach is
// idempotent: a hostdev that is absent is a no-op.
//
// Errors: ErrInvalidHostdev, ErrDomainNotFound, ErrOtherHost, ErrLiveDetach
// (refused, config unchanged), ErrTimeout (the guest has not released the
// device yet; config unchanged; repeat the call), ErrUnreachable.
func (c *Conn) Detach(ctx context.Context, domain string, h Hostdev, instance string) error {
	h, err := h.normalize()
	if err != nil {
		return err
	}
	name, err := c.parseRef(domain)
	if err != nil {
		return err
	}
	doc, err := domainHostdev(h).Marshal()
	if err != nil {
		return fmt.Errorf("marshal hostdev %s: %w", h, err)
	}
	defer c.lockFor(h, name)()
	err = c.doTimeout(ctx, c.cfg.CallTimeout+c.cfg.DetachTimeout, "detach", func(r *rpc) error {
		return c.detach(r, name, h, doc, instance)
	})
	if err != nil {
		return fmt.Errorf("detach %s (instance %s) from %s: %w", h, instance, name, err)
	}
	c.log.Debug("detached", "domain", name, "hostdev", h.String(), "instance", instance)
	return nil
}

func (c *Conn) detach(r *rpc, name string, h Hostdev, doc, instance string) error {
	d, err := r.lookup(name)
	if err != nil {
		return err
	}
	st, err := r.state(d)
	if err != nil {
		return err
	}
	cfg, live, err := r.defs(d, st)
	if err != nil {
		return err
	}
	if hd := findHostdev(live, h); hd != nil {
		if hd.Alias == nil || hd.Alias.Name == "" {
			return fmt.Errorf("domain %s: live %s has no alias", name, h)
		}
		present := func(def *libvirtxml.Domain) bool { return findHostdev(def, h) != nil }
		if err := c.detachLive(r, d, hd.Alias.Name, present); err != nil {
			return err
		}
	}
	if findHostdev(cfg, h) != nil {
		if err := r.detachDevice(d, doc, libvirt.DomainDeviceModifyConfig); err != nil {
			return fmt.Errorf("domain %s: detach from config: %w", name, err)
		}
	}
	cfgMeta, err := readMetadata(cfg)
	if err != nil {
		return err
	}
	liveMeta, err := readMetadata(live)
	if err != nil {
		return err
	}
	return r.writeMetadata(d, cfgMeta, cfgMeta.without(instance, h), liveMeta, liveMeta.without(instance, h), st)
}

// detachLive asks libvirt to unplug the device with alias from the running
// domain and waits for the guest to release it: a DeviceRemoved event for the
// alias, or the domain stopping. libvirt's alias detach does not wait itself,
// so the wait is bounded by DetachTimeout alone. present reports whether a
// live definition still holds the device; it is consulted after a reconnect,
// when the event may have been lost.
func (c *Conn) detachLive(r *rpc, d libvirt.Domain, alias string, present func(*libvirtxml.Domain) bool) error {
	waitCtx, cancel := context.WithTimeout(r.ctx, c.cfg.DetachTimeout)
	defer cancel()
	// Subscribe before the request so the event cannot slip past.
	events := c.Events(waitCtx)
	if err := r.detachAlias(d, alias, libvirt.DomainDeviceModifyLive); err != nil {
		if !refused(err) {
			return err
		}
		return fmt.Errorf("domain %s: %w: %s: %w", d.Name, ErrLiveDetach, alias, err)
	}
	id := uuid.UUID(d.UUID).String()
	for {
		select {
		case <-waitCtx.Done():
			if r.ctx.Err() != nil {
				return ctxErr(r.ctx)
			}
			return fmt.Errorf("domain %s: %w: the guest has not released %s after %v", d.Name, ErrTimeout, alias, c.cfg.DetachTimeout)
		case e, ok := <-events:
			if !ok {
				if c.life.Err() != nil {
					return ErrClosed
				}
				events = nil // closed because waitCtx ended; the case above reports it
				continue
			}
			switch {
			case e.Kind == Reconnected:
				if gone, err := c.deviceGone(waitCtx, d, present); err != nil || gone {
					return err
				}
			case e.UUID != id:
			case e.Kind == DeviceRemoved && e.Alias == alias:
				return nil
			case e.Kind == DeviceRemovalFailed && e.Alias == alias:
				return fmt.Errorf("domain %s: %w: the guest refused to release %s", d.Name, ErrLiveDetach, alias)
			case e.Kind == Stopped || e.Kind == Undefined:
				return nil // the live definition went with the QEMU process
			}
		}
	}
}

// deviceGone re-reads the live definition after a reconnect.
func (c *Conn) deviceGone(ctx context.Context, d libvirt.Domain, present func(*libvirtxml.Domain) bool) (bool, error) {
	s, err := c.session(ctx)
	if err != nil {
		return false, err
	}
	r := &rpc{ctx: ctx, s: s, c: c}
	st, err := r.state(d)
	if errors.Is(err, ErrDomainNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if !st.active {
		return true, nil
	}
	live, err := r.def(d, false)
	if err != nil {
		return false, err
	}
	return !present(live), nil
}
