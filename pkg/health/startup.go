package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// Driver readiness at start: at boot the daemon may start before the
// NVIDIA driver's units are done loading the driver and enabling SR-IOV,
// and a vGPU needs its VF.

// StartMargin is what EXTEND_TIMEOUT_USEC adds beyond a wait's deadline:
// time for the start-up reconcile that follows.
const StartMargin = 2 * time.Minute

// Startup is the start-up wait's wiring.
type Startup struct {
	// Driver is the NVML backend; Inventory reads the host (discover.Host).
	Driver    Driver
	Inventory interface {
		Inventory(ctx context.Context) (gpu.Inventory, error)
	}
	// Catalog says which models take vGPUs on VFs.
	Catalog *profile.Catalog
	// OwnVFs are the GPUs (UUIDs) whose VFs vgpud itself disabled, in a
	// MIG mode change a crash cut off: not waited for, the start-up
	// reconcile enables them (manager.VFsDisabledByVgpud).
	OwnVFs []string
	// Wait bounds the whole wait (driverWait).
	Wait time.Duration
	// Notify tells the service manager what start-up waits for.
	Notify interface {
		Status(s string)
		ExtendTimeout(d time.Duration)
	}
	Logger *slog.Logger
}

// WaitDriver waits, up to s.Wait, for NVML to load and then for the
// SR-IOV VFs (waitVFs). While it waits, it asks systemd to extend the
// start timeout. An error is a driver that did not load: the daemon
// starts degraded.
func WaitDriver(ctx context.Context, s Startup) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	deadline := time.Now().Add(s.Wait)
	for attempt := 1; ; attempt++ {
		err := s.Driver.Init(ctx)
		if err == nil {
			if attempt > 1 {
				s.Logger.Info("NVIDIA driver is ready", "after", attempt)
			}
			s.waitVFs(ctx, deadline)
			return nil
		}
		if !errors.Is(err, gpu.ErrDriverNotLoaded) || time.Now().After(deadline) {
			return fmt.Errorf("NVIDIA driver not ready after %v: %w", s.Wait, err)
		}
		if attempt == 1 {
			s.Logger.Warn("waiting for the NVIDIA driver", "err", err, "up to", s.Wait)
			s.Notify.Status("waiting for the NVIDIA driver")
		}
		s.Notify.ExtendTimeout(time.Until(deadline) + StartMargin)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// awaitingVFs lists the GPUs whose VFs should be there and are not: the
// PCI function offers SR-IOV (sriov_totalvfs > 0), the vGPU manager is
// loaded (NVML lists vGPU types for the GPU), and no VF is enabled yet.
func awaitingVFs(inv gpu.Inventory, cat *profile.Catalog, own []string) []string {
	var out []string
	for _, g := range inv.GPUs {
		if g.Lost || slices.Contains(own, g.UUID) || g.VGPU.TotalVFs == 0 || g.VGPU.NumVFs > 0 || len(g.VGPU.Supported) == 0 {
			continue
		}
		if m, ok := cat.Model(g.Model); ok && (m.VGPU == nil || m.VGPU.SRIOVVFs == 0) {
			continue
		}
		out = append(out, g.PCI)
	}
	sort.Strings(out)
	return out
}

// waitVFs waits, until deadline, for the SR-IOV VFs of every GPU that
// should have them. It never fails the start: a GPU without VFs takes no
// vGPU, which its capacity shows; the log says what to run.
func (s Startup) waitVFs(ctx context.Context, deadline time.Time) {
	var missing []string
	for attempt := 1; ; attempt++ {
		inv, err := s.Inventory.Inventory(ctx)
		if err == nil {
			missing = awaitingVFs(inv, s.Catalog, s.OwnVFs)
			if len(missing) == 0 {
				if attempt > 1 {
					s.Logger.Info("SR-IOV virtual functions are ready", "after", attempt)
				}
				return
			}
		}
		if attempt == 1 {
			s.Logger.Warn("waiting for the SR-IOV virtual functions of GPUs (the NVIDIA units run sriov-manage -e)",
				"gpus", missing, "err", err, "up to", time.Until(deadline).Round(time.Second))
		}
		if !time.Now().Before(deadline) {
			s.Logger.Error("SR-IOV virtual functions did not appear: no vGPU can be created on these GPUs until they do; run /usr/lib/nvidia/sriov-manage -e ALL",
				"gpus", missing, "err", err)
			return
		}
		s.Notify.Status("waiting for SR-IOV virtual functions on " + strings.Join(missing, ", "))
		s.Notify.ExtendTimeout(time.Until(deadline) + StartMargin)
		if !sleepCtx(ctx, min(time.Second, time.Until(deadline))) {
			return
		}
	}
}
