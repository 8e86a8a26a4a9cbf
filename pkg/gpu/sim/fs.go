package sim

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// FS is the simulated sysfs as the sysfs backend sees it: names are
// relative to the sysfs root ("bus/pci/devices/0000:41:00.4/nvidia/
// current_vgpu_type"). Reads come from the rendered tree; writes go to the
// simulated kernel and driver, which change the state and re-render.
type FS struct{ h *Host }

// FS returns the host's sysfs view.
func (h *Host) FS() *FS { return &FS{h: h} }

// Root is the directory the on-disk mirror is written to (with Options.Mirror).
func (f *FS) Root() string { return f.h.SysRoot() }

func pathErr(op, name string, err error) error { return &fs.PathError{Op: op, Path: name, Err: err} }

func (f *FS) clean(op, name string) (string, error) {
	c := path.Clean("/" + name)[1:]
	if c == "" || strings.HasPrefix(c, "..") {
		return "", pathErr(op, name, fs.ErrInvalid)
	}
	return c, nil
}

// readOp runs a read under the shared lock, with read faults applied. fn
// gets the tree and the cleaned name.
func (f *FS) readOp(op, name string, fn func(t *tree, name string) error) error {
	c, err := f.clean(op, name)
	if err != nil {
		return err
	}
	h := f.h
	var faultErr error
	var delay time.Duration
	attr := path.Base(c)
	err = h.view(func(st *state) error {
		if hasSysfsFault(st, "read:"+attr) {
			return errNeedWrite
		}
		return fn(h.tree, c)
	})
	if errors.Is(err, errNeedWrite) {
		err = h.mutate(func(st *state) (bool, error) {
			canon, _, _ := h.tree.resolve(c, true)
			flt, moved := st.checkFault("read:"+attr, st.gpuOfPath(canon), true)
			if flt != nil {
				delay = flt.delay()
				if flt.Errno != 0 {
					faultErr = pathErr(op, name, syscall.Errno(flt.Errno))
					return moved, nil
				}
			}
			return moved, fn(h.tree, c)
		})
	}
	if delay > 0 {
		h.sleep(delay)
	}
	if faultErr != nil {
		return faultErr
	}
	if err != nil {
		var pe *fs.PathError
		if !errors.As(err, &pe) {
			err = pathErr(op, name, err)
		}
	}
	return err
}

var errNeedWrite = errors.New("fault needs a write lock")

func hasSysfsFault(st *state, op string) bool {
	for _, f := range st.Faults {
		if f.Op == op {
			return true
		}
	}
	return false
}

// ReadFile reads an attribute.
func (f *FS) ReadFile(name string) ([]byte, error) {
	var data []byte
	err := f.readOp("read", name, func(t *tree, c string) error {
		_, e, err := t.resolve(c, true)
		switch {
		case err != nil:
			return err
		case e.kind == 'd':
			return syscall.EISDIR
		case e.errno != 0:
			return e.errno
		}
		data = []byte(e.data)
		return nil
	})
	return data, err
}

// ReadDir lists a directory, sorted by name.
func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) {
	var out []fs.DirEntry
	err := f.readOp("readdir", name, func(t *tree, c string) error {
		canon, e, err := t.resolve(c, true)
		if err != nil {
			return err
		}
		if e.kind != 'd' {
			return syscall.ENOTDIR
		}
		for _, n := range t.children[canon] {
			out = append(out, fileInfo{name: n, e: t.entries[path.Join(canon, n)]})
		}
		return nil
	})
	return out, err
}

// Readlink reads a symlink.
func (f *FS) Readlink(name string) (string, error) {
	var out string
	err := f.readOp("readlink", name, func(t *tree, c string) error {
		_, e, err := t.resolve(c, false)
		if err != nil {
			return err
		}
		if e.kind != 'l' {
			return syscall.EINVAL
		}
		out = e.data
		return nil
	})
	return out, err
}

// Stat stats a path, following links.
func (f *FS) Stat(name string) (fs.FileInfo, error) {
	var out fs.FileInfo
	err := f.readOp("stat", name, func(t *tree, c string) error {
		canon, e, err := t.resolve(c, true)
		if err != nil {
			return err
		}
		out = fileInfo{name: path.Base(canon), e: e}
		return nil
	})
	return out, err
}

