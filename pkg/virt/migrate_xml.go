package virt

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// ErrBadDestXML: a definition meant for the destination of a migration is
// not the source's with the vGPU swapped: another name or UUID, the vGPU
// missing, or some other difference. Nothing was sent to libvirtd.
var ErrBadDestXML = errors.New("destination XML is not the source's with the vGPU replaced")

// MigrationXML is a domain's definitions rewritten for a migration's
// destination, as DestinationXML makes them.
type MigrationXML struct {
	// Live is the running domain's definition (read with
	// VIR_DOMAIN_XML_MIGRATABLE) with the vGPU swapped where it holds it,
	// for VIR_MIGRATE_PARAM_DEST_XML; "" when the domain is shut off.
	Live string
	// Persistent is the persistent configuration (inactive and
	// migratable) with the vGPU swapped where it holds it, for
	// VIR_MIGRATE_PARAM_PERSIST_XML or the offline define; "" for a
	// transient domain.
	Persistent string
	// VGPULive says the live definition holds the vGPU: moving the domain
	// while it runs needs VFIO device migration (CheckLiveMigration).
	VGPULive bool
}

// DomainXML returns the domain's definition as libvirt gives it for a
// migration (VIR_DOMAIN_XML_MIGRATABLE): the persistent configuration when
// inactive is set, else the live one.
func (c *Conn) DomainXML(ctx context.Context, ref string, inactive bool) (string, error) {
	name, err := c.parseRef(ref)
	if err != nil {
		return "", err
	}
	var out string
	err = c.do(ctx, "domain xml", func(r *rpc) error {
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		out, err = r.migratableXML(d, inactive)
		return err
	})
	return out, err
}

func (r *rpc) migratableXML(d libvirt.Domain, inactive bool) (string, error) {
	flags, which := libvirt.DomainXMLMigratable, "live"
	if inactive {
		flags, which = flags|libvirt.DomainXMLInactive, "config"
	}
	doc, err := call(r, func(l *libvirt.Libvirt) (string, error) { return l.DomainGetXMLDesc(d, flags) })
	if err != nil {
		return "", fmt.Errorf("domain %s: read %s XML: %w", d.Name, which, err)
	}
	return doc, nil
}

// DestinationXML reads the domain's definitions and rewrites them for a
// migration that moves vGPU from to to (the destination's mdev UUID or VF
// address, of the same kind), with the vgpud metadata entry renamed to the
// destination's instance toInstance ("" keeps the ID). Everything else is
// kept. A domain that holds from in neither definition is ErrBadDestXML.
func (c *Conn) DestinationXML(ctx context.Context, ref string, from, to Hostdev, toInstance string) (MigrationXML, error) {
	name, err := c.parseRef(ref)
	if err != nil {
		return MigrationXML{}, err
	}
	var out MigrationXML
	err = c.do(ctx, "destination xml", func(r *rpc) error {
		out = MigrationXML{}
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		st, err := r.state(d)
		if err != nil {
			return err
		}
		found := false
		for _, side := range []struct {
			on       bool
			inactive bool
			dst      *string
		}{{st.active, false, &out.Live}, {st.persistent, true, &out.Persistent}} {
			if !side.on {
				continue
			}
			doc, err := r.migratableXML(d, side.inactive)
			if err != nil {
				return err
			}
			rewritten, held, err := RewriteHostdev(doc, from, to, toInstance)
			if err != nil {
				return fmt.Errorf("domain %s: %w", name, err)
			}
			*side.dst = rewritten
			found = found || held
			if !side.inactive {
				out.VGPULive = held
			}
		}
		if !found {
			return fmt.Errorf("%w: domain %s holds no %s", ErrBadDestXML, name, from)
		}
		return nil
	})
	return out, err
}

// RewriteHostdev returns the domain definition doc with hostdev from
// replaced by to: only the hostdev's source address changes (its alias,
// guest address and options stay), and the vgpud metadata entry for from
// names to and, when toInstance is set, that instance. held says whether
// doc had the hostdev; one without it comes back unchanged but for the
// metadata entry. from and to must be of the same kind.
func RewriteHostdev(doc string, from, to Hostdev, toInstance string) (out string, held bool, err error) {
	if from, err = from.normalize(); err != nil {
		return "", false, err
	}
	if to, err = to.normalize(); err != nil {
		return "", false, err
	}
	if from.Kind != to.Kind {
		return "", false, fmt.Errorf("%w: cannot turn %s into %s", ErrInvalidHostdev, from, to)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		return "", false, fmt.Errorf("%w: parse: %w", ErrBadDestXML, err)
	}
	if hd := findHostdev(&def, from); hd != nil {
		held = true
		setHostdevSource(hd, to)
	}
	if err := rewriteMetadata(&def, from, to, toInstance); err != nil {
		return "", false, err
	}
	out, err = def.Marshal()
	if err != nil {
		return "", false, fmt.Errorf("marshal domain %s: %w", def.Name, err)
	}
	return out, held, nil
}

