package manager_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// driftEvents drains the HostDrift events a subscription holds now.
func driftEvents(ch <-chan manager.Event) []manager.Event {
	var out []manager.Event
	for {
		select {
		case e := <-ch:
			if e.Kind == manager.EventDrift {
				out = append(out, e)
			}
		default:
			return out
		}
	}
}

// TestCheckDriftRepairsVanishedInstances: a reboot behind the daemon's back
// and a GPU instance destroyed by hand are found by one periodic check,
// repaired by its reconcile (re-created at their placement) and announced
// one event per instance; a second check finds nothing.
func TestCheckDriftRepairsVanishedInstances(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	mig := e.mustCreate("acme", "3g.40gb", sim.DefaultH100MIG)
	vf := e.mustCreate("acme", "L4-4Q", "")
	md := e.mustCreate("acme", "A10-4Q", "")
	before := e.summary()
	events, stop := e.m.Subscribe()
	defer stop()

	if rep, err := e.m.CheckDrift(ctx); err != nil || len(rep.Missing) != 0 || rep.Reconcile != nil {
		t.Fatalf("check on an unchanged host: %+v, %v", rep, err)
	}
	if ev := driftEvents(events); len(ev) != 0 {
		t.Fatalf("events on an unchanged host: %+v", ev)
	}

	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	rep, err := e.m.CheckDrift(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{mig.UUID, vf.UUID, md.UUID}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(rep.Missing))
	if !slices.Equal(got, want) || rep.Reconcile == nil || len(rep.Reconcile.Recreated) != 3 {
		t.Fatalf("after a reboot: missing %v (want %v), reconcile %+v", got, want, rep.Reconcile)
	}
	if after := e.summary(); after != before {
		t.Fatalf("host after the repair:\n%s\nbefore:\n%s", after, before)
	}
	ev := driftEvents(events)
	if len(ev) != 3 {
		t.Fatalf("drift events %+v, want one per instance", ev)
	}
	for _, x := range ev {
		if x.Op != manager.DriftMissing || !strings.Contains(x.Detail, "re-created") {
			t.Fatalf("event %+v", x)
		}
	}

	// nvidia-smi mig -dci; -dgi by hand.
	r, err := e.m.Instance(mig.UUID)
	if err != nil {
		t.Fatal(err)
	}
	destroyGI(t, e, sim.DefaultH100MIG, r.GIID)
	rep, err = e.m.CheckDrift(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Missing, []string{mig.UUID}) || rep.Reconcile == nil || !slices.Equal(rep.Reconcile.Recreated, []string{mig.UUID}) {
		t.Fatalf("after a hand-made DestroyGpuInstance: %+v, reconcile %+v", rep, rep.Reconcile)
	}
	if got, _ := e.m.Instance(mig.UUID); got.State != store.StateReady || got.GIStart != mig.GIStart {
		t.Fatalf("record %+v, want ready at start %d", got, mig.GIStart)
	}
	if ev := driftEvents(events); len(ev) != 1 || ev[0].ID != mig.UUID {
		t.Fatalf("drift events %+v", ev)
	}
	if rep, err := e.m.CheckDrift(ctx); err != nil || len(rep.Missing) != 0 {
		t.Fatalf("check after the repair: %+v, %v", rep, err)
	}
}

// TestCheckDriftReportsForeignOnce: a GPU instance made behind vgpud's back
// is reported foreign by the next check, announced once, left alone.
func TestCheckDriftReportsForeignOnce(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	events, stop := e.m.Subscribe()
	defer stop()
	lib := e.sim.NVML()
	lib.Init()
	d, _ := lib.DeviceGetHandleByPciBusId(sim.DefaultH100MIG)
	info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, r := d.CreateGpuInstance(&info); r != nvml.SUCCESS {
		t.Fatalf("foreign GI: %v", r)
	}
	for i := range 2 {
		rep, err := e.m.CheckDrift(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Foreign) != 1 || rep.Foreign[0].Kind != manager.ForeignGPUInstance || rep.Reconcile != nil {
			t.Fatalf("check %d: %+v", i, rep)
		}
		ev := driftEvents(events)
		if wantN := 1 - i; len(ev) != wantN {
			t.Fatalf("check %d: drift events %+v, want %d", i, ev, wantN)
		}
		if i == 0 && (ev[0].Op != manager.DriftForeign || !strings.Contains(ev[0].Detail, "gpu-instance")) {
			t.Fatalf("event %+v", ev[0])
		}
	}
	if !strings.Contains(e.summary(), "gi") {
		t.Fatalf("foreign GI touched:\n%s", e.summary())
	}
}

