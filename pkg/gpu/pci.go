package gpu

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrBadPCIAddress is returned for a string that is not a PCI address.
var ErrBadPCIAddress = errors.New("bad PCI address")

// PCIAddress is a parsed domain:bus:device.function.
type PCIAddress struct {
	Domain   uint32
	Bus      uint8
	Device   uint8
	Function uint8
}

// String formats the address the way sysfs names devices: 0000:41:00.0.
func (a PCIAddress) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// ParsePCI parses "0000:41:00.0", NVML's "00000000:41:00.0" and "41:00.0"
// (domain 0); hex digits may be upper or lower case.
func ParsePCI(s string) (PCIAddress, error) {
	var a PCIAddress
	bad := func(why string) (PCIAddress, error) {
		return PCIAddress{}, fmt.Errorf("%w %q: %s (want DDDD:BB:DD.F)", ErrBadPCIAddress, s, why)
	}
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		parts = append([]string{"0"}, parts...)
	case 3:
	default:
		return bad("wrong number of ':'")
	}
	if len(parts[0]) == 0 || len(parts[0]) > 8 {
		return bad("domain must be 1-8 hex digits")
	}
	d, err := strconv.ParseUint(parts[0], 16, 32)
	if err != nil {
		return bad("domain is not hex")
	}
	if len(parts[0]) > 4 && d > 0xffff {
		return bad("domain out of range")
	}
	b, err := strconv.ParseUint(parts[1], 16, 8)
	if err != nil || len(parts[1]) != 2 {
		return bad("bus must be 2 hex digits")
	}
	df := strings.Split(parts[2], ".")
	if len(df) != 2 || len(df[0]) != 2 || len(df[1]) != 1 {
		return bad("device.function must be DD.F")
	}
	dev, err := strconv.ParseUint(df[0], 16, 8)
	if err != nil || dev > 0x1f {
		return bad("device must be 00-1f")
	}
	fn, err := strconv.ParseUint(df[1], 16, 8)
	if err != nil || fn > 7 {
		return bad("function must be 0-7")
	}
	a.Domain, a.Bus, a.Device, a.Function = uint32(d), uint8(b), uint8(dev), uint8(fn)
	return a, nil
}

// NormalizePCI returns s in sysfs form, or an error.
func NormalizePCI(s string) (string, error) {
	a, err := ParsePCI(s)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// VFAddress returns the address of virtual function n of a physical
// function, with the SR-IOV first-VF offset and stride (the routing id
// advances through device.function numbers on the same bus).
func VFAddress(pf PCIAddress, offset, stride, n int) PCIAddress {
	rid := int(pf.Device)<<3 | int(pf.Function)
	rid += offset + stride*n
	a := pf
	a.Bus = pf.Bus + uint8(rid>>8)
	a.Device = uint8(rid>>3) & 0x1f
	a.Function = uint8(rid & 7)
	return a
}
