package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
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

// recorder stands between one syncer and Placement and notes each
// request as "METHOD /path" (the query left out).
type recorder struct {
	url string
	mu  sync.Mutex
	log []string
	// before, if set (before the syncer's first request), runs before
	// each request goes on to Placement.
	before func(*http.Request)
}

func startRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.log = append(r.log, req.Method+" "+req.URL.Path)
		before := r.before
		r.mu.Unlock()
		if before != nil {
			before(req)
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// take returns the requests noted since the last take.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

// count is how many of reqs start with prefix ("PUT /resource_classes/").
func count(reqs []string, prefix string) int {
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

// recordedHost is a host whose syncer talks to Placement through a recorder.
func recordedHost(t *testing.T, name, url string) (*host, *recorder) {
	t.Helper()
	rec := startRecorder(t, url)
	return startHost(t, name, rec.url, nil, Config{}), rec
}

// l4Instance publishes the host, creates an L4-4Q on its L4 and waits
// until Placement holds the instance's allocation; it returns the
// instance and the L4's provider.
func l4Instance(t *testing.T, a *host, c *placementapi.Client) (store.Instance, string) {
	t.Helper()
	a.pass(t)
	rec, err := a.h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	converged(t, c, a)
	return rec, GPUProviderUUID(a.s.top(), sim.DefaultL4)
}

// A host's first publish lists the classes and traits Placement defines
// and creates only those missing: the second host of a fleet creates
// none, and a provider it has just made is written, not read.
func TestFirstPublishCreatesOnlyMissingNames(t *testing.T) {
	srv, _ := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	a.pass(t)
	first := ra.take()
	if n := count(first, "PUT /resource_classes/"); n == 0 {
		t.Fatalf("the first host created no class: %v", first)
	}
	if n := count(first, "GET /resource_classes"); n != 1 {
		t.Fatalf("the first host listed the classes %d times, want once: %v", n, first)
	}
	b, rb := recordedHost(t, "hostb", srv.URL())
	b.pass(t)
	second := rb.take()
	if n := count(second, "PUT /resource_classes/") + count(second, "PUT /traits/"); n != 0 {
		t.Fatalf("the second host created %d classes or traits the first had made: %v", n, second)
	}
	if n := count(second, "GET /resource_classes") + count(second, "GET /traits"); n != 2 {
		t.Fatalf("the second host listed %d times, want classes and traits once each: %v", n, second)
	}
	// Four GPUs made: each is created, its inventories and traits written
	// without a read before them.
	for _, read := range []string{"/inventories", "/traits", "/allocations"} {
		for _, r := range second {
			if strings.HasPrefix(r, "GET /resource_providers/") && strings.HasSuffix(r, read) {
				t.Fatalf("a provider just made was read (%s): %v", r, second)
			}
		}
	}
	if len(second) > 20 {
		t.Fatalf("the second host's first publish took %d requests: %v", len(second), second)
	}
}

// A pass with nothing to change reads the tree and, of the GPU providers,
// only the allocations of those that hold some: one that held none at the
// generation it still has cannot hold any now. That holds from the pass
// after the first publish: the first publish's trait writes, which move
// each generation past its inventories', are cached at the generation
// they gave.
func TestIdlePassReadsOnlyTheTree(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	ra.take()
	a.pass(t)
	if idle := ra.take(); len(idle) != 1 || !strings.HasPrefix(idle[0], "GET /resource_providers") {
		t.Fatalf("the pass after the first publish of an empty host made %d requests, want the tree alone: %v", len(idle), idle)
	}
	// A claim someone else writes bumps the provider's generation: the
	// next pass reads that provider's allocations (and keeps the claim
	// through its grace).
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	stray := uuid.NewString()
	if err := claim(c, stray, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if got := ra.take(); count(got, "GET /resource_providers/"+mig+"/allocations") == 0 {
		t.Fatalf("the pass after a claim did not read its provider's allocations: %v", got)
	}
	// Its deletion bumps no generation: a provider that held something is
	// read on every pass.
	if err := c.PutConsumer(ctx, stray, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if got := ra.take(); count(got, "GET /resource_providers/"+mig+"/allocations") == 0 {
		t.Fatalf("the pass after a deletion did not read the allocations: %v", got)
	}
	if st, err := a.s.Status(ctx); err != nil || len(st.Differences) != 0 {
		t.Fatalf("status: %+v, %v", st.Differences, err)
	}
}

// A pass an event started reads the allocations of the providers whose
// generation moved and of no other; what a DELETE took without moving
// a generation is the periodic pass's to find: it reads every provider
// that holds anything, and writes back an instance's allocation lost so.
func TestEventPassReadsChangedProvidersAlone(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	var l4Inst string
	for _, r := range []manager.CreateRequest{
		{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4},
		{Tenant: "acme", Profile: "1g.10gb", GPU: sim.DefaultH100MIG},
	} {
		rec, err := a.h.Manager.Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if r.GPU == sim.DefaultL4 {
			l4Inst = rec.UUID
		}
	}
	converged(t, c, a)
	a.pass(t)
	a.pass(t)
	event := func() []string {
		t.Helper()
		ra.take()
		if err := a.s.passWith(ctx, false, 0); err != nil {
			t.Fatal(err)
		}
		return ra.take()
	}
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	if got := event(); len(got) != 1 {
		t.Fatalf("an event's pass on a host nothing changed made %d requests, want the tree alone: %v", len(got), got)
	}
	stray := uuid.NewString()
	if err := claim(c, stray, mig, map[string]int{"CUSTOM_VGPUD_MIG_1G_10GB": 1, SliceClass: 1}); err != nil {
		t.Fatal(err)
	}
	got := event()
	if count(got, "GET /resource_providers/"+mig+"/allocations") != 1 || count(got, "GET /resource_providers/"+l4+"/allocations") != 0 {
		t.Fatalf("the event's pass after a claim on the H100 read the allocations of: %v; want the H100's once", got)
	}
	// A DELETE moves no generation: the events' passes do not see it,
	// the periodic one does (the stray claim gone, the instance's
	// allocation lost).
	for _, id := range []string{stray, l4Inst} {
		if err := c.PutConsumer(ctx, id, placementapi.Consumer{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := event(); len(got) != 1 {
		t.Fatalf("an event's pass after a DELETE made %d requests, want the tree alone: %v", len(got), got)
	}
	ra.take()
	a.pass(t)
	got = ra.take()
	if count(got, "GET /resource_providers/"+l4+"/allocations") != 1 || count(got, "GET /resource_providers/"+mig+"/allocations") != 1 {
		t.Fatalf("the periodic pass did not read every occupied provider's allocations: %v", got)
	}
	if cons, err := c.Consumer(ctx, l4Inst); err != nil || cons.Allocations[l4].Resources == nil {
		t.Fatalf("the periodic pass left the L4 instance's allocation lost: %+v, %v", cons.Allocations, err)
	}
	if st, err := a.s.Status(ctx); err != nil || len(st.Differences) != 0 {
		t.Fatalf("status: %+v, %v", st.Differences, err)
	}
}

// The periodic pass reads an occupied provider whose generation did not
// move once its allocations were last read AuditInterval ago, not every
// Interval: a DELETE of an instance's allocation is written back within
// AuditInterval, and the passes between read the tree alone. A pass
// that falls a little early on its tick audits as the tick would.
func TestPeriodicPassAuditsAfterAuditInterval(t *testing.T) {
	srv, c := startPlacement(t)
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ra := startRecorder(t, srv.URL())
	a := startHost(t, "hosta", ra.url, nil, Config{Now: clock.now, Interval: time.Minute, AuditInterval: 5 * time.Minute})
	ctx := context.Background()
	rec, l4 := l4Instance(t, a, c)
	a.pass(t) // reads the L4's allocations: the audit counts from here
	if err := c.PutConsumer(ctx, rec.UUID, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	periodic := func() []string {
		t.Helper()
		ra.take()
		if err := a.s.passWith(ctx, true, a.s.cfg.AuditInterval); err != nil {
			t.Fatal(err)
		}
		return ra.take()
	}
	for range 4 {
		clock.advance(time.Minute)
		if got := periodic(); len(got) != 1 {
			t.Fatalf("a periodic pass within the audit interval made %d requests, want the tree alone: %v", len(got), got)
		}
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) != 0 {
		t.Fatalf("written back before its audit: %+v, %v", cons.Allocations, err)
	}
	clock.advance(time.Minute - time.Second)
	if got := periodic(); count(got, "GET /resource_providers/"+l4+"/allocations") != 1 {
		t.Fatalf("the periodic pass an audit interval after the last read did not read the L4's allocations: %v", got)
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || cons.Allocations[l4].Resources == nil {
		t.Fatalf("the audit left the instance's allocation lost: %+v, %v", cons.Allocations, err)
	}
	// The rewrite moved the generation: the next pass reads the L4 once
	// more, the one after it the tree alone.
	clock.advance(time.Minute)
	periodic()
	clock.advance(time.Minute)
	if got := periodic(); len(got) != 1 {
		t.Fatalf("the second periodic pass after the audit made %d requests, want the tree alone: %v", len(got), got)
	}
	// A scheduler's claim beside the instance (the claim moves the
	// generation: read at once), then deleted: a provider that holds a
	// claim that is no instance is read by every periodic pass, and the
	// next finds it gone.
	stray := uuid.NewString()
	if err := claim(c, stray, l4, l4x4Q); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Minute)
	if got := periodic(); count(got, "GET /resource_providers/"+l4+"/allocations") != 1 {
		t.Fatalf("the periodic pass after a claim did not read its provider: %v", got)
	}
	if err := c.PutConsumer(ctx, stray, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Minute)
	if got := periodic(); count(got, "GET /resource_providers/"+l4+"/allocations") != 1 {
		t.Fatalf("the periodic pass within the audit did not read a provider holding a claim: %v", got)
	}
	if st, err := a.s.Status(ctx); err != nil || len(st.Differences) != 0 {
		t.Fatalf("status after the claim went: %+v, %v", st.Differences, err)
	}
}

// An allocation an event's pass took from its cache but a DELETE took
// since (no generation moved) is not written back by that pass: it may
// be a scheduler's claim it gave up on. The provider is read again by the
// next pass, which writes back an instance's allocation lost so.
func TestEventPassRewritesNothingDeleted(t *testing.T) {
	srv, c := startPlacement(t)
	a, _ := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	rec, l4 := l4Instance(t, a, c)
	a.pass(t)
	a.pass(t)
	// The cache says the instance holds something else there (as a
	// scheduler's claim of another size would): the pass rewrites it.
	a.s.mu.Lock()
	e := a.s.cache[l4]
	if _, ok := e.held[rec.UUID]; !ok {
		a.s.mu.Unlock()
		t.Fatalf("the cache does not hold the instance: %+v", e.held)
	}
	e.held = map[string]map[string]int{rec.UUID: {"CUSTOM_OTHER": 1}}
	a.s.cache[l4] = e
	a.s.mu.Unlock()
	if err := c.PutConsumer(ctx, rec.UUID, placementapi.Consumer{}); err != nil {
		t.Fatal(err)
	}
	if err := a.s.passWith(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) != 0 {
		t.Fatalf("the event's pass wrote back a deleted allocation: %+v, %v", cons.Allocations, err)
	}
	// The next pass, an event's too, reads the provider again.
	if err := a.s.passWith(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || cons.Allocations[l4].Resources == nil {
		t.Fatalf("the next pass left the instance's allocation lost: %+v, %v", cons.Allocations, err)
	}
}

// A removal of a consumer that holds none of the host's providers (moved
// to another host since the pass read it) writes nothing: a write would
// move the other provider's generation and rewrite the consumer's type.
func TestRemovalOfConsumerHeldElsewhereWritesNothing(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	other := elsewhere(t, c)
	id := uuid.NewString()
	if err := c.PutConsumer(ctx, id, placementapi.Consumer{
		Allocations: map[string]placementapi.Allocation{other: {Resources: map[string]int{"CUSTOM_ELSEWHERE": 1}}},
		ProjectID:   "p", UserID: "u", ConsumerType: "MIGRATION"}); err != nil {
		t.Fatal(err)
	}
	before, err := c.Consumer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ra.take()
	if err := a.s.removeAllocation(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := ra.take(); count(got, "PUT /allocations/") != 0 {
		t.Fatalf("the removal wrote a consumer holding nothing of the host's: %v", got)
	}
	after, err := c.Consumer(ctx, id)
	if err != nil || *after.Generation != *before.Generation || after.ConsumerType != "MIGRATION" {
		t.Fatalf("the consumer is now %+v, %v; want it as it was (%+v)", after, err, before)
	}
}

// Traits another writer changed are set back by the periodic pass, even
// after an event's pass took them as the last pass left them.
func TestPeriodicPassChecksTraitsEventPassTook(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	a.pass(t)
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	want, gen, err := c.Traits(ctx, l4)
	if err != nil || len(want) < 2 {
		t.Fatalf("the L4's traits: %v, %v", want, err)
	}
	if _, err := c.SetTraits(ctx, l4, gen, want[1:]); err != nil {
		t.Fatal(err)
	}
	// Two events' passes (the second finds the provider as the first
	// left it) and a settle of the GPU: none reads the traits.
	ra.take()
	for range 2 {
		if err := a.s.passWith(ctx, false, 0); err != nil {
			t.Fatal(err)
		}
	}
	view, err := a.h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range view {
		if g.PCI == sim.DefaultL4 {
			if err := a.s.Settle(ctx, g.UUID, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := ra.take(); count(got, "GET /resource_providers/"+l4+"/traits") != 0 {
		t.Fatalf("an event's pass or the settle read the traits: %v", got)
	}
	a.pass(t)
	if got, _, err := c.Traits(ctx, l4); err != nil || !sameSet(got, want) {
		t.Fatalf("after the periodic pass the L4 has traits %v, %v; want %v", got, err, want)
	}
}

// The pass a create's events start waits for the create's settle, which
// publishes the GPU: it then finds the inventories written and writes
// none, where a pass beside the settle would write them too (and one of
// the two writes be a conflict, read and sent again).
func TestEventPassWaitsForSettle(t *testing.T) {
	srv, c := startPlacement(t)
	rec := startRecorder(t, srv.URL())
	a := startHost(t, "hosta", rec.url, nil, Config{})
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	var hold atomic.Bool
	rec.before = func(r *http.Request) {
		// The settle's inventory write, held long enough for a pass
		// started by the create's events to run beside it.
		if r.Method == "PUT" && r.URL.Path == "/resource_providers/"+l4+"/inventories" && hold.CompareAndSwap(true, false) {
			time.Sleep(300 * time.Millisecond)
		}
	}
	ctx := context.Background()
	a.pass(t)
	a.pass(t)
	before := lastPass(a.s)
	a.run(t)
	passAfter(t, a.s, before) // the loop's first pass
	before = lastPass(a.s)
	rec.take()
	hold.Store(true)
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4}); err != nil {
		t.Fatal(err)
	}
	passAfter(t, a.s, before)
	if hold.Load() {
		t.Fatal("the settle wrote no inventories")
	}
	if got := rec.take(); count(got, "PUT /resource_providers/"+l4+"/inventories") != 1 {
		t.Fatalf("the L4's inventories were written %d times, want once (the settle's): %v", count(got, "PUT /resource_providers/"+l4+"/inventories"), got)
	}
	converged(t, c, a)
}

// A scheduler's create reads Placement again (its allocation confirmed)
// after the admission's event has started a pass: that pass waits for the
// create's settle (the manager expects it before the first event) and
// finds the GPU as the settle published and read it, at the generation
// the claim moved. The GPU's allocations are read once, by the settle.
func TestSchedulerCreateSettlesBeforeItsPass(t *testing.T) {
	srv, c := startPlacement(t)
	rec := startRecorder(t, srv.URL())
	a := startHost(t, "hosta", rec.url, nil, Config{})
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	id := uuid.NewString()
	var completed, held atomic.Bool
	rec.before = func(r *http.Request) {
		// The create's confirmation (its read of the consumer after the
		// adoption completed the claim), held long enough for a pass the
		// admission's event started to run beside the create.
		switch {
		case r.URL.Path != "/allocations/"+id:
		case r.Method == "PUT":
			completed.Store(true)
		case r.Method == "GET" && completed.Load() && held.CompareAndSwap(false, true):
			time.Sleep(300 * time.Millisecond)
		}
	}
	ctx := context.Background()
	a.pass(t)
	a.pass(t)
	before := time.Now()
	a.run(t)
	passAfter(t, a.s, before) // the loop's first pass
	if err := claim(c, id, l4, map[string]int{"CUSTOM_VGPUD_L4_4Q": 1}); err != nil {
		t.Fatal(err)
	}
	rec.take()
	before = time.Now()
	if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", PlacementConsumer: id}); err != nil {
		t.Fatal(err)
	}
	// Every pass the create's events started, run.
	passAfter(t, a.s, before)
	for last := lastPass(a.s); ; last = lastPass(a.s) {
		time.Sleep(300 * time.Millisecond)
		if lastPass(a.s).Equal(last) {
			break
		}
	}
	got := rec.take()
	if !held.Load() {
		t.Fatalf("the create did not read its completed claim again (its confirmation): %v", got)
	}
	if n := count(got, "GET /resource_providers/"+l4+"/allocations"); n != 1 {
		t.Fatalf("the L4's allocations were read %d times, want once (the settle's): %v", n, got)
	}
	if n := count(got, "PUT /resource_providers/"+l4+"/inventories"); n > 1 {
		t.Fatalf("the L4's inventories were written %d times, want at most once (the settle's): %v", n, got)
	}
	converged(t, c, a)
}

// lastPass is when s's last pass succeeded.
func lastPass(s *Syncer) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastOK
}

// passAfter waits (10 s at most) for a pass of s that succeeded after
// before.
func passAfter(t *testing.T, s *Syncer, before time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !lastPass(s).After(before) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !lastPass(s).After(before) {
		t.Fatal("no pass ran")
	}
}

// After Placement lost its database a host writes its instances'
// allocations again in one POST /allocations, as consumers Placement does
// not know; one it does know (held elsewhere) makes the batch fall back to
// writing each alone, at the consumer's generation, keeping what it holds
// elsewhere.
func TestResyncWritesAllocationsTogether(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	for _, gpu := range []string{sim.DefaultH100MIG, sim.DefaultH100MIG, sim.DefaultL4} {
		profile := "1g.10gb"
		if gpu == sim.DefaultL4 {
			profile = "NVIDIA L4-4Q"
		}
		if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profile, GPU: gpu}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, c, a)
	if err := srv.Wipe(); err != nil {
		t.Fatal(err)
	}
	ra.take()
	a.pass(t)
	got := ra.take()
	if n := count(got, "POST /allocations"); n != 1 {
		t.Fatalf("the pass after a wipe posted allocations %d times, want once: %v", n, got)
	}
	if n := count(got, "PUT /allocations/") + count(got, "GET /allocations/"); n != 0 {
		t.Fatalf("the pass after a wipe wrote consumers one by one: %v", got)
	}
	converged(t, c, a)

	// Two allocations lost again, one of whose consumers also holds
	// something of another provider: the batch is refused as a whole,
	// and each is written alone with what it holds elsewhere kept.
	ids := mustInstances(t, a)
	other := elsewhere(t, c)
	for i, id := range ids[:2] {
		cons := placementapi.Consumer{Allocations: map[string]placementapi.Allocation{}, ProjectID: "p", UserID: "u", ConsumerType: "INSTANCE"}
		if i == 0 {
			cons.Allocations[other] = placementapi.Allocation{Resources: map[string]int{"CUSTOM_ELSEWHERE": 1}}
		}
		cur, err := c.Consumer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		cons.Generation = cur.Generation
		if err := c.PutConsumer(ctx, id, cons); err != nil {
			t.Fatal(err)
		}
	}
	ra.take()
	a.pass(t)
	if got := ra.take(); count(got, "POST /allocations") != 1 || count(got, "PUT /allocations/") != 2 {
		t.Fatalf("want the batch refused, then two writes alone: %v", got)
	}
	converged(t, c, a)
	cons, err := c.Consumer(ctx, ids[0])
	if err != nil || len(cons.Allocations) != 2 || cons.Allocations[other].Resources["CUSTOM_ELSEWHERE"] != 1 {
		t.Fatalf("the consumer held elsewhere: %+v, %v", cons, err)
	}
}

// destroySettled fails unless got are the requests of a destroy's settle
// of consumer on provider: four, three one after another. The provider's
// allocations, with the consumer read beside them; the inventories,
// known at the generation the last pass left (not read), written; the
// allocation removed at the consumer's generation.
func destroySettled(t *testing.T, got []string, consumer, provider string) {
	t.Helper()
	read := "GET /allocations/" + consumer
	i := slices.Index(got, read)
	want := []string{"GET /resource_providers/" + provider + "/allocations", "PUT /resource_providers/" + provider + "/inventories", "PUT /allocations/" + consumer}
	if i < 0 || i == len(got)-1 || !slices.Equal(slices.Delete(slices.Clone(got), i, i+1), want) {
		t.Fatalf("the destroy's settle made %v, want %s beside %v", got, read, want)
	}
}

// A destroy's settle writes its GPU's inventories from the generation the
// last pass left, then removes the allocation: the pass after it knows
// the provider without reading it (it holds nothing now, at the
// generation the removal moved it to), where it read its inventories,
// traits and allocations again.
func TestPassAfterSettleReadsNothingSettled(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "NVIDIA L4-4Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatal(err)
	}
	converged(t, c, a)
	a.pass(t)
	ra.take()
	if err := a.h.Manager.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	destroySettled(t, ra.take(), rec.UUID, l4)
	a.pass(t)
	if got := ra.take(); len(got) != 1 {
		t.Fatalf("the pass after a settled destroy made %d requests, want the tree alone: %v", len(got), got)
	}
	converged(t, c, a)
}

// An allocation a destroy's settle could not remove is the next pass's
// first write: it waits for no read of the tree or of any provider.
func TestRemovalLeftBySettleGoesFirst(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	var ids []string
	for _, gpu := range []string{sim.DefaultH100MIG, sim.DefaultH100MIG} {
		rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: gpu})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, rec.UUID)
	}
	converged(t, c, a)
	// The destroy runs without the fleet, as one whose settle gave up:
	// its allocation is marked to go at the next pass.
	a.h.Manager.SetFleet(nil)
	if err := a.h.Manager.Destroy(ctx, ids[0], manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(a.s)
	a.s.Unclaim(ids[0])
	ra.take()
	a.pass(t)
	got := ra.take()
	if len(got) < 2 || got[0] != "GET /allocations/"+ids[0] || got[1] != "PUT /allocations/"+ids[0] {
		t.Fatalf("the pass did not remove the allocation first: %v", got)
	}
	if n := count(got, "PUT /allocations/"); n != 1 {
		t.Fatalf("%d removals, want one: %v", n, got)
	}
	converged(t, c, a)
}

// Hosts that listed the classes before another defined them (every host
// after Placement lost its database) learn it from the first name
// Placement answers it had, list again, and create nothing more.
func TestNamesDefinedMeanwhileListedAgain(t *testing.T) {
	srv, _ := startPlacement(t)
	ctx := context.Background()
	b, rb := recordedHost(t, "hostb", srv.URL())
	if err := b.s.list(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := b.s.list(ctx, true); err != nil {
		t.Fatal(err)
	}
	a := startHost(t, "hosta", srv.URL(), nil, Config{})
	a.pass(t)
	view, err := b.h.Manager.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	rb.take()
	if err := b.s.ensureNames(ctx, b.s.desired(view)); err != nil {
		t.Fatal(err)
	}
	got := rb.take()
	if n := count(got, "PUT /resource_classes/"); n != 1 {
		t.Fatalf("the host created %d classes another had defined meanwhile, want one before it listed again: %v", n, got)
	}
	if n := count(got, "GET /resource_classes"); n != 1 {
		t.Fatalf("the host listed the classes %d times, want once again: %v", n, got)
	}
}

// A destroy whose consumer also holds something of another provider
// (an instance nova-compute placed, with its VCPUs elsewhere): the
// removal writes the consumer with what it holds elsewhere, which moves
// no generation of the GPU's provider. The settle must not take the
// provider for empty at the next generation: a scheduler's claim landing
// there next is read by the next pass.
func TestDestroyHeldElsewhereKeepsProviderRead(t *testing.T) {
	srv, c := startPlacement(t)
	a, ra := recordedHost(t, "hosta", srv.URL())
	ctx := context.Background()
	a.pass(t)
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: sim.DefaultH100MIG})
	if err != nil {
		t.Fatal(err)
	}
	converged(t, c, a)
	other := elsewhere(t, c)
	cons, err := c.Consumer(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	cons.Allocations[other] = placementapi.Allocation{Resources: map[string]int{"CUSTOM_ELSEWHERE": 1}}
	if err := c.PutConsumer(ctx, rec.UUID, cons); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	a.pass(t)
	if err := a.h.Manager.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	if cons, err := c.Consumer(ctx, rec.UUID); err != nil || len(cons.Allocations) != 1 || cons.Allocations[other].Resources["CUSTOM_ELSEWHERE"] != 1 {
		t.Fatalf("after the destroy the consumer holds %+v, %v; want what it holds elsewhere alone", cons.Allocations, err)
	}
	claim := schedulerClaims(t, c, "CUSTOM_VGPUD_MIG_1G_10GB:1,CUSTOM_VGPUD_GPU:1,CUSTOM_VGPUD_MIG_SLICE:1")
	h100 := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	if cons, err := c.Consumer(ctx, claim); err != nil || cons.Allocations[h100].Resources == nil {
		t.Fatalf("the scheduler's claim landed on %+v, %v; want the H100", cons.Allocations, err)
	}
	ra.take()
	a.pass(t)
	if got := ra.take(); count(got, "GET /resource_providers/"+h100+"/allocations") == 0 {
		t.Fatalf("the pass after the destroy and a scheduler's claim did not read the H100's allocations: %v", got)
	}
	if st, err := a.s.Status(ctx); err != nil || st.Providers == nil {
		t.Fatalf("fleet status: %+v, %v", st, err)
	} else {
		for _, p := range st.Providers {
			if p.UUID == h100 && p.PlacementAllocations != 1 {
				t.Fatalf("fleet status shows %d allocations on the H100, want the scheduler's claim", p.PlacementAllocations)
			}
		}
	}
}

// elsewhere makes a provider outside every host's tree, with 4 of
// CUSTOM_ELSEWHERE: what a consumer may hold beside a GPU (a compute
// node's VCPUs, say).
func elsewhere(t *testing.T, c *placementapi.Client) string {
	t.Helper()
	ctx := context.Background()
	other := uuid.NewString()
	if err := c.CreateProvider(ctx, other, "elsewhere", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureResourceClass(ctx, "CUSTOM_ELSEWHERE"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetInventories(ctx, other, 0, map[string]placementapi.Inventory{"CUSTOM_ELSEWHERE": {Total: 4, MinUnit: 1, MaxUnit: 4, StepSize: 1, AllocationRatio: 1}}); err != nil {
		t.Fatal(err)
	}
	return other
}
