package virt

import (
	"context"
	"fmt"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// Domain is a libvirt domain as vgpud sees it.
type Domain struct {
	Name       string
	UUID       string
	Running    bool // active: running, paused or otherwise holding a QEMU process
	Persistent bool // has a persistent config (not transient)
}

// Attached is one hostdev a domain holds, or one vgpud's metadata records,
// with where each was found, so reconcile can cross-check both sides.
type Attached struct {
	// Instance is the vgpud instance the metadata records for this hostdev,
	// or "" for a hostdev vgpud has no record of.
	Instance string
	// Hostdev is the device. Options (Display, RamFB) come from the config,
	// else the live definition; for a metadata entry without a hostdev only
	// the identity is known.
	Hostdev Hostdev
	// Config and Live say whether the hostdev is in the persistent config
	// and in the live definition (Live is false for a domain that is not
	// running).
	Config, Live bool
	// MetadataConfig and MetadataLive say whether the config's and the live
	// definition's vgpud metadata record Instance for this hostdev.
	MetadataConfig, MetadataLive bool
}

// parseRef turns a domain reference into a domain name on this connection.
// A reference is a plain name, or a libvirt URI followed by "/" and the
// name ("qemu:///system/vm1"); libvirt does not allow "/" in domain names,
// so the last one separates them. A URI other than this connection's is
// ErrOtherHost.
func (c *Conn) parseRef(ref string) (string, error) {
	if !strings.Contains(ref, "://") {
		if ref == "" {
			return "", fmt.Errorf("%w: empty domain name", ErrDomainNotFound)
		}
		return ref, nil
	}
	i := strings.LastIndex(ref, "/")
	uri, name := ref[:i], ref[i+1:]
	if uri != c.cfg.URI {
		return "", fmt.Errorf("domain %q: %w: this connection serves %s", ref, ErrOtherHost, c.cfg.URI)
	}
	if name == "" {
		return "", fmt.Errorf("%w: empty domain name in %q", ErrDomainNotFound, ref)
	}
	return name, nil
}

// Domain looks a domain up by reference (see Attach).
func (c *Conn) Domain(ctx context.Context, ref string) (Domain, error) {
	name, err := c.parseRef(ref)
	if err != nil {
		return Domain{}, err
	}
	var out Domain
	err = c.do(ctx, "domain", func(r *rpc) error {
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		st, err := r.state(d)
		if err != nil {
			return err
		}
		out = Domain{Name: d.Name, UUID: uuid.UUID(d.UUID).String(), Running: st.active, Persistent: st.persistent}
		return nil
	})
	return out, err
}

// Domains lists every domain on this connection's host: name, UUID and
// whether it runs (a second listing, of the active ones: two calls
// whatever the number of domains). Persistent is not read.
func (c *Conn) Domains(ctx context.Context) ([]Domain, error) {
	var out []Domain
	err := c.do(ctx, "domains", func(r *rpc) error {
		list := func(flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, error) {
			return call(r, func(l *libvirt.Libvirt) ([]libvirt.Domain, error) {
				ds, _, err := l.ConnectListAllDomains(1, flags)
				return ds, err
			})
		}
		ds, err := list(0)
		if err != nil {
			return fmt.Errorf("list domains: %w", err)
		}
		active, err := list(libvirt.ConnectListDomainsActive)
		if err != nil {
			return fmt.Errorf("list running domains: %w", err)
		}
		running := map[libvirt.UUID]bool{}
		for _, d := range active {
			running[d.UUID] = true
		}
		out = out[:0]
		for _, d := range ds {
			out = append(out, Domain{Name: d.Name, UUID: uuid.UUID(d.UUID).String(), Running: running[d.UUID]})
		}
		return nil
	})
	return out, err
}

// Quiesce waits until the libvirt calls abandoned at their deadline have
// returned: what libvirt holds afterwards includes their effect.
func (c *Conn) Quiesce(ctx context.Context) error {
	return c.calls.Quiesce(ctx)
}

// Attached lists the hostdevs (mdev and PCI) in the domain's config and live
// definition, joined with the instances its vgpud metadata records.
func (c *Conn) Attached(ctx context.Context, ref string) ([]Attached, error) {
	name, err := c.parseRef(ref)
	if err != nil {
		return nil, err
	}
	var out []Attached
	err = c.do(ctx, "attached", func(r *rpc) error {
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
		out, err = joinAttached(cfg, live)
		return err
	})
	return out, err
}

// joinAttached merges hostdevs and metadata entries of both definitions by
// hostdev identity, in order of first appearance.
func joinAttached(cfg, live *libvirtxml.Domain) ([]Attached, error) {
	var out []Attached
	index := map[string]int{}
	at := func(h Hostdev) *Attached {
		k := h.key()
		if i, ok := index[k]; ok {
			return &out[i]
		}
		index[k] = len(out)
		out = append(out, Attached{Hostdev: h})
		return &out[len(out)-1]
	}
	for _, side := range []struct {
		def    *libvirtxml.Domain
		config bool
	}{{cfg, true}, {live, false}} {
		if side.def == nil || side.def.Devices == nil {
			continue
		}
		for i := range side.def.Devices.Hostdevs {
			h, ok := hostdevFromXML(&side.def.Devices.Hostdevs[i])
			if !ok {
				continue
			}
			a := at(h)
			if side.config {
				a.Config = true
			} else {
				a.Live = true
			}
		}
	}
	for _, side := range []struct {
		def    *libvirtxml.Domain
		config bool
	}{{cfg, true}, {live, false}} {
		m, err := readMetadata(side.def)
		if err != nil {
			return nil, err
		}
		for _, e := range m {
			h, ok := e.hostdev()
			if !ok {
				continue
			}
			a := at(h)
			a.Instance = e.ID
			if side.config {
				a.MetadataConfig = true
			} else {
				a.MetadataLive = true
			}
		}
	}
	return out, nil
}
