// Package simhost builds vgpud's manager on a simulated host as the
// daemon builds it at start: the simulator (pkg/gpu/sim) below the NVML
// and sysfs backends, the store, a manager over them, and the start-up
// reconcile. It starts the manager again on the same state as a restart
// of the daemon does, and holds the small manager helpers the tests share.
// Only tests and bench/ import it.
//
// Imports: pkg/gpu/nvml, pkg/gpu/sim, pkg/gpu/sysfs, pkg/manager, pkg/profile, pkg/store, pkg/tenant, profiles.
package simhost

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/profiles"
)

// Options say what host to build and how.
type Options struct {
	// Dir holds the state: the simulated host in Dir/sim, the store in
	// Dir/state.db, as in the daemon's state directory. Start uses a
	// fresh t.TempDir() when it is empty; Open needs it.
	Dir string
	// Spec describes the simulated host. nil: whatever Dir/sim holds, or
	// the built-in host (sim.DefaultSpec) when it is new.
	Spec *sim.Spec
	// Catalog is the GPU catalog; nil: the embedded one.
	Catalog *profile.Catalog
	// Sim, NVML and Store are the options of the simulator, the NVML
	// backend and the store.
	Sim   sim.OpenOptions
	NVML  nvmlb.Options
	Store store.Options
	// FS, when set, makes the tree the sysfs backend reads and writes from
	// the simulated host (a recorder around h.FS(), say); nil: h.FS().
	FS func(h *sim.Host) sysfs.FS
	// Manager configures the manager: Virt, Logger, Crash, BusyRetry,
	// UndefinePolicy, BootID and the like. Catalog, Store, NVML and Sysfs
	// are set to the pieces built here.
	Manager manager.Config
	// SimBootID makes the manager read the simulated host's boot ID (in
	// place of Manager.BootID), so that a simulated reboot resets the GPUs
	// failed before it.
	SimBootID bool
	// GateReset makes the manager reset GPUs as on a real host: through
	// the NVML backend's session gate (nvml.Resetter: every NVML call of
	// the process paused, NVML shut down and initialized again) over the
	// simulated kernel's steps, in place of the simulator's per-GPU
	// session release. Ignored when Manager.Reset is set.
	GateReset bool
	// NoReconcile leaves the manager as New made it, for a caller that
	// refreshes or reconciles itself.
	NoReconcile bool
	// BeforeReconcile, when set, is given each new manager before its
	// start-up reconcile, as the daemon sets the fleet there (a fleet
	// scheduler's create cut off by a crash is settled against it).
	BeforeReconcile func(*manager.Manager)
}

// Host is the simulated host and the manager over it.
type Host struct {
	Dir     string
	Catalog *profile.Catalog
	Sim     *sim.Host
	DB      *store.DB
	NVML    *nvmlb.Backend
	Sysfs   *sysfs.Sysfs
	// simReset is the latest start's resetter, its NVML sessions dropped at
	// a restart.
	simReset *sim.Resetter
	Manager  *manager.Manager
	// Report is what the last start's reconcile did.
	Report manager.ReconcileReport

	opts   Options
	closed bool
}

// Start builds the host for a test (Open), failing the test on an error,
// and closes it when the test ends.
func Start(t testing.TB, o Options) *Host {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	h, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Open opens (creating on first use) the simulated host in o.Dir and its
// store, and starts a manager over them.
func Open(ctx context.Context, o Options) (*Host, error) {
	if o.Dir == "" {
		return nil, errors.New("simhost: no state directory")
	}
	h := &Host{Dir: o.Dir, Catalog: o.Catalog, opts: o}
	if h.Catalog == nil {
		cat, err := profile.Load(profiles.FS)
		if err != nil {
			return nil, err
		}
		h.Catalog = cat
	}
	s, err := sim.Open(filepath.Join(o.Dir, "sim"), o.Spec, h.Catalog, o.Sim)
	if err != nil {
		return nil, err
	}
	h.Sim = s
	if err := h.start(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// start opens the store and the backends and makes the manager, as a
// daemon start does; the simulated host stays open across starts.
func (h *Host) start(ctx context.Context) error {
	db, err := store.Open(filepath.Join(h.Dir, "state.db"), h.opts.Store)
	if err != nil {
		return err
	}
	h.DB = db
	lib := h.Sim.NVML()
	h.NVML = nvmlb.New(lib, h.Catalog, h.opts.NVML)
	if err := h.NVML.Init(ctx); err != nil {
		return err
	}
	var fs sysfs.FS = h.Sim.FS()
	if h.opts.FS != nil {
		fs = h.opts.FS(h.Sim)
	}
	h.Sysfs = sysfs.New(fs).WithMdevctl(h.Sim.MdevctlDir())
	c := h.opts.Manager
	c.Catalog, c.Store, c.NVML, c.Sysfs = h.Catalog, h.DB, h.NVML, h.Sysfs
	if h.simReset, err = h.Sim.Resetter(lib); err != nil {
		return err
	}
	if c.Reset == nil && h.opts.GateReset {
		c.Reset = h.NVML.Resetter(simKernel{h: h.Sim, r: h.simReset})
	} else if c.Reset == nil {
		c.Reset = h.simReset
	}
	if h.opts.SimBootID {
		c.BootID = func() string { id, _ := h.Sim.BootID(); return id }
	}
	h.Manager = manager.New(c)
	h.Report = manager.ReconcileReport{}
	if h.opts.BeforeReconcile != nil {
		h.opts.BeforeReconcile(h.Manager)
	}
	if h.opts.NoReconcile {
		return nil
	}
	h.Report, err = h.Manager.Reconcile(ctx)
	if err != nil {
		return fmt.Errorf("reconcile at start: %w", err)
	}
	return nil
}

// Restart stands for the daemon dying and starting again on the same
// state: the store is closed and opened again, and new backends and a new
// manager are made and reconciled (Report says what that did). The old
// manager is dropped as a killed daemon's would be, not closed.
func (h *Host) Restart(ctx context.Context) error {
	if h.simReset != nil {
		// The process died: the kernel closed its NVML sessions.
		h.simReset.ProcessExited()
	}
	if h.DB != nil {
		if err := h.DB.Close(); err != nil {
			return err
		}
		h.DB = nil
	}
	return h.start(ctx)
}

// Close closes the store and the simulated host; closing again does
// nothing.
func (h *Host) Close() error {
	if h.closed {
		return nil
	}
	h.closed = true
	var errs []error
	if h.DB != nil {
		errs = append(errs, h.DB.Close())
	}
	errs = append(errs, h.Sim.Close())
	return errors.Join(errs...)
}

// simKernel is the simulated host's side of a reset by PCI address, as
// sysfs.Reset is a real host's: the other holders of the GPU, its VFs
// (sriov-manage) and the reset (nvidia-smi -r).
type simKernel struct {
	h *sim.Host
	r *sim.Resetter
}

func (k simKernel) Holders(ctx context.Context, pci string) ([]string, error) {
	return k.r.Holders(ctx, pci)
}

func (k simKernel) SetVFs(_ context.Context, pci string, on bool) error {
	return k.h.SetVFs(pci, on)
}

func (k simKernel) ResetGPU(_ context.Context, pci string) error {
	return k.h.ResetGPU(pci)
}
