package virt

import (
	"context"
	"encoding/xml"
	"errors"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
)

// No hostdev can be live here (no VFIO), so the wait for libvirt's
// device-removed event is tested with stand-in devices: a USB tablet, which
// QEMU unplugs at once, and a PCI watchdog in a guest with ACPI but no OS,
// which never acknowledges the unplug.

func internalConn(t *testing.T, env *libvirtd.Env, detach time.Duration) *Conn {
	t.Helper()
	c, err := Connect(context.Background(), Config{Socket: env.Socket(), DetachTimeout: detach})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// plugLive hot-plugs dev into the running domain and returns its alias.
func plugLive(t *testing.T, env *libvirtd.Env, name string, dev string, alias func(*libvirtxml.Domain) string) string {
	t.Helper()
	l := env.Client(t)
	d, err := l.DomainLookupByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.DomainAttachDeviceFlags(d, dev, uint32(libvirt.DomainDeviceModifyLive)); err != nil {
		t.Fatalf("hot-plug %s: %v", dev, err)
	}
	doc, err := l.DomainGetXMLDesc(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	a := alias(&def)
	if a == "" {
		t.Fatalf("hot-plugged device has no alias:\n%s", doc)
	}
	return a
}

func inputAlias(def *libvirtxml.Domain) string {
	for _, in := range def.Devices.Inputs {
		if in.Type == "tablet" && in.Alias != nil {
			return in.Alias.Name
		}
	}
	return ""
}

func watchdogAlias(def *libvirtxml.Domain) string {
	for _, w := range def.Devices.Watchdogs {
		if w.Alias != nil {
			return w.Alias.Name
		}
	}
	return ""
}

func runDetachLive(t *testing.T, c *Conn, name, alias string, present func(*libvirtxml.Domain) bool) error {
	t.Helper()
	return c.do(context.Background(), "test detach", func(r *rpc) error {
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		return c.detachLive(r, d, alias, present)
	})
}

func TestDetachLiveWaitsForDeviceRemoved(t *testing.T) {
	env := libvirtd.Start(t)
	c := internalConn(t, env, 10*time.Second)
	dom := env.DefineDomain(t, "virt-unplug")
	env.StartDomain(t, dom.Name)
	dev, err := (&libvirtxml.DomainInput{Type: "tablet", Bus: "usb"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	alias := plugLive(t, env, dom.Name, dev, inputAlias)

	present := func(def *libvirtxml.Domain) bool { return inputAlias(def) == alias }
	if err := runDetachLive(t, c, dom.Name, alias, present); err != nil {
		t.Fatalf("detachLive: %v", err)
	}
	// The event came, so the device must be gone now, not later.
	var gone bool
	err = c.do(context.Background(), "check", func(r *rpc) error {
		d, err := r.lookup(dom.Name)
		if err != nil {
			return err
		}
		live, err := r.def(d, false)
		gone = !present(live)
		return err
	})
	if err != nil || !gone {
		t.Fatalf("after detachLive the tablet is still live (err %v)", err)
	}
}

func TestDetachLiveTimesOut(t *testing.T) {
	env := libvirtd.Start(t)
	c := internalConn(t, env, time.Second)
	d := libvirtd.TinyDomain("virt-stuck-unplug")
	// ACPI makes the PCI bus hotpluggable; with no OS in the guest the
	// unplug request is never acknowledged.
	d.Features = &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}}
	dom := env.DefineDomainXML(t, d)
	env.StartDomain(t, dom.Name)
	dev, err := (&libvirtxml.DomainWatchdog{Model: "i6300esb"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	alias := plugLive(t, env, dom.Name, dev, watchdogAlias)

	start := time.Now()
	err = runDetachLive(t, c, dom.Name, alias, func(def *libvirtxml.Domain) bool { return watchdogAlias(def) == alias })
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("detachLive = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d < time.Second || d > 5*time.Second {
		t.Fatalf("gave up after %v, DetachTimeout is 1s", d)
	}
}

// TestDoRepeatsAfterBrokenConnection breaks the connection under an
// operation's first run: do must run it again on a new connection.
func TestDoRepeatsAfterBrokenConnection(t *testing.T) {
	env := libvirtd.Start(t)
	c := internalConn(t, env, time.Second)
	dom := env.DefineDomain(t, "virt-retry")
	runs := 0
	var sessions []uint64
	err := c.do(context.Background(), "test", func(r *rpc) error {
		runs++
		sessions = append(sessions, r.s.id)
		if runs == 1 {
			r.s.kill()
		}
		_, err := r.lookup(dom.Name)
		return err
	})
	if err != nil {
		t.Fatalf("do: %v", err)
	}
	if runs != 2 || sessions[0] == sessions[1] {
		t.Fatalf("ran %d times on sessions %v, want twice on two sessions", runs, sessions)
	}
}

func TestParseRef(t *testing.T) {
	c := &Conn{cfg: Config{URI: "qemu:///system"}}
	for _, tc := range []struct {
		ref, name string
		err       error
	}{
		{"vm1", "vm1", nil},
		{"qemu:///system/vm1", "vm1", nil},
		{"qemu+ssh://host2/system/vm1", "", ErrOtherHost},
		{"qemu:///session/vm1", "", ErrOtherHost},
		{"qemu:///system/", "", ErrDomainNotFound},
		{"", "", ErrDomainNotFound},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			name, err := c.parseRef(tc.ref)
			if !errors.Is(err, tc.err) || name != tc.name {
				t.Fatalf("parseRef(%q) = %q, %v; want %q, %v", tc.ref, name, err, tc.name, tc.err)
			}
		})
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	m := metadata{}.with(entryFor("a", Hostdev{Kind: Mdev, MdevUUID: "4b20d080-1b54-4048-85b3-a6a62d165c01"})).
		with(entryFor("b", Hostdev{Kind: VF, PCI: "0000:41:00.4"}))
	doc, err := m.marshal()
	if err != nil || doc == "" {
		t.Fatalf("marshal = %q, %v", doc, err)
	}
	// Another application's element named "instances" must be ignored.
	other, err := xml.Marshal(struct {
		XMLName xml.Name `xml:"urn:other instances"`
	}{})
	if err != nil {
		t.Fatal(err)
	}
	def := &libvirtxml.Domain{Name: "x", Metadata: &libvirtxml.DomainMetadata{
		XML: string(other) + namespaced(t, m),
	}}
	got, err := readMetadata(def)
	if err != nil {
		t.Fatal(err)
	}
	if !equalMeta(got, m) {
		t.Fatalf("read %+v, want %+v", got, m)
	}
	if again := got.with(entryFor("a", Hostdev{Kind: Mdev, MdevUUID: "4b20d080-1b54-4048-85b3-a6a62d165c01"})); !equalMeta(again, metadata{m[1], m[0]}) {
		t.Fatalf("with() of an existing instance = %+v", again)
	}
	// A device belongs to one instance: an entry left for an earlier one
	// on the same VF is replaced.
	if moved := got.with(entryFor("c", Hostdev{Kind: VF, PCI: "0000:41:00.4"})); !equalMeta(moved, metadata{m[0], entryFor("c", Hostdev{Kind: VF, PCI: "0000:41:00.4"})}) {
		t.Fatalf("with() of another instance on a recorded device = %+v", moved)
	}
	if rest := got.without("a", Hostdev{Kind: VF, PCI: "0000:41:00.4"}); len(rest) != 0 {
		t.Fatalf("without() left %+v", rest)
	}
	if empty, _ := metadata(nil).marshal(); empty != "" {
		t.Fatalf("empty metadata marshals to %q", empty)
	}
}

// namespaced re-encodes vgpud's element in its namespace, as a stored
// definition has it. (libvirt's prefixed form is read in the libvirtd tests.)
func namespaced(t *testing.T, m metadata) string {
	t.Helper()
	type nsDoc struct {
		XMLName   xml.Name    `xml:"https://vgpud.dev/xmlns/domain/1 instances"`
		Instances []metaEntry `xml:"https://vgpud.dev/xmlns/domain/1 instance"`
	}
	b, err := xml.Marshal(nsDoc{Instances: m})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