// setHostdevSource points hd, which holds a device of h's kind, at h.
func setHostdevSource(hd *libvirtxml.DomainHostdev, h Hostdev) {
	if h.Kind == Mdev {
		hd.SubsysMDev.Source.Address.UUID = h.MdevUUID
		return
	}
	a, _ := parsePCI(h.PCI)
	hd.SubsysPCI.Source.Address = &libvirtxml.DomainAddressPCI{
		Domain: &a.domain, Bus: &a.bus, Slot: &a.slot, Function: &a.function,
	}
}

// rewriteMetadata renames the vgpud metadata entry for from in place,
// leaving every other metadata element as libvirt wrote it.
func rewriteMetadata(def *libvirtxml.Domain, from, to Hostdev, toInstance string) error {
	m, err := readMetadata(def)
	if err != nil || len(m) == 0 {
		return err
	}
	changed := false
	for i, e := range m {
		if h, ok := e.hostdev(); ok && h.key() == from.key() {
			id := e.ID
			if toInstance != "" {
				id = toInstance
			}
			m[i] = entryFor(id, to)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	inner, err := spliceMetadata(def.Metadata.XML, m)
	if err != nil {
		return fmt.Errorf("domain %s: %w", def.Name, err)
	}
	def.Metadata.XML = inner
	return nil
}

// prefixedDoc is vgpud's metadata element as libvirt prints it, with the
// namespace bound to MetadataPrefix, for writing into a whole definition
// (DomainSetMetadata adds the binding itself; a definition has to carry
// it).
type prefixedDoc struct {
	XMLName   xml.Name        `xml:"vgpud:instances"`
	NS        string          `xml:"xmlns:vgpud,attr"`
	Instances []prefixedEntry `xml:"vgpud:instance"`
}

type prefixedEntry struct {
	ID   string `xml:"id,attr"`
	Kind string `xml:"kind,attr"`
	Mdev string `xml:"mdev,attr,omitempty"`
	PCI  string `xml:"pci,attr,omitempty"`
}

// spliceMetadata replaces vgpud's element in the <metadata> inner XML
// with one listing m.
func spliceMetadata(inner string, m metadata) (string, error) {
	doc := prefixedDoc{NS: MetadataNamespace}
	for _, e := range m {
		doc.Instances = append(doc.Instances, prefixedEntry(e))
	}
	b, err := xml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("marshal vgpud metadata: %w", err)
	}
	dec := xml.NewDecoder(strings.NewReader(inner))
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "", fmt.Errorf("vgpud metadata: element not found: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if err := dec.Skip(); err != nil {
			return "", fmt.Errorf("vgpud metadata: %w", err)
		}
		if se.Name.Space == MetadataNamespace && se.Name.Local == "instances" {
			return inner[:start] + string(b) + inner[dec.InputOffset():], nil
		}
	}
}

// CheckDestXML checks that dst, a definition meant for a migration's
// destination, is src with hostdev from replaced by to and nothing else
// changed but vgpud's metadata: same name and UUID, to held where src held
// from. It is what DestinationXML makes, checked again before libvirt is
// given a definition that came from elsewhere (a caller's edit, a stored
// plan). Violations are ErrBadDestXML.
func CheckDestXML(src, dst string, from, to Hostdev) error {
	var err error
	if from, err = from.normalize(); err != nil {
		return err
	}
	if to, err = to.normalize(); err != nil {
		return err
	}
	var s, d libvirtxml.Domain
	if err := s.Unmarshal(src); err != nil {
		return fmt.Errorf("%w: source: %w", ErrBadDestXML, err)
	}
	if err := d.Unmarshal(dst); err != nil {
		return fmt.Errorf("%w: destination: %w", ErrBadDestXML, err)
	}
	if s.Name != d.Name || s.UUID != d.UUID {
		return fmt.Errorf("%w: domain %s (%s) became %s (%s)", ErrBadDestXML, s.Name, s.UUID, d.Name, d.UUID)
	}
	held, dheld := findHostdev(&s, from) != nil, findHostdev(&d, to) != nil
	if held != dheld {
		return fmt.Errorf("%w: source holds %s: %v; destination holds %s: %v", ErrBadDestXML, from, held, to, dheld)
	}
	if from.key() != to.key() && findHostdev(&d, from) != nil {
		return fmt.Errorf("%w: destination still holds the source's %s", ErrBadDestXML, from)
	}
	// Put the source's device back and drop the metadata on both sides:
	// what is left must be the same document.
	if hd := findHostdev(&d, to); hd != nil {
		setHostdevSource(hd, from)
	}
	s.Metadata, d.Metadata = nil, nil
	a, err := s.Marshal()
	if err != nil {
		return fmt.Errorf("marshal source: %w", err)
	}
	b, err := d.Marshal()
	if err != nil {
		return fmt.Errorf("marshal destination: %w", err)
	}
	if a != b {
		return fmt.Errorf("%w: domain %s differs beyond the vGPU", ErrBadDestXML, s.Name)
	}
	return nil
}
