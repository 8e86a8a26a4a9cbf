package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// candidateRequests are what the check asks Placement for: the churn's
// requests and the profiles whose room depends most on alignment.
func candidateRequests() []tplacement.Request {
	return append(Requests(),
		tplacement.Request{Profile: "4g.40gb", Resources: "CUSTOM_VGPUD_MIG_4G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"},
		tplacement.Request{Profile: "7g.80gb", Resources: "CUSTOM_VGPUD_MIG_7G_80GB:1,CUSTOM_VGPUD_MIG_SLICE:8"},
		tplacement.Request{Profile: "H100XM-3-40C", Resources: "CUSTOM_VGPUD_H100XM_3_40C:1,CUSTOM_VGPUD_MIG_SLICE:4"},
		tplacement.Request{Profile: "L4-24Q", Resources: "CUSTOM_VGPUD_L4_24Q:1"},
	)
}

// candidatesDiffer names every GPU where Placement's allocation
// candidates and the host's admission disagree: a candidate the host
// would refuse now, or a GPU the host would take the request on that
// Placement does not offer.
func candidatesDiffer(t *testing.T, c *placementapi.Client, hosts []*host) string {
	t.Helper()
	ctx := context.Background()
	var diff strings.Builder
	for _, r := range candidateRequests() {
		q := url.Values{"resources1": {r.Resources}, "limit": {"1000"}}
		cands, err := c.AllocationCandidates(ctx, q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		offered := map[string]bool{}
		for _, cand := range cands {
			for p := range cand.Allocations {
				offered[p] = true
			}
		}
		for _, h := range hosts {
			for _, g := range h.h.Manager.Inventory().GPUs {
				plan, err := h.h.Manager.Plan(ctx, manager.CreateRequest{Profile: r.Profile, GPU: g.PCI})
				if err != nil {
					t.Fatalf("plan %s on %s: %v", r.Profile, g.PCI, err)
				}
				p := GPUProviderUUID(h.s.top(), g.PCI)
				switch {
				case offered[p] && !plan.Fits:
					fmt.Fprintf(&diff, "%s %s: Placement offers %s, the host refuses it: %s\n", h.name, g.PCI, r.Profile, plan.Refusal)
				case !offered[p] && plan.Fits:
					fmt.Fprintf(&diff, "%s %s: the host takes %s, Placement offers no candidate there\n", h.name, g.PCI, r.Profile)
				}
			}
		}
	}
	return diff.String()
}

// TestCandidatesAreAdmission: after each round of random local creates
// and destroys, once the hosts' passes have run, GET
// /allocation_candidates names exactly the GPUs where vgpud's admission
// would accept each request now: no stale offer, and no room Placement
// does not show.
func TestCandidatesAreAdmission(t *testing.T) {
	srv, c := startPlacement(t)
	var hosts []*host
	for i, spec := range Specs() {
		h := startHost(t, fmt.Sprintf("cand%d", i), srv.URL(), spec, Config{Inventories: InventoriesExact})
		h.run(t)
		hosts = append(hosts, h)
	}
	converged(t, c, hosts...)
	if d := candidatesDiffer(t, c, hosts); d != "" {
		t.Fatalf("empty hosts:\n%s", d)
	}
	rnd := rand.New(rand.NewPCG(7, 14))
	reqs := Requests()
	type live struct {
		h  *host
		id string
	}
	var alive []live
	for round := 0; round < 6; round++ {
		for op := 0; op < 12; op++ {
			if len(alive) > 0 && rnd.IntN(3) == 0 {
				k := rnd.IntN(len(alive))
				if err := alive[k].h.h.Manager.Destroy(context.Background(), alive[k].id, manager.DestroyOptions{}); err != nil {
					t.Fatal(err)
				}
				alive = append(alive[:k], alive[k+1:]...)
				continue
			}
			h := hosts[rnd.IntN(len(hosts))]
			rec, err := h.h.Manager.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: reqs[rnd.IntN(len(reqs))].Profile})
			if err == nil {
				alive = append(alive, live{h, rec.UUID})
			}
		}
		converged(t, c, hosts...)
		if d := candidatesDiffer(t, c, hosts); d != "" {
			t.Fatalf("round %d (%d instances):\n%s", round, len(alive), d)
		}
	}
	t.Logf("%d rounds, %d instances at the end: candidates equal the admission on every GPU", 6, len(alive))
}
