package libvirtd

import (
	"encoding/xml"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// markerNS names the metadata element that marks a domain as defined by this
// harness, so a later run can remove what a crashed run left behind without
// touching any other domain.
const markerNS = "https://vgpud.dev/xmlns/testenv/1"

type marker struct {
	XMLName xml.Name `xml:"https://vgpud.dev/xmlns/testenv/1 domain"`
}

// Domain names a domain the harness defined.
type Domain struct {
	Name string
	UUID string
}

// TinyDomain is the smallest guest that starts under TCG here: type qemu,
// 64 MiB, 1 vCPU, machine pc, no disk, no graphics, no devices. Tests that
// need more (a graphics device, ACPI) change the returned value and pass it to
// DefineDomainXML.
func TinyDomain(name string) *libvirtxml.Domain {
	return &libvirtxml.Domain{
		Type:   "qemu",
		Name:   name,
		UUID:   uuid.NewString(),
		Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Value: 1},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "pc", Type: "hvm"},
		},
		Devices: &libvirtxml.DomainDeviceList{},
	}
}

// DefineDomain defines TinyDomain(name) and undefines it (destroying it
// first if it runs) at cleanup.
func (e *Env) DefineDomain(t testing.TB, name string) Domain {
	t.Helper()
	return e.DefineDomainXML(t, TinyDomain(name))
}

// DefineDomainXML defines d (a UUID is generated when it has none) and
// undefines it at cleanup, destroying it first if it runs. Defining over an
// existing domain of the same name fails the test rather than replacing it.
func (e *Env) DefineDomainXML(t testing.TB, d *libvirtxml.Domain) Domain {
	t.Helper()
	if d.UUID == "" {
		d.UUID = uuid.NewString()
	}
	mark, err := xml.Marshal(marker{})
	if err != nil {
		t.Fatalf("libvirtd: marker: %v", err)
	}
	if d.Metadata == nil {
		d.Metadata = &libvirtxml.DomainMetadata{}
	}
	d.Metadata.XML += string(mark)
	doc, err := d.Marshal()
	if err != nil {
		t.Fatalf("libvirtd: marshal domain %s: %v", d.Name, err)
	}
	l := e.Client(t)
	if _, err := l.DomainLookupByName(d.Name); err == nil {
		t.Fatalf("libvirtd: a domain named %q already exists; not replacing it", d.Name)
	}
	if _, err := l.DomainDefineXMLFlags(doc, libvirt.DomainDefineValidate); err != nil {
		t.Fatalf("libvirtd: define %s: %v", d.Name, err)
	}
	dom := Domain{Name: d.Name, UUID: d.UUID}
	t.Cleanup(func() { e.removeDomain(t, dom.UUID) })
	return dom
}

// bareMarker is the <description> that marks a domain DefineBareDomain
// defined, which has no <metadata> to hold the marker element.
const bareMarker = "defined by the vgpud test harness (" + markerNS + ")"

// DefineBareDomain defines TinyDomain(name) without a <metadata> element,
// as a domain made with `virsh define` from a plain file is: tests of
// what vgpud leaves in a domain's XML need one. The harness marks it by
// its <description> instead, so a crashed run's leftover is still removed.
func (e *Env) DefineBareDomain(t testing.TB, name string) Domain {
	t.Helper()
	d := TinyDomain(name)
	d.Description = bareMarker
	doc, err := d.Marshal()
	if err != nil {
		t.Fatalf("libvirtd: marshal domain %s: %v", d.Name, err)
	}
	l := e.Client(t)
	if _, err := l.DomainLookupByName(d.Name); err == nil {
		t.Fatalf("libvirtd: a domain named %q already exists; not replacing it", d.Name)
	}
	if _, err := l.DomainDefineXMLFlags(doc, libvirt.DomainDefineValidate); err != nil {
		t.Fatalf("libvirtd: define %s: %v", d.Name, err)
	}
	dom := Domain{Name: d.Name, UUID: d.UUID}
	t.Cleanup(func() { e.removeDomain(t, dom.UUID) })
	return dom
}

// StartDomain starts a defined domain.
func (e *Env) StartDomain(t testing.TB, name string) {
	t.Helper()
	l := e.Client(t)
	dom, err := l.DomainLookupByName(name)
	if err != nil {
		t.Fatalf("libvirtd: lookup %s: %v", name, err)
	}
	if err := l.DomainCreate(dom); err != nil {
		t.Fatalf("libvirtd: start %s: %v", name, err)
	}
}

