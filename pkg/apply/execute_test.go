package apply_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

func TestExecuteVgpudSample(t *testing.T) {
	e := newEnv(t)
	cs, res := e.apply(mustParse(t, "vgpud.yaml", ""))
	want := []string{
		"0000:41:00.0 acme 1g.10gb×2", "0000:41:00.0 acme 2g.20gb×1", "0000:41:00.0 acme 3g.40gb×1",
		"0000:81:00.0 beta L4-4Q×2", "0000:a1:00.0 beta A10-8Q×1",
	}
	if got := e.layout(); !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	// Done lists the created instances by UUID, in the order performed.
	ids := e.uuids()
	for i, c := range res.Done {
		if c.Op == apply.OpCreate && !ids[c.Instance] {
			t.Fatalf("done[%d] %+v names no instance", i, c)
		}
	}
	if len(res.Done) != len(cs.Changes) || res.Failed != nil || res.Error != "" {
		t.Fatalf("result %+v", res)
	}
	v, err := e.m.Tenant("acme")
	if err != nil || v.Quota != (tenant.Quota{VRAMBytes: 120 << 30, ComputeMilli: 2000, MaxInstances: 8}) || v.Class != tenant.Guaranteed {
		t.Fatalf("acme %+v, %v", v, err)
	}
}

// The mig-parted samples on the MIG H100 (GPU 0): each reaches its
// layout, re-applying changes nothing, and switching configs keeps what
// the next one still wants.
func TestMigPartedSamples(t *testing.T) {
	e := newEnv(t)
	steps := []struct {
		config     string
		layout     []string
		keptBefore int // instances of the previous step kept
	}{
		{"gpu0-1g.10gb", []string{"0000:41:00.0 default 1g.10gb×7"}, 0},
		{"gpu0-balanced", []string{"0000:41:00.0 default 1g.10gb×2", "0000:41:00.0 default 2g.20gb×1", "0000:41:00.0 default 3g.40gb×1"}, 2},
		{"gpu0-3g.40gb", []string{"0000:41:00.0 default 3g.40gb×2"}, 1},
		{"gpu0-balanced@acme", []string{"0000:41:00.0 acme 1g.10gb×2", "0000:41:00.0 acme 2g.20gb×1", "0000:41:00.0 acme 3g.40gb×1"}, 0},
	}
	untouched := e.create(mustTenant(e, "other"), "L4-4Q", sim.DefaultL4)
	for _, s := range steps {
		before := e.uuids()
		cs, _ := e.apply(mustParse(t, "mig-parted.yaml", s.config))
		if got := e.layout(); !slices.Equal(got, append(s.layout, "0000:81:00.0 other L4-4Q×1")) {
			t.Fatalf("%s: layout %v, want %v", s.config, got, s.layout)
		}
		kept := 0
		for _, id := range cs.Kept {
			if before[id] && e.uuids()[id] {
				kept++
			}
		}
		if kept != s.keptBefore {
			t.Fatalf("%s: kept %d of the previous instances, want %d:\n%s", s.config, kept, s.keptBefore, cs)
		}
		if !e.migOn(sim.DefaultH100MIG) {
			t.Fatalf("%s: MIG off", s.config)
		}
		if !e.uuids()[untouched.UUID] {
			t.Fatalf("%s: destroyed an instance on a GPU the config does not mention", s.config)
		}
	}
}

func mustTenant(e *env, name string) string {
	e.tenant(name)
	return name
}

