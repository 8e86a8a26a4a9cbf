package manager_test

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/internal/invariant"
	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// sessionsHost is the built-in host with NVML sessions modelled: the
// manager's own NVML holds every GPU, as on a real host.
func sessionsHost() *sim.Spec {
	s := sim.DefaultSpec()
	s.Options.NVMLSessions = true
	return s
}

// newEnvNoReset is newEnv with GPU resets forbidden (gpuReset: never):
// a MIG mode change the driver leaves pending stays so.
func newEnvNoReset(t testing.TB, spec *sim.Spec) *env {
	t.Helper()
	e := &env{t: t}
	e.host = simhost.Start(t, simhost.Options{
		Spec: spec,
		Manager: manager.Config{
			Crash:     func(p string) { e.crashAt(p) },
			BusyRetry: 1,
			Logger:    testenv.Logger(t),
			GPUReset:  manager.GPUResetNever,
		},
		SimBootID: true,
	})
	e.cat, e.sim, e.db, e.m = e.host.Catalog, e.host.Sim, e.host.DB, e.host.Manager
	return e
}

// migState reads the GPU's MIG mode, its VF count and the intents left.
func (e *env) migState(pci string) (on, pending bool, vfs, intents int) {
	e.t.Helper()
	if err := e.m.Refresh(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	g, err := e.m.GPU(pci)
	if err != nil {
		e.t.Fatal(err)
	}
	var its []store.Intent
	if err := e.db.View(func(tx *store.Tx) (err error) { its, err = tx.Intents(); return err }); err != nil {
		e.t.Fatal(err)
	}
	return g.MIG.Enabled, g.MIG.Pending != g.MIG.Enabled, g.VGPU.NumVFs, len(its)
}

// A MIG mode change on a GPU with SR-IOV VFs, which the driver leaves
// pending until a reset, is carried through by the manager (its own NVML
// session let go, the VFs disabled, the GPU reset, the VFs and the session
// back), both ways, and heterogeneous mode is set again after the reset
// that lost it.
func TestMIGModeCarriedThrough(t *testing.T) {
	e := newEnv(t, sessionsHost())
	ctx := context.Background()
	g := sim.DefaultH100TS
	if err := e.m.SetHeterogeneous(ctx, g, true); err != nil {
		t.Fatal(err)
	}
	if err := e.m.SetMIGMode(ctx, g, true); err != nil {
		t.Fatalf("MIG on: %v", err)
	}
	if on, pending, vfs, its := e.migState(g); !on || pending || vfs == 0 || its != 0 {
		t.Fatalf("after MIG on: on %v pending %v VFs %d intents %d; want on, nothing pending, VFs back, no intent\n%s", on, pending, vfs, its, e.summary())
	}
	if hs, _ := e.sim.Sessions(g); len(hs) != 1 {
		t.Fatalf("NVML sessions after the change: %q; want the manager's again", hs)
	}
	if err := e.m.SetMIGMode(ctx, g, false); err != nil {
		t.Fatalf("MIG off: %v", err)
	}
	if on, pending, vfs, its := e.migState(g); on || pending || vfs == 0 || its != 0 {
		t.Fatalf("after MIG off: on %v pending %v VFs %d intents %d", on, pending, vfs, its)
	}
	if v, _ := e.m.GPU(g); !v.VGPU.Heterogeneous {
		t.Fatal("heterogeneous mode not set again after the reset")
	}
}

// On a real host the reset goes through the NVML backend's session gate:
// the whole process's NVML session is shut down (not one GPU's), the
// kernel's steps taken, NVML initialized again, and the GPU and its
// settings read through the new session. Other processes' sessions still
// refuse the change before any step.
func TestMIGModeThroughSessionGate(t *testing.T) {
	e := &env{t: t}
	nvmlLog := &testenv.Buffer{}
	e.host = simhost.Start(t, simhost.Options{
		Spec:      sessionsHost(),
		Manager:   manager.Config{Crash: func(p string) { e.crashAt(p) }, BusyRetry: 1, Logger: testenv.Logger(t)},
		NVML:      nvmlb.Options{Logger: slog.New(slog.NewTextHandler(nvmlLog, nil))},
		SimBootID: true,
		GateReset: true,
	})
	e.cat, e.sim, e.db, e.m = e.host.Catalog, e.host.Sim, e.host.DB, e.host.Manager
	ctx := context.Background()
	g := sim.DefaultH100TS
	if err := e.m.SetHeterogeneous(ctx, g, true); err != nil {
		t.Fatal(err)
	}
	if err := e.m.SetMIGMode(ctx, g, true); err != nil {
		t.Fatalf("MIG on: %v", err)
	}
	if on, pending, vfs, its := e.migState(g); !on || pending || vfs == 0 || its != 0 {
		t.Fatalf("after MIG on: on %v pending %v VFs %d intents %d; want on, nothing pending, VFs back, no intent\n%s", on, pending, vfs, its, e.summary())
	}
	if hs, _ := e.sim.Sessions(g); len(hs) != 1 {
		t.Fatalf("NVML sessions after the change: %q; want the manager's again", hs)
	}
	if l := nvmlLog.String(); !strings.Contains(l, "NVML session released for a GPU reset") || !strings.Contains(l, "NVML session reopened after a GPU reset") {
		t.Fatalf("the reset did not go through the NVML session gate; the backend logged:\n%s", l)
	}
	if err := e.m.SetMIGMode(ctx, g, false); err != nil {
		t.Fatalf("MIG off: %v", err)
	}
	if on, pending, vfs, its := e.migState(g); on || pending || vfs == 0 || its != 0 {
		t.Fatalf("after MIG off: on %v pending %v VFs %d intents %d", on, pending, vfs, its)
	}
	if v, _ := e.m.GPU(g); !v.VGPU.Heterogeneous {
		t.Fatal("heterogeneous mode not set again after the reset")
	}
	if err := e.sim.OpenSession(g, "dcgm"); err != nil {
		t.Fatal(err)
	}
	err := e.m.SetMIGMode(ctx, g, true)
	if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "NVML sessions are open by") {
		t.Fatalf("MIG on with another NVML client: %v (want Busy naming it)", err)
	}
	if on, pending, _, _ := e.migState(g); on || pending {
		t.Fatalf("a refused change changed the GPU: on %v pending %v", on, pending)
	}
}

