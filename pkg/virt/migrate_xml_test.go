package virt_test

import (
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/pkg/virt"
)

// srcDomainXML is a definition as libvirt prints it, with an mdev and a VF
// hostdev (aliases, guest addresses), vgpud's metadata beside another
// application's, and devices that must come through unchanged.
const srcDomainXML = `<domain type='qemu'>
  <name>mig</name>
  <uuid>8f0d64ab-3c1e-4d3b-9a52-1b6a3f0c2d11</uuid>
  <metadata>
    <other:app xmlns:other="https://example.org/app/1"><other:note>keep me</other:note></other:app>
    <vgpud:instances xmlns:vgpud="https://vgpud.dev/xmlns/domain/1">
      <vgpud:instance id="src-inst-1" kind="mdev" mdev="` + mdevUUID + `"/>
      <vgpud:instance id="src-inst-2" kind="vf" pci="` + vfAddr + `"/>
    </vgpud:instances>
  </metadata>
  <memory unit='KiB'>65536</memory>
  <vcpu placement='static'>1</vcpu>
  <os><type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>
      <source><address uuid='` + mdevUUID + `'/></source>
      <alias name='hostdev0'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <driver name='vfio'/>
      <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x4'/></source>
      <alias name='hostdev1'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x06' function='0x0'/>
    </hostdev>
    <memballoon model='virtio'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0'/></memballoon>
  </devices>
</domain>`

const dstMdev = "9c6f1a2e-5d4b-4e3a-8f21-0a1b2c3d4e5f"