// The vgpu-device-manager samples: each reaches its layout and is
// idempotent; a config covers the GPUs that offer its types.
func TestVGPUDeviceManagerSamples(t *testing.T) {
	e := newEnv(t)
	mig := e.create(mustTenant(e, "other"), "1g.10gb", sim.DefaultH100MIG)
	steps := []struct {
		config string
		layout []string
	}{
		{"L4-4Q", []string{"0000:81:00.0 default L4-4Q×6"}},
		{"L4-8Q", []string{"0000:81:00.0 default L4-8Q×3"}},
		{"A10-4Q", []string{"0000:81:00.0 default L4-8Q×3", "0000:a1:00.0 default A10-4Q×6"}},
		{"H100XM-2-20C", []string{"0000:41:00.0 default H100XM-2-20C×3", "0000:81:00.0 default L4-8Q×3", "0000:a1:00.0 default A10-4Q×6"}},
		{"mixed", []string{"0000:41:00.0 default H100XM-2-20C×3", "0000:61:00.0 default H100XM-20C×4", "0000:81:00.0 default L4-4Q×2", "0000:a1:00.0 default A10-8Q×3"}},
		{"none", nil},
	}
	for _, s := range steps {
		cs, _ := e.apply(mustParse(t, "vgpu-device-manager.yaml", s.config))
		// The plain MIG instance is outside vgpu-device-manager's scope.
		want := append([]string{"0000:41:00.0 other 1g.10gb×1"}, s.layout...)
		slices.Sort(want)
		if got := e.layout(); !slices.Equal(got, want) {
			t.Fatalf("%s: layout %v, want %v\n%s", s.config, got, want, cs)
		}
	}
	if !e.uuids()[mig.UUID] {
		t.Fatal("the plain MIG instance was destroyed")
	}
}

// A failing step stops the run: what was done is reported, the failed
// change and the manager's sentinel too, and a second diff shows what
// remains.
func TestExecuteStopsAtFirstError(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	d := mustParse(t, "vgpud.yaml", "")
	cs, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	// The third GPU instance (the first 1g.10gb) fails in the driver.
	if err := e.sim.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Return: 2, Skip: 2, Count: 1}); err != nil {
		t.Fatal(err)
	}
	res, err := apply.Execute(ctx, e.m, cs)
	if err == nil {
		t.Fatal("execute succeeded through a fault")
	}
	if !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("error %v lost the manager's sentinel", err)
	}
	// The other GPUs' changes run beside the MIG GPU's and stop when it
	// fails: some of them may be done, in the run's order.
	var got, onMIG []string
	for _, c := range res.Done {
		got = append(got, string(c.Op)+" "+c.Tenant+" "+c.Profile)
		if c.GPU == sim.DefaultH100MIG {
			onMIG = append(onMIG, c.Profile)
		}
	}
	if len(got) < 4 || !slices.Equal(got[:2], []string{"define-tenant acme ", "define-tenant beta "}) || !slices.Equal(onMIG, []string{"3g.40gb", "2g.20gb"}) {
		t.Fatalf("done %v", got)
	}
	if res.Failed == nil || res.Failed.Profile != "1g.10gb" || res.Remaining != 9-len(res.Done)-1 || res.Error == "" {
		t.Fatalf("result %+v", res)
	}
	if !strings.Contains(err.Error(), "create 1g.10gb for tenant acme on 0000:41:00.0") || !strings.Contains(err.Error(), fmt.Sprintf("%d of 9 changes done", len(res.Done))) {
		t.Fatalf("error %q", err)
	}
	if b, err := json.Marshal(res); err != nil || !strings.Contains(string(b), `"failed":{"op":"create"`) {
		t.Fatalf("result JSON %s, %v", b, err)
	}
	rest, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	if got := lines(rest); len(got) != res.Remaining+1 || !slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, "create 1g.10gb") }) {
		t.Fatalf("remaining:\n%s", rest)
	}
	e.apply(d)
}

