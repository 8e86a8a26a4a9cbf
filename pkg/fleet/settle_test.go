package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
)

// TestSettleBeforeReturn: a create and a destroy bring their GPU's
// provider up to date before they return, with no pass in between: a
// scheduler's next look at Placement sees the room they took or freed.
func TestSettleBeforeReturn(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosts", srv.URL(), nil, Config{})
	a.pass(t) // no loop runs: only the operations themselves publish now
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	inSync := func(what string) {
		t.Helper()
		for _, p := range a.s.desired(mustView(t, a)) {
			if p.uuid != l4 {
				continue
			}
			inv, _, err := c.Inventories(ctx, l4)
			if err != nil || !sameInventories(inv, p.inv) {
				t.Fatalf("after %s, Placement's L4 inventories = %v (%v); the host's %v", what, inv, err, p.inv)
			}
		}
	}
	octx, outcome := manager.WithPlacementOutcome(ctx)
	rec, err := a.h.Manager.Create(octx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	// The first vGPU locks the L4 to its type: every other type's total
	// falls, and so does the whole GPU's.
	inSync("a create")
	if err := a.h.Manager.Destroy(octx, rec.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := outcome.Behind(); got != "" {
		t.Fatalf("a create and destroy with Placement answering report it behind: %q", got)
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) != 0 {
		t.Fatalf("allocation right after the destroy returned: %+v, %v", cons, err)
	}
	inSync("a destroy")
}

// TestDestroyPublishesBeforeRemoval: a destroy's settle writes the GPU's
// inventories as they stand without the instance before it removes the
// instance's allocation. Removed first, Placement would offer the freed
// room beside carvable totals searched with the instance still carved,
// and could accept a mix the freed slots cannot hold in every order. When
// the removal reaches Placement, the inventories there are already the
// host's after the destroy.
func TestDestroyPublishesBeforeRemoval(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	rec := startRecorder(t, srv.URL())
	a := startHost(t, "hosts", rec.url, nil, Config{})
	h100 := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	var d store.Instance
	for _, name := range []string{"2g.20gb", "1g.10gb", "3g.40gb"} {
		r := mustCreate(t, a.h, name, sim.DefaultH100MIG)
		if name == "2g.20gb" {
			d = r
		}
	}
	// The second pass reads the generation the first one's allocation
	// writes left, and knows the inventories at it.
	a.pass(t)
	a.pass(t)
	var mu sync.Mutex
	var atRemoval map[string]placementapi.Inventory
	rec.mu.Lock()
	rec.before = func(req *http.Request) {
		if req.Method == http.MethodGet || req.URL.Path != "/allocations/"+d.UUID {
			return
		}
		inv, _, err := c.Inventories(ctx, h100)
		if err != nil {
			t.Errorf("read the H100's inventories at the removal: %v", err)
		}
		mu.Lock()
		atRemoval = inv
		mu.Unlock()
	}
	rec.mu.Unlock()
	before, _, err := c.Inventories(ctx, h100)
	if err != nil {
		t.Fatal(err)
	}
	rec.take()
	destroyUpToDate(t, a, c, d.UUID)
	after, _, err := c.Inventories(ctx, h100)
	if err != nil {
		t.Fatal(err)
	}
	if sameInventories(before, after) {
		t.Fatalf("the destroy of a 2g.20gb changed nothing in the H100's inventories: %v", after)
	}
	destroySettled(t, rec.take(), d.UUID, h100)
	mu.Lock()
	defer mu.Unlock()
	if atRemoval == nil {
		t.Fatal("the destroy's settle did not remove the allocation")
	}
	if !sameInventories(atRemoval, after) {
		t.Fatalf("when the allocation was removed Placement held %v; after the settle %v", atRemoval, after)
	}
	for _, p := range a.s.desired(mustView(t, a)) {
		if p.uuid == h100 && !sameInventories(after, p.inv) {
			t.Fatalf("after the destroy Placement holds %v; the host %v", after, p.inv)
		}
	}
}

// TestDestroyOfRoomNotOffered: the 7g.80gb is the H100's one instance;
// once it is destroyed the carvable totals of the empty H100 hold no
// 7g.80gb class. The destroy's settle publishes before it removes the
// allocation, which still holds that class, and Placement refuses to
// delete a class in use: the settle keeps it, with nothing free, the
// destroy reports nothing behind, and the next pass drops the class.
func TestDestroyOfRoomNotOffered(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hosta", srv.URL(), nil, Config{})
	ctx := context.Background()
	h100 := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	r := mustCreate(t, a.h, "7g.80gb", sim.DefaultH100MIG)
	a.pass(t)
	destroyUpToDate(t, a, c, r.UUID)
	inv, _, err := c.Inventories(ctx, h100)
	if err != nil {
		t.Fatal(err)
	}
	if i, ok := inv["CUSTOM_VGPUD_MIG_7G_80GB"]; ok && i.Total-i.Reserved > 0 {
		t.Fatalf("after the destroy Placement offers a 7g.80gb on the empty H100: %+v", i)
	}
	a.pass(t)
	if inv, _, err = c.Inventories(ctx, h100); err != nil {
		t.Fatal(err)
	}
	if _, ok := inv["CUSTOM_VGPUD_MIG_7G_80GB"]; ok {
		t.Fatalf("the pass after the destroy keeps the 7g.80gb class: %v", inv)
	}
	converged(t, c, a)
}

// TestLocalCreateOfRoomNotOfferedBesideAClaim: a local create of a
// profile fleet.offer leaves out, on an H100 where a scheduler's claim
// is still in flight. The claim's write counts the new instance as the
// host's while the carvable totals are searched with the claim in
// flight; the create is carved, reports nothing behind, and both
// allocations stand.
func TestLocalCreateOfRoomNotOfferedBesideAClaim(t *testing.T) {
	srv, c := startPlacement(t)
	offer := map[string][]string{"H100-SXM5-80GB": {"3g.40gb", "1g.10gb"}}
	a := startHost(t, "hosta", srv.URL(), nil, Config{Offer: offer})
	a.pass(t)
	ctx := context.Background()
	h100 := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	claim := schedulerClaims(t, c, "CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_GPU:1,CUSTOM_VGPUD_MIG_SLICE:4")
	octx, outcome := manager.WithPlacementOutcome(ctx)
	rec, err := a.h.Manager.Create(octx, manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: sim.DefaultH100MIG})
	if err != nil {
		t.Fatalf("a local 2g.20gb (not offered) beside a scheduler's 3g.40gb in flight: %v", err)
	}
	if got := outcome.Behind(); got != "" {
		t.Fatalf("the create reports Placement behind: %q", got)
	}
	for _, id := range []string{claim, rec.UUID} {
		if cons, err := c.Consumer(ctx, id); err != nil || len(cons.Allocations[h100].Resources) == 0 {
			t.Fatalf("allocation of %s on the H100: %+v, %v", id, cons.Allocations, err)
		}
	}
}

// TestLocalCreateOfRoomNotOffered: carvable inventories hold back the
// room of a 7g.80gb on an empty H100, so Placement has no such class
// there and a plain claim would be refused for want of it. The claim
// first makes the GPU's inventories hold it, so that no scheduler can
// take its slices before the carve; the create reports nothing behind and
// returns with its allocation written and the class's total what it
// holds.
func TestLocalCreateOfRoomNotOffered(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hosta", srv.URL(), nil, Config{})
	a.pass(t)
	ctx := context.Background()
	h100 := GPUProviderUUID(RootUUID("hosta"), sim.DefaultH100MIG)
	inv, _, err := c.Inventories(ctx, h100)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := inv["CUSTOM_VGPUD_MIG_7G_80GB"]; ok {
		t.Fatalf("the empty H100 offers a 7g.80gb with carvable inventories: %v", inv)
	}
	// The claim alone, before any carve: a scheduler's 1g.10gb on the
	// same GPU is refused by Placement itself.
	gpuUUID := ""
	for _, g := range a.h.Manager.Inventory().GPUs {
		if g.PCI == sim.DefaultH100MIG {
			gpuUUID = g.UUID
		}
	}
	held := uuid.NewString()
	if err := a.s.Claim(ctx, manager.FleetClaim{Instance: held, GPU: gpuUUID, Profile: "7g.80gb", Kind: store.KindMIG}); err != nil {
		t.Fatalf("claim of a 7g.80gb not offered: %v", err)
	}
	err = c.PutConsumer(ctx, uuid.NewString(), placementapi.Consumer{ProjectID: "p", UserID: "u", ConsumerType: "INSTANCE",
		Allocations: map[string]placementapi.Allocation{h100: {Resources: map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1, GPUClass: 1}}}})
	if !errors.Is(err, placementapi.ErrCapacity) {
		t.Fatalf("a scheduler's 1g.10gb beside a held 7g.80gb claim: %v; want a capacity refusal", err)
	}
	a.s.Unclaim(held)
	a.pass(t)
	if inv, _, err = c.Inventories(ctx, h100); err != nil || inv["CUSTOM_VGPUD_MIG_1G_10GB"].Total == 0 {
		t.Fatalf("the H100's inventories after the claim was dropped: %v, %v", inv, err)
	}

	octx, outcome := manager.WithPlacementOutcome(ctx)
	rec, err := a.h.Manager.Create(octx, manager.CreateRequest{Tenant: "acme", Profile: "7g.80gb", GPU: sim.DefaultH100MIG})
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome.Behind(); got != "" {
		t.Fatalf("a local create of room not offered reports Placement behind: %q", got)
	}
	cons, err := c.Consumer(ctx, rec.UUID)
	want := map[string]int{"CUSTOM_VGPUD_MIG_7G_80GB": 1, "CUSTOM_VGPUD_MIG_SLICE": 8, GPUClass: 1}
	if err != nil || !sameResources(cons.Allocations[h100].Resources, want) || len(cons.Allocations) != 1 {
		t.Fatalf("allocation right after the create returned: %+v, %v; want %v on the H100", cons.Allocations, err, want)
	}
	if inv, _, err = c.Inventories(ctx, h100); err != nil || inv["CUSTOM_VGPUD_MIG_7G_80GB"].Total != 1 {
		t.Fatalf("the H100's 7g.80gb inventory after the create: %+v, %v", inv["CUSTOM_VGPUD_MIG_7G_80GB"], err)
	}
}