var (
	reCreate  = regexp.MustCompile(`^devices/pci[0-9a-f]{4}:00/([0-9a-f:.]+)/mdev_supported_types/nvidia-([0-9]+)/create$`)
	reRemove  = regexp.MustCompile(`^devices/pci[0-9a-f]{4}:00/([0-9a-f:.]+)/([0-9a-f-]{36})/remove$`)
	reMParams = regexp.MustCompile(`^devices/pci[0-9a-f]{4}:00/([0-9a-f:.]+)/([0-9a-f-]{36})/nvidia/vgpu_params$`)
	reVFType  = regexp.MustCompile(`^devices/pci[0-9a-f]{4}:00/([0-9a-f:.]+)/nvidia/current_vgpu_type$`)
	reVParams = regexp.MustCompile(`^devices/pci[0-9a-f]{4}:00/([0-9a-f:.]+)/nvidia/vgpu_params$`)
	reUUID    = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// maxVGPUParams is the longest vgpu_params string the driver stores.
const maxVGPUParams = 1023

// WriteFile writes an attribute, with the kernel's and driver's effects and
// errno values (reference 1.3, 1.4, 2.4). Attributes without a store
// method fail with EACCES.
func (f *FS) WriteFile(name string, data []byte) error {
	c, err := f.clean("write", name)
	if err != nil {
		return err
	}
	h := f.h
	var delay time.Duration
	var werr error
	class, idx := h.sysfsLatClass(c)
	h.timed(class, idx, func() { err = h.writeLocked(c, data, &delay, &werr) })
	if delay > 0 {
		h.sleep(delay)
	}
	if err != nil {
		return pathErr("write", name, err)
	}
	if werr != nil {
		return pathErr("write", name, werr)
	}
	return nil
}

// sysfsLatClass names the timed operation a write of the cleaned path c
// is, and the index of the GPU it acts on (latNone, -1: untimed).
func (h *Host) sysfsLatClass(c string) (latClass, int) {
	if m := h.ops.Load(); m == nil || m.by == ([latClasses]time.Duration{}) {
		return latNone, -1
	}
	class, idx := latNone, -1
	_ = h.view(func(st *state) error {
		canon, _, err := h.tree.resolve(c, true)
		if err != nil {
			return nil // the write fails as it would untimed
		}
		switch {
		case reVFType.MatchString(canon):
			class = latVGPUType
		case reCreate.MatchString(canon):
			class = latMdevCreate
		case reRemove.MatchString(canon):
			class = latMdevRemove
		default:
			return nil
		}
		g := st.gpuOfPath(canon)
		for i := range st.GPUs {
			if st.GPUs[i] == g {
				idx = i
			}
		}
		return nil
	})
	return class, idx
}

// writeLocked applies a write of the cleaned path c under the host lock:
// werr is the write's own failure, delay a fault's added time.
func (h *Host) writeLocked(c string, data []byte, delay *time.Duration, werr *error) error {
	return h.mutate(func(st *state) (bool, error) {
		canon, ent, rerr := h.tree.resolve(c, true)
		if rerr != nil {
			*werr = rerr
			return false, nil
		}
		if ent.kind == 'd' {
			*werr = syscall.EISDIR
			return false, nil
		}
		g := st.gpuOfPath(canon)
		flt, moved := st.checkFault("write:"+filepath.Base(canon), g, true)
		if flt != nil {
			*delay = flt.delay()
			if flt.Errno != 0 {
				*werr = syscall.Errno(flt.Errno)
				return moved, nil
			}
		}
		if g != nil && g.Lost {
			*werr = syscall.EIO
			return moved, nil
		}
		changed, e := h.store(st, g, canon, data)
		*werr = e
		return moved || changed, nil
	})
}

// gpuOfPath finds the GPU a canonical sysfs path belongs to.
func (st *state) gpuOfPath(canon string) *gpuState {
	parts := strings.Split(canon, "/")
	if len(parts) < 3 || parts[0] != "devices" {
		return nil
	}
	pci := parts[2]
	for _, g := range st.GPUs {
		if g.PCI == pci || g.vfByPCI(pci) != nil {
			return g
		}
	}
	return nil
}

func (h *Host) store(st *state, g *gpuState, canon string, data []byte) (bool, error) {
	if m := reCreate.FindStringSubmatch(canon); m != nil && g != nil {
		id, _ := strconv.Atoi(m[2])
		return h.mdevCreate(st, g, m[1], id, data)
	}
	if m := reRemove.FindStringSubmatch(canon); m != nil && g != nil {
		return h.mdevRemove(st, g, m[2], data)
	}
	if m := reMParams.FindStringSubmatch(canon); m != nil && g != nil {
		for _, x := range g.Mdevs {
			if x.UUID == m[2] {
				return storeParams(x.VGPU, nil, data)
			}
		}
		return false, syscall.ENODEV
	}
	if m := reVFType.FindStringSubmatch(canon); m != nil && g != nil {
		return h.vfSetType(st, g, m[1], data)
	}
	if m := reVParams.FindStringSubmatch(canon); m != nil && g != nil {
		v := g.vfByPCI(m[1])
		if v == nil {
			return false, syscall.ENODEV
		}
		return storeParams(v.VGPU, v, data)
	}
	return false, syscall.EACCES
}

// storeParams is vgpu_params' store: EPERM while a VM uses the vGPU, E2BIG
// beyond the driver's buffer; the driver drops the last byte it is given
// (so callers write a trailing newline), and a lone space clears it.
func storeParams(v *vgpu, holder *vf, data []byte) (bool, error) {
	if v != nil && v.VM != "" {
		return false, syscall.EPERM
	}
	if len(data) > maxVGPUParams+1 {
		return false, syscall.E2BIG
	}
	s := string(data)
	if len(s) > 0 {
		s = s[:len(s)-1]
	}
	s = strings.TrimSpace(s)
	if v != nil {
		v.Params = s
	} else if holder != nil {
		holder.Params = s
	}
	return true, nil
}

// mdevCreate is mdev_supported_types/<type>/create (reference 1.3).
func (h *Host) mdevCreate(st *state, g *gpuState, parent string, typeID int, data []byte) (bool, error) {
	if len(data) != 36 && !(len(data) == 37 && data[36] == '\n') {
		return false, syscall.EINVAL
	}
	u := string(data[:36])
	if !reUUID.MatchString(u) {
		return false, syscall.EINVAL
	}
	u = strings.ToLower(u)
	for _, x := range st.GPUs {
		for _, m := range x.Mdevs {
			if m.UUID == u {
				return false, syscall.EEXIST
			}
		}
	}
	t, ok := g.model.VGPUTypeByID(typeID)
	if !ok || !g.model.HasFlow(t, string(gpu.FlavourMdev)) {
		return false, syscall.EINVAL
	}
	if mdevAvailable(g, parent, t, st.Spec.Options) <= 0 {
		// The vGPU manager refuses; NVIDIA maps it to EIO.
		return false, syscall.EIO
	}
	m := &mdv{UUID: u, Parent: parent, IOMMUGroup: st.NextGroup, VGPU: st.createVGPU(g, t)}
	st.NextGroup++
	g.Mdevs = append(g.Mdevs, m)
	st.uevent("add", devDir(parent)+"/"+u, "mdev", map[string]string{"MDEV_TYPE": fmt.Sprintf("nvidia-%d", t.ID)})
	return true, nil
}

// mdevRemove is <mdev>/remove: "1" removes, "0" is a no-op, anything else
// EINVAL; EBUSY while a VM has the device open.
func (h *Host) mdevRemove(st *state, g *gpuState, u string, data []byte) (bool, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 0, 64)
	if err != nil {
		return false, syscall.EINVAL
	}
	if n == 0 {
		return false, nil
	}
	for i, m := range g.Mdevs {
		if m.UUID != u {
			continue
		}
		if m.VGPU.VM != "" {
			return false, syscall.EBUSY
		}
		g.Mdevs = append(g.Mdevs[:i], g.Mdevs[i+1:]...)
		st.uevent("remove", devDir(m.Parent)+"/"+u, "mdev", nil)
		return true, nil
	}
	return false, syscall.ENODEV
}