// A MIG mode change the driver leaves pending (the GPU has SR-IOV VFs
// enabled, as on a vGPU host) is carried through a GPU reset after the
// destroys it needed; with resets forbidden the dry run refuses it before
// any change, with the manual procedure.
func TestExecuteModeChangePending(t *testing.T) {
	e := newEnv(t)
	e.apply(mustParse(t, "mig-parted.yaml", "gpu0-1g.10gb"))
	e.apply(mustParse(t, "mig-parted.yaml", "all-disabled"))
	if e.migOn(sim.DefaultH100MIG) || len(e.layout()) != 0 {
		t.Fatalf("MIG on %v, layout %v", e.migOn(sim.DefaultH100MIG), e.layout())
	}

	e = newEnvConfig(t, nil, manager.Config{BusyRetry: 1, GPUReset: manager.GPUResetNever})
	e.apply(mustParse(t, "mig-parted.yaml", "gpu0-1g.10gb"))
	before := e.layout()
	_, err := apply.Diff(context.Background(), e.m, mustParse(t, "mig-parted.yaml", "all-disabled"))
	if !errors.Is(err, manager.ErrBusy) || !strings.Contains(err.Error(), "pending until a GPU reset") {
		t.Fatalf("dry run with resets forbidden: %v, want ErrBusy with the manual procedure", err)
	}
	if got := e.layout(); !slices.Equal(got, before) {
		t.Fatalf("layout %v, want %v", got, before)
	}
}

// On a GPU without VFs the mode changes, in both directions, with the
// instances of the old mode destroyed first.
func TestExecuteModeChange(t *testing.T) {
	no := false
	e := newEnvSpec(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{
		{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100MIG, Flavour: gpu.FlavourVFIO, VFs: &no},
		{Model: "L4-24GB", PCI: sim.DefaultL4, Flavour: gpu.FlavourVFIO},
	}})
	cs, _ := e.apply(mustParse(t, "mig-parted.yaml", "all-1g.10gb@ops"))
	if !slices.Contains(lines(cs), "enable MIG on 0000:41:00.0 (H100-SXM5-80GB)") {
		t.Fatalf("changes:\n%s", cs)
	}
	if !e.migOn(sim.DefaultH100MIG) {
		t.Fatal("MIG still off")
	}
	if got := e.layout(); !slices.Equal(got, []string{"0000:41:00.0 ops 1g.10gb×7"}) {
		t.Fatalf("layout %v", got)
	}
	e.apply(mustParse(t, "mig-parted.yaml", "all-disabled@ops"))
	if e.migOn(sim.DefaultH100MIG) || len(e.layout()) != 0 {
		t.Fatalf("MIG on %v, layout %v", e.migOn(sim.DefaultH100MIG), e.layout())
	}
}

// A change set survives JSON (dry run, review, execute) and Execute puts
// it in its safe order whatever order it comes in.
func TestExecuteOrdersAnyChangeSet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.tenant("old")
	e.create("old", "7g.80gb", sim.DefaultH100MIG)
	e.create("old", "L4-8Q", sim.DefaultL4)
	d := mustParse(t, "vgpud.yaml", "")
	cs, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cs)
	if err != nil {
		t.Fatal(err)
	}
	var back apply.ChangeSet
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	slices.Reverse(back.Changes)
	res, err := apply.Execute(ctx, e.m, back)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	phase := map[apply.Op]int{apply.OpDestroy: 0, apply.OpSetMIGMode: 1, apply.OpDefineTenant: 2, apply.OpUpdateTenant: 2, apply.OpUndefineTenant: 3, apply.OpCreate: 4}
	for i := 1; i < len(res.Done); i++ {
		a, b := res.Done[i-1], res.Done[i]
		if phase[a.Op] > phase[b.Op] || a.Op == apply.OpCreate && b.Op == apply.OpCreate && a.VRAMBytes < b.VRAMBytes {
			t.Fatalf("done out of order: %s before %s", a, b)
		}
	}
	if res.Done[0].Op != apply.OpDestroy || len(res.Done) != len(cs.Changes) {
		t.Fatalf("done %v", res.Done)
	}
	again, err := apply.Diff(ctx, e.m, d)
	if err != nil || !again.Empty() {
		t.Fatalf("second diff %v:\n%s", err, again)
	}
}

