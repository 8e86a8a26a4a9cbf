package virt_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/virt"
)

const (
	mdevUUID  = "4b20d080-1b54-4048-85b3-a6a62d165c01"
	mdevUUID2 = "4b20d080-1b54-4048-85b3-a6a62d165c02"
	vfAddr    = "0000:41:00.4"
	gpuAddr   = "0000:3b:00.0"
)

// hostdevCases are the hostdev kinds vgpud generates, with what libvirt
// must see in each.
var hostdevCases = []struct {
	name    string
	h       virt.Hostdev
	managed string // "" for mdev
}{
	{"mdev", virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID}, ""},
	{"mdev display ramfb", virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID, Display: true, RamFB: true}, ""},
	{"mdev display only", virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID, Display: true}, ""},
	{"vendor-VFIO VF", virt.Hostdev{Kind: virt.VF, PCI: vfAddr}, "no"},
	{"passthrough GPU", virt.Hostdev{Kind: virt.Passthrough, PCI: gpuAddr}, "yes"},
}

func TestHostdevXMLRoundTrip(t *testing.T) {
	for _, tc := range hostdevCases {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := virt.HostdevXML(tc.h)
			if err != nil {
				t.Fatalf("HostdevXML: %v", err)
			}
			var hd libvirtxml.DomainHostdev
			if err := hd.Unmarshal(doc); err != nil {
				t.Fatalf("unmarshal %s: %v", doc, err)
			}
			again, err := hd.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if again != doc {
				t.Fatalf("round trip changed the XML:\n%s\n%s", doc, again)
			}
			if hd.Managed != tc.managed {
				t.Errorf("managed = %q, want %q", hd.Managed, tc.managed)
			}
			checkHostdev(t, &hd, tc.h)
		})
	}
}

// checkHostdev asserts that a parsed hostdev is h.
func checkHostdev(t *testing.T, hd *libvirtxml.DomainHostdev, h virt.Hostdev) {
	t.Helper()
	switch h.Kind {
	case virt.Mdev:
		m := hd.SubsysMDev
		if m == nil || m.Source == nil || m.Source.Address == nil {
			t.Fatalf("not an mdev hostdev: %+v", hd)
		}
		if m.Model != "vfio-pci" || m.Source.Address.UUID != h.MdevUUID {
			t.Errorf("mdev model %q uuid %q, want vfio-pci %s", m.Model, m.Source.Address.UUID, h.MdevUUID)
		}
		if (m.Display == "on") != h.Display {
			t.Errorf("display = %q, want on=%v", m.Display, h.Display)
		}
		if (m.RamFB == "on") != h.RamFB {
			t.Errorf("ramfb = %q, want on=%v", m.RamFB, h.RamFB)
		}
	default:
		p := hd.SubsysPCI
		if p == nil || p.Source == nil || p.Source.Address == nil {
			t.Fatalf("not a PCI hostdev: %+v", hd)
		}
		a := p.Source.Address
		got := pciString(a)
		if got != h.PCI {
			t.Errorf("PCI address %s, want %s", got, h.PCI)
		}
		if p.Driver == nil || p.Driver.Name != "vfio" {
			t.Errorf("driver %+v, want vfio", p.Driver)
		}
		want := map[virt.HostdevKind]string{virt.VF: "no", virt.Passthrough: "yes"}[h.Kind]
		if hd.Managed != want {
			t.Errorf("managed = %q, want %q", hd.Managed, want)
		}
	}
}

func pciString(a *libvirtxml.DomainAddressPCI) string {
	if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
		return "incomplete"
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", *a.Domain, *a.Bus, *a.Slot, *a.Function)
}

// TestHostdevXMLValidates wraps each generated hostdev in a full domain and
// checks it against libvirt's domain schema with virt-xml-validate.
func TestHostdevXMLValidates(t *testing.T) {
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		skipOrFail(t, "virt-xml-validate is not installed (libvirt-clients, libxml2-utils)")
	}
	for _, tc := range hostdevCases {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := virt.HostdevXML(tc.h)
			if err != nil {
				t.Fatal(err)
			}
			var hd libvirtxml.DomainHostdev
			if err := hd.Unmarshal(doc); err != nil {
				t.Fatal(err)
			}
			d := libvirtd.TinyDomain("validate-" + tc.h.Kind.String())
			d.Devices.Hostdevs = []libvirtxml.DomainHostdev{hd}
			if tc.h.Display {
				d.Devices.Graphics = []libvirtxml.DomainGraphic{{VNC: &libvirtxml.DomainGraphicVNC{}}}
			}
			full, err := d.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "domain.xml")
			if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("virt-xml-validate", path, "domain").CombinedOutput()
			if err != nil {
				t.Fatalf("virt-xml-validate: %v\n%s\n%s", err, out, full)
			}
		})
	}
}

func TestHostdevXMLInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    virt.Hostdev
	}{
		{"no kind", virt.Hostdev{MdevUUID: mdevUUID}},
		{"mdev bad uuid", virt.Hostdev{Kind: virt.Mdev, MdevUUID: "not-a-uuid"}},
		{"mdev uuid without dashes", virt.Hostdev{Kind: virt.Mdev, MdevUUID: "4b20d0801b54404885b3a6a62d165c01"}},
		{"mdev with pci", virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID, PCI: vfAddr}},
		{"mdev ramfb without display", virt.Hostdev{Kind: virt.Mdev, MdevUUID: mdevUUID, RamFB: true}},
		{"vf without address", virt.Hostdev{Kind: virt.VF}},
		{"vf short address", virt.Hostdev{Kind: virt.VF, PCI: "41:00.4"}},
		{"vf slot out of range", virt.Hostdev{Kind: virt.VF, PCI: "0000:41:20.0"}},
		{"vf function out of range", virt.Hostdev{Kind: virt.VF, PCI: "0000:41:00.8"}},
		{"vf not hex", virt.Hostdev{Kind: virt.VF, PCI: "0000:4g:00.0"}},
		{"vf with display", virt.Hostdev{Kind: virt.VF, PCI: vfAddr, Display: true}},
		{"passthrough with uuid", virt.Hostdev{Kind: virt.Passthrough, PCI: gpuAddr, MdevUUID: mdevUUID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if doc, err := virt.HostdevXML(tc.h); !errors.Is(err, virt.ErrInvalidHostdev) {
				t.Fatalf("HostdevXML = %q, %v; want ErrInvalidHostdev", doc, err)
			}
		})
	}
}

func TestHostdevXMLNormalizes(t *testing.T) {
	doc, err := virt.HostdevXML(virt.Hostdev{Kind: virt.VF, PCI: "0000:4A:1F.7"})
	if err != nil {
		t.Fatal(err)
	}
	var hd libvirtxml.DomainHostdev
	if err := hd.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	if got := pciString(hd.SubsysPCI.Source.Address); got != "0000:4a:1f.7" {
		t.Fatalf("address %s, want 0000:4a:1f.7", got)
	}
	doc, err = virt.HostdevXML(virt.Hostdev{Kind: virt.Mdev, MdevUUID: "4B20D080-1B54-4048-85B3-A6A62D165C01"})
	if err != nil {
		t.Fatal(err)
	}
	if err := hd.Unmarshal(doc); err != nil {
		t.Fatal(err)
	}
	if got := hd.SubsysMDev.Source.Address.UUID; got != mdevUUID {
		t.Fatalf("uuid %s, want %s", got, mdevUUID)
	}
}

func skipOrFail(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("VGPUD_TEST_REQUIRE_LIBVIRTD") == "1" {
		t.Fatal(reason)
	}
	t.Skip("skipping: " + reason)
}