func TestRewriteHostdev(t *testing.T) {
	t.Run("mdev", func(t *testing.T) {
		to := virt.Hostdev{Kind: virt.Mdev, MdevUUID: dstMdev}
		out, held, err := virt.RewriteHostdev(srcDomainXML, mdevA, to, "dst-inst-1")
		if err != nil || !held {
			t.Fatalf("RewriteHostdev = held %v, %v", held, err)
		}
		d := parseDomain(t, out)
		hd := d.Devices.Hostdevs[0]
		if got := hd.SubsysMDev.Source.Address.UUID; got != dstMdev {
			t.Fatalf("mdev UUID = %s, want %s", got, dstMdev)
		}
		if hd.Alias == nil || hd.Alias.Name != "hostdev0" || hd.Address == nil || hd.Address.PCI == nil || *hd.Address.PCI.Slot != 5 {
			t.Fatalf("the hostdev's alias or guest address changed: %+v", hd)
		}
		if got := pciString(d.Devices.Hostdevs[1].SubsysPCI.Source.Address); got != vfAddr {
			t.Fatalf("the other hostdev changed: %s", got)
		}
		entries := vgpudEntries(t, d)
		want := []string{"dst-inst-1 mdev " + dstMdev, "src-inst-2 vf " + vfAddr}
		if strings.Join(entries, ",") != strings.Join(want, ",") {
			t.Fatalf("metadata = %v, want %v", entries, want)
		}
		if !strings.Contains(d.Metadata.XML, "keep me") {
			t.Fatalf("the other application's metadata was lost: %s", d.Metadata.XML)
		}
		if err := virt.CheckDestXML(srcDomainXML, out, mdevA, to); err != nil {
			t.Fatalf("CheckDestXML of RewriteHostdev's output: %v", err)
		}
		validate(t, out)
	})

	t.Run("vf", func(t *testing.T) {
		to := virt.Hostdev{Kind: virt.VF, PCI: "0000:81:01.2"}
		out, held, err := virt.RewriteHostdev(srcDomainXML, vfA, to, "")
		if err != nil || !held {
			t.Fatalf("RewriteHostdev = held %v, %v", held, err)
		}
		d := parseDomain(t, out)
		hd := d.Devices.Hostdevs[1]
		if got := pciString(hd.SubsysPCI.Source.Address); got != "0000:81:01.2" || hd.Managed != "no" || hd.Alias.Name != "hostdev1" {
			t.Fatalf("VF hostdev = %s managed %q alias %v", got, hd.Managed, hd.Alias)
		}
		if got := d.Devices.Hostdevs[0].SubsysMDev.Source.Address.UUID; got != mdevUUID {
			t.Fatalf("the mdev changed: %s", got)
		}
		if entries := vgpudEntries(t, d); entries[1] != "src-inst-2 vf 0000:81:01.2" {
			t.Fatalf("metadata = %v", entries)
		}
		if err := virt.CheckDestXML(srcDomainXML, out, vfA, to); err != nil {
			t.Fatalf("CheckDestXML: %v", err)
		}
		validate(t, out)
	})

	t.Run("not held", func(t *testing.T) {
		out, held, err := virt.RewriteHostdev(srcDomainXML, mdevB, virt.Hostdev{Kind: virt.Mdev, MdevUUID: dstMdev}, "x")
		if err != nil || held {
			t.Fatalf("RewriteHostdev of a device the domain lacks = held %v, %v", held, err)
		}
		if got := parseDomain(t, out).Devices.Hostdevs[0].SubsysMDev.Source.Address.UUID; got != mdevUUID {
			t.Fatalf("a hostdev changed: %s", got)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		if _, _, err := virt.RewriteHostdev(srcDomainXML, mdevA, vfA, ""); !errors.Is(err, virt.ErrInvalidHostdev) {
			t.Fatalf("mdev → VF: %v, want ErrInvalidHostdev", err)
		}
		if _, _, err := virt.RewriteHostdev(srcDomainXML, mdevA, virt.Hostdev{Kind: virt.Mdev, MdevUUID: "nope"}, ""); !errors.Is(err, virt.ErrInvalidHostdev) {
			t.Fatalf("bad UUID: %v, want ErrInvalidHostdev", err)
		}
		if _, _, err := virt.RewriteHostdev("<domain", mdevA, mdevB, ""); !errors.Is(err, virt.ErrBadDestXML) {
			t.Fatalf("bad XML: %v, want ErrBadDestXML", err)
		}
	})
}

func TestCheckDestXML(t *testing.T) {
	to := virt.Hostdev{Kind: virt.Mdev, MdevUUID: dstMdev}
	good, _, err := virt.RewriteHostdev(srcDomainXML, mdevA, to, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, dst := range map[string]string{
		"renamed":        strings.Replace(good, "<name>mig</name>", "<name>other</name>", 1),
		"another UUID":   strings.Replace(good, "8f0d64ab", "00000000", 1),
		"memory changed": strings.Replace(good, "65536", "131072", 1),
		"vGPU not moved": srcDomainXML,
		"other hostdev":  strings.Replace(good, "bus=\"0x41\"", "bus=\"0x42\"", 1),
		"not a domain":   "<domain",
		"vGPU removed":   strings.ReplaceAll(good, dstMdev, "11111111-2222-3333-4444-555555555555"),
	} {
		if dst == good {
			t.Fatalf("%s: the edit did not apply", name)
		}
		if err := virt.CheckDestXML(srcDomainXML, dst, mdevA, to); !errors.Is(err, virt.ErrBadDestXML) {
			t.Errorf("%s: CheckDestXML = %v, want ErrBadDestXML", name, err)
		}
	}
}

func parseDomain(t *testing.T, doc string) *libvirtxml.Domain {
	t.Helper()
	var d libvirtxml.Domain
	if err := d.Unmarshal(doc); err != nil {
		t.Fatalf("parse: %v\n%s", err, doc)
	}
	return &d
}

// vgpudEntries reads vgpud's metadata element by namespace: "id kind dev".
func vgpudEntries(t *testing.T, d *libvirtxml.Domain) []string {
	t.Helper()
	var doc struct {
		XMLName   xml.Name `xml:"https://vgpud.dev/xmlns/domain/1 instances"`
		Instances []struct {
			ID   string `xml:"id,attr"`
			Kind string `xml:"kind,attr"`
			Mdev string `xml:"mdev,attr"`
			PCI  string `xml:"pci,attr"`
		} `xml:"https://vgpud.dev/xmlns/domain/1 instance"`
	}
	dec := xml.NewDecoder(strings.NewReader(d.Metadata.XML))
	for {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("no vgpud metadata in %s", d.Metadata.XML)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Space != virt.MetadataNamespace {
			continue
		}
		if err := dec.DecodeElement(&doc, &se); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range doc.Instances {
			out = append(out, e.ID+" "+e.Kind+" "+e.Mdev+e.PCI)
		}
		return out
	}
}

// validate checks a whole definition against libvirt's domain schema.
func validate(t *testing.T, doc string) {
	t.Helper()
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		skipOrFail(t, "virt-xml-validate is not installed (libvirt-clients, libxml2-utils)")
	}
	path := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", path, "domain").CombinedOutput(); err != nil {
		t.Fatalf("virt-xml-validate: %v\n%s\n%s", err, out, doc)
	}
}
