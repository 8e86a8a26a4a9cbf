package fleet

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

func TestCheckOffer(t *testing.T) {
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	good := map[string][]string{
		"H100-SXM5-80GB": {"3g.40gb", "H100XM-3-40C", "NVIDIA H100XM-8C", "passthrough"},
		"L4-24GB":        {"L4-4Q"},
	}
	if err := CheckOffer(cat, good); err != nil {
		t.Fatalf("CheckOffer(%v) = %v", good, err)
	}
	if err := CheckOffer(cat, nil); err != nil {
		t.Fatalf("CheckOffer(nil) = %v", err)
	}
	for _, c := range []struct {
		offer map[string][]string
		want  string
	}{
		{map[string][]string{"H99-1GB": {"3g.40gb"}}, `no GPU model "H99-1GB"`},
		{map[string][]string{"": {"3g.40gb"}}, `no GPU model ""`},
		{map[string][]string{"L4-24GB": {}}, "no profile listed"},
		{map[string][]string{"L4-24GB": {""}}, "an empty profile name"},
		{map[string][]string{"L4-24GB": {"3g.40gb"}}, `model L4-24GB has no profile "3g.40gb"`},
		{map[string][]string{"H100-SXM5-80GB": {"L4-4Q"}}, `model H100-SXM5-80GB has no profile "L4-4Q"`},
		{map[string][]string{"H100-SXM5-80GB": {"1c.3g.40gb"}}, "compute-instance profile"},
		{map[string][]string{"L4-24GB": {"L4-4Q", "NVIDIA L4-4Q"}}, "listed twice"},
	} {
		err := CheckOffer(cat, c.offer)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, manager.ErrInvalidArgument) {
			t.Errorf("CheckOffer(%v) = %v; want InvalidArgument naming %q", c.offer, err, c.want)
		}
	}
}

// TestOfferPublishesListedProfiles: with fleet.offer a model's GPUs carry
// the classes of the listed profiles and the shared classes, nothing else;
// a model it does not name keeps every class. A local create of a profile
// not offered carves without a claim and returns with its allocation
// written, its class's total what it holds.
func TestOfferPublishesListedProfiles(t *testing.T) {
	srv, c := startPlacement(t)
	offer := map[string][]string{
		"L4-24GB":        {"NVIDIA L4-4Q"},
		"H100-SXM5-80GB": {"3g.40gb", "1g.10gb", "passthrough"},
	}
	a := startHost(t, "hosto", srv.URL(), nil, Config{Offer: offer})
	a.pass(t)
	ctx := context.Background()
	classes := func(pci string) []string {
		t.Helper()
		inv, _, err := c.Inventories(ctx, GPUProviderUUID(a.s.top(), pci))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for rc := range inv {
			out = append(out, rc)
		}
		sort.Strings(out)
		return out
	}
	if got, want := strings.Join(classes(sim.DefaultL4), " "), "CUSTOM_VGPUD_GPU CUSTOM_VGPUD_L4_4Q CUSTOM_VGPUD_VGPU_FB_MIB"; got != want {
		t.Fatalf("the L4 offering L4-4Q publishes %s; want %s", got, want)
	}
	if got, want := strings.Join(classes(sim.DefaultH100MIG), " "), "CUSTOM_VGPUD_GPU CUSTOM_VGPUD_MIG_1G_10GB CUSTOM_VGPUD_MIG_3G_40GB CUSTOM_VGPUD_MIG_SLICE CUSTOM_VGPUD_PASSTHROUGH"; got != want {
		t.Fatalf("the H100 offering 3g.40gb, 1g.10gb and whole publishes %s; want %s", got, want)
	}
	if n := len(classes(sim.DefaultA10)); n < 10 {
		t.Fatalf("the A10, whose model the offer does not name, publishes %d classes: %v", n, classes(sim.DefaultA10))
	}

	octx, outcome := manager.WithPlacementOutcome(ctx)
	rec, err := a.h.Manager.Create(octx, manager.CreateRequest{Tenant: "acme", Profile: "L4-2Q", GPU: sim.DefaultL4})
	if err != nil {
		t.Fatalf("a local create of a type the L4 does not offer: %v", err)
	}
	if got := outcome.Behind(); got != "" {
		t.Fatalf("a local create of a type not offered reports Placement behind: %q", got)
	}
	l4 := GPUProviderUUID(a.s.top(), sim.DefaultL4)
	cons, err := c.Consumer(ctx, rec.UUID)
	if err != nil || cons.Allocations[l4].Resources["CUSTOM_VGPUD_L4_2Q"] != 1 || cons.Allocations[l4].Resources[GPUClass] != 1 {
		t.Fatalf("allocation right after the create returned: %+v, %v", cons.Allocations, err)
	}
	inv, _, err := c.Inventories(ctx, l4)
	if err != nil || inv["CUSTOM_VGPUD_L4_2Q"].Total != 1 {
		t.Fatalf("the L4's L4-2Q inventory: %+v, %v; want total 1, what the instance holds", inv["CUSTOM_VGPUD_L4_2Q"], err)
	}
	a.pass(t)
	if st, err := a.s.Status(ctx); err != nil || len(st.Differences) != 0 {
		t.Fatalf("fleet status after the pass: %+v, %v", st.Differences, err)
	}
	if err := a.h.Manager.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	a.pass(t)
	if got, want := strings.Join(classes(sim.DefaultL4), " "), "CUSTOM_VGPUD_GPU CUSTOM_VGPUD_L4_4Q CUSTOM_VGPUD_VGPU_FB_MIB"; got != want {
		t.Fatalf("after the destroy the L4 publishes %s; want %s", got, want)
	}
}

// TestOfferChangeKeepsPendingClaim: a scheduler's claim of a profile the
// host stops offering (a reload changed fleet.offer) before its create
// came is still adopted: the host can carve it, and the allocation the
// scheduler holds is the truth for its create.
func TestOfferChangeKeepsPendingClaim(t *testing.T) {
	srv, c := startPlacement(t)
	a := startHost(t, "hostp", srv.URL(), nil, Config{})
	a.pass(t)
	ctx := context.Background()
	id := schedulerClaims(t, c, "CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_GPU:1,CUSTOM_VGPUD_MIG_SLICE:4")
	s, err := New(Config{Host: "hostp", Grace: time.Hour, ClaimTimeout: 15 * time.Second, Offer: map[string][]string{"H100-SXM5-80GB": {"1g.10gb"}}},
		newClient(t, srv.URL()), a.h.Manager, quietLog(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	a.h.Manager.SetFleet(s)
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", PlacementConsumer: id})
	if err != nil || rec.GPUPCI != sim.DefaultH100MIG {
		t.Fatalf("a scheduler's create of a profile no longer offered = %+v, %v", rec, err)
	}
	if err := s.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status(ctx); err != nil || len(st.Differences) != 0 {
		t.Fatalf("fleet status: %+v, %v", st.Differences, err)
	}
	if cons, err := c.Consumer(ctx, id); err != nil || len(cons.Allocations) != 1 {
		t.Fatalf("the scheduler's allocation after the create: %+v, %v", cons, err)
	}
}