// destroyGI destroys a GPU instance and its compute instances through the
// simulated driver, as an administrator would.
func destroyGI(t *testing.T, e *env, pci string, id int) {
	t.Helper()
	lib := e.sim.NVML()
	lib.Init()
	d, r := lib.DeviceGetHandleByPciBusId(pci)
	if r != nvml.SUCCESS {
		t.Fatal(r)
	}
	gi, r := d.GetGpuInstanceById(id)
	if r != nvml.SUCCESS {
		t.Fatalf("GPU instance %d: %v", id, r)
	}
	for p := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, r := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if r != nvml.SUCCESS {
			continue
		}
		cis, _ := gi.GetComputeInstances(&info)
		for _, ci := range cis {
			if r := ci.Destroy(); r != nvml.SUCCESS {
				t.Fatal(r)
			}
		}
	}
	if r := gi.Destroy(); r != nvml.SUCCESS {
		t.Fatal(r)
	}
}

// Instances failed because their GPU's SR-IOV VFs vanished (sriov-manage
// -d behind vgpud's back) come back by themselves once the VFs return:
// the periodic check retries failed instances whose GPU changed, and only
// those (a check that finds the GPU as it was leaves them, so a lasting
// failure is not retried at every interval).
func TestCheckDriftBringsBackInstancesWhenVFsReturn(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	var ids []string
	for range 6 {
		ids = append(ids, e.mustCreate("acme", "L4-2Q", sim.DefaultL4).UUID)
	}
	slices.Sort(ids)
	before := e.summary()
	if _, err := e.m.CheckDrift(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.SetVFs(sim.DefaultL4, false); err != nil {
		t.Fatal(err)
	}
	rep, err := e.m.CheckDrift(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(rep.Missing)); !slices.Equal(got, ids) || rep.Reconcile == nil || len(rep.Reconcile.Failed) != 6 {
		t.Fatalf("VFs off: missing %v, reconcile %+v; want all six missing and failed", got, rep.Reconcile)
	}
	// Nothing changed: no retry.
	if rep, err := e.m.CheckDrift(ctx); err != nil || rep.Reconcile != nil || len(rep.Retried) != 0 {
		t.Fatalf("check with the VFs still off: %+v, %v; want no reconcile", rep, err)
	}
	if err := e.sim.SetVFs(sim.DefaultL4, true); err != nil {
		t.Fatal(err)
	}
	rep, err = e.m.CheckDrift(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(rep.Retried)); !slices.Equal(got, ids) || rep.Reconcile == nil || len(rep.Reconcile.Recreated) != 6 {
		t.Fatalf("VFs back: retried %v, reconcile %+v; want all six re-created", got, rep.Reconcile)
	}
	for _, id := range ids {
		if r, err := e.m.Instance(id); err != nil || r.State != store.StateReady {
			t.Fatalf("instance %s after the VFs came back: %+v, %v", id, r, err)
		}
	}
	if after := e.summary(); after != before {
		t.Fatalf("host after the VFs came back:\n%s\nbefore:\n%s", after, before)
	}
	if rep, err := e.m.CheckDrift(ctx); err != nil || rep.Reconcile != nil || len(rep.Missing)+len(rep.Retried) != 0 {
		t.Fatalf("check after the repair: %+v, %v", rep, err)
	}
}