func TestExecuteEdgeCases(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.tenant("acme")
	gone := e.create("acme", "L4-4Q", sim.DefaultL4)
	cs, err := apply.Diff(ctx, e.m, mustParse(t, "vgpu-device-manager.yaml", "A10-4Q"))
	if err != nil {
		t.Fatal(err)
	}
	empty, err := apply.Execute(ctx, e.m, apply.ChangeSet{})
	if err != nil || len(empty.Done) != 0 {
		t.Fatalf("empty change set: %+v, %v", empty, err)
	}
	cases := []struct {
		name    string
		ctx     func() context.Context
		changes []apply.Change
		want    error
		done    int
	}{
		{"destroy of an instance already gone", nil, []apply.Change{{Op: apply.OpDestroy, Instance: gone.UUID}, {Op: apply.OpDestroy, Instance: gone.UUID}}, nil, 2},
		{"tenant without settings", nil, []apply.Change{{Op: apply.OpDefineTenant, Tenant: "x"}}, manager.ErrInvalidArgument, 0},
		{"unknown op", nil, []apply.Change{{Op: "resize"}}, manager.ErrInvalidArgument, 0},
		{"set MIG mode without a mode", nil, []apply.Change{{Op: apply.OpSetMIGMode, GPU: sim.DefaultH100MIG}}, manager.ErrInvalidArgument, 0},
		{"unknown GPU", nil, []apply.Change{{Op: apply.OpCreate, GPU: "0000:ff:00.0", Profile: "L4-4Q", Tenant: "acme"}}, manager.ErrNotFound, 0},
		{"cancelled", func() context.Context { c, cancel := context.WithCancel(ctx); cancel(); return c }, cs.Changes, context.Canceled, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cx := ctx
			if c.ctx != nil {
				cx = c.ctx()
			}
			res, err := apply.Execute(cx, e.m, apply.ChangeSet{Changes: c.changes})
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if len(res.Done) != c.done {
				t.Fatalf("done %d, want %d", len(res.Done), c.done)
			}
		})
	}
	if got := e.layout(); len(got) != 0 {
		t.Fatalf("layout %v", got)
	}
}

// wantedRecorder is the manager, with each create's demand hints kept by
// GPU (the GPUs' creates run side by side).
type wantedRecorder struct {
	*manager.Manager
	mu  sync.Mutex
	got map[string][]map[string]int
}

func (w *wantedRecorder) Create(ctx context.Context, req manager.CreateRequest) (store.Instance, error) {
	w.mu.Lock()
	w.got[req.GPU] = append(w.got[req.GPU], req.Wanted)
	w.mu.Unlock()
	return w.Manager.Create(ctx, req)
}

// Each create tells placement which creates are still to come on its
// GPU, so a time-sliced vGPU does not lock a GPU that a later create
// needs.
func TestExecutePassesDemandToPlacement(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cs, err := apply.Diff(ctx, e.m, mustParse(t, "vgpud.yaml", ""))
	if err != nil {
		t.Fatal(err)
	}
	rec := &wantedRecorder{Manager: e.m, got: map[string][]map[string]int{}}
	res, err := apply.Execute(ctx, rec, cs)
	if err != nil {
		t.Fatal(err)
	}
	creates := map[string][]apply.Change{}
	n := 0
	for _, c := range res.Done {
		if c.Op == apply.OpCreate {
			creates[c.GPUUUID] = append(creates[c.GPUUUID], c)
			n++
		}
	}
	if n < 2 || len(rec.got) != len(creates) {
		t.Fatalf("%d creates done on %d GPUs, recorded on %d", n, len(creates), len(rec.got))
	}
	for g, cs := range creates {
		for i, got := range rec.got[g] {
			want := map[string]int{}
			for _, c := range cs[i+1:] {
				want[c.Profile]++
			}
			if len(want) == 0 {
				want = nil
			}
			if !maps.Equal(got, want) {
				t.Fatalf("GPU %s create %d (%s): wanted %v, want %v", g, i, cs[i].Profile, got, want)
			}
		}
	}
}