// refuseOnce stands in front of a real Placement and answers the first
// request that match picks with a 400, as Placement refuses a write it
// cannot take; every other request goes through.
func refuseOnce(t *testing.T, target string, match func(*http.Request) bool) string {
	t.Helper()
	var done atomic.Bool
	return interpose(t, target, func(w http.ResponseWriter, r *http.Request) bool {
		if !match(r) || !done.CompareAndSwap(false, true) {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"errors": [{"status": 400, "title": "Bad Request", "detail": "refused for this test", "code": "placement.undefined_code"}]}`)
		return true
	})
}

// interpose stands in front of target (a real Placement, or a proxy in
// front of it) and passes every request through once answer, given it
// first, has not answered it itself (false).
func interpose(t *testing.T, target string, answer func(http.ResponseWriter, *http.Request) bool) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !answer(w, r) {
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestDestroyPublishesAgainAfterAFailedPublish: a destroy's publish
// before the removal is refused; the removal still goes, and the settle
// publishes again after it, so that the destroy returns with Placement
// up to date and reports nothing behind.
func TestDestroyPublishesAgainAfterAFailedPublish(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	var h100 string
	armed := atomic.Bool{}
	front := refuseOnce(t, srv.URL(), func(r *http.Request) bool {
		return armed.Load() && r.Method == http.MethodPut && r.URL.Path == "/resource_providers/"+h100+"/inventories"
	})
	a := startHost(t, "hosta", front, nil, Config{})
	h100 = GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	d := mustCreate(t, a.h, "2g.20gb", sim.DefaultH100MIG)
	mustCreate(t, a.h, "1g.10gb", sim.DefaultH100MIG)
	a.pass(t)
	armed.Store(true)
	destroyUpToDate(t, a, c, d.UUID)
	inv, _, err := c.Inventories(ctx, h100)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range a.s.desired(mustView(t, a)) {
		if p.uuid == h100 && !sameInventories(inv, p.inv) {
			t.Fatalf("after the destroy Placement holds %v; the host %v", inv, p.inv)
		}
	}
}

// TestPassLeavesSettlingRemoval: the destroy's event marks its
// allocation and starts a pass while the destroy's settle is still
// publishing the GPU's inventories. The pass leaves the allocation to the
// settle: it neither reads the consumer nor removes it, which would offer
// the freed room beside inventories that still counted the instance
// before the settle's publish lands. The settle then publishes and
// removes, and the destroy reports nothing behind.
func TestPassLeavesSettlingRemoval(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	rec := startRecorder(t, srv.URL())
	var h100 string
	var hold atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	front := interpose(t, rec.url, func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPut && r.URL.Path == "/resource_providers/"+h100+"/inventories" && hold.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
		return false
	})
	t.Cleanup(let) // before the front's Close: a held request ends
	a := startHost(t, "hosta", front, nil, Config{})
	h100 = GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	d := mustCreate(t, a.h, "2g.20gb", sim.DefaultH100MIG)
	mustCreate(t, a.h, "1g.10gb", sim.DefaultH100MIG)
	a.pass(t)
	hold.Store(true)
	done := make(chan error, 1)
	octx, outcome := manager.WithPlacementOutcome(ctx)
	go func() { done <- a.h.Manager.Destroy(octx, d.UUID, manager.DestroyOptions{}) }()
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatal("the destroy's settle published nothing")
	}
	a.s.take(manager.Event{Kind: manager.EventInstanceRemoved, ID: d.UUID})
	rec.take()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.s.Pass(pctx); err != nil {
		t.Fatalf("a pass during the settle: %v", err)
	}
	for _, r := range rec.take() {
		if r == "GET /allocations/"+d.UUID || r == "PUT /allocations/"+d.UUID || r == "DELETE /allocations/"+d.UUID {
			t.Fatalf("a pass during the destroy's settle made %s", r)
		}
	}
	let()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := outcome.Behind(); got != "" {
		t.Fatalf("the destroy reports Placement behind: %q", got)
	}
	if cons, err := c.Consumer(ctx, d.UUID); err != nil || len(cons.Allocations) != 0 {
		t.Fatalf("allocation after the destroy returned: %+v, %v", cons.Allocations, err)
	}
	converged(t, c, a)
}

// destroyUpToDate destroys id on a and fails unless the destroy reports
// Placement up to date and returns with its allocation gone.
func destroyUpToDate(t *testing.T, a *host, c *placementapi.Client, id string) {
	t.Helper()
	ctx := context.Background()
	octx, outcome := manager.WithPlacementOutcome(ctx)
	if err := a.h.Manager.Destroy(octx, id, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := outcome.Behind(); got != "" {
		t.Fatalf("the destroy of %s reports Placement behind: %q", id, got)
	}
	if cons, err := c.Consumer(ctx, id); err != nil || len(cons.Allocations) != 0 {
		t.Fatalf("allocation right after the destroy of %s returned: %+v, %v", id, cons, err)
	}
}

// TestSlowRemovalIsNoOutage: Placement answers a destroy's publish but
// not its removal within the settle's time. The settle fails and leaves
// the removal to the pass, but Placement answered it: the syncer does not
// take it for unreachable, and the next operations keep their whole
// deadlines (a scheduler's create its time to read its allocation).
func TestSlowRemovalIsNoOutage(t *testing.T) {
	srv, c := startPlacement(t)
	rec := startRecorder(t, srv.URL())
	a := startHost(t, "hosta", rec.url, nil, withSettleTimeout(Config{}, 2*time.Second))
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	a.pass(t)
	d := mustCreate(t, a.h, "NVIDIA L4-4Q", sim.DefaultL4)
	a.pass(t)
	var slow atomic.Bool
	rec.before = func(r *http.Request) {
		// Past the settle's 2 s (its publish has 1 s of it), within the
		// client's own timeout.
		if r.URL.Path == "/allocations/"+d.UUID && r.Method != http.MethodGet && slow.CompareAndSwap(true, false) {
			time.Sleep(2500 * time.Millisecond)
		}
	}
	failed := settlesOf(a.s, "failed")
	before := counted(t, failed)
	slow.Store(true)
	if err := a.h.Manager.Destroy(context.Background(), d.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := counted(t, failed); got != before+1 {
		t.Fatalf("vgpud_fleet_settles_total{outcome=failed} = %v, want %v", got, before+1)
	}
	if a.s.down() {
		t.Fatal("a removal that ran out of the settle's time, after Placement answered its publish, made the syncer take Placement for unreachable")
	}
	a.pass(t)
	if r := holds(t, c, d.UUID, l4); len(r) != 0 {
		t.Fatalf("the pass after the failed settle left the allocation: %v", r)
	}
}
