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
// generation: only the next periodic pass sees it), Placement offers none
// of the room it held, which the host cannot carve. Kept up for it, the
// totals would offer that room to the next claim, stale too. A new create
// of the consumer ends that.
func TestStaleRefusalOffersNoRoomOnceDeleted(t *testing.T) {
	st := refuseStale(t, true)
	st.deleted(t)
	if err := claim(st.c, uuid.NewString(), st.ts, st.whole); !errors.Is(err, placementapi.ErrCapacity) {
		inv, _, _ := st.c.Inventories(context.Background(), st.ts)
		t.Fatalf("a whole-GPU claim after the stale one was deleted = %v, want ErrCapacity (the host has a vGPU there); inventories %v", err, inv)
	}

	// The vGPU gone, the scheduler places the consumer there again.
	ctx := context.Background()
	if err := st.a.h.Manager.Destroy(ctx, st.vgpu, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	st.a.pass(t)
	if err := claim(st.c, st.consumer, st.ts, st.whole); err != nil {
		t.Fatal(err)
	}
	rec, err := st.a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: st.consumer})
	if err != nil || rec.GPUPCI != sim.DefaultH100TS {
		t.Fatalf("a new create of the refused consumer on its GPU, free again = %+v, %v", rec, err)
	}
	st.a.s.mu.Lock()
	_, marked := st.a.s.refused[st.consumer]
	st.a.s.mu.Unlock()
	if marked {
		t.Error("the consumer is still marked refused after a new create of it")
	}
	st.a.pass(t)
	converged(t, st.c, st.a)
}

// TestStaleRefusalLeavesTheHostsWrites: while the host has an allocation
// of its own to write on the GPU (a vGPU carved while the fleet was not
// told), the refused allocation still counts in the totals, so that
// Placement takes that write; the pass after it lowers them.
func TestStaleRefusalLeavesTheHostsWrites(t *testing.T) {
	st := refuseStale(t, false)
	st.a.pass(t) // writes the vGPU's allocation beside the refused one
	st.a.pass(t) // reads the provider it moved: the refused one left out
	st.deleted(t)
	if err := claim(st.c, uuid.NewString(), st.ts, st.whole); !errors.Is(err, placementapi.ErrCapacity) {
		t.Fatalf("a whole-GPU claim after the stale one was deleted = %v, want ErrCapacity", err)
	}
	converged(t, st.c, st.a)
}

// staleRefused is a whole-GPU claim on the time-sliced H100 that the host
// refused as stale: it carved a vGPU there without the fleet.
type staleRefused struct {
	a              *host
	c              *placementapi.Client
	ts             string
	whole          map[string]int
	consumer, vgpu string
}

// refuseStale makes a staleRefused; published, a pass publishes the vGPU
// (the claim held beside it) before the refusal.
func refuseStale(t *testing.T, published bool) staleRefused {
	t.Helper()
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosts", srv.URL(), nil, Config{})
	a.pass(t)
	st := staleRefused{a: a, c: c, ts: GPUProviderUUID(a.s.top(), sim.DefaultH100TS),
		whole: map[string]int{classWhole: 1, GPUClass: gpuUnitsOf(store.KindPassthrough)}, consumer: uuid.NewString()}
	if err := claim(c, st.consumer, st.ts, st.whole); err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(nil)
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "H100XM-20C", GPU: sim.DefaultH100TS})
	if err != nil {
		t.Fatal(err)
	}
	st.vgpu = rec.UUID
	a.h.Manager.SetFleet(a.s)
	if published {
		a.pass(t)
	}
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: st.consumer}); !errors.Is(err, manager.ErrStaleClaim) {
		t.Fatalf("adopting the whole GPU the host carved a vGPU on = %v, want StaleClaim", err)
	}
	return st
}

// deleted deletes the refused allocation, as its scheduler does.
func (st staleRefused) deleted(t *testing.T) {
	t.Helper()
	if err := st.c.PutConsumer(context.Background(), st.consumer, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
}
