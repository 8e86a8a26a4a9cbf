package virt

import (
	"encoding/xml"
	"fmt"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// MetadataNamespace is the XML namespace of vgpud's element in a domain's
// <metadata>. libvirt writes it with the prefix MetadataPrefix:
//
//	<vgpud:instances xmlns:vgpud="https://vgpud.dev/xmlns/domain/1">
//	  <vgpud:instance id="..." kind="mdev" mdev="4b20d080-..."/>
//	  <vgpud:instance id="..." kind="vf" pci="0000:41:00.4"/>
//	</vgpud:instances>
const (
	MetadataNamespace = "https://vgpud.dev/xmlns/domain/1"
	MetadataPrefix    = "vgpud"
)

// metaDoc is the element as vgpud writes it; libvirt puts it (and its
// children) in MetadataNamespace under MetadataPrefix.
type metaDoc struct {
	XMLName   xml.Name    `xml:"instances"`
	Instances []metaEntry `xml:"instance"`
}

// metaEntry records one instance vgpud attached and the hostdev it used.
type metaEntry struct {
	ID   string `xml:"id,attr"`
	Kind string `xml:"kind,attr"`
	Mdev string `xml:"mdev,attr,omitempty"`
	PCI  string `xml:"pci,attr,omitempty"`
}

func entryFor(instance string, h Hostdev) metaEntry {
	e := metaEntry{ID: instance, Kind: h.Kind.String()}
	if h.Kind == Mdev {
		e.Mdev = h.MdevUUID
	} else {
		e.PCI = h.PCI
	}
	return e
}

// hostdev is the Hostdev the entry names (identity only, no options).
func (e metaEntry) hostdev() (Hostdev, bool) {
	k, ok := parseKind(e.Kind)
	if !ok {
		return Hostdev{}, false
	}
	h, err := Hostdev{Kind: k, MdevUUID: e.Mdev, PCI: e.PCI}.normalize()
	return h, err == nil
}

// metadata is the list of entries in one definition (config or live).
type metadata []metaEntry

// readMetadata finds vgpud's element among a definition's metadata, by
// namespace. A definition without one has an empty list.
func readMetadata(def *libvirtxml.Domain) (metadata, error) {
	if def == nil || def.Metadata == nil || def.Metadata.XML == "" {
		return nil, nil
	}
	dec := xml.NewDecoder(strings.NewReader(def.Metadata.XML))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil // no vgpud element
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Space != MetadataNamespace || se.Name.Local != "instances" {
			if ok {
				if err := dec.Skip(); err != nil {
					return nil, nil
				}
			}
			continue
		}
		var doc metaDoc
		if err := dec.DecodeElement(&doc, &se); err != nil {
			return nil, fmt.Errorf("domain %s: vgpud metadata: %w", def.Name, err)
		}
		return doc.Instances, nil
	}
}

// has reports whether e is recorded exactly.
func (m metadata) has(e metaEntry) bool { return slices.Contains(m, e) }

// with returns m with e recorded, replacing an entry for the same instance
// or the same device: a device belongs to one instance, and an entry a
// crash left for an earlier instance on it is stale.
func (m metadata) with(e metaEntry) metadata {
	eh, eok := e.hostdev()
	out := make(metadata, 0, len(m)+1)
	for _, x := range m {
		if x.ID == e.ID {
			continue
		}
		if xh, ok := x.hostdev(); ok && eok && xh.key() == eh.key() {
			continue
		}
		out = append(out, x)
	}
	return append(out, e)
}

// without returns m less the entries for instance or for hostdev h.
func (m metadata) without(instance string, h Hostdev) metadata {
	out := make(metadata, 0, len(m))
	for _, x := range m {
		xh, ok := x.hostdev()
		if x.ID == instance || (ok && xh.key() == h.key()) {
			continue
		}
		out = append(out, x)
	}
	return out
}

// names reports whether some entry is for instance.
func (m metadata) names(instance string) bool {
	return slices.ContainsFunc(m, func(x metaEntry) bool { return x.ID == instance })
}

// marshal returns the element for DomainSetMetadata, or "" when m is empty
// (the element is then removed).
func (m metadata) marshal() (string, error) {
	if len(m) == 0 {
		return "", nil
	}
	b, err := xml.Marshal(metaDoc{Instances: m})
	if err != nil {
		return "", fmt.Errorf("marshal vgpud metadata: %w", err)
	}
	return string(b), nil
}
