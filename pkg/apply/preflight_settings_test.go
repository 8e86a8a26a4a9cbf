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

// A scheduler pin for a GPU passed through whole is refused by the dry run
// (Diff) with the GPU named, and the real apply refuses the same before
// any change, also with a change set made while the GPU was free.
func TestApplyRefusesSchedulerOnPassedThroughGPU(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	doc := "version: v1\ntenants:\n  - name: acme\nlayout:\n  - gpu: \"" + sim.DefaultL4 + "\"\n    scope: [vgpu]\n" +
		"    scheduler: {policy: equal_share}\n    instances:\n      - {profile: L4-4Q, tenant: acme, count: 0}\n"
	ctx := context.Background()
	stale, err := apply.Diff(ctx, e.m, parseDoc(t, doc))
	if err != nil {
		t.Fatalf("diff on a free GPU: %v", err)
	}
	pt := e.create("acme", "L4-24GB/passthrough", sim.DefaultL4)
	want := []string{"GPU " + sim.DefaultL4 + " (L4-24GB) is passed through whole (instance " + pt.UUID + " stays)"}

	before := hostState(e)
	_, err = apply.Diff(ctx, e.m, parseDoc(t, doc))
	var pe *apply.PreflightError
	if !errors.Is(err, manager.ErrBusy) || !errors.As(err, &pe) {
		t.Fatalf("dry run: %v, want a Busy pre-flight refusal", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("dry run: %q lacks %q", err, w)
		}
	}
	if after := hostState(e); after != before {
		t.Fatalf("the dry run changed the host:\n%s\nwas\n%s", after, before)
	}
	executeRefused(t, e, stale, apply.Limits{}, manager.ErrBusy, want...)
	// What the step itself would have met: the manager refuses the pin.
	if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: "equal_share"}); !errors.Is(err, manager.ErrBusy) ||
		!strings.Contains(manager.Message(err), "passed through whole") {
		t.Fatalf("SetGPUScheduler on a passed-through GPU: %v, want Busy", err)
	}
	// Handing it to the share loop only drops a pin: allowed.
	if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Mode: manager.SchedAdaptive}); err != nil {
		t.Fatalf("adaptive on a passed-through GPU: %v", err)
	}
}

// A MIG-mode change set made while the GPU was free, executed after a
// passthrough took it, stops before its first change with the GPU named
// (the manager changes a mode only on a GPU without instances).
func TestExecuteRefusesModeChangeUnderPassthrough(t *testing.T) {
	e := newEnv(t)
	e.tenant("acme")
	doc := "version: v1\ntenants:\n  - name: acme\nlayout:\n  - gpu: \"" + sim.DefaultH100TS + "\"\n    mig: true\n    instances: []\n"
	stale, err := apply.Diff(context.Background(), e.m, parseDoc(t, doc))
	if err != nil {
		t.Fatalf("diff on a free GPU: %v", err)
	}
	pt := e.create("acme", "H100-SXM5-80GB/passthrough", sim.DefaultH100TS)
	executeRefused(t, e, stale, apply.Limits{}, manager.ErrBusy,
		"GPU "+sim.DefaultH100TS+" (H100-SXM5-80GB) is passed through whole (instance "+pt.UUID+" stays)")
}
