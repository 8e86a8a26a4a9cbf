package sysfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// The sysfs side of a GPU reset on a real host, the steps a MIG mode
// change that the driver leaves pending is carried through by (the
// manager's GPUResetter): the GPU's SR-IOV VFs disabled and enabled again
// through sriov_numvfs (what NVIDIA's sriov-manage -d and -e do once the
// VFs are free), the function-level reset through the PCI device's
// `reset` attribute (what nvidia-smi -r asks the kernel for), and the
// wait until the GPU answers again. Who else holds the GPU's device node
// open (an NVML session holds /dev/nvidiaN from its Init to its Shutdown,
// and the driver refuses the reset while one is open) is read from /proc
// (Holders). Every step reads first and changes nothing when there is
// nothing to do, so a step repeated after a crash is harmless.

// Reset does the sysfs steps of a GPU reset over Sys, rooted at /sys, and
// reads the holders of a GPU from Proc, rooted at /proc.
type Reset struct {
	Sys, Proc FS
	// Self is this process's id, left out of Holders.
	Self int
	// Poll is how often WaitBack reads the GPU (default 100 ms).
	Poll time.Duration
}

// ErrResetRefused is wrapped when the kernel refuses a step (EBUSY, EPERM,
// EINVAL, EIO); the message says which and why it likely did.
var ErrResetRefused = errors.New("refused by the kernel")

func (r Reset) poll() time.Duration {
	if r.Poll > 0 {
		return r.Poll
	}
	return 100 * time.Millisecond
}

// writeStep writes one attribute of step and names the kernel's refusal.
func (r Reset) writeStep(ctx context.Context, pci, attr, value, step string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("GPU %s: %s: %w", pci, step, err)
	}
	err := r.Sys.WriteFile(pciPath(pci)+"/"+attr, []byte(value))
	var errno syscall.Errno
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("GPU %s: %s: the kernel has no %s for it: %w", pci, step, attr, gpu.ErrNotSupported)
	case errors.As(err, &errno) && (errno == syscall.EBUSY || errno == syscall.EPERM || errno == syscall.EINVAL || errno == syscall.EIO):
		return fmt.Errorf("GPU %s: %s (write %q to %s): %w: %w (a VF still in use, or a process holding the GPU)", pci, step, value, attr, ErrResetRefused, err)
	}
	return fmt.Errorf("GPU %s: %s (write %q to %s): %w", pci, step, value, attr, err)
}

func (r Reset) readInt(pci, attr string) (int, error) {
	b, err := r.Sys.ReadFile(pciPath(pci) + "/" + attr)
	if err != nil {
		return 0, fmt.Errorf("GPU %s: read %s: %w", pci, attr, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("GPU %s: %s: %q is not a number: %w", pci, attr, strings.TrimSpace(string(b)), ErrParse)
	}
	return n, nil
}

// SetVFs disables the GPU's SR-IOV VFs (on false: sriov_numvfs 0) or
// enables all it offers (sriov_totalvfs). Enabling over a different
// non-zero count first disables them, as the kernel takes no change
// between two non-zero counts. Nothing is written when the count is
// already the one asked for.
func (r Reset) SetVFs(ctx context.Context, pci string, on bool) error {
	num, err := r.readInt(pci, "sriov_numvfs")
	if err != nil {
		return err
	}
	want := 0
	if on {
		if want, err = r.readInt(pci, "sriov_totalvfs"); err != nil {
			return err
		}
	}
	if num == want {
		return nil
	}
	if num != 0 {
		if err := r.writeStep(ctx, pci, "sriov_numvfs", "0", "disable its SR-IOV VFs"); err != nil {
			return err
		}
	}
	if want == 0 {
		return nil
	}
	return r.writeStep(ctx, pci, "sriov_numvfs", strconv.Itoa(want), "enable its SR-IOV VFs")
}

// ResetGPU resets the GPU through its PCI device's reset attribute, once
// its VFs are disabled (the driver refuses the reset of a GPU whose VFs
// are enabled; refused here first, naming them), and returns when the
// GPU answers again (WaitBack).
func (r Reset) ResetGPU(ctx context.Context, pci string) error {
	if num, err := r.readInt(pci, "sriov_numvfs"); err == nil && num > 0 {
		return fmt.Errorf("GPU %s: reset: %d SR-IOV VFs are enabled; disable them first: %w", pci, num, gpu.ErrInUse)
	}
	if err := r.writeStep(ctx, pci, "reset", "1", "reset"); err != nil {
		return err
	}
	return r.WaitBack(ctx, pci)
}

// WaitBack waits until the GPU answers again after a reset: its vendor
// id reads NVIDIA's and it is bound to a driver. It gives up when ctx
// ends (gpu.ErrTimeout).
func (r Reset) WaitBack(ctx context.Context, pci string) error {
	t := time.NewTicker(r.poll())
	defer t.Stop()
	for {
		if r.answers(pci) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("GPU %s: not back after the reset: %w: %w", pci, gpu.ErrTimeout, ctx.Err())
		case <-t.C:
		}
	}
}

func (r Reset) answers(pci string) bool {
	b, err := r.Sys.ReadFile(pciPath(pci) + "/vendor")
	if err != nil || strings.TrimSpace(string(b)) != "0x10de" {
		return false
	}
	_, err = r.Sys.Readlink(pciPath(pci) + "/driver")
	return err == nil
}

// Holders names the other processes that hold the GPU's device node
// (/dev/nvidiaN, N its minor as the driver's /proc says) open, as "pid
// PID (COMM)", sorted. Processes that exit while they are read, and those
// whose files this process may not read, are left out.
func (r Reset) Holders(ctx context.Context, pci string) ([]string, error) {
	info, err := r.Proc.ReadFile(path.Join("driver/nvidia/gpus", pci, "information"))
	if err != nil {
		return nil, fmt.Errorf("GPU %s: the driver's information: %w", pci, err)
	}
	minor := ""
	for _, l := range strings.Split(string(info), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "Device Minor" {
			minor = strings.TrimSpace(v)
		}
	}
	if _, err := strconv.Atoi(minor); err != nil {
		return nil, fmt.Errorf("GPU %s: the driver's information names no device minor: %w", pci, ErrParse)
	}
	node := "/dev/nvidia" + minor
	procs, err := r.Proc.ReadDir(".")
	if err != nil {
		return nil, fmt.Errorf("read the processes: %w", err)
	}
	var out []string
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == r.Self {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("GPU %s: holders: %w", pci, err)
		}
		fds, err := r.Proc.ReadDir(p.Name() + "/fd")
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			if t, err := r.Proc.Readlink(p.Name() + "/fd/" + fd.Name()); err == nil && t == node {
				comm, _ := r.Proc.ReadFile(p.Name() + "/comm")
				out = append(out, fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm))))
				break
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
