package fleet

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// l4x4Q is what an L4-4Q's claim asks of its L4.
var l4x4Q = map[string]int{"CUSTOM_VGPUD_L4_4Q": 1, "CUSTOM_VGPUD_GPU": 1, "CUSTOM_VGPUD_VGPU_FB_MIB": 4096}

// claim writes a scheduler's allocation for consumer on provider.
func claim(c *placementapi.Client, consumer, provider string, res map[string]int) error {
	return c.PutConsumer(context.Background(), consumer, placementapi.Consumer{
		Allocations: map[string]placementapi.Allocation{provider: {Resources: res}},
		ProjectID:   "p", UserID: "u", ConsumerType: "INSTANCE"})
}

func TestFleet(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	if v, err := c.CheckVersion(ctx); err != nil {
		t.Fatalf("CheckVersion = %s, %v", v, err)
	}
	a := startHost(t, "hosta", srv.URL(), nil, Config{Inventories: InventoriesExact})
	a.pass(t)
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)

	t.Run("tree", func(t *testing.T) {
		tree, err := c.Tree(ctx, a.s.top())
		if err != nil || len(tree) != 5 {
			t.Fatalf("tree = %v, %v; want root and 4 GPUs", tree, err)
		}
		p, err := c.Provider(ctx, mig)
		if err != nil || p.Name != "hosta_pci_0000_41_00_0" || p.ParentUUID != a.s.top() {
			t.Fatalf("MIG provider = %+v, %v", p, err)
		}
		inv, _, _ := c.Inventories(ctx, mig)
		if inv[SliceClass].Total != 8 || inv["CUSTOM_VGPUD_MIG_1G_10GB"].Total != 7 || inv["CUSTOM_VGPUD_MIG_3G_40GB"].Total != 2 {
			t.Fatalf("MIG inventories = %v", inv)
		}
		traits, _, _ := c.Traits(ctx, mig)
		if !contains(traits, TraitManaged) || !contains(traits, "CUSTOM_VGPUD_FLOW_MIG") || !contains(traits, "CUSTOM_VGPUD_MODEL_H100_SXM5_80GB") {
			t.Fatalf("traits = %v", traits)
		}
		// A restart derives the same UUIDs: a second syncer's pass changes nothing.
		s2, _ := New(Config{Host: "hosta", Inventories: InventoriesExact}, c, a.h.Manager, quietLog(t), nil)
		if err := s2.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		if tree2, _ := c.Tree(ctx, a.s.top()); len(tree2) != 5 {
			t.Fatalf("after a restart the tree has %d providers", len(tree2))
		}
	})

	t.Run("status names differences", func(t *testing.T) {
		st, err := a.s.Status(ctx)
		if err != nil || len(st.Differences) != 0 || len(st.Providers) != 4 || st.LastError != "" || st.LastSync.IsZero() {
			t.Fatalf("status after a pass = %+v, %v; want 4 providers, no difference", st, err)
		}
		// Three ways Placement can drift: an allocation of no instance, an
		// inventory changed behind vgpud's back, a managed provider of no GPU.
		stray := uuid.NewString()
		if err := claim(c, stray, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
			t.Fatal(err)
		}
		inv, gen, _ := c.Inventories(ctx, mig)
		one := inv["CUSTOM_VGPUD_MIG_3G_40GB"]
		one.Total = 1
		inv["CUSTOM_VGPUD_MIG_3G_40GB"] = one
		if _, err := c.SetInventories(ctx, mig, gen, inv); err != nil {
			t.Fatal(err)
		}
		ghost := uuid.NewString()
		if err := c.CreateProvider(ctx, ghost, "hosta_pci_0000_ff_00_0", a.s.top()); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SetTraits(ctx, ghost, 0, []string{TraitManaged}); err != nil {
			t.Fatal(err)
		}
		st, err = a.s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]string{}
		for _, d := range st.Differences {
			kinds[d.Kind] = d.Subject
		}
		if len(st.Differences) != 3 || kinds[DiffAllocationStale] != stray || kinds[DiffInventoryDiffers] != "CUSTOM_VGPUD_MIG_3G_40GB" || kinds[DiffProviderStale] != ghost {
			t.Fatalf("differences = %+v", st.Differences)
		}
		// Status only reads: a pass repairs (the stray claim waits out Grace).
		if err := c.PutConsumer(ctx, stray, placementapi.Consumer{}); err != nil {
			t.Fatal(err)
		}
		a.pass(t)
		if st, err = a.s.Status(ctx); err != nil || len(st.Differences) != 0 {
			t.Fatalf("after a pass: %+v, %v", st.Differences, err)
		}
	})

	t.Run("slice class refuses seven 1g and two 3g", func(t *testing.T) {
		var ids []string
		for i := 0; i < 7; i++ {
			id := uuid.NewString()
			if err := claim(c, id, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
				t.Fatalf("1g #%d: %v", i, err)
			}
			ids = append(ids, id)
		}
		err := claim(c, uuid.NewString(), mig, map[string]int{"CUSTOM_VGPUD_MIG_3G_40GB": 1, SliceClass: 4})
		if !errors.Is(err, placementapi.ErrCapacity) {
			t.Fatalf("3g after seven 1g = %v, want ErrCapacity", err)
		}
		for _, id := range ids {
			if err := c.PutConsumer(ctx, id, placementapi.Consumer{}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("framebuffer class refuses what the GPU cannot hold", func(t *testing.T) {
		ts := GPUProviderUUID(a.s.top(), sim.DefaultH100TS)
		if err := a.h.Manager.SetHeterogeneous(ctx, sim.DefaultH100TS, true); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = a.h.Manager.SetHeterogeneous(ctx, sim.DefaultH100TS, false); a.pass(t) }()
		a.pass(t)
		inv, _, _ := c.Inventories(ctx, ts)
		fb := inv[FramebufferClass].Total
		var p gpuProvider
		for _, q := range a.s.desired(mustView(t, a)) {
			if q.uuid == ts {
				p = q
			}
		}
		big, small := "", ""
		for name, fc := range p.classes {
			if big == "" || fc.FramebufferMiB > p.classes[big].FramebufferMiB {
				big = name
			}
			if small == "" || fc.FramebufferMiB < p.classes[small].FramebufferMiB {
				small = name
			}
		}
		if fb == 0 || big == small || p.classes[small].FramebufferMiB == 0 {
			t.Fatalf("heterogeneous GPU inventories = %v", inv)
		}
		// The biggest type fills the GPU; then the smallest type, whose
		// own class still has room, must be refused by the shared class.
		var ids []string
		used := 0
		refused := false
		try := func(name string, n int) {
			for i := 0; i < n && !refused; i++ {
				id := uuid.NewString()
				amt := int(p.classes[name].FramebufferMiB)
				err := claim(c, id, ts, map[string]int{name: 1, FramebufferClass: amt})
				if errors.Is(err, placementapi.ErrCapacity) {
					refused = used+amt > fb
					if !refused {
						t.Fatalf("%s refused with %d of %d MiB used: %v", name, used, fb, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				used += amt
				ids = append(ids, id)
			}
		}
		try(big, inv[big].Total)
		try(small, inv[small].Total)
		if !refused || used > fb {
			t.Fatalf("no refusal: %d of %d MiB claimed", used, fb)
		}
		for _, id := range ids {
			if err := c.PutConsumer(ctx, id, placementapi.Consumer{}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("local create claims first, destroy removes", func(t *testing.T) {
		rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb"})
		if err != nil {
			t.Fatal(err)
		}
		cons, err := c.Consumer(ctx, rec.UUID)
		if err != nil || cons.Allocations[mig].Resources[SliceClass] != 4 {
			t.Fatalf("allocation right after Create = %+v, %v", cons, err)
		}
		converged(t, c, a)
		if err := a.h.Manager.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
			t.Fatal(err)
		}
		converged(t, c, a)
		if cons, _ := c.Consumer(ctx, rec.UUID); len(cons.Allocations) != 0 {
			t.Fatalf("allocation after destroy: %+v", cons)
		}
	})

	t.Run("adopt a scheduler's allocation", func(t *testing.T) {
		id := schedulerClaims(t, c, "CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4")
		rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: id})
		if err != nil || rec.UUID != id || rec.GPUPCI != sim.DefaultH100MIG {
			t.Fatalf("adopting create = %+v, %v", rec, err)
		}
		converged(t, c, a)
		// The other 3g slot: taken locally with no fleet, a scheduler's
		// claim written before is stale.
		stale := uuid.NewString()
		if err := claim(c, stale, mig, map[string]int{"CUSTOM_VGPUD_MIG_3G_40GB": 1, SliceClass: 4}); err != nil {
			t.Fatal(err)
		}
		a.h.Manager.SetFleet(nil)
		if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: sim.DefaultH100MIG}); err != nil {
			t.Fatal(err)
		}
		a.h.Manager.SetFleet(a.s)
		before := len(a.h.Manager.Inventory().GPUs[0].MIG.Instances)
		_, err = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: stale})
		if !errors.Is(err, manager.ErrNoCapacity) {
			t.Fatalf("stale adopt = %v, want NoCapacity", err)
		}
		if after := len(a.h.Manager.Inventory().GPUs[0].MIG.Instances); after != before {
			t.Fatalf("a refused adopt changed the host: %d GIs, was %d", after, before)
		}
		// The syncer removes the stale allocation once its grace is over
		// (the scheduler deletes it itself in practice).
		if err := c.PutConsumer(ctx, stale, placementapi.Consumer{}); err != nil {
			t.Fatal(err)
		}
		converged(t, c, a)
	})

	t.Run("foreign and malformed allocations are refused", func(t *testing.T) {
		b := startHost(t, "hostb", srv.URL(), nil, Config{})
		b.pass(t)
		other := GPUProviderUUID(b.s.top(), sim.DefaultH100MIG)
		id := uuid.NewString()
		if err := claim(c, id, other, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
			t.Fatal(err)
		}
		_, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: id})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("foreign adopt = %v, want InvalidArgument", err)
		}
		// The right host, another profile.
		_, err = b.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", PlacementConsumer: id})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("adopt for another class = %v, want InvalidArgument", err)
		}
		_, err = b.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: uuid.NewString()})
		if !errors.Is(err, manager.ErrNotFound) {
			t.Fatalf("adopt without an allocation = %v, want NotFound", err)
		}
		_, err = b.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: "not-a-uuid"})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("adopt with a bad UUID = %v, want InvalidArgument", err)
		}
		b.h.Manager.SetFleet(nil)
		_, err = b.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: id})
		b.h.Manager.SetFleet(b.s)
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("adopt on a host without Placement = %v, want InvalidArgument", err)
		}
		if n := len(mustInstances(t, b)); n != 0 {
			t.Fatalf("refused adopts left %d instances", n)
		}
		rec, err := b.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: id})
		if err != nil || rec.UUID != id {
			t.Fatalf("adopt on the right host = %+v, %v", rec, err)
		}
		converged(t, c, a, b)
	})

	t.Run("orphans go after the grace", func(t *testing.T) {
		a.s.cfg.Grace = 50 * time.Millisecond
		defer func() { a.s.cfg.Grace = time.Hour }()
		id := uuid.NewString()
		if err := claim(c, id, GPUProviderUUID(a.s.top(), sim.DefaultL4), map[string]int{"CUSTOM_VGPUD_L4_4Q": 1}); err != nil {
			t.Fatal(err)
		}
		a.pass(t)
		if cons, _ := c.Consumer(ctx, id); len(cons.Allocations) == 0 {
			t.Fatal("orphan removed before its grace")
		}
		time.Sleep(60 * time.Millisecond)
		converged(t, c, a)
		if cons, _ := c.Consumer(ctx, id); len(cons.Allocations) != 0 {
			t.Fatal("orphan kept after its grace")
		}
	})

	t.Run("placement down, then wiped", func(t *testing.T) {
		srv.Stop()
		start := time.Now()
		if err := a.s.Pass(ctx); !errors.Is(err, placementapi.ErrUnreachable) {
			t.Fatalf("pass with Placement down = %v", err)
		}
		var made []string
		for i := 0; i < 3; i++ {
			rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q"})
			if err != nil {
				t.Fatalf("local create with Placement down: %v", err)
			}
			made = append(made, rec.UUID)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("local creates with Placement down took %s", d)
		}
		if err := srv.Run(); err != nil {
			t.Fatal(err)
		}
		converged(t, c, a)
		if err := srv.Wipe(); err != nil {
			t.Fatal(err)
		}
		converged(t, c, a)
		for _, id := range made {
			if cons, err := c.Consumer(ctx, id); err != nil || len(cons.Allocations) != 1 {
				t.Fatalf("allocation of %s after the wipe: %+v, %v", id, cons, err)
			}
		}
	})
	_ = fmt.Sprint
}

func mustView(t *testing.T, h *host) []manager.FleetGPU {
	t.Helper()
	v, err := h.h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	return v
}
