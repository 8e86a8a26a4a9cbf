package nvml

import (
	"context"
	"fmt"
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// HostReset is the kernel side of a GPU reset on a real host, by PCI
// address (sysfs.Reset): the other processes holding the GPU's device
// node, its SR-IOV VFs, and the reset with the wait for the GPU.
type HostReset interface {
	Holders(ctx context.Context, pci string) ([]string, error)
	SetVFs(ctx context.Context, pci string, on bool) error
	ResetGPU(ctx context.Context, pci string) error
}

// Resetter carries a GPU reset on a real host (the manager's
// GPUResetter): it releases the process's NVML session (ReleaseSession:
// every NVML caller in the process waits), lets host take the kernel's
// steps, and opens the session again. The manager calls ReopenGPU after
// whatever step failed.
type Resetter struct {
	b    *Backend
	host HostReset

	mu sync.Mutex
	// pci keeps each GPU's PCI address by UUID: while the session is
	// released, NVML cannot be asked.
	pci map[string]string
}

// Resetter returns the resetter of the backend's GPUs over host.
func (b *Backend) Resetter(host HostReset) *Resetter {
	return &Resetter{b: b, host: host, pci: map[string]string{}}
}

// pciOf is the PCI address of the GPU with UUID id.
func (r *Resetter) pciOf(ctx context.Context, id string) (string, error) {
	r.mu.Lock()
	addr, ok := r.pci[id]
	r.mu.Unlock()
	if ok {
		return addr, nil
	}
	if r.b.gate.heldBy(id) {
		return "", fmt.Errorf("GPU %s: its PCI address is unknown and NVML's session is released: %w", id, gpu.ErrNotFound)
	}
	ctx, release, err := r.b.hold(ctx, "GetPciInfo")
	if err != nil {
		return "", err
	}
	defer release()
	d, err := r.b.device(ctx, id)
	if err != nil {
		return "", err
	}
	info, err := call(ctx, r.b, "GetPciInfo", d.GetPciInfo)
	if err != nil {
		return "", fmt.Errorf("GPU %s: PCI address: %w", id, err)
	}
	addr, err = gpu.NormalizePCI(cString(info.BusId[:]))
	if err != nil {
		return "", fmt.Errorf("GPU %s: PCI address: %w", id, err)
	}
	r.mu.Lock()
	r.pci[id] = addr
	r.mu.Unlock()
	return addr, nil
}

// Holders names the other processes holding the GPU's device node open
// (vgpud's own session is not named).
func (r *Resetter) Holders(ctx context.Context, id string) ([]string, error) {
	addr, err := r.pciOf(ctx, id)
	if err != nil {
		return nil, err
	}
	return r.host.Holders(ctx, addr)
}

// ReleaseGPU releases the process's NVML session (every GPU's: NVML has
// one session per process) for the reset of GPU id.
func (r *Resetter) ReleaseGPU(ctx context.Context, id string) error {
	// Read while NVML can still be asked.
	if _, err := r.pciOf(ctx, id); err != nil {
		return err
	}
	return r.b.ReleaseSession(ctx, id)
}

// ReopenGPU opens the session again after the reset of GPU id, whatever
// step failed before.
func (r *Resetter) ReopenGPU(ctx context.Context, id string) error {
	return r.b.ReopenSession(ctx, id)
}

// SetVFs disables (on false) or enables the GPU's SR-IOV VFs.
func (r *Resetter) SetVFs(ctx context.Context, id string, on bool) error {
	addr, err := r.pciOf(ctx, id)
	if err != nil {
		return err
	}
	return r.host.SetVFs(ctx, addr, on)
}

// ResetGPU resets the GPU and returns when it answers again. The session
// must be released for it first: the driver refuses the reset of a GPU
// the process holds open.
func (r *Resetter) ResetGPU(ctx context.Context, id string) error {
	if !r.b.gate.heldBy(id) {
		return fmt.Errorf("GPU %s: reset: vgpud's NVML session is open (release it first): %w", id, gpu.ErrInUse)
	}
	addr, err := r.pciOf(ctx, id)
	if err != nil {
		return err
	}
	return r.host.ResetGPU(ctx, addr)
}
