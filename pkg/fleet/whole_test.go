package fleet

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

const (
	classXM3     = "CUSTOM_VGPUD_H100XM_3_40C"
	classWhole   = "CUSTOM_VGPUD_PASSTHROUGH"
	profileWhole = manager.ProfilePassthrough
)

// TestFleetMIGBackedAndWholeGPU: MIG-backed vGPU types and the whole GPU
// have classes of their own, so a scheduler can ask Placement for them;
// a MIG-backed vGPU consumes its GPU instance's slices, a whole GPU every
// slice of a MIG GPU (written by vgpud when the scheduler asked only the
// whole-GPU class), and Placement itself refuses what the host cannot hold.
func TestFleetMIGBackedAndWholeGPU(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostw", srv.URL(), nil, Config{Inventories: InventoriesExact})
	a.pass(t)
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	ts := GPUProviderUUID(a.s.top(), sim.DefaultH100TS)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)

	inv, _, _ := c.Inventories(ctx, mig)
	if inv[classXM3].Total != 2 || inv[classWhole].Total != 1 || inv[SliceClass].Total != 8 {
		t.Fatalf("MIG GPU inventories = %v; want %s 2, %s 1", inv, classXM3, classWhole)
	}
	if inv, _, _ := c.Inventories(ctx, l4); inv[classWhole].Total != 1 {
		t.Fatalf("L4 inventories = %v; want %s 1", inv, classWhole)
	}

	// A scheduler asks for a MIG-backed vGPU with its slices.
	q := url.Values{"resources1": {classXM3 + ":1," + SliceClass + ":4"}, "limit": {"5"}}
	cands, err := c.AllocationCandidates(ctx, q.Encode())
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates for %s = %v, %v; want the MIG GPU", classXM3, cands, err)
	}
	adopted := uuid.NewString()
	if err := c.PutConsumer(ctx, adopted, placementapi.Consumer{Allocations: cands[0].Allocations, ProjectID: "p", UserID: "u", ConsumerType: ConsumerType}); err != nil {
		t.Fatal(err)
	}
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-3-40C", PlacementConsumer: adopted})
	if err != nil || rec.UUID != adopted || rec.GPUPCI != sim.DefaultH100MIG {
		t.Fatalf("adopting create of a MIG-backed vGPU = %+v, %v", rec, err)
	}
	// A local create claims the type and its slices before carving; the
	// grid is then full in Placement too.
	local, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-3-40C"})
	if err != nil {
		t.Fatal(err)
	}
	if cons, err := c.Consumer(ctx, local.UUID); err != nil || !sameResources(cons.Allocations[mig].Resources, map[string]int{classXM3: 1, SliceClass: 4, GPUClass: 1}) {
		t.Fatalf("allocation right after a local create = %+v, %v", cons, err)
	}
	if err := claim(c, uuid.NewString(), mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); !errors.Is(err, placementapi.ErrCapacity) {
		t.Fatalf("a 1g claim on a grid two MIG-backed vGPUs fill = %v, want ErrCapacity", err)
	}
	converged(t, c, a)

	// The whole GPU: only GPUs with nothing carved are candidates.
	q = url.Values{"resources1": {classWhole + ":1"}, "limit": {"10"}}
	cands, err = c.AllocationCandidates(ctx, q.Encode())
	if err != nil || len(cands) != 3 {
		t.Fatalf("candidates for a whole GPU = %d, %v; want the three GPUs with nothing carved", len(cands), err)
	}
	for _, cand := range cands {
		if _, ok := cand.Allocations[mig]; ok {
			t.Fatal("a GPU with vGPUs on it is a candidate for a whole GPU")
		}
	}
	whole := uuid.NewString()
	if err := claim(c, whole, l4, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	if rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: whole}); err != nil || rec.GPUPCI != sim.DefaultL4 {
		t.Fatalf("adopting create of a whole L4 = %+v, %v", rec, err)
	}
	converged(t, c, a)

	// A stale whole-GPU claim: something was carved there meanwhile.
	stale := uuid.NewString()
	if err := claim(c, stale, ts, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(nil)
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-20C", GPU: sim.DefaultH100TS}); err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(a.s)
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: stale}); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("stale whole-GPU adopt = %v, want NoCapacity", err)
	}
	if err := c.PutConsumer(ctx, stale, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}

	// The MIG GPU emptied: a whole-GPU claim of the class alone is
	// completed with every slice before carving, so a slice claimed
	// meanwhile makes Placement refuse it.
	for _, id := range []string{adopted, local.UUID} {
		if err := a.h.Manager.Destroy(ctx, id, manager.DestroyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, c, a)
	wrong := uuid.NewString()
	if err := claim(c, wrong, mig, map[string]int{classWhole: 1, SliceClass: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: wrong}); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("whole-GPU adopt holding 3 of 8 slices = %v, want InvalidArgument", err)
	}
	if err := c.PutConsumer(ctx, wrong, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	// A create the admission refuses leaves the scheduler's allocation as
	// it was: the profile is not the allocation's, the tenant unknown.
	whole = uuid.NewString()
	if err := claim(c, whole, mig, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: whole}); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("3g.40gb adopting a whole-GPU allocation = %v, want InvalidArgument", err)
	}
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "nobody", Profile: profileWhole, PlacementConsumer: whole}); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("whole GPU for an unknown tenant = %v, want NotFound", err)
	}
	if cons, _ := c.Consumer(ctx, whole); !sameResources(cons.Allocations[mig].Resources, map[string]int{classWhole: 1}) {
		t.Fatalf("refused creates changed the scheduler's allocation: %+v", cons.Allocations)
	}
	if err := c.PutConsumer(ctx, whole, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	racer := uuid.NewString()
	whole = uuid.NewString()
	if err := claim(c, whole, mig, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	if err := claim(c, racer, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
		t.Fatal(err)
	}
	before := len(mustInstances(t, a))
	_, err = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: whole})
	if !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("whole-GPU adopt with a slice claimed meanwhile = %v, want NoCapacity", err)
	}
	if n := len(mustInstances(t, a)); n != before {
		t.Fatalf("a refused whole-GPU adopt changed the host: %d instances, was %d", n, before)
	}
	if err := c.PutConsumer(ctx, racer, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	if rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: whole}); err != nil || rec.GPUPCI != sim.DefaultH100MIG {
		t.Fatalf("whole-GPU adopt on the emptied MIG GPU = %+v, %v", rec, err)
	}
	if cons, _ := c.Consumer(ctx, whole); !sameResources(cons.Allocations[mig].Resources, map[string]int{classWhole: 1, SliceClass: 8, GPUClass: GPUUnits}) {
		t.Fatalf("whole MIG GPU's allocation = %+v; want the class and all 8 slices", cons.Allocations)
	}
	if err := claim(c, uuid.NewString(), mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); !errors.Is(err, placementapi.ErrCapacity) {
		t.Fatalf("a slice claim on a GPU passed through = %v, want ErrCapacity", err)
	}
	converged(t, c, a)
	for _, g := range mustView(t, a) {
		if g.PCI == sim.DefaultH100MIG && g.State != gpu.StatePassthrough {
			t.Fatalf("MIG GPU state %s after the whole-GPU create", g.State)
		}
	}
}

