package virt

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/internal/hostcall"
)

// rpc issues libvirt calls on one session, each abandoned when the
// operation's context ends. go-libvirt calls take no context, so each runs in
// a goroutine; an abandoned one ends when its reply arrives or the connection
// drops.
type rpc struct {
	ctx context.Context
	s   *session
	c   *Conn
}

// call runs fn, returning early with ErrTimeout (or the cancellation) when
// the context ends first; the abandoned call is counted until it returns
// (Quiesce). Errors from libvirtd are mapped by code.
func call[T any](r *rpc, fn func(l *libvirt.Libvirt) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	if err := r.ctx.Err(); err != nil {
		var zero T
		return zero, ctxErr(r.ctx)
	}
	res, err := hostcall.Go(r.ctx, &r.c.calls, func() result {
		v, err := fn(r.s.l)
		return result{v, err}
	})
	if err != nil {
		var zero T
		return zero, ctxErr(r.ctx)
	}
	return res.v, libvirtErr(res.err)
}

func call0(r *rpc, fn func(l *libvirt.Libvirt) error) error {
	_, err := call(r, func(l *libvirt.Libvirt) (struct{}, error) { return struct{}{}, fn(l) })
	return err
}

func (r *rpc) lookup(name string) (libvirt.Domain, error) {
	d, err := call(r, func(l *libvirt.Libvirt) (libvirt.Domain, error) { return l.DomainLookupByName(name) })
	if err != nil {
		return d, fmt.Errorf("domain %q: %w", name, err)
	}
	return d, nil
}

// domState is what an operation needs to know about a domain up front.
type domState struct {
	active, persistent bool
}

func (r *rpc) state(d libvirt.Domain) (domState, error) {
	active, err := call(r, func(l *libvirt.Libvirt) (int32, error) { return l.DomainIsActive(d) })
	if err != nil {
		return domState{}, fmt.Errorf("domain %s: is active: %w", d.Name, err)
	}
	persistent, err := call(r, func(l *libvirt.Libvirt) (int32, error) { return l.DomainIsPersistent(d) })
	if err != nil {
		return domState{}, fmt.Errorf("domain %s: is persistent: %w", d.Name, err)
	}
	return domState{active: active == 1, persistent: persistent == 1}, nil
}

// def reads and parses a domain definition: the persistent config when
// inactive is set, the live one otherwise.
func (r *rpc) def(d libvirt.Domain, inactive bool) (*libvirtxml.Domain, error) {
	var flags libvirt.DomainXMLFlags
	which := "live"
	if inactive {
		flags = libvirt.DomainXMLInactive
		which = "config"
	}
	doc, err := call(r, func(l *libvirt.Libvirt) (string, error) { return l.DomainGetXMLDesc(d, flags) })
	if err != nil {
		return nil, fmt.Errorf("domain %s: read %s XML: %w", d.Name, which, err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("domain %s: parse %s XML: %w", d.Name, which, err)
	}
	return &def, nil
}

// defs reads the config (when persistent) and, when running, the live
// definition.
func (r *rpc) defs(d libvirt.Domain, st domState) (cfg, live *libvirtxml.Domain, err error) {
	if st.persistent {
		if cfg, err = r.def(d, true); err != nil {
			return nil, nil, err
		}
	}
	if st.active {
		if live, err = r.def(d, false); err != nil {
			return nil, nil, err
		}
	}
	return cfg, live, nil
}

func (r *rpc) attachDevice(d libvirt.Domain, doc string, flags libvirt.DomainDeviceModifyFlags) error {
	return call0(r, func(l *libvirt.Libvirt) error { return l.DomainAttachDeviceFlags(d, doc, uint32(flags)) })
}

func (r *rpc) detachDevice(d libvirt.Domain, doc string, flags libvirt.DomainDeviceModifyFlags) error {
	return call0(r, func(l *libvirt.Libvirt) error { return l.DomainDetachDeviceFlags(d, doc, uint32(flags)) })
}

func (r *rpc) detachAlias(d libvirt.Domain, alias string, flags libvirt.DomainDeviceModifyFlags) error {
	return call0(r, func(l *libvirt.Libvirt) error { return l.DomainDetachDeviceAlias(d, alias, uint32(flags)) })
}

// setMetadata writes vgpud's element (removing it when m is empty) to the
// definitions named by flags.
func (r *rpc) setMetadata(d libvirt.Domain, m metadata, flags libvirt.DomainModificationImpact) error {
	doc, err := m.marshal()
	if err != nil {
		return err
	}
	var text libvirt.OptString
	if doc != "" {
		text = libvirt.OptString{doc}
	}
	err = call0(r, func(l *libvirt.Libvirt) error {
		return l.DomainSetMetadata(d, int32(libvirt.DomainMetadataElement), text,
			libvirt.OptString{MetadataPrefix}, libvirt.OptString{MetadataNamespace}, flags)
	})
	if err != nil {
		return fmt.Errorf("domain %s: write vgpud metadata: %w", d.Name, err)
	}
	return nil
}

// writeMetadata brings the config and live metadata to cfg and live, in one
// call when both change to the same list.
func (r *rpc) writeMetadata(d libvirt.Domain, cfgNow, cfg, liveNow, live metadata, st domState) error {
	cfgChange := st.persistent && !equalMeta(cfgNow, cfg)
	liveChange := st.active && !equalMeta(liveNow, live)
	switch {
	case cfgChange && liveChange && equalMeta(cfg, live):
		return r.setMetadata(d, cfg, libvirt.DomainAffectConfig|libvirt.DomainAffectLive)
	case cfgChange && liveChange:
		if err := r.setMetadata(d, cfg, libvirt.DomainAffectConfig); err != nil {
			return err
		}
		return r.setMetadata(d, live, libvirt.DomainAffectLive)
	case cfgChange:
		return r.setMetadata(d, cfg, libvirt.DomainAffectConfig)
	case liveChange:
		return r.setMetadata(d, live, libvirt.DomainAffectLive)
	}
	return nil
}

func equalMeta(a, b metadata) bool { return slices.Equal(a, b) }

// emptyMetadata is the line libvirt writes for a <metadata> element left
// with no children.
var emptyMetadata = regexp.MustCompile(`(?m)^[ \t]*<metadata/>\n`)

// dropEmptyMetadata removes an empty <metadata/> from the domain's config
// by defining the config again without it: libvirt has no call that
// removes the element itself. The XML is read with its secrets (graphics
// passwords), which the redefinition must keep. A config whose metadata is
// not empty, or that does not hold exactly one empty element, is left
// alone.
func (r *rpc) dropEmptyMetadata(d libvirt.Domain) error {
	doc, err := call(r, func(l *libvirt.Libvirt) (string, error) {
		return l.DomainGetXMLDesc(d, libvirt.DomainXMLInactive|libvirt.DomainXMLSecure)
	})
	if err != nil {
		return fmt.Errorf("domain %s: read config XML: %w", d.Name, err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		return fmt.Errorf("domain %s: parse config XML: %w", d.Name, err)
	}
	if def.Metadata == nil || strings.TrimSpace(def.Metadata.XML) != "" {
		return nil
	}
	at := emptyMetadata.FindAllStringIndex(doc, -1)
	if len(at) != 1 {
		return nil
	}
	doc = doc[:at[0][0]] + doc[at[0][1]:]
	_, err = call(r, func(l *libvirt.Libvirt) (libvirt.Domain, error) { return l.DomainDefineXMLFlags(doc, 0) })
	if err != nil {
		return fmt.Errorf("domain %s: define config without the empty metadata: %w", d.Name, err)
	}
	return nil
}
