// Package sysfs is the vGPU backend over the kernel's sysfs: legacy mediated
// devices (mdev_supported_types/*/create, <mdev>/remove) and the vendor-VFIO
// flow on SR-IOV virtual functions (nvidia/creatable_vgpu_types,
// nvidia/current_vgpu_type). Every access goes through FS, rooted at a
// configurable path, so the simulated host's tree and the real /sys are
// driven by the same code. No other package touches sysfs paths. The
// steps of a real host's GPU reset (reset.go) read the holders of a GPU's
// device node from /proc, through a second FS.
//
// It imports pkg/gpu only.
//
// Imports: pkg/gpu.
package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// FS is what the backend needs from a sysfs tree. Names are relative to
// the sysfs root ("bus/pci/devices/0000:41:00.0/sriov_numvfs").
type FS interface {
	ReadFile(name string) ([]byte, error)
	// WriteFile writes data to an existing attribute in one write.
	WriteFile(name string, data []byte) error
	ReadDir(name string) ([]fs.DirEntry, error)
	Readlink(name string) (string, error)
	Stat(name string) (fs.FileInfo, error)
}

// OSFS is the real sysfs (or any directory) rooted at Root.
type OSFS struct{ Root string }

func (o OSFS) full(name string) string { return filepath.Join(o.Root, filepath.Clean("/"+name)) }

// ReadFile reads an attribute.
func (o OSFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(o.full(name)) }

// WriteFile opens an attribute write-only (no create, no truncate: sysfs
// has neither) and writes data in one call, as the kernel expects.
func (o OSFS) WriteFile(name string, data []byte) error {
	f, err := os.OpenFile(o.full(name), os.O_WRONLY|os.O_SYNC, 0)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	return cerr
}

// ReadDir lists a directory.
func (o OSFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(o.full(name)) }

// Readlink reads a symlink.
func (o OSFS) Readlink(name string) (string, error) { return os.Readlink(o.full(name)) }

// Stat stats a path, following links.
func (o OSFS) Stat(name string) (fs.FileInfo, error) { return os.Stat(o.full(name)) }

// Sysfs is the backend.
type Sysfs struct {
	fs FS
	// mdevctl is mdevctl's config directory; "": not read.
	mdevctl string
	// mdevctlMu guards mdevctlStuck: the reads of the directory that
	// outlived their deadline and have not returned yet (no other is
	// started then).
	mdevctlMu    sync.Mutex
	mdevctlStuck int
}

// New returns the backend over fsys.
func New(fsys FS) *Sysfs { return &Sysfs{fs: fsys} }

// WithMdevctl makes Discover mark the mdevs that mdevctl defines, read
// from mdevctl's config directory dir (DefaultMdevctlDir on a real host)
// as ReadMdevctl says.
func (s *Sysfs) WithMdevctl(dir string) *Sysfs {
	s.mdevctl = dir
	return s
}

// Errors callers tell apart. Busy devices are gpu.ErrInUse and types the
// driver refuses now gpu.ErrNoResources; the errno the kernel or driver
// returned stays wrapped too (errors.Is(err, syscall.EIO)).
var (
	ErrNoDevice   = errors.New("no such PCI device")
	ErrNotVFIO    = errors.New("not a vendor-VFIO virtual function")
	ErrNoMdevType = errors.New("no such mdev type")
	ErrParse      = errors.New("unparsable sysfs attribute")
)

func pciPath(bdf string) string { return "bus/pci/devices/" + bdf }

func (s *Sysfs) readString(name string) (string, error) {
	b, err := s.fs.ReadFile(name)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func (s *Sysfs) readInt(name string) (int, error) {
	v, err := s.readString(name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %q is not an integer", ErrParse, name, v)
	}
	return n, nil
}

func (s *Sysfs) linkBase(name string) (string, error) {
	t, err := s.fs.Readlink(name)
	if err != nil {
		return "", err
	}
	return path.Base(t), nil
}

// PCIDevice is what sysfs says of one PCI function.
type PCIDevice struct {
	Address    string
	Vendor     uint16
	Device     uint16
	Class      uint32
	Driver     string
	NUMANode   int
	IOMMUGroup int
	// TotalVFs, NumVFs and VFs are set on SR-IOV physical functions.
	TotalVFs int
	NumVFs   int
	VFs      []string
	// PhysFn is set on virtual functions.
	PhysFn string
}

// Device reads a PCI function. A missing device is ErrNoDevice.
func (s *Sysfs) Device(bdf string) (PCIDevice, error) {
	d := PCIDevice{Address: bdf, NUMANode: -1, IOMMUGroup: -1}
	base := pciPath(bdf)
	if _, err := s.fs.Stat(base); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return d, fmt.Errorf("%w: %s", ErrNoDevice, bdf)
		}
		return d, fmt.Errorf("read PCI device %s: %w", bdf, err)
	}
	hex16 := func(attr string) (uint16, error) {
		v, err := s.readString(base + "/" + attr)
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 16)
		if err != nil {
			return 0, fmt.Errorf("%w: %s/%s: %q", ErrParse, base, attr, v)
		}
		return uint16(n), nil
	}
	var err error
	if d.Vendor, err = hex16("vendor"); err != nil {
		return d, err
	}
	if d.Device, err = hex16("device"); err != nil {
		return d, err
	}
	if v, err := s.readString(base + "/class"); err == nil {
		c, _ := strconv.ParseUint(strings.TrimPrefix(v, "0x"), 16, 32)
		d.Class = uint32(c)
	}
	if drv, err := s.linkBase(base + "/driver"); err == nil {
		d.Driver = drv
	}
	if n, err := s.readInt(base + "/numa_node"); err == nil {
		d.NUMANode = n
	}
	if g, err := s.linkBase(base + "/iommu_group"); err == nil {
		d.IOMMUGroup, _ = strconv.Atoi(g)
	}
	if pf, err := s.linkBase(base + "/physfn"); err == nil {
		d.PhysFn = pf
	}
	if n, err := s.readInt(base + "/sriov_totalvfs"); err == nil {
		d.TotalVFs = n
		d.NumVFs, _ = s.readInt(base + "/sriov_numvfs")
		entries, err := s.fs.ReadDir(base)
		if err != nil {
			return d, fmt.Errorf("list %s: %w", base, err)
		}
		type vfn struct {
			n   int
			bdf string
		}
		var vfs []vfn
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), "virtfn") {
				continue
			}
			n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "virtfn"))
			if err != nil {
				continue
			}
			bdf, err := s.linkBase(base + "/" + e.Name())
			if err != nil {
				return d, fmt.Errorf("read %s/%s: %w", base, e.Name(), err)
			}
			vfs = append(vfs, vfn{n, bdf})
		}
		sort.Slice(vfs, func(i, j int) bool { return vfs[i].n < vfs[j].n })
		for _, v := range vfs {
			d.VFs = append(d.VFs, v.bdf)
		}
	}
	return d, nil
}

// errnoOf returns the errno wrapped in err, or 0.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}