// DestroyDomain stops a running domain at once.
func (e *Env) DestroyDomain(t testing.TB, name string) {
	t.Helper()
	l := e.Client(t)
	dom, err := l.DomainLookupByName(name)
	if err != nil {
		t.Fatalf("libvirtd: lookup %s: %v", name, err)
	}
	if err := l.DomainDestroy(dom); err != nil {
		t.Fatalf("libvirtd: destroy %s: %v", name, err)
	}
}

// SnapshotDomain gives a defined domain the metadata of a snapshot,
// redefined as `virsh snapshot-create --redefine` does (no disk is
// touched): libvirt refuses to undefine a domain that has one. drop
// deletes the snapshot's metadata; the domain's removal at cleanup takes
// them with it.
func (e *Env) SnapshotDomain(t testing.TB, name string) (drop func()) {
	t.Helper()
	l := e.Client(t)
	dom, err := l.DomainLookupByName(name)
	if err != nil {
		t.Fatalf("libvirtd: lookup %s: %v", name, err)
	}
	def, err := l.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
	if err != nil {
		t.Fatalf("libvirtd: dumpxml %s: %v", name, err)
	}
	snap, err := l.DomainSnapshotCreateXML(dom, "<domainsnapshot><name>kept</name><state>shutoff</state><creationTime>1</creationTime>"+def+"</domainsnapshot>",
		uint32(libvirt.DomainSnapshotCreateRedefine))
	if err != nil {
		t.Fatalf("libvirtd: redefine a snapshot of %s: %v", name, err)
	}
	return func() {
		t.Helper()
		if err := l.DomainSnapshotDelete(snap, libvirt.DomainSnapshotDeleteMetadataOnly); err != nil {
			t.Fatalf("libvirtd: delete the snapshot of %s: %v", name, err)
		}
	}
}

// removeDomain destroys (if running) and undefines a domain by UUID; one that
// is already gone is fine.
func (e *Env) removeDomain(t testing.TB, id string) {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Errorf("libvirtd: bad uuid %q: %v", id, err)
		return
	}
	l, err := dial(e.socket)
	if err != nil {
		t.Errorf("libvirtd: cannot remove domain %s: %v", id, err)
		return
	}
	defer l.Disconnect()
	dom, err := l.DomainLookupByUUID(libvirt.UUID(u))
	if err != nil {
		if !libvirt.IsNotFound(err) {
			t.Errorf("libvirtd: lookup %s: %v", id, err)
		}
		return
	}
	if active, err := l.DomainIsActive(dom); err == nil && active == 1 {
		if err := l.DomainDestroy(dom); err != nil {
			// Right after a libvirtd restart the destroy can race with
			// libvirtd's own reconnect to the guest, which then stops it
			// first; a guest that is down is what was wanted.
			if active, aerr := l.DomainIsActive(dom); aerr != nil || active == 1 {
				t.Errorf("libvirtd: destroy %s: %v", dom.Name, err)
			}
		}
	}
	if persistent, err := l.DomainIsPersistent(dom); err == nil && persistent == 1 {
		if err := l.DomainUndefineFlags(dom, libvirt.DomainUndefineManagedSave|libvirt.DomainUndefineNvram|libvirt.DomainUndefineSnapshotsMetadata); err != nil && !libvirt.IsNotFound(err) {
			t.Errorf("libvirtd: undefine %s: %v", dom.Name, err)
		}
	}
}

// sweepStale removes domains a crashed earlier run defined. It only runs while
// the machine-wide lock is held, so no running test owns them.
func (e *Env) sweepStale(t testing.TB) {
	t.Helper()
	l, err := dial(e.socket)
	if err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	doms, _, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
	if err != nil {
		l.Disconnect()
		t.Fatalf("libvirtd: list domains: %v", err)
	}
	var stale []Domain
	for _, dom := range doms {
		doc, err := l.DomainGetXMLDesc(dom, libvirt.DomainXMLInactive)
		if err != nil {
			continue
		}
		// The marker is looked up by namespace in the parsed metadata, not by
		// searching the document text.
		var d libvirtxml.Domain
		if d.Unmarshal(doc) != nil {
			continue
		}
		if d.Description != bareMarker && (d.Metadata == nil || !hasMarker(d.Metadata.XML)) {
			continue
		}
		stale = append(stale, Domain{Name: dom.Name, UUID: d.UUID})
	}
	l.Disconnect()
	for _, d := range stale {
		t.Logf("removing domain %s left by an earlier run", d.Name)
		e.removeDomain(t, d.UUID)
	}
}

func hasMarker(inner string) bool {
	dec := xml.NewDecoder(strings.NewReader(inner))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Space == markerNS && se.Name.Local == "domain" {
			return true
		}
	}
}
