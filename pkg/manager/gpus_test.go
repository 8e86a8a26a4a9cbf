package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

func TestFailedGPUFailsItsInstancesUntilCleared(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "L4-4Q", "")
	e.m.MarkGPUFailed(r.GPUUUID, "XID 48 (double-bit ECC)")
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := e.m.Instance(r.UUID)
	if got.State != store.StateFailed || !strings.Contains(got.Reason, "XID 48") {
		t.Fatalf("instance on a failed GPU: %s %q", got.State, got.Reason)
	}
	if _, err := e.create("acme", "L4-4Q", sim.DefaultL4); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("carving on a failed GPU: %v", err)
	}
	// A restart of vgpud does not return the GPU to service.
	e.restart()
	if got, _ := e.m.Instance(r.UUID); got.State != store.StateFailed {
		t.Fatalf("after a restart: %s %q", got.State, got.Reason)
	}
	if _, err := e.create("acme", "L4-4Q", sim.DefaultL4); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("carving on a failed GPU after a restart: %v", err)
	}
	// An operator does.
	if _, err := e.m.ClearGPU(context.Background(), sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.m.Instance(r.UUID); got.State != store.StateReady {
		t.Fatalf("after the GPU is cleared: %s %q", got.State, got.Reason)
	}
	// So does a host reboot (it resets the GPU): the instance is re-created.
	e.m.MarkGPUFailed(r.GPUUUID, "XID 48 (double-bit ECC)")
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	rep := e.restart()
	got, _ = e.m.Instance(r.UUID)
	if got.State != store.StateReady || len(rep.Recreated) != 1 || len(e.m.FailedGPUs()) != 0 {
		t.Fatalf("after a reboot: %s %q, report %+v, failed %v", got.State, got.Reason, rep, e.m.FailedGPUs())
	}
	if _, err := e.m.ClearGPU(context.Background(), "0000:ff:00.0"); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("clear an unknown GPU: %v", err)
	}
}

// Operations on GPU modes: MIG mode on and off (with the driver's pending
// change), and the heterogeneous vGPU mode, which vgpud keeps and applies
// again after a host reboot resets it.
func TestGPUModes(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	// MIG off on the time-sliced H100 and on again: refused while an
	// instance lives there, done otherwise.
	r := e.mustCreate("acme", "H100XM-20C", sim.DefaultH100TS)
	if err := e.m.SetMIGMode(ctx, sim.DefaultH100TS, true); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("MIG on under an instance: %v, want ErrBusy", err)
	}
	if err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	err := e.m.SetMIGMode(ctx, sim.DefaultH100TS, true)
	g, _ := e.m.GPU(sim.DefaultH100TS)
	switch {
	case err == nil:
		if !g.MIG.Enabled {
			t.Fatalf("MIG on succeeded, GPU shows %+v", g.MIG)
		}
	case errors.Is(err, manager.ErrBusy) && strings.Contains(manager.Message(err), "reset"):
		if !g.MIG.Pending || g.MIG.Enabled {
			t.Fatalf("MIG change pending, GPU shows %+v", g.MIG)
		}
	default:
		t.Fatalf("MIG on: %v", err)
	}
	if err := e.m.SetMIGMode(ctx, sim.DefaultL4, true); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("MIG on an L4: %v, want ErrInvalidArgument", err)
	}

	// Heterogeneous mode on the L4: mixed sizes then fit; a reboot resets
	// the mode and vgpud sets it again before re-creating them.
	if err := e.m.SetHeterogeneous(ctx, sim.DefaultL4, true); err != nil {
		t.Fatal(err)
	}
	a := e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
	b := e.mustCreate("acme", "L4-8Q", sim.DefaultL4)
	if err := e.m.SetHeterogeneous(ctx, sim.DefaultL4, false); !errors.Is(err, manager.ErrBusy) ||
		!strings.Contains(manager.Message(err), "destroy the GPU's vGPUs first") || strings.Contains(manager.Message(err), "stop the VM") {
		t.Fatalf("mode change under vGPUs (none attached): %v, want ErrBusy saying to destroy them", err)
	}
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	rep := e.restart()
	if len(rep.Recreated) != 2 || len(rep.Failed) != 0 {
		t.Fatalf("after a reboot: %+v", rep)
	}
	for _, id := range []string{a.UUID, b.UUID} {
		if got, _ := e.m.Instance(id); got.State != store.StateReady {
			t.Fatalf("instance %s after a reboot: %s %q", id, got.State, got.Reason)
		}
	}
	if g, _ := e.m.GPU(sim.DefaultL4); !g.VGPU.Heterogeneous {
		t.Fatal("heterogeneous mode not applied again after the reboot")
	}
	assertConsistent(t, e)
}

// MIG on, asked while a MIG-off is still pending (the driver cannot take
// it while the GPU's VFs are enabled), undoes the pending change: the GPU
// is in the mode asked for with nothing pending, and the answer says so
// (success), not Busy with a reset to do. (Resets are forbidden, so that
// the off stays pending.)
func TestMIGOnUndoingAPendingOff(t *testing.T) {
	e := newEnvNoReset(t, nil)
	ctx := context.Background()
	err := e.m.SetMIGMode(ctx, sim.DefaultH100MIG, false)
	if !errors.Is(err, manager.ErrBusy) {
		// The simulated GPU took it at once: nothing pending to undo.
		t.Fatalf("MIG off with the VFs enabled: %v, want it pending (Busy)", err)
	}
	if g, _ := e.m.GPU(sim.DefaultH100MIG); !g.MIG.Enabled || g.MIG.Pending {
		t.Fatalf("MIG off pending: GPU shows %+v", g.MIG)
	}
	if err := e.m.SetMIGMode(ctx, sim.DefaultH100MIG, true); err != nil {
		t.Fatalf("MIG on undoing the pending off: %v, want success", err)
	}
	if g, _ := e.m.GPU(sim.DefaultH100MIG); !g.MIG.Enabled || !g.MIG.Pending {
		t.Fatalf("after MIG on: GPU shows %+v, want on with on pending", g.MIG)
	}
	// Asked again: nothing to change.
	if err := e.m.SetMIGMode(ctx, sim.DefaultH100MIG, true); err != nil {
		t.Fatalf("MIG on again: %v", err)
	}
}

// A destroy whose release the driver refuses as an invalid argument (the
// instance it recorded is no longer there as recorded: a reboot or reset
// went between, and another may hold its id) is Busy, to retry, never
// InvalidArgument: the caller named a real instance. The instance stays,
// and the retry destroys it.
func TestDestroyRefusedAsInvalidByTheDriverIsBusy(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	r := e.mustCreate("acme", "3g.40gb", sim.DefaultH100MIG)
	for _, op := range []string{"ComputeInstanceDestroy", "GpuInstanceDestroy"} {
		if err := e.sim.AddFault(sim.Fault{Op: op, Return: int(nvml.ERROR_INVALID_ARGUMENT), Count: 1}); err != nil {
			t.Fatal(err)
		}
		err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{})
		if !errors.Is(err, manager.ErrBusy) || errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("%s refused as INVALID_ARGUMENT: %v (%s), want Busy", op, err, manager.Name(err))
		}
		if got, err := e.m.Instance(r.UUID); err != nil || got.State != store.StateReady {
			t.Fatalf("after the refused destroy (%s): %+v, %v", op, got, err)
		}
	}
	if err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatalf("retry: %v", err)
	}
}
