package nvml_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// sysfsAttr reads attribute name of the PCI device pci; "" when the
// kernel has none.
func sysfsAttr(pci, name string) string {
	b, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", pci, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// TestRealGPUResetReadiness reads, for every real GPU, what a MIG mode
// change carried through a GPU reset depends on: the MIG mode now and
// pending (NVML's GetMigMode), the SR-IOV VFs (sriov_totalvfs,
// sriov_numvfs: the reset is refused while they are enabled), the PCI
// reset methods the kernel offers (reset_method), and, on Blackwell GB20x,
// each GPU instance's scheduler through the _v2 getters. Read-only: no
// mode, VF, reset or scheduler is changed. A pending MIG mode is logged
// as waiting for a reset; values the driver or kernel report that cannot
// be so (VFs enabled beyond the total, a pending mode on a GPU without
// MIG) fail.
func TestRealGPUResetReadiness(t *testing.T) {
	if !*realGPU {
		t.Skip("pass -real-gpu on a host with the NVIDIA driver")
	}
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := nvmlb.New(gonvml.New(), cat, nvmlb.Options{})
	if err := b.Init(ctx); err != nil {
		t.Fatalf("NVML: %v", err)
	}
	defer b.Shutdown(ctx)
	gpus, err := b.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		switch {
		case !g.MIG.Capable && (g.MIG.Enabled || g.MIG.Pending):
			t.Errorf("GPU %s: MIG enabled=%v pending=%v on a GPU without MIG", g.PCI, g.MIG.Enabled, g.MIG.Pending)
		case g.MIG.Capable && g.MIG.Enabled != g.MIG.Pending:
			t.Logf("GPU %s: MIG mode change pending until a GPU reset: now %v, pending %v", g.PCI, g.MIG.Enabled, g.MIG.Pending)
		}
		total, num := sysfsAttr(g.PCI, "sriov_totalvfs"), sysfsAttr(g.PCI, "sriov_numvfs")
		if total != "" && num != "" {
			nt, err1 := strconv.Atoi(total)
			nn, err2 := strconv.Atoi(num)
			if err1 != nil || err2 != nil || nn < 0 || nn > nt {
				t.Errorf("GPU %s: sriov_numvfs %q, sriov_totalvfs %q", g.PCI, num, total)
			}
		}
		_, err := os.Stat(filepath.Join("/sys/bus/pci/devices", g.PCI, "reset"))
		t.Logf("GPU %s %s: MIG capable=%v now=%v pending=%v; VFs %s of %s; reset file %v, reset methods %q",
			g.PCI, g.Model, g.MIG.Capable, g.MIG.Enabled, g.MIG.Pending, orDash(num), orDash(total), err == nil, sysfsAttr(g.PCI, "reset_method"))
		for _, x := range g.MIG.Instances {
			s, err := b.GPUInstanceScheduler(ctx, g.UUID, x.ID)
			if err != nil && !errors.Is(err, gpu.ErrNotSupported) {
				t.Errorf("GPU %s GPU instance %d scheduler (_v2): %v", g.PCI, x.ID, err)
			}
			t.Logf("GPU %s GPU instance %d (%s): scheduler %+v (%v)", g.PCI, x.ID, x.Profile, s, err)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
