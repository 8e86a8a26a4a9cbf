package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
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

// refusingProxy stands in front of a real Placement and refuses the
// allocation writes of one consumer (409, as Placement refuses a claim
// over capacity; a POST /allocations naming it is refused whole, as
// Placement refuses it), or holds every request while hang is set.
type refusingProxy struct {
	refuse atomic.Value // string: the consumer whose PUT is refused
	hang   atomic.Bool
	held   chan struct{}
	rp     *httputil.ReverseProxy
}

func (p *refusingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.hang.Load() {
		select {
		case <-p.held:
		case <-r.Context().Done():
		}
		return
	}
	if id, _ := p.refuse.Load().(string); id != "" && refused(r, id) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprint(w, `{"errors": [{"status": 409, "title": "Conflict", "detail": "Unable to allocate inventory: refused for this test", "code": "placement.undefined_code"}]}`)
		return
	}
	p.rp.ServeHTTP(w, r)
}

// refused reports whether r writes id's allocation: a PUT of it, or a
// POST /allocations naming it among others.
func refused(r *http.Request, id string) bool {
	switch {
	case r.Method == http.MethodPut && r.URL.Path == "/allocations/"+id:
		return true
	case r.Method == http.MethodPost && r.URL.Path == "/allocations":
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		return bytes.Contains(body, []byte(`"`+id+`"`))
	}
	return false
}

func startRefusingProxy(t *testing.T, placementURL string) (*refusingProxy, string) {
	t.Helper()
	target, err := url.Parse(placementURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	p := &refusingProxy{rp: rp, held: make(chan struct{})}
	p.refuse.Store("")
	front := httptest.NewServer(p)
	t.Cleanup(func() {
		p.hang.Store(false)
		close(p.held)
		front.Close()
	})
	return p, front.URL
}

// withoutFleet runs f as the host would while Placement is out of reach
// of the manager (no claim, no settle): what Placement then lacks is the
// sync's to repair.
func withoutFleet(h *host, f func()) {
	h.h.Manager.SetFleet(nil)
	defer h.h.Manager.SetFleet(h.s)
	f()
}

func create(t *testing.T, h *host, profile, gpuPCI string) store.Instance {
	t.Helper()
	rec, err := h.h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: gpuPCI})
	if err != nil {
		t.Fatalf("create %s on %s: %v", profile, gpuPCI, err)
	}
	return rec
}

func destroy(t *testing.T, h *host, id string) {
	t.Helper()
	if err := h.h.Manager.Destroy(context.Background(), id, manager.DestroyOptions{}); err != nil {
		t.Fatalf("destroy %s: %v", id, err)
	}
}

