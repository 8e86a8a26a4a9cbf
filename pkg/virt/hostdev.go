package virt

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// HostdevKind says how a vGPU or GPU reaches the guest.
type HostdevKind int

const (
	// Mdev is a legacy mediated device: <hostdev type='mdev'
	// model='vfio-pci'> naming the mdev UUID.
	Mdev HostdevKind = iota + 1
	// VF is a vendor-VFIO virtual function: a PCI hostdev with
	// managed='no', because the VF stays bound to the nvidia driver and
	// libvirt must not try to rebind it.
	VF
	// Passthrough is a whole GPU: a PCI hostdev with managed='yes', so
	// libvirt binds it to vfio-pci at start and back at stop.
	Passthrough
)

func (k HostdevKind) String() string {
	switch k {
	case Mdev:
		return "mdev"
	case VF:
		return "vf"
	case Passthrough:
		return "passthrough"
	}
	return "HostdevKind(" + strconv.Itoa(int(k)) + ")"
}

func parseKind(s string) (HostdevKind, bool) {
	for _, k := range []HostdevKind{Mdev, VF, Passthrough} {
		if k.String() == s {
			return k, true
		}
	}
	return 0, false
}

// Hostdev is one device vgpud hands to a domain. A hostdev is identified by
// its mdev UUID (Mdev) or its PCI address (VF, Passthrough); the other fields
// are options.
type Hostdev struct {
	Kind     HostdevKind
	MdevUUID string // Mdev only
	PCI      string // VF and Passthrough: "0000:41:00.4"
	// Display turns on the mdev's display (display='on'): display-capable
	// (Q-series) types only, and the domain needs a <graphics> device.
	Display bool
	// RamFB adds a boot framebuffer (ramfb='on'). It needs Display: libvirt
	// 9.0 accepts ramfb alone in a config, but QEMU's vfio-pci refuses
	// ramfb=on without display=on when the guest starts.
	RamFB bool
}

// key is the hostdev's identity: two Hostdevs with the same key are the
// same device, whatever their options.
func (h Hostdev) key() string {
	if h.Kind == Mdev {
		return "mdev:" + h.MdevUUID
	}
	return "pci:" + h.PCI
}

func (h Hostdev) String() string {
	if h.Kind == Mdev {
		return "mdev " + h.MdevUUID
	}
	return h.Kind.String() + " " + h.PCI
}

// normalize validates h and returns it in canonical form (lower-case UUID,
// zero-padded lower-case PCI address).
func (h Hostdev) normalize() (Hostdev, error) {
	switch h.Kind {
	case Mdev:
		u, err := uuid.Parse(h.MdevUUID)
		if err != nil || len(h.MdevUUID) != 36 {
			return h, fmt.Errorf("%w: mdev UUID %q", ErrInvalidHostdev, h.MdevUUID)
		}
		if h.PCI != "" {
			return h, fmt.Errorf("%w: mdev %s with a PCI address", ErrInvalidHostdev, h.MdevUUID)
		}
		if h.RamFB && !h.Display {
			return h, fmt.Errorf("%w: ramfb needs display on mdev %s", ErrInvalidHostdev, h.MdevUUID)
		}
		h.MdevUUID = u.String()
	case VF, Passthrough:
		a, err := parsePCI(h.PCI)
		if err != nil {
			return h, err
		}
		if h.MdevUUID != "" {
			return h, fmt.Errorf("%w: %s hostdev %s with an mdev UUID", ErrInvalidHostdev, h.Kind, h.PCI)
		}
		if h.Display || h.RamFB {
			return h, fmt.Errorf("%w: display and ramfb are mdev options, not for %s %s", ErrInvalidHostdev, h.Kind, h.PCI)
		}
		h.PCI = a.String()
	default:
		return h, fmt.Errorf("%w: kind %v", ErrInvalidHostdev, h.Kind)
	}
	return h, nil
}

// pciAddr is a host PCI address.
type pciAddr struct {
	domain, bus, slot, function uint
}

func (a pciAddr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.slot, a.function)
}

