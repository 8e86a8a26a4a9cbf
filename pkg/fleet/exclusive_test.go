package fleet

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// flavorResources is what the flavor table's flavor of profile asks in
// its numbered group, as an allocation's resources.
func flavorResources(t *testing.T, profile string, form tplacement.Form) map[string]int {
	t.Helper()
	out := map[string]int{}
	for k, v := range tplacement.FlavorOf(profile).ExtraSpecs(ClassName, form) {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(k, "resources1:")] = n
	}
	return out
}

// TestWholeGPUExclusiveAtClaim: two schedulers race a whole-GPU claim
// against another profile's claim on the same GPU, as the flavor table
// asks them; Placement itself refuses one of the two at claim time, on a
// MIG GPU and on a time-sliced GPU whose vGPU flavor asks its class alone
// (no framebuffer), and the winner's create is carved.
func TestWholeGPUExclusiveAtClaim(t *testing.T) {
	srv, c := startPlacement(t)
	ctx := context.Background()
	a := startHost(t, "hostx", srv.URL(), nil, Config{})
	converged(t, c, a)
	for _, tc := range []struct {
		pci, other string
		form       tplacement.Form
	}{
		{sim.DefaultH100MIG, "1g.10gb", tplacement.WithFramebuffer},
		{sim.DefaultL4, "L4-4Q", tplacement.ClassAlone},
	} {
		prov := GPUProviderUUID(a.s.top(), tc.pci)
		if inv, _, _ := c.Inventories(ctx, prov); inv[GPUClass].Total != GPUUnits || inv[GPUClass].Reserved != 0 {
			t.Fatalf("%s: %s = %+v, want total %d", tc.pci, GPUClass, inv[GPUClass], GPUUnits)
		}
		for round := 0; round < 4; round++ {
			ids := []string{uuid.NewString(), uuid.NewString()}
			profiles := []string{profileWhole, tc.other}
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range ids {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					errs[i] = claim(c, ids[i], prov, flavorResources(t, profiles[i], tc.form))
				}(i)
			}
			wg.Wait()
			won := -1
			for i, err := range errs {
				switch {
				case err == nil:
					if won >= 0 {
						t.Fatalf("%s round %d: Placement accepted a whole GPU and %s on one GPU", tc.pci, round, tc.other)
					}
					won = i
				case errors.Is(err, placementapi.ErrCapacity), errors.Is(err, placementapi.ErrConflict):
				default:
					t.Fatalf("%s round %d: claim of %s: %v", tc.pci, round, profiles[i], err)
				}
			}
			if won < 0 {
				t.Fatalf("%s round %d: Placement refused both claims: %v", tc.pci, round, errs)
			}
			// The loser, asked again now, is refused too.
			if err := claim(c, ids[1-won], prov, flavorResources(t, profiles[1-won], tc.form)); !errors.Is(err, placementapi.ErrCapacity) {
				t.Fatalf("%s round %d: %s claimed beside %s = %v, want ErrCapacity", tc.pci, round, profiles[1-won], profiles[won], err)
			}
			rec, err := a.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profiles[won], PlacementConsumer: ids[won]})
			if err != nil || rec.GPUPCI != tc.pci {
				t.Fatalf("%s round %d: the winner's create (%s) = %+v, %v", tc.pci, round, profiles[won], rec, err)
			}
			converged(t, c, a)
			if err := a.h.Manager.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
			converged(t, c, a)
		}
	}
}
