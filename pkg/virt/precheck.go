package virt

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// Version is a dotted version: libvirt's, QEMU's or the kernel's.
type Version struct{ Major, Minor, Micro uint64 }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Micro < w.Micro
}

// versionFromLibvirt decodes libvirt's packed form, major*1000000 +
// minor*1000 + micro (ConnectGetLibVersion, ConnectGetVersion).
func versionFromLibvirt(n uint64) Version {
	return Version{n / 1000000, n / 1000 % 1000, n % 1000}
}

// versionRE is the leading "major.minor[.micro]" of a version string.
var versionRE = regexp.MustCompile(`^(\d+)\.(\d+)(?:\.(\d+))?`)

// ParseVersion reads the leading "major.minor[.micro]" of s, such as a
// kernel release ("6.1.0-18-amd64", "5.18", "6.9-rc2").
func ParseVersion(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, fmt.Errorf("version %q: want major.minor[.micro]", s)
	}
	var v [3]uint64
	for i, p := range m[1:] {
		if p == "" {
			continue
		}
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return Version{}, fmt.Errorf("version %q: %w", s, err)
		}
		v[i] = n
	}
	return Version{v[0], v[1], v[2]}, nil
}

// HostVersions is what one end of a migration runs.
type HostVersions struct {
	// Host is libvirtd's hostname, to name the end in a refusal.
	Host                  string
	Libvirt, QEMU, Kernel Version
}

// Oldest versions that migrate a running domain with a VFIO device (a
// vGPU's mdev or VF): QEMU's VFIO migration is no longer experimental from
// 8.1, the kernel's VFIO migration interface (version 2) is 5.18's, and
// libvirt 8.6 is the oldest vgpud moves such a domain with.
var (
	MinQEMUVFIOMigration    = Version{8, 1, 0}
	MinLibvirtVFIOMigration = Version{8, 6, 0}
	MinKernelVFIOMigration  = Version{5, 18, 0}
)

// ErrLiveMigrationRefused: the domain runs with a vGPU and one end of the
// migration is too old to move a VFIO device's state. The error is a
// *PrecheckError naming each reason. Nothing was sent to libvirtd.
var ErrLiveMigrationRefused = errors.New("live migration refused")

// RefusalReason names why a live migration is refused.
type RefusalReason string

const (
	ReasonQEMUTooOld    RefusalReason = "qemu_too_old"
	ReasonLibvirtTooOld RefusalReason = "libvirt_too_old"
	ReasonKernelTooOld  RefusalReason = "kernel_too_old"
)

// Refusal is one reason with the end it was found on.
type Refusal struct {
	Reason RefusalReason
	End    string // "source" or "destination"
	Host   string
	Have   Version
	Need   Version
}

func (r Refusal) String() string {
	what := map[RefusalReason]string{ReasonQEMUTooOld: "QEMU", ReasonLibvirtTooOld: "libvirt", ReasonKernelTooOld: "kernel"}[r.Reason]
	return fmt.Sprintf("%s: %s %s on the %s (%s) is older than %s, which live migration of a VFIO device needs",
		r.Reason, what, r.Have, r.End, r.Host, r.Need)
}

// PrecheckError lists why a live migration was refused; it wraps
// ErrLiveMigrationRefused.
type PrecheckError struct{ Refusals []Refusal }

func (e *PrecheckError) Error() string {
	s := make([]string, len(e.Refusals))
	for i, r := range e.Refusals {
		s[i] = r.String()
	}
	return ErrLiveMigrationRefused.Error() + ": " + strings.Join(s, "; ")
}

func (e *PrecheckError) Unwrap() error { return ErrLiveMigrationRefused }

