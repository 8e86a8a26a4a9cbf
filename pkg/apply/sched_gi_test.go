package apply_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

const rtxProPCI = "0000:c1:00.0"

func rtxProHost(t *testing.T) *env {
	t.Helper()
	e := newEnvSpec(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: rtxPro, PCI: rtxProPCI, Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, MIG: true},
	}})
	e.tenant("acme")
	return e
}

// An instance line's scheduler pins the scheduler of the GPU instances
// that hold its vGPUs, after the creates that make them; applied again,
// the layout changes nothing; changed, only the pins change.
func TestApplyGPUInstanceScheduler(t *testing.T) {
	e := rtxProHost(t)
	layout := func(sched string) *apply.Desired {
		return parseText(t, "version: v1\nlayout:\n  - gpu: '"+rtxProPCI+"'\n    instances:\n"+
			"      - {profile: 'RTX Pro 6000 Blackwell DC-1-6Q', tenant: acme, count: 6, scheduler: "+sched+"}\n")
	}
	cs, _ := e.apply(layout("{policy: equal_share, timeslice: 5ms}"))
	last := cs.Changes[len(cs.Changes)-1]
	if last.Op != apply.OpSetGPUInstanceScheduler || !strings.Contains(last.String(), "equal_share, time slice 5ms") {
		t.Fatalf("changes (the GPU instances' scheduler last):\n%s", cs)
	}
	g, err := e.m.GPU(rtxProPCI)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.GPUInstanceSchedulers) != 2 { // six DC-1-6Q: four to a 1g.24gb+gfx
		t.Fatalf("GPU instance schedulers %+v, want two GPU instances", g.GPUInstanceSchedulers)
	}
	for _, v := range g.GPUInstanceSchedulers {
		if v.Mode != manager.SchedPinned || v.Policy != "equal_share" || v.Timeslice != 5*time.Millisecond || v.Pending {
			t.Fatalf("GPU instance %d: %+v", v.GPUInstance, v)
		}
	}
	again, err := apply.Diff(context.Background(), e.m, layout("{policy: equal_share, timeslice: 5ms}"))
	if err != nil || len(again.Changes) != 0 {
		t.Fatalf("applied again: %v\n%s", err, again)
	}
	cs, _ = e.apply(layout("{policy: fixed_share}"))
	if len(cs.Changes) != 1 || cs.Changes[0].Op != apply.OpSetGPUInstanceScheduler {
		t.Fatalf("a new setting: want the one change\n%s", cs)
	}
	g, _ = e.m.GPU(rtxProPCI)
	for _, v := range g.GPUInstanceSchedulers {
		if v.Policy != "fixed_share" {
			t.Fatalf("after the new setting GPU instance %d: %+v", v.GPUInstance, v)
		}
	}
}

// A scheduler on a line that cannot have one is refused before anything
// changes: not GB20x, a MIG profile, two settings for one type's shared
// GPU instances, or a bad setting (when the file is read).
func TestApplyGPUInstanceSchedulerRefused(t *testing.T) {
	e := rtxProHost(t)
	e.tenant("beta")
	before := e.summary()
	for _, c := range []struct{ layout, say string }{
		{"version: v1\nlayout: [{gpu: '" + sim.DefaultH100MIG + "', instances: [{profile: 'H100XM-1-10C', tenant: acme, scheduler: {policy: equal_share}}]}]", "no per-GPU-instance vGPU scheduler"},
		{"version: v1\nlayout: [{gpu: '" + rtxProPCI + "', instances: [{profile: 1g.24gb, tenant: acme, scheduler: {policy: equal_share}}]}]", "only MIG-backed vGPU types"},
		{"version: v1\nlayout: [{gpu: '" + rtxProPCI + "', instances: [{profile: 'RTX Pro 6000 Blackwell DC-1-6Q', tenant: acme, scheduler: {policy: equal_share}}, {profile: 'RTX Pro 6000 Blackwell DC-1-6Q', tenant: beta, scheduler: {policy: fixed_share}}]}]", "shares GPU instances with instances[0]"},
	} {
		_, err := apply.Diff(context.Background(), e.m, parseText(t, c.layout))
		if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(err.Error(), c.say) {
			t.Errorf("%s: %v, want InvalidArgument saying %q", c.layout, err, c.say)
		}
	}
	for _, bad := range []string{"{policy: round_robin}", "{policy: equal_share, timeslice: 31ms}", "{mode: adaptive, policy: equal_share}"} {
		_, err := apply.Parse("host.yaml", []byte("version: v1\nlayout: [{gpu: '"+rtxProPCI+"', instances: [{profile: 'RTX Pro 6000 Blackwell DC-1-6Q', tenant: acme, scheduler: "+bad+"}]}]"), "")
		var fe *apply.FileError
		if !errors.As(err, &fe) || fe.Field != "layout[0].instances[0].scheduler" {
			t.Errorf("%s: %v, want a FileError at layout[0].instances[0].scheduler", bad, err)
		}
	}
	// A change set edited after its dry run: the pre-flight refuses it.
	cs := apply.ChangeSet{Changes: []apply.Change{{Op: apply.OpSetGPUInstanceScheduler, GPU: sim.DefaultH100MIG, Profile: "H100XM-1-10C", Tenant: "acme",
		Scheduler: &apply.SchedulerSpec{Policy: "equal_share"}}}}
	if _, err := apply.Execute(context.Background(), e.m, cs); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Errorf("edited change set: %v, want InvalidArgument", err)
	}
	if after := e.summary(); after != before {
		t.Fatalf("refused layouts changed the host:\n%s\nwas\n%s", after, before)
	}
}