// holds is what consumer holds on provider in Placement.
func holds(t *testing.T, c *placementapi.Client, consumer, provider string) map[string]int {
	t.Helper()
	cons, err := c.Consumer(context.Background(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	return cons.Allocations[provider].Resources
}

// overUsed names every class of h's providers whose usage exceeds its
// capacity (total - reserved) in Placement.
func overUsed(t *testing.T, c *placementapi.Client, h *host) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for _, p := range h.s.desired(mustView(t, h)) {
		inv, _, err := c.Inventories(ctx, p.uuid)
		if err != nil {
			t.Fatal(err)
		}
		allocs, err := c.ProviderAllocations(ctx, p.uuid)
		if err != nil {
			t.Fatal(err)
		}
		used := map[string]int{}
		for _, r := range allocs {
			for rc, n := range r {
				used[rc] += n
			}
		}
		for rc, u := range used {
			if i := inv[rc]; u > i.Total-i.Reserved {
				out = append(out, fmt.Sprintf("%s %s used %d, total %d reserved %d", p.name, rc, u, i.Total, i.Reserved))
			}
		}
	}
	return out
}

func differences(t *testing.T, h *host) []Difference {
	t.Helper()
	st, err := h.s.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Differences
}

// TestRefusedWriteStallsNothing: Placement refuses one instance's
// allocation on every pass. The pass reports it (a write-failed
// difference naming the consumer, the write-failures metric by kind) and
// fails, but every other provider and consumer converges in that same
// pass, and the local creates and destroys that follow keep their
// promises (claim written before carving, allocation removed before
// returning): Placement answers, whatever the last pass met.
func TestRefusedWriteStallsNothing(t *testing.T) {
	srv, c := startPlacement(t)
	proxy, front := startRefusingProxy(t, srv.URL())
	a := startHost(t, "hostr", front, nil, Config{})
	a.pass(t)
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	a10 := GPUProviderUUID(a.s.top(), sim.DefaultA10)
	kept := create(t, a, "NVIDIA A10-4Q", sim.DefaultA10)
	// Carved while Placement was out of reach: their allocations are the
	// pass's to write.
	var victim, other store.Instance
	withoutFleet(a, func() {
		victim = create(t, a, "3g.40gb", sim.DefaultH100MIG)
		other = create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	})
	proxy.refuse.Store(victim.UUID)
	failures := writeFailuresOf(a.s, "allocation", "capacity")
	before := counted(t, failures)
	err := a.s.Pass(context.Background())
	if !errors.Is(err, placementapi.ErrCapacity) || !strings.Contains(err.Error(), victim.UUID) {
		t.Fatalf("pass with %s's allocation refused = %v", victim.UUID, err)
	}
	// Every other consumer and provider converged in that pass.
	if r := holds(t, c, other.UUID, l4); r["CUSTOM_VGPUD_L4_4Q"] != 1 {
		t.Fatalf("allocation of %s after the pass = %v", other.UUID, r)
	}
	// A local create claims before it carves, and a destroy removes its
	// allocation before it returns, although the last pass failed.
	made := create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	if r := holds(t, c, made.UUID, l4); r["CUSTOM_VGPUD_L4_4Q"] != 1 {
		t.Fatalf("claim of a local create after a failed pass = %v; want it written before the create returned", r)
	}
	destroy(t, a, kept.UUID)
	if r := holds(t, c, kept.UUID, a10); len(r) != 0 {
		t.Fatalf("allocation of %s after its destroy returned: %v", kept.UUID, r)
	}
	if bad := overUsed(t, c, a); len(bad) > 0 {
		t.Fatalf("usage above capacity in Placement: %v", bad)
	}
	if got := counted(t, failures); got != before+1 {
		t.Fatalf("vgpud_fleet_write_failures_total{write=allocation,kind=capacity} = %v, want %v", got, before+1)
	}
	named := false
	for _, d := range differences(t, a) {
		switch {
		case d.Kind == DiffWriteFailed && d.Subject == victim.UUID && d.Provider == GPUProviderName("hostr", sim.DefaultH100MIG):
			named = true
		case d.Kind == DiffAllocationMissing && d.Subject == victim.UUID:
		default:
			t.Errorf("difference %+v: only %s's allocation should differ", d, victim.UUID)
		}
	}
	if !named {
		t.Fatalf("fleet status does not name the refused write: %+v", differences(t, a))
	}
	// Placement takes it again: the next pass repairs, nothing is named.
	proxy.refuse.Store("")
	a.pass(t)
	if r := holds(t, c, victim.UUID, mig); r[SliceClass] != 4 {
		t.Fatalf("allocation of %s once Placement takes it = %v", victim.UUID, r)
	}
	if d := differences(t, a); len(d) != 0 {
		t.Fatalf("differences after a pass Placement took whole: %+v", d)
	}
	converged(t, c, a)
}

// TestClaimOnCarvedRoom: an instance carved while Placement was out of
// reach, whose room a scheduler then claimed there. The pass writes the
// instance's allocation anyway (the host is the authority: its total is
// raised to what is held, so nothing is free), never shows usage above a
// capacity, and succeeds: the scheduler's claim is only an allocation
// without an instance, refused as stale when its create arrives.
func TestClaimOnCarvedRoom(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostc", srv.URL(), nil, Config{})
	a.pass(t)
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	var carved store.Instance
	withoutFleet(a, func() { carved = create(t, a, "7g.80gb", sim.DefaultH100MIG) })
	sched := uuid.NewString()
	if err := claim(c, sched, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.s.Pass(ctx); err != nil {
		t.Fatalf("pass with a scheduler's claim on the room the host carved: %v", err)
	}
	if bad := overUsed(t, c, a); len(bad) > 0 {
		t.Fatalf("usage above capacity in Placement: %v", bad)
	}
	if r := holds(t, c, carved.UUID, mig); r["CUSTOM_VGPUD_MIG_7G_80GB"] != 1 || r[SliceClass] != 8 {
		t.Fatalf("allocation of the carved instance = %v", r)
	}
	for _, d := range differences(t, a) {
		if d.Kind != DiffAllocationStale || d.Subject != sched {
			t.Fatalf("difference %+v; only the scheduler's claim should show", d)
		}
	}
	// Its create arrives: stale. The scheduler deletes its claim, and the
	// totals fall back to the host's.
	_, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", PlacementConsumer: sched})
	if !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("create of the scheduler's claim = %v, want NoCapacity (stale)", err)
	}
	if err := c.PutConsumer(ctx, sched, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	converged(t, c, a)
	if d := differences(t, a); len(d) != 0 {
		t.Fatalf("differences once the claim is gone: %+v", d)
	}
}

// TestDestroyBeforeFirstPass: a daemon that has just started (a new
// syncer, no pass yet) destroys an instance: its allocation is gone
// before the destroy returns, not left to a pass that cannot tell it from
// a scheduler's claim.
func TestDestroyBeforeFirstPass(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hostd", srv.URL(), nil, Config{})
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	rec := create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	if r := holds(t, c, rec.UUID, l4); r["CUSTOM_VGPUD_L4_4Q"] != 1 {
		t.Fatalf("claim = %v", r)
	}
	restarted, err := New(Config{Host: "hostd", Grace: time.Hour}, newClient(t, srv.URL()), a.h.Manager, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.s = restarted
	a.h.Manager.SetFleet(restarted)
	destroy(t, a, rec.UUID)
	if r := holds(t, c, rec.UUID, l4); len(r) != 0 {
		t.Fatalf("allocation after a destroy before the first pass: %v", r)
	}
	converged(t, c, a)
}

// TestStaleClassRepaired: a class the host stops offering while an
// allocation still holds it (an L4-12A destroyed while Placement was out
// of reach, then the L4 locked to L4-4Q). The pass removes the allocation
// before it lowers the totals, so the class goes in the same pass, no
// usage ever exceeds a capacity, and the passes after it do not skip a
// provider whose inventories Placement does not hold as the host wants.
func TestStaleClassRepaired(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hosts", srv.URL(), nil, Config{})
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	big := create(t, a, "NVIDIA L4-12A", sim.DefaultL4)
	a.pass(t)
	withoutFleet(a, func() {
		destroy(t, a, big.UUID)
		create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	})
	a.pass(t)
	if bad := overUsed(t, c, a); len(bad) > 0 {
		t.Fatalf("usage above capacity in Placement: %v", bad)
	}
	a.pass(t)
	a.pass(t)
	if d := differences(t, a); len(d) != 0 {
		t.Fatalf("Placement still differs from the host after three passes: %+v", d)
	}
	if r := holds(t, c, big.UUID, l4); len(r) != 0 {
		t.Fatalf("allocation of the destroyed L4-12A: %v", r)
	}
}

// TestDeletedAllocationWrittenBack: an instance's allocation deleted by
// someone else while its GPU stays idle is written back by the next pass:
// a pass compares with what Placement holds, not with what it last wrote
// (a deletion bumps no provider generation).
func TestDeletedAllocationWrittenBack(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostx", srv.URL(), nil, Config{})
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	rec := create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	a.pass(t)
	a.pass(t)
	if err := c.PutConsumer(ctx, rec.UUID, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if r := holds(t, c, rec.UUID, l4); r["CUSTOM_VGPUD_L4_4Q"] != 1 {
		t.Fatalf("allocation deleted by someone else, after a pass: %v", r)
	}
	if d := differences(t, a); len(d) != 0 {
		t.Fatalf("differences: %+v", d)
	}
}

// TestBookkeepingSettles: a destroy's own removal followed by its
// InstanceRemoved event, taken late (a pass in flight), leaves nothing
// behind: a later scheduler's claim under the same UUID (Nova reuses
// instance UUIDs) keeps its grace, the bookkeeping does not grow with
// destroys, and a quiet pass reads no provider's inventories again.
func TestBookkeepingSettles(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostb", srv.URL(), nil, Config{})
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	var last string
	for i := 0; i < 3; i++ {
		rec := create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
		a.pass(t)
		destroy(t, a, rec.UUID)
		a.s.take(manager.Event{Kind: manager.EventInstanceRemoved, ID: rec.UUID})
		last = rec.UUID
	}
	// A scheduler claims under the last UUID again, before any pass.
	if err := claim(c, last, l4, map[string]int{"CUSTOM_VGPUD_L4_4Q": 1, FramebufferClass: 4096}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if r := holds(t, c, last, l4); r["CUSTOM_VGPUD_L4_4Q"] != 1 {
		t.Fatalf("a scheduler's claim under a destroyed instance's UUID was swept without grace: %v", r)
	}
	if err := c.PutConsumer(ctx, last, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	a.pass(t)
	if left := bookkeeping(a.s); left != "" {
		t.Fatalf("bookkeeping left after the consumers are gone: %s", left)
	}
	// A quiet host: the root, the tree and each provider's allocations.
	before := a.s.c.Requests()
	a.pass(t)
	if n := a.s.c.Requests() - before; n > 2+4 {
		t.Fatalf("a quiet pass made %d requests; want the root, the tree and 4 providers' allocations", n)
	}
}

// hookSource runs a hook at a consumer's first HasConsumer check.
type hookSource struct {
	Source
	once     sync.Once
	consumer string
	hook     func()
}

func (h *hookSource) HasConsumer(id string) bool {
	if id == h.consumer {
		ok := h.Source.HasConsumer(id)
		h.once.Do(h.hook)
		return ok
	}
	return h.Source.HasConsumer(id)
}

// TestPassDoesNotRestoreDestroyed: a pass that found an instance's
// allocation missing checks it is an instance, then the instance is
// destroyed (its destroy finding nothing to remove) before the pass
// writes the allocation: the pass removes it again at once.
func TestPassDoesNotRestoreDestroyed(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostp", srv.URL(), nil, Config{})
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	var rec store.Instance
	withoutFleet(a, func() { rec = create(t, a, "NVIDIA L4-4Q", sim.DefaultL4) })
	src := &hookSource{Source: a.h.Manager, consumer: rec.UUID, hook: func() { destroy(t, a, rec.UUID) }}
	s, err := New(Config{Host: "hostp", Grace: time.Hour}, c, src, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.s = s
	a.h.Manager.SetFleet(s)
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if r := holds(t, c, rec.UUID, l4); len(r) != 0 {
		t.Fatalf("the pass wrote back the allocation of an instance destroyed meanwhile: %v", r)
	}
}

// TestSettleBounded: a Placement that holds every request does not hold
// a destroy for the claim timeout: Settle has a short deadline of its
// own, counts its failure, and leaves the removal to the next pass, which
// makes it without grace once Placement answers.
func TestSettleBounded(t *testing.T) {
	srv, c := startPlacement(t)
	proxy, front := startRefusingProxy(t, srv.URL())
	a := startHost(t, "hostt", front, nil, Config{})
	// Each request may wait an hour: only Settle's own deadline ends it.
	patient, err := placementapi.New(placementapi.Config{Endpoint: front, Timeout: time.Hour, Backoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a.s, err = New(withSettleTimeout(Config{Host: "hostt", Grace: time.Hour, ClaimTimeout: time.Hour}, 100*time.Millisecond), patient, a.h.Manager, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(a.s)
	a.pass(t)
	rec := create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	a.pass(t)
	failed := settlesOf(a.s, "failed")
	before := counted(t, failed)
	proxy.hang.Store(true)
	done := make(chan error, 1)
	octx, outcome := manager.WithPlacementOutcome(context.Background())
	go func() { done <- a.h.Manager.Destroy(octx, rec.UUID, manager.DestroyOptions{}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a destroy waited on a Placement that does not answer (a minute, claim timeout one hour)")
	}
	if got := counted(t, failed); got != before+1 {
		t.Fatalf("vgpud_fleet_settles_total{outcome=failed} = %v, want %v", got, before+1)
	}
	// The destroy's caller is told what was left to the pass.
	if got := outcome.Behind(); !strings.Contains(got, "the allocation of destroyed instance "+rec.UUID+" left for the next pass") {
		t.Fatalf("the destroy's outcome = %q, want its allocation named as left for the next pass", got)
	}
	proxy.hang.Store(false)
	a.pass(t)
	if r := holds(t, c, rec.UUID, GPUProviderUUID(a.s.top(), sim.DefaultL4)); len(r) != 0 {
		t.Fatalf("allocation of the destroyed instance after the next pass: %v", r)
	}
}

// TestStaleWholeGPUClaimRepaired: the fleet e2e's case. A scheduler's
// whole-GPU claim on an empty L4, then a local vGPU there, which locks the
// L4 to its type: every other class, the whole GPU's included, falls to
// nothing on the host while the claim still holds the whole-GPU class.
// Its create is refused as stale and the scheduler deletes its claim
// (which changes no provider generation): the passes after it bring
// Placement back to the host, every class the L4 no longer offers gone.
func TestStaleWholeGPUClaimRepaired(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostw", srv.URL(), nil, Config{})
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	sched := uuid.NewString()
	if err := claim(c, sched, l4, map[string]int{classWhole: 1}); err != nil {
		t.Fatal(err)
	}
	create(t, a, "NVIDIA L4-4Q", sim.DefaultL4)
	a.pass(t)
	if bad := overUsed(t, c, a); len(bad) > 0 {
		t.Fatalf("usage above capacity in Placement: %v", bad)
	}
	_, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profileWhole, PlacementConsumer: sched})
	if err == nil {
		t.Fatal("the whole-GPU create on an L4 holding a vGPU succeeded")
	}
	if err := c.PutConsumer(ctx, sched, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	a.pass(t)
	if d := differences(t, a); len(d) != 0 {
		t.Fatalf("Placement still differs from the host after the stale claim went: %+v", d)
	}
}