// CheckLiveMigration refuses, with a *PrecheckError, a live migration of
// a domain whose live definition holds a vGPU (vgpuLive) when either end
// is older than the Min*VFIOMigration versions. A domain with its vGPU in
// its configuration only carries no device state and may always move.
func CheckLiveMigration(src, dst HostVersions, vgpuLive bool) error {
	if !vgpuLive {
		return nil
	}
	var e PrecheckError
	for _, end := range []struct {
		name string
		v    HostVersions
	}{{"source", src}, {"destination", dst}} {
		for _, c := range []struct {
			reason     RefusalReason
			have, need Version
		}{
			{ReasonQEMUTooOld, end.v.QEMU, MinQEMUVFIOMigration},
			{ReasonLibvirtTooOld, end.v.Libvirt, MinLibvirtVFIOMigration},
			{ReasonKernelTooOld, end.v.Kernel, MinKernelVFIOMigration},
		} {
			if c.have.Less(c.need) {
				e.Refusals = append(e.Refusals, Refusal{Reason: c.reason, End: end.name, Host: end.v.Host, Have: c.have, Need: c.need})
			}
		}
	}
	if len(e.Refusals) > 0 {
		return &e
	}
	return nil
}

// HostVersions reads libvirt's and QEMU's versions and the hostname from
// libvirtd, and the kernel release from uname(2): the connection is a unix
// socket, so libvirtd runs on this kernel. The other end of a migration
// reports its own (its vgpud calls this).
func (c *Conn) HostVersions(ctx context.Context) (HostVersions, error) {
	var out HostVersions
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		return out, fmt.Errorf("uname: %w", err)
	}
	var rel strings.Builder
	for _, b := range uts.Release {
		if b == 0 {
			break
		}
		rel.WriteByte(byte(b))
	}
	k, err := ParseVersion(rel.String())
	if err != nil {
		return out, fmt.Errorf("kernel release: %w", err)
	}
	err = c.do(ctx, "host versions", func(r *rpc) error {
		lib, err := call(r, func(l *libvirt.Libvirt) (uint64, error) { return l.ConnectGetLibVersion() })
		if err != nil {
			return fmt.Errorf("libvirt version: %w", err)
		}
		hv, err := call(r, func(l *libvirt.Libvirt) (uint64, error) { return l.ConnectGetVersion() })
		if err != nil {
			return fmt.Errorf("QEMU version: %w", err)
		}
		host, err := call(r, func(l *libvirt.Libvirt) (string, error) { return l.ConnectGetHostname() })
		if err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
		out = HostVersions{Host: host, Libvirt: versionFromLibvirt(lib), QEMU: versionFromLibvirt(hv), Kernel: k}
		return nil
	})
	return out, err
}

// PrecheckLive reads this end's versions and whether the domain's live
// definition holds a VFIO hostdev (an mdev, or a PCI hostdev: libvirt
// assigns those through VFIO), and applies CheckLiveMigration against
// dst, the destination's HostVersions.
func (c *Conn) PrecheckLive(ctx context.Context, ref string, dst HostVersions) error {
	name, err := c.parseRef(ref)
	if err != nil {
		return err
	}
	src, err := c.HostVersions(ctx)
	if err != nil {
		return err
	}
	var vfio bool
	err = c.do(ctx, "precheck", func(r *rpc) error {
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		vfio, err = r.holdsVFIO(d)
		return err
	})
	if err != nil {
		return err
	}
	if err := CheckLiveMigration(src, dst, vfio); err != nil {
		return fmt.Errorf("domain %s: %w", name, err)
	}
	return nil
}

// holdsVFIO reports whether the running domain's live definition holds a
// hostdev of a kind vgpud hands out; a shut-off domain holds none.
func (r *rpc) holdsVFIO(d libvirt.Domain) (bool, error) {
	st, err := r.state(d)
	if err != nil || !st.active {
		return false, err
	}
	live, err := r.def(d, false)
	if err != nil {
		return false, err
	}
	return hasVFIOHostdev(live), nil
}

// hasVFIOHostdev reports whether def holds an mdev or PCI hostdev.
func hasVFIOHostdev(def *libvirtxml.Domain) bool {
	if def == nil || def.Devices == nil {
		return false
	}
	for i := range def.Devices.Hostdevs {
		if _, ok := hostdevFromXML(&def.Devices.Hostdevs[i]); ok {
			return true
		}
	}
	return false
}
