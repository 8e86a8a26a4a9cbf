package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Resetter is the host side of a GPU reset on the simulated host, for the
// process whose NVML library is lib (Host.NVML): its session on a GPU,
// the GPU's VFs (sriov-manage) and the reset (nvidia-smi -r), with the
// driver's refusals (docs/simulator.md, "What the driver refuses").
type Resetter struct {
	h   *Host
	lib *lib
}

// Resetter returns the resetter of the process using lib, one of the
// host's libraries.
func (h *Host) Resetter(l nvml.Interface) (*Resetter, error) {
	sl, ok := l.(*lib)
	if !ok || sl.h != h {
		return nil, errors.New("simulated resetter: the NVML library is not the host's")
	}
	return &Resetter{h: h, lib: sl}, nil
}

// Holders names the other processes holding an NVML session on the GPU.
func (r *Resetter) Holders(_ context.Context, gpuUUID string) ([]string, error) {
	var out []string
	err := r.h.view(func(st *state) error {
		g := st.gpu(gpuUUID)
		if g == nil {
			return fmt.Errorf("%w: %s", ErrNoSuchGPU, gpuUUID)
		}
		others := *g
		others.Sessions = nil
		for _, s := range g.Sessions {
			if s.Lib != r.lib.id {
				others.Sessions = append(others.Sessions, s)
			}
		}
		out = others.holders()
		return nil
	})
	return out, err
}

// ReleaseGPU closes the library's session on the GPU.
func (r *Resetter) ReleaseGPU(_ context.Context, gpuUUID string) error {
	if ret := r.lib.ReleaseGPU(gpuUUID); ret != nvml.SUCCESS {
		return fmt.Errorf("release GPU %s: %w", gpuUUID, ret)
	}
	return nil
}

// ReopenGPU opens the library's session on the GPU again.
func (r *Resetter) ReopenGPU(_ context.Context, gpuUUID string) error {
	if ret := r.lib.ReopenGPU(gpuUUID); ret != nvml.SUCCESS {
		return fmt.Errorf("reopen GPU %s: %w", gpuUUID, ret)
	}
	return nil
}

// SetVFs is sriov-manage -e (on) or -d on the GPU.
func (r *Resetter) SetVFs(_ context.Context, gpuUUID string, on bool) error {
	return r.h.SetVFs(gpuUUID, on)
}

// ResetGPU is nvidia-smi -r on the GPU; the simulated reset is done when
// it returns.
func (r *Resetter) ResetGPU(_ context.Context, gpuUUID string) error {
	return r.h.ResetGPU(gpuUUID)
}

// ProcessExited drops the sessions of the resetter's library, as the
// kernel closes a process's files when it dies (a test's restart of the
// daemon in one process).
func (r *Resetter) ProcessExited() {
	r.lib.closeSessions()
}