// vfSetType is nvidia/current_vgpu_type (reference 2.4).
func (h *Host) vfSetType(st *state, g *gpuState, pci string, data []byte) (bool, error) {
	v := g.vfByPCI(pci)
	if v == nil {
		return false, syscall.ENODEV
	}
	n, err := strconv.ParseInt(strings.TrimSuffix(string(data), "\n"), 10, 64)
	if err != nil {
		return false, syscall.EINVAL
	}
	if n == 0 {
		if v.VGPU == nil {
			return false, syscall.EPERM
		}
		if v.VGPU.VM != "" {
			return false, syscall.EPERM
		}
		v.VGPU = nil
		st.uevent("change", devDir(pci), "pci", map[string]string{"NVIDIA_VGPU_TYPE": "0"})
		return true, nil
	}
	if v.VGPU != nil {
		return false, syscall.EPERM
	}
	t, ok := g.model.VGPUTypeByID(int(n))
	if !ok || !g.model.HasFlow(t, string(gpu.FlavourVFIO)) || room(g, t, st.Spec.Options) <= 0 {
		// Not creatable now: RM refuses ("Failed to add vgpu create request").
		h.log.Debug("simulated NVRM: Failed to add vgpu create request: 0x38", "vf", pci, "type", n)
		return false, syscall.EIO
	}
	v.VGPU = st.createVGPU(g, t)
	v.VGPU.Params = v.Params
	st.uevent("change", devDir(pci), "pci", map[string]string{"NVIDIA_VGPU_TYPE": strconv.Itoa(t.ID)})
	return true, nil
}
