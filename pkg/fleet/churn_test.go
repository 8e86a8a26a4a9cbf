package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// schedHost is a host as the test's fleet scheduler sees it; it keeps
// what its creates placed and the refusals other than NoCapacity (a
// scheduler's claim may be stale, nothing else may go wrong).
type schedHost struct {
	*host
	out *outcomes
}

type outcomes struct {
	mu     sync.Mutex
	placed map[string]int
	wrong  []string
}

func (h schedHost) Name() string { return h.name }

func (h schedHost) Owns(provider string) bool {
	for _, g := range h.h.Manager.Inventory().GPUs {
		if GPUProviderUUID(h.s.top(), g.PCI) == provider {
			return true
		}
	}
	return false
}

func (h schedHost) Create(ctx context.Context, consumer, profile string) error {
	_, err := h.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profile, PlacementConsumer: consumer})
	h.out.mu.Lock()
	defer h.out.mu.Unlock()
	switch {
	case err == nil:
		h.out.placed[profile]++
	case !errors.Is(err, manager.ErrNoCapacity):
		h.out.wrong = append(h.out.wrong, fmt.Sprintf("%s on %s: %v", profile, h.name, err))
	}
	return err
}

func (h schedHost) Destroy(ctx context.Context, id string) error {
	return h.h.Manager.Destroy(ctx, id, manager.DestroyOptions{})
}

// Specs are the three hosts' GPU mixes.
func Specs() []*sim.Spec {
	return []*sim.Spec{
		sim.DefaultSpec(),
		{Version: "v1", GPUs: []sim.GPUSpec{
			{Model: "H100-SXM5-80GB", PCI: "0000:41:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "H100-SXM5-80GB", PCI: "0000:42:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
		}},
		{Version: "v1", GPUs: []sim.GPUSpec{
			{Model: "H100-SXM5-80GB", PCI: "0000:41:00.0", Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "L4-24GB", PCI: "0000:81:00.0", Flavour: gpu.FlavourVFIO},
			{Model: "L4-24GB", PCI: "0000:82:00.0", Flavour: gpu.FlavourVFIO},
		}},
	}
}

// Requests are what the test's schedulers ask for: the churn's profiles
// from the one flavor table, time-sliced types by their class alone.
func Requests() []tplacement.Request {
	return tplacement.Requests(ClassName, tplacement.ClassAlone, tplacement.ChurnProfiles...)
}

// TestChurn: three hosts publish to one Placement; 1, 4 and 16 schedulers
// churn through it; after each phase Placement equals the union of the
// hosts' truth. Then Placement is stopped while local operations go on
// (none fails), started again, and converges.
func TestChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Placement and three hosts")
	}
	srv, c := startPlacement(t)
	ctx, cancel := context.WithCancel(context.Background())
	var hosts []*host
	var sh []tplacement.Host
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	out := &outcomes{placed: map[string]int{}}
	for i, spec := range Specs() {
		// The churn measures staleness, not Placement's speed: sixteen
		// schedulers and three race-instrumented hosts on one uwsgi
		// worker can keep a request waiting past the 2 s default, and a
		// create whose claim cannot be completed in time is refused as a
		// backend failure, which is right but not what is counted here.
		h := startHost(t, []string{"hosta", "hostb", "hostc"}[i], srv.URL(), spec, Config{Interval: 2 * time.Second, ClaimTimeout: 15 * time.Second})
		hosts = append(hosts, h)
		sh = append(sh, schedHost{h, out})
		wg.Add(1)
		go func() { defer wg.Done(); h.s.Run(ctx) }()
	}
	converged(t, c, hosts...)
	sched := &tplacement.Scheduler{C: c, Hosts: sh}
	for _, phase := range []struct{ workers, ops int }{{1, 12}, {4, 24}, {16, 48}} {
		stale0, placed0 := sched.Stale.Load(), sched.Placed.Load()
		if err := sched.Churn(ctx, phase.workers, phase.ops, Requests(), uint64(phase.workers)); err != nil {
			t.Fatalf("%d schedulers: %v", phase.workers, err)
		}
		converged(t, c, hosts...)
		t.Logf("%2d schedulers: placed %d, refused as stale %d, claims lost in Placement %d, no candidate %d",
			phase.workers, sched.Placed.Load()-placed0, sched.Stale.Load()-stale0, sched.ClaimLost.Load(), sched.NoCandidate.Load())
	}
	if len(out.wrong) > 0 {
		t.Fatalf("creates refused for another reason than a stale claim:\n%s", strings.Join(out.wrong, "\n"))
	}
	// Every kind of request goes through a scheduler at least once, on
	// hosts emptied first (the random churn may never have placed one).
	for _, h := range hosts {
		for _, id := range mustInstances(t, h) {
			if err := h.h.Manager.Destroy(ctx, id, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	converged(t, c, hosts...)
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, r := range Requests() {
		if _, _, err := sched.Place(ctx, r, rnd); err != nil {
			t.Fatalf("%s on empty hosts: %v", r.Profile, err)
		}
	}
	if len(out.wrong) > 0 {
		t.Fatalf("creates refused for another reason than a stale claim:\n%s", strings.Join(out.wrong, "\n"))
	}
	converged(t, c, hosts...)

	// Placement down: local operations go on.
	srv.Stop()
	for _, h := range hosts {
		for _, v := range mustInstances(t, h) {
			if err := h.h.Manager.Destroy(ctx, v, manager.DestroyOptions{}); err != nil {
				t.Fatalf("%s: destroy with Placement down: %v", h.name, err)
			}
			break
		}
		if _, err := h.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "1g.10gb"}); err != nil && !errors.Is(err, manager.ErrNoCapacity) {
			t.Fatalf("%s: create with Placement down: %v", h.name, err)
		}
	}
	time.Sleep(3 * time.Second) // passes fail meanwhile
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	converged(t, c, hosts...)
	if err := srv.Wipe(); err != nil {
		t.Fatal(err)
	}
	converged(t, c, hosts...)
}

func mustInstances(t *testing.T, h *host) []string {
	t.Helper()
	views, err := h.h.Manager.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range views {
		out = append(out, v.UUID)
	}
	return out
}

// TestRaceForLastSlices: two schedulers claim the last 3g slot of one GPU
// at once; exactly one instance is carved and Placement holds one claim.
func TestRaceForLastSlices(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hosta", srv.URL(), nil, Config{})
	for _, p := range []string{"3g.40gb"} {
		if _, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: p, GPU: sim.DefaultH100MIG}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, c, a)
	mig := GPUProviderUUID(a.s.top(), sim.DefaultH100MIG)
	inv, _, _ := c.Inventories(ctx, mig)
	room3g := inv["CUSTOM_VGPUD_MIG_3G_40GB"].Total - 1
	if room3g != 1 {
		t.Fatalf("3g room published = %d, want 1 (inventories %v)", room3g, inv)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := uuid.NewString()
			if err := claim(c, id, mig, map[string]int{"CUSTOM_VGPUD_MIG_3G_40GB": 1, SliceClass: 4}); err != nil {
				errs[i] = err
				return
			}
			_, errs[i] = a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: id})
		}(i)
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, placementapi.ErrCapacity), errors.Is(err, placementapi.ErrConflict), errors.Is(err, manager.ErrNoCapacity):
		default:
			t.Fatalf("unexpected refusal: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d schedulers won the last 3g slot (%v), want 1", won, errs)
	}
	converged(t, c, a)
}
