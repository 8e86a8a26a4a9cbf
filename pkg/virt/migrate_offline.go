package virt

import (
	"context"
	"errors"
	"fmt"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// MigrateOffline moves a shut-off domain's persistent definition: it
// defines persistXML (DestinationXML's Persistent) on dst
// (DefineMigrated), then undefines the source's unless keepSource
// (UndefineMigrated). Repeating it after a failure is safe: defining the
// same UUID again replaces the destination's definition, and a source
// already undefined is fine. Hosts whose vgpuds each hold only their own
// connection call the two halves on their own ends instead.
func (c *Conn) MigrateOffline(ctx context.Context, dst *Conn, ref, persistXML string, keepSource bool) error {
	name, err := c.parseRef(ref)
	if err != nil {
		return err
	}
	gone := false
	err = c.do(ctx, "offline migrate: check source", func(r *rpc) error {
		d, err := r.lookup(name)
		if errors.Is(err, ErrDomainNotFound) {
			gone = true
			return nil
		}
		if err != nil {
			return err
		}
		st, err := r.state(d)
		if err != nil {
			return err
		}
		if st.active {
			return fmt.Errorf("migrate %s offline: %w", name, ErrDomainRunning)
		}
		if !st.persistent {
			return fmt.Errorf("migrate %s offline: %w", name, ErrNotPersistent)
		}
		return checkSame(d, persistXML)
	})
	if err != nil {
		return err
	}
	if gone {
		// A repeat after the source was undefined: the destination must
		// hold it.
		if _, err := dst.Domain(ctx, name); err != nil {
			return fmt.Errorf("migrate %s offline: on neither end: %w", name, err)
		}
		return nil
	}
	if _, err := dst.DefineMigrated(ctx, persistXML); err != nil {
		return fmt.Errorf("migrate %s offline: %w", name, err)
	}
	if keepSource {
		return nil
	}
	if err := c.UndefineMigrated(ctx, name); err != nil {
		return fmt.Errorf("migrate %s offline: %w", name, err)
	}
	return nil
}

// DefineMigrated defines, on this (the destination) host, a domain that
// moves here shut off: persistXML is the source's configuration rewritten
// by DestinationXML, validated by libvirt. The same UUID defined here
// already (a repeat) is redefined; one that runs here is ErrDomainRunning.
func (c *Conn) DefineMigrated(ctx context.Context, persistXML string) (Domain, error) {
	var def libvirtxml.Domain
	if err := def.Unmarshal(persistXML); err != nil {
		return Domain{}, fmt.Errorf("%w: parse: %w", ErrBadDestXML, err)
	}
	id, err := uuid.Parse(def.UUID)
	if err != nil || def.Name == "" {
		return Domain{}, fmt.Errorf("%w: domain %q has no name or UUID (%q)", ErrBadDestXML, def.Name, def.UUID)
	}
	var out Domain
	err = c.do(ctx, "define migrated", func(r *rpc) error {
		d, err := call(r, func(l *libvirt.Libvirt) (libvirt.Domain, error) { return l.DomainLookupByUUID(libvirt.UUID(id)) })
		switch {
		case err == nil:
			st, err := r.state(d)
			if err != nil {
				return err
			}
			if st.active {
				return fmt.Errorf("define %s on %s: %w: a domain with its UUID runs here", def.Name, c.cfg.URI, ErrDomainRunning)
			}
		case !errors.Is(err, ErrDomainNotFound):
			return fmt.Errorf("define %s on %s: look up its UUID: %w", def.Name, c.cfg.URI, err)
		}
		d, err = call(r, func(l *libvirt.Libvirt) (libvirt.Domain, error) {
			return l.DomainDefineXMLFlags(persistXML, libvirt.DomainDefineValidate)
		})
		if err != nil {
			return fmt.Errorf("define %s on %s: %w", def.Name, c.cfg.URI, err)
		}
		out = Domain{Name: d.Name, UUID: id.String(), Persistent: true}
		return nil
	})
	return out, err
}

// UndefineMigrated removes, on this (the source) host, the shut-off
// definition of a domain that now lives on another host. Its NVRAM and
// TPM state files stay. A domain already gone is fine; one that runs is
// ErrDomainRunning.
func (c *Conn) UndefineMigrated(ctx context.Context, ref string) error {
	name, err := c.parseRef(ref)
	if err != nil {
		return err
	}
	return c.do(ctx, "undefine migrated", func(r *rpc) error {
		d, err := r.lookup(name)
		if errors.Is(err, ErrDomainNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		st, err := r.state(d)
		if err != nil {
			return err
		}
		if st.active {
			return fmt.Errorf("undefine %s: %w", name, ErrDomainRunning)
		}
		if !st.persistent {
			return nil
		}
		err = call0(r, func(l *libvirt.Libvirt) error {
			return l.DomainUndefineFlags(d, libvirt.DomainUndefineKeepNvram|libvirt.DomainUndefineKeepTpm)
		})
		var le *LibvirtError
		switch {
		case err == nil, errors.Is(err, ErrDomainNotFound):
			return nil
		case errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrOperationInvalid:
			// The domain is shut off (checked above): what libvirt
			// refuses is what it holds, which the operator removes.
			return fmt.Errorf("undefine %s: %w: %w", name, ErrUndefineRefused, err)
		}
		return fmt.Errorf("undefine %s: %w", name, err)
	})
}