// What holds the GPU outside vgpud refuses the change before any step,
// named: another NVML client, a VM running a vGPU vgpud did not create.
// With gpuReset: never the manual procedure is returned.
func TestMIGModeRefusedWhenHeld(t *testing.T) {
	ctx := context.Background()
	g := sim.DefaultH100TS
	unchanged := func(t *testing.T, e *env) {
		t.Helper()
		if on, pending, _, its := e.migState(g); on || pending || its != 0 {
			t.Fatalf("refused change left on %v pending %v intents %d", on, pending, its)
		}
	}
	t.Run("nvml-client", func(t *testing.T) {
		e := newEnv(t, sessionsHost())
		if err := e.sim.OpenSession(g, "dcgm"); err != nil {
			t.Fatal(err)
		}
		err := e.m.SetMIGMode(ctx, g, true)
		if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "dcgm") {
			t.Fatalf("MIG on with dcgm holding the GPU: %v; want Busy naming dcgm", err)
		}
		unchanged(t, e)
	})
	t.Run("foreign-vm", func(t *testing.T) {
		e := newEnv(t, sessionsHost())
		vf := strings.TrimSuffix(g, "0") + "4"
		if err := e.sim.FS().WriteFile("bus/pci/devices/"+vf+"/nvidia/current_vgpu_type", []byte("1302\n")); err != nil {
			t.Skipf("writing a foreign vGPU: %v", err)
		}
		if err := e.sim.OpenDevice(vf, "6a1c3d0e-2b7f-4f55-9d1e-0c8b4a2f7e31", "guest"); err != nil {
			t.Fatal(err)
		}
		err := e.m.SetMIGMode(ctx, g, true)
		if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "vgpud did not create") {
			t.Fatalf("MIG on with a foreign VM vGPU: %v; want Busy naming it", err)
		}
		unchanged(t, e)
	})
	t.Run("never", func(t *testing.T) {
		e := newEnvNoReset(t, sessionsHost())
		err := e.m.SetMIGMode(ctx, g, true)
		if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "sriov-manage -d") || !strings.Contains(err.Error(), "gpuReset: never") {
			t.Fatalf("MIG on with resets forbidden: %v; want the manual procedure", err)
		}
	})
}

// Killed at each step of the sequence, the manager's restart finishes it:
// MIG mode committed, VFs back, no intent left, records and host agree.
func TestMIGModeCrashPoints(t *testing.T) {
	for _, p := range []string{manager.CrashMIGIntent, manager.CrashMIGRelease, manager.CrashMIGVFsOff, manager.CrashMIGReset, manager.CrashMIGVFsOn} {
		t.Run(p, func(t *testing.T) {
			e := newEnv(t, sessionsHost())
			e.tenant("acme", unlimited())
			keep := e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
			g := sim.DefaultH100TS
			e.crash = func(at string) {
				if at == p {
					runtime.Goexit()
				}
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = e.m.SetMIGMode(context.Background(), g, true)
				t.Errorf("the change ran past crash point %s", p)
			}()
			<-done
			rep := e.restart()
			if on, pending, vfs, its := e.migState(g); !on || pending || vfs == 0 || its != 0 {
				t.Fatalf("after the restart: on %v pending %v VFs %d intents %d (report %+v)\n%s", on, pending, vfs, its, rep, e.summary())
			}
			recs, _ := e.m.AllInstances()
			var rs []store.Instance
			for _, r := range recs {
				rs = append(rs, r.Instance)
			}
			if extra, missing := invariant.HostDiff(e.m.Inventory(), rs); len(extra)+len(missing) > 0 {
				t.Fatalf("records and host disagree: extra %v missing %v", extra, missing)
			}
			if len(rs) != 1 || rs[0].UUID != keep.UUID {
				t.Fatalf("records after the restart: %+v; want the L4 instance alone", recs)
			}
		})
	}
}