// TestFleetWholeHeterogeneousGPU: a whole GPU in heterogeneous vGPU mode
// takes all its framebuffer, written into the scheduler's allocation.
func TestFleetWholeHeterogeneousGPU(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostv", srv.URL(), nil, Config{})
	if err := a.h.Manager.SetHeterogeneous(ctx, sim.DefaultH100TS, true); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	ts := GPUProviderUUID(a.s.top(), sim.DefaultH100TS)
	inv, _, _ := c.Inventories(ctx, ts)
	fb := inv[FramebufferClass].Total
	if fb == 0 || inv[classWhole].Total != 1 {
		t.Fatalf("heterogeneous GPU inventories = %v", inv)
	}
	whole := uuid.NewString()
	if err := claim(c, whole, ts, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	if rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: whole}); err != nil || rec.GPUPCI != sim.DefaultH100TS {
		t.Fatalf("whole heterogeneous GPU = %+v, %v", rec, err)
	}
	if cons, _ := c.Consumer(ctx, whole); !sameResources(cons.Allocations[ts].Resources, map[string]int{classWhole: 1, FramebufferClass: fb, GPUClass: GPUUnits}) {
		t.Fatalf("whole heterogeneous GPU's allocation = %+v; want the class and all %d MiB", cons.Allocations, fb)
	}
	converged(t, c, a)
}

// TestFleetDownGPUs: on a failed or a lost GPU what its instances hold
// stays allocatable, the rest is reserved; so after Placement lost its
// database (or before an upgrade had written them) the allocations of the
// instances still recorded there are written again, and the pass does not
// fail. A lost GPU's allocations keep the shape they were written with
// (its discovery no longer knows its modes).
func TestFleetDownGPUs(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostd", srv.URL(), nil, Config{})
	if err := a.h.Manager.SetHeterogeneous(ctx, sim.DefaultH100TS, true); err != nil {
		t.Fatal(err)
	}
	mustCreate := func(profile, pci string) {
		t.Helper()
		if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: pci}); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(profileWhole, sim.DefaultH100MIG)
	mustCreate("H100XM-20C", sim.DefaultH100TS)
	mustCreate("NVIDIA L4-4Q", sim.DefaultL4)
	converged(t, c, a)
	want := a.truth(t)

	for _, g := range a.h.Manager.Inventory().GPUs {
		if g.PCI == sim.DefaultH100TS {
			a.h.Manager.MarkGPUFailed(g.UUID, "XID 48 (double-bit ECC)")
		}
	}
	if err := a.h.Sim.LoseGPU(sim.DefaultH100MIG); err != nil {
		t.Fatal(err)
	}
	if err := a.h.Manager.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, g := range mustView(t, a) {
		states[g.PCI] = string(g.State)
	}
	if states[sim.DefaultH100MIG] != "lost" || states[sim.DefaultH100TS] != "failed" {
		t.Fatalf("GPU states %v; want the MIG H100 lost, the time-sliced one failed", states)
	}
	a.pass(t)
	converged(t, c, a)
	if got := a.truth(t); !sameHolding(got, want) {
		t.Fatalf("allocations changed when their GPUs went down:\nnow %v\nwas %v", got, want)
	}
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	if inv, _, _ := c.Inventories(ctx, mig); inv[SliceClass].Reserved != 0 || inv[SliceClass].Total != 8 {
		t.Fatalf("lost whole GPU's slices = %+v; its allocation holds all 8", inv[SliceClass])
	}
	if err := srv.Wipe(); err != nil {
		t.Fatal(err)
	}
	converged(t, c, a)
	if err := claim(c, uuid.NewString(), GPUProviderUUID(a.s.top(), sim.DefaultH100TS), map[string]int{"CUSTOM_VGPUD_H100XM_20C": 1, FramebufferClass: 20480}); !errors.Is(err, placementapi.ErrCapacity) {
		t.Fatalf("a claim on a failed GPU = %v, want ErrCapacity", err)
	}
}
