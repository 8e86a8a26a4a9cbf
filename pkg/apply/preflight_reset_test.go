package apply_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// migOnDoc turns MIG on on the time-sliced H100, whose vGPUs go.
const migOnDoc = "version: v1\ntenants:\n  - name: acme\nlayout:\n  - gpu: \"" + sim.DefaultH100TS + "\"\n    mig: true\n    instances: []\n"

func sessionsSpec() *sim.Spec {
	s := sim.DefaultSpec()
	s.Options.NVMLSessions = true
	return s
}

// A MIG mode change on a GPU with SR-IOV VFs and vGPUs of vgpud's: the
// dry run lists the GPU reset's steps, and one apply destroys the vGPUs,
// carries the change through the reset and leaves MIG on.
func TestApplyMIGChangeThroughReset(t *testing.T) {
	e := newEnvSpec(t, sessionsSpec())
	e.tenant("acme")
	e.create("acme", "H100XM-20C", sim.DefaultH100TS)
	ctx := context.Background()
	cs, err := apply.Diff(ctx, e.m, parseDoc(t, migOnDoc))
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	out := cs.String()
	for _, w := range []string{"enable MIG on " + sim.DefaultH100TS, "through a GPU reset", "disable its SR-IOV VFs", "reset the GPU", "enable its SR-IOV VFs"} {
		if !strings.Contains(out, w) {
			t.Fatalf("dry run lacks %q:\n%s", w, out)
		}
	}
	res, err := apply.Execute(ctx, e.m, cs)
	if err != nil {
		t.Fatalf("apply: %v (%+v)\n%s", err, res, e.summary())
	}
	g, err := e.m.GPU(sim.DefaultH100TS)
	if err != nil || !g.MIG.Enabled || !g.MIG.Pending || g.VGPU.NumVFs == 0 {
		t.Fatalf("after the apply: %+v, VFs %d, %v; want MIG on, nothing pending, VFs back", g.MIG, g.VGPU.NumVFs, err)
	}
	if again, err := apply.Diff(ctx, e.m, parseDoc(t, migOnDoc)); err != nil || !again.Empty() {
		t.Fatalf("re-applied: %v, %v; want nothing to change", again, err)
	}
}

// A MIG mode change that needs a reset of a GPU a VM uses is refused by the
// dry run, naming the VM, and by the apply before its first change (also
// with a change set made while no VM ran). With resets forbidden the
// refusal is the manual procedure.
func TestApplyRefusesMIGResetUnderVM(t *testing.T) {
	e := newEnvSpec(t, sessionsSpec())
	e.tenant("acme")
	in := e.create("acme", "H100XM-20C", sim.DefaultH100TS)
	ctx := context.Background()
	stale, err := apply.Diff(ctx, e.m, parseDoc(t, migOnDoc))
	if err != nil {
		t.Fatalf("dry run with no VM: %v", err)
	}
	if err := e.sim.OpenDevice(in.VF, "6a1c3d0e-2b7f-4f55-9d1e-0c8b4a2f7e31", "guest"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	want := "VM 6a1c3d0e-2b7f-4f55-9d1e-0c8b4a2f7e31 runs a vGPU"
	_, err = apply.Diff(ctx, e.m, parseDoc(t, migOnDoc))
	var pe *apply.PreflightError
	if !errors.Is(err, manager.ErrBusy) || !errors.As(err, &pe) || !strings.Contains(err.Error(), want) {
		t.Fatalf("dry run with a VM: %v; want a Busy pre-flight refusal naming the VM", err)
	}
	executeRefused(t, e, stale, apply.Limits{}, manager.ErrBusy, want)
}

// With gpuReset: never, the dry run refuses the change up front with the
// manual procedure.
func TestApplyMIGResetForbidden(t *testing.T) {
	e := newEnvConfig(t, sessionsSpec(), manager.Config{BusyRetry: 1, GPUReset: manager.GPUResetNever})
	_, err := apply.Diff(context.Background(), e.m, parseDoc(t, migOnDoc))
	if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "sriov-manage -d") || !strings.Contains(err.Error(), "gpuReset: never") {
		t.Fatalf("dry run with resets forbidden: %v; want the manual procedure", err)
	}
}

// mig-parted's configs (the forms of its config-default.yaml) apply to the
// default host in one apply each, from whatever layout the one before
// left, MIG mode changes of GPUs with VFs included (carried through a GPU
// reset), and applying one again changes nothing (env.apply checks both).
func TestMigPartedConfigsApplyInOneGo(t *testing.T) {
	e := newEnvSpec(t, sessionsSpec())
	for _, name := range []string{"all-balanced", "all-disabled", "all-enabled", "all-1g.10gb", "all-balanced", "all-enabled", "all-disabled", "all-1g.10gb", "all-disabled"} {
		e.apply(mustParse(t, "nvidia/mig-parted.yaml", name))
	}
}
