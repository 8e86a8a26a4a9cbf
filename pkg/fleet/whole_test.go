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
	a := startHost(t, "hostw", srv.URL(), nil, Config{})
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
	if cons, err := c.Consumer(ctx, local.UUID); err != nil || !sameResources(cons.Allocations[mig].Resources, map[string]int{classXM3: 1, SliceClass: 4}) {
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
	racer := uuid.NewString()
	whole = uuid.NewString()
	if err := claim(c, whole, mig, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	if err := claim(c, racer, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: whole})
	if !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("whole-GPU adopt with a slice claimed meanwhile = %v, want NoCapacity", err)
	}
	if g := a.h.Manager.Inventory().GPUs[0]; len(g.MIG.Instances) != 0 {
		t.Fatalf("a refused whole-GPU adopt changed the host: %+v", g.MIG.Instances)
	}
	if err := c.PutConsumer(ctx, racer, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	if rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: whole}); err != nil || rec.GPUPCI != sim.DefaultH100MIG {
		t.Fatalf("whole-GPU adopt on the emptied MIG GPU = %+v, %v", rec, err)
	}
	if cons, _ := c.Consumer(ctx, whole); !sameResources(cons.Allocations[mig].Resources, map[string]int{classWhole: 1, SliceClass: 8}) {
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
