package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
)

// TestStaleClaimNamed: a scheduler's claim the host no longer has room
// for is refused as StaleClaim (its own error name, so a scheduler tells
// "reschedule" from other refusals without reading prose), and the
// message names this host's GPU (PCI address and model) and what took the
// room, not the catalog's models. A gpu option that disagrees with the
// consumer's allocation is refused by name, nothing carved.
func TestStaleClaimNamed(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosts", srv.URL(), nil, Config{})
	a.pass(t)
	ts := GPUProviderUUID(a.s.top(), sim.DefaultH100TS)
	model := simhost.GPU(t, a.h.Manager, sim.DefaultH100TS).Model

	stale := uuid.NewString()
	if err := claim(c, stale, ts, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	// Carved meanwhile without the fleet (Placement's view is then stale).
	a.h.Manager.SetFleet(nil)
	took, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-20C", GPU: sim.DefaultH100TS})
	if err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(a.s)
	_, err = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: stale})
	if !errors.Is(err, manager.ErrStaleClaim) || manager.Name(err) != "StaleClaim" {
		t.Fatalf("stale whole-GPU adopt = %v (%s), want StaleClaim", err, manager.Name(err))
	}
	msg := manager.Message(err)
	t.Logf("stale claim: %s", msg)
	for _, want := range []string{sim.DefaultH100TS, model, "H100XM-20C", took.UUID} {
		if !strings.Contains(msg, want) {
			t.Errorf("stale message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "A100-SXM4-40GB") || strings.Contains(msg, "T4-16GB") {
		t.Errorf("stale message %q lists the catalog's models", msg)
	}

	// --gpu against the consumer's allocation: refused by name.
	id := uuid.NewString()
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	if err := claim(c, id, l4, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	before := len(mustInstances(t, a))
	_, err = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: id, GPU: sim.DefaultH100MIG})
	if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(manager.Message(err), sim.DefaultL4) || !strings.Contains(manager.Message(err), sim.DefaultH100MIG) {
		t.Fatalf("placement consumer on the L4 with --gpu %s = %v; want InvalidArgument naming both", sim.DefaultH100MIG, err)
	}
	if n := len(mustInstances(t, a)); n != before {
		t.Fatalf("the refused create left %d instances, was %d", n, before)
	}
	// Both agreeing: created there.
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: id, GPU: sim.DefaultL4})
	if err != nil || rec.GPUPCI != sim.DefaultL4 {
		t.Fatalf("placement consumer with its own GPU = %+v, %v", rec, err)
	}
}

// TestStaleRefusalOffersNoRoomOnceDeleted: an allocation the host refused
// as stale keeps no total up. The refusal publishes the GPU's totals
// without it, so once the scheduler deletes it (a DELETE moves no
// generation: only the next periodic pass sees it), Placement
// offers none of the room it held, which the host cannot carve. Kept up
// for it, the totals would offer that room to the next claim, stale too.
func TestStaleRefusalOffersNoRoomOnceDeleted(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosts", srv.URL(), nil, Config{})
	a.pass(t)
	ts := GPUProviderUUID(a.s.top(), sim.DefaultH100TS)
	whole := map[string]int{classWhole: 1, GPUClass: gpuUnitsOf(store.KindPassthrough)}

	stale := uuid.NewString()
	if err := claim(c, stale, ts, whole); err != nil {
		t.Fatal(err)
	}
	// Carved meanwhile without the fleet: Placement's totals say the GPU
	// is free, the host has a vGPU on it.
	a.h.Manager.SetFleet(nil)
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-20C", GPU: sim.DefaultH100TS}); err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(a.s)
	// A pass publishes the vGPU, the claim held beside it: its classes'
	// totals are what is held, nothing free.
	a.pass(t)
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: stale}); !errors.Is(err, manager.ErrStaleClaim) {
		t.Fatalf("adopting the whole GPU the host carved a vGPU on = %v, want StaleClaim", err)
	}
	// The scheduler deletes its refused claim and another asks the same.
	if err := c.PutConsumer(ctx, stale, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	if err := claim(c, uuid.NewString(), ts, whole); !errors.Is(err, placementapi.ErrCapacity) {
		inv, _, _ := c.Inventories(ctx, ts)
		t.Fatalf("a whole-GPU claim after the stale one was deleted = %v, want ErrCapacity (the host has a vGPU there); inventories %v", err, inv)
	}

	// A new create of the consumer ends the refusal: its claim counts
	// again (a pass keeps the totals up for it until it is carved).
	if err := claim(c, stale, GPUProviderUUID(a.s.top(), sim.DefaultL4), map[string]int{classWhole: 1, GPUClass: gpuUnitsOf(store.KindPassthrough)}); err != nil {
		t.Fatal(err)
	}
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: stale})
	if err != nil || rec.GPUPCI != sim.DefaultL4 {
		t.Fatalf("a new create of the refused consumer on a free GPU = %+v, %v", rec, err)
	}
	a.pass(t)
	converged(t, c, a)
}