// parsePCI parses "DDDD:BB:SS.F" (hex), the form sysfs uses.
func parsePCI(s string) (pciAddr, error) {
	bad := fmt.Errorf("%w: PCI address %q (want DDDD:BB:SS.F)", ErrInvalidHostdev, s)
	dbs, fn, ok := strings.Cut(s, ".")
	parts := strings.Split(dbs, ":")
	if !ok || len(parts) != 3 || len(parts[0]) != 4 || len(parts[1]) != 2 || len(parts[2]) != 2 || len(fn) != 1 {
		return pciAddr{}, bad
	}
	var v [4]uint64
	for i, p := range []string{parts[0], parts[1], parts[2], fn} {
		n, err := strconv.ParseUint(p, 16, 16)
		if err != nil {
			return pciAddr{}, bad
		}
		v[i] = n
	}
	if v[2] > 0x1f || v[3] > 7 {
		return pciAddr{}, bad
	}
	return pciAddr{uint(v[0]), uint(v[1]), uint(v[2]), uint(v[3])}, nil
}

// domainHostdev builds the libvirtxml value for h, which must be normalized.
func domainHostdev(h Hostdev) *libvirtxml.DomainHostdev {
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return ""
	}
	switch h.Kind {
	case Mdev:
		return &libvirtxml.DomainHostdev{
			SubsysMDev: &libvirtxml.DomainHostdevSubsysMDev{
				Model:   "vfio-pci",
				Display: onOff(h.Display),
				RamFB:   onOff(h.RamFB),
				Source: &libvirtxml.DomainHostdevSubsysMDevSource{
					Address: &libvirtxml.DomainAddressMDev{UUID: h.MdevUUID},
				},
			},
		}
	default:
		a, _ := parsePCI(h.PCI)
		managed := "no"
		if h.Kind == Passthrough {
			managed = "yes"
		}
		return &libvirtxml.DomainHostdev{
			Managed: managed,
			SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
				Driver: &libvirtxml.DomainHostdevSubsysPCIDriver{Name: "vfio"},
				Source: &libvirtxml.DomainHostdevSubsysPCISource{
					Address: &libvirtxml.DomainAddressPCI{
						Domain: &a.domain, Bus: &a.bus, Slot: &a.slot, Function: &a.function,
					},
				},
			},
		}
	}
}

// HostdevXML returns the <hostdev> element for h, marshalled by libvirtxml.
func HostdevXML(h Hostdev) (string, error) {
	h, err := h.normalize()
	if err != nil {
		return "", err
	}
	doc, err := domainHostdev(h).Marshal()
	if err != nil {
		return "", fmt.Errorf("marshal hostdev %s: %w", h, err)
	}
	return doc, nil
}

// hostdevFromXML reads a Hostdev back from a domain definition's hostdev.
// Hostdevs that vgpud does not hand out (USB, SCSI, ...) give false.
func hostdevFromXML(d *libvirtxml.DomainHostdev) (Hostdev, bool) {
	switch {
	case d.SubsysMDev != nil:
		m := d.SubsysMDev
		if m.Source == nil || m.Source.Address == nil {
			return Hostdev{}, false
		}
		u, err := uuid.Parse(m.Source.Address.UUID)
		if err != nil {
			return Hostdev{}, false
		}
		return Hostdev{Kind: Mdev, MdevUUID: u.String(), Display: m.Display == "on", RamFB: m.RamFB == "on"}, true
	case d.SubsysPCI != nil:
		p := d.SubsysPCI
		if p.Source == nil || p.Source.Address == nil {
			return Hostdev{}, false
		}
		a := p.Source.Address
		if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil {
			return Hostdev{}, false
		}
		kind := VF
		if d.Managed == "yes" {
			kind = Passthrough
		}
		return Hostdev{Kind: kind, PCI: pciAddr{*a.Domain, *a.Bus, *a.Slot, *a.Function}.String()}, true
	}
	return Hostdev{}, false
}

// findHostdev returns the hostdev in def with h's identity, or nil.
func findHostdev(def *libvirtxml.Domain, h Hostdev) *libvirtxml.DomainHostdev {
	if def == nil || def.Devices == nil {
		return nil
	}
	k := h.key()
	for i := range def.Devices.Hostdevs {
		if got, ok := hostdevFromXML(&def.Devices.Hostdevs[i]); ok && got.key() == k {
			return &def.Devices.Hostdevs[i]
		}
	}
	return nil
}
