package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// Driver readiness at start: at boot the daemon may start before the
// NVIDIA driver's units are done loading the driver and enabling SR-IOV,
// and a vGPU needs its VF.

// startMargin is what EXTEND_TIMEOUT_USEC adds beyond a wait's deadline:
// time for the start-up reconcile that follows.
const startMargin = 2 * time.Minute

// waitDriver waits, up to DriverWait, for NVML to load and then for the
// SR-IOV VFs (waitVFs). While it waits, it asks systemd to extend the
// start timeout.
func (d *daemon) waitDriver(ctx context.Context) error {
	deadline := time.Now().Add(d.cfg.DriverWait.Duration)
	for attempt := 1; ; attempt++ {
		err := d.host.nvml.Init(ctx)
		if err == nil {
			if attempt > 1 {
				d.log.Info("NVIDIA driver is ready", "after", attempt)
			}
			d.waitVFs(ctx, deadline)
			return nil
		}
		if !errors.Is(err, gpu.ErrDriverNotLoaded) || time.Now().After(deadline) {
			return fmt.Errorf("NVIDIA driver not ready after %v: %w", d.cfg.DriverWait.Duration, err)
		}
		if attempt == 1 {
			d.log.Warn("waiting for the NVIDIA driver", "err", err, "up to", d.cfg.DriverWait.Duration)
			d.notify.Status("waiting for the NVIDIA driver")
		}
		d.notify.ExtendTimeout(time.Until(deadline) + startMargin)
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
func awaitingVFs(inv gpu.Inventory, cat *profile.Catalog) []string {
	var out []string
	for _, g := range inv.GPUs {
		if g.Lost || g.VGPU.TotalVFs == 0 || g.VGPU.NumVFs > 0 || len(g.VGPU.Supported) == 0 {
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
func (d *daemon) waitVFs(ctx context.Context, deadline time.Time) {
	disc := discover.Host{NVML: d.host.nvml, Sysfs: d.host.sysfs}
	var missing []string
	for attempt := 1; ; attempt++ {
		inv, err := disc.Inventory(ctx)
		if err == nil {
			missing = awaitingVFs(inv, d.host.cat)
			if len(missing) == 0 {
				if attempt > 1 {
					d.log.Info("SR-IOV virtual functions are ready", "after", attempt)
				}
				return
			}
		}
		if attempt == 1 {
			d.log.Warn("waiting for the SR-IOV virtual functions of GPUs (the NVIDIA units run sriov-manage -e)",
				"gpus", missing, "err", err, "up to", time.Until(deadline).Round(time.Second))
		}
		if !time.Now().Before(deadline) {
			d.log.Error("SR-IOV virtual functions did not appear: no vGPU can be created on these GPUs until they do; run /usr/lib/nvidia/sriov-manage -e ALL",
				"gpus", missing, "err", err)
			return
		}
		d.notify.Status("waiting for SR-IOV virtual functions on " + strings.Join(missing, ", "))
		d.notify.ExtendTimeout(time.Until(deadline) + startMargin)
		if !sleepCtx(ctx, min(time.Second, time.Until(deadline))) {
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
