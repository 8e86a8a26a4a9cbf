package sysfs_test

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
)

// fakeTree is a sysfs (or /proc) tree in memory with the kernel's rules
// for the attributes a reset writes: sriov_numvfs takes no change between
// two non-zero counts (EBUSY), and refuses while busy (a VF in use); writing reset takes the device off
// the bus (vendor 0xffff, no driver) for backFor reads of vendor.
type fakeTree struct {
	mu      sync.Mutex
	files   map[string]string
	links   map[string]string
	writes  []string
	busy    bool
	backFor int
	down    int
}

const pf = "bus/pci/devices/0000:41:00.0/"

func newFakeSys(numVFs string) *fakeTree {
	return &fakeTree{files: map[string]string{
		pf + "vendor": "0x10de\n", pf + "sriov_totalvfs": "16\n", pf + "sriov_numvfs": numVFs + "\n", pf + "reset": "",
	}, links: map[string]string{pf + "driver": "../../../bus/pci/drivers/nvidia"}, backFor: 3}
}

func (f *fakeTree) ReadFile(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == pf+"vendor" && f.down > 0 {
		f.down--
		if f.down == 0 {
			f.links[pf+"driver"] = "../../../bus/pci/drivers/nvidia"
		}
		return []byte("0xffff\n"), nil
	}
	v, ok := f.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return []byte(v), nil
}

func (f *fakeTree) WriteFile(name string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.files[name]; !ok {
		return &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	v := string(data)
	f.writes = append(f.writes, strings.TrimPrefix(name, pf)+"="+v)
	switch name {
	case pf + "sriov_numvfs":
		cur := strings.TrimSpace(f.files[name])
		switch {
		case f.busy:
			return &fs.PathError{Op: "write", Path: name, Err: syscall.EBUSY}
		case cur != "0" && v != "0":
			return &fs.PathError{Op: "write", Path: name, Err: syscall.EBUSY}
		}
	case pf + "reset":
		f.down = f.backFor
		delete(f.links, pf+"driver")
		return nil
	}
	f.files[name] = v + "\n"
	return nil
}

func (f *fakeTree) ReadDir(name string) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := fstest.MapFS{}
	for k := range f.files {
		m[k] = &fstest.MapFile{}
	}
	for k := range f.links {
		m[k] = &fstest.MapFile{}
	}
	return fs.ReadDir(m, name)
}

func (f *fakeTree) Readlink(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.links[name]
	if !ok {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrNotExist}
	}
	return t, nil
}

func (f *fakeTree) Stat(name string) (fs.FileInfo, error) {
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

func (f *fakeTree) attr(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.TrimSpace(f.files[pf+name])
}

// A reset's sysfs steps on a fake tree: the VFs off, the reset, the wait
// until the GPU answers, the VFs back; each step a no-op when already
// done; the kernel's refusals named.
func TestResetSteps(t *testing.T) {
	ctx := context.Background()
	sys := newFakeSys("16")
	r := sysfs.Reset{Sys: sys, Poll: time.Millisecond}
	const gpuPCI = "0000:41:00.0"

	// The reset is refused while VFs are enabled, before any write.
	if err := r.ResetGPU(ctx, gpuPCI); !errors.Is(err, gpu.ErrInUse) || len(sys.writes) != 0 {
		t.Fatalf("reset with VFs enabled: %v, writes %v", err, sys.writes)
	}
	// A VF in use: the kernel refuses to disable them.
	sys.busy = true
	if err := r.SetVFs(ctx, gpuPCI, false); !errors.Is(err, sysfs.ErrResetRefused) || !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("VFs off while one is in use: %v", err)
	}
	sys.busy = false
	if err := r.SetVFs(ctx, gpuPCI, false); err != nil || sys.attr("sriov_numvfs") != "0" {
		t.Fatalf("VFs off: %v, sriov_numvfs %s", err, sys.attr("sriov_numvfs"))
	}
	n := len(sys.writes)
	if err := r.SetVFs(ctx, gpuPCI, false); err != nil || len(sys.writes) != n {
		t.Fatalf("VFs off again: %v, writes %v", err, sys.writes[n:])
	}
	if err := r.ResetGPU(ctx, gpuPCI); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if _, err := sys.Readlink(pf + "driver"); err != nil {
		t.Fatal("reset returned before the GPU was back on its driver")
	}
	if err := r.SetVFs(ctx, gpuPCI, true); err != nil || sys.attr("sriov_numvfs") != "16" {
		t.Fatalf("VFs on: %v, sriov_numvfs %s", err, sys.attr("sriov_numvfs"))
	}
	want := []string{"sriov_numvfs=0", "sriov_numvfs=0", "reset=1", "sriov_numvfs=16"}
	if !slices.Equal(sys.writes, want) {
		t.Fatalf("writes %v, want %v", sys.writes, want)
	}
	// A count other than the total is brought to it through 0.
	sys = newFakeSys("4")
	r.Sys = sys
	if err := r.SetVFs(ctx, gpuPCI, true); err != nil || !slices.Equal(sys.writes, []string{"sriov_numvfs=0", "sriov_numvfs=16"}) {
		t.Fatalf("VFs 4 -> all: %v, writes %v", err, sys.writes)
	}
	// A GPU that does not come back: the wait ends with the context.
	sys = newFakeSys("0")
	sys.backFor = 1 << 30
	r.Sys = sys
	tctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := r.ResetGPU(tctx, gpuPCI); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("reset of a GPU that stays off the bus: %v", err)
	}
	// No reset attribute (the kernel has no reset method for it).
	sys = newFakeSys("0")
	delete(sys.files, pf+"reset")
	r.Sys = sys
	if err := r.ResetGPU(ctx, gpuPCI); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("reset without a reset attribute: %v", err)
	}
	// Unparsable counts are named.
	sys = newFakeSys("x")
	r.Sys = sys
	if err := r.SetVFs(ctx, gpuPCI, false); !errors.Is(err, sysfs.ErrParse) {
		t.Fatalf("sriov_numvfs x: %v", err)
	}
}

// Holders reads /proc: the processes other than this one with the GPU's
// device node open, by its minor in the driver's information.
func TestResetHolders(t *testing.T) {
	proc := &fakeTree{files: map[string]string{
		"driver/nvidia/gpus/0000:41:00.0/information": "Model: \t\t NVIDIA H100\nDevice Minor: \t 2\nBus Location: \t 0000:41:00.0\n",
		"100/comm": "vgpud\n", "200/comm": "nvidia-smi\n", "300/comm": "bash\n", "400/comm": "dcgm\n",
	}, links: map[string]string{
		"100/fd/5": "/dev/nvidia2", // this process
		"200/fd/3": "/dev/nvidiactl", "200/fd/4": "/dev/nvidia2",
		"300/fd/0": "/dev/pts/0",
		"400/fd/7": "/dev/nvidia1", // another GPU
	}}
	r := sysfs.Reset{Proc: proc, Self: 100}
	got, err := r.Holders(context.Background(), "0000:41:00.0")
	if err != nil || !slices.Equal(got, []string{"pid 200 (nvidia-smi)"}) {
		t.Fatalf("holders %v, %v", got, err)
	}
	if _, err := r.Holders(context.Background(), "0000:61:00.0"); err == nil {
		t.Fatal("holders of a GPU the driver does not list: no error")
	}
}
