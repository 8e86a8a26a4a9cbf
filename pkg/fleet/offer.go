package fleet

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
)

// fleet.offer: per GPU model, the profiles whose classes the host
// publishes, as Nova's enabled_mdev_types names the types a pGPU offers.
// Placement's allocation candidates cost grows with the classes each
// matching provider carries (bench/candidatecost), and an empty GPU can
// carve 20 to 35 profiles; an operator who sells a few of them publishes
// those. What is not offered stays carvable by a local create; its
// instances' allocations are written as every other's, with the class's
// total what they hold.

// offerName is a profile's name as an offer compares it: without the
// NVIDIA or GRID prefix of the driver's vGPU type names (profile.TypeName),
// or the MIG one its GPU-instance profile names may carry.
func offerName(p string) string {
	return strings.TrimPrefix(profile.TypeName(p), "MIG ")
}

// CheckOffer refuses an offer that names a model the catalog lacks, or a
// profile the model does not have or the fleet does not publish (compute
// instances narrower than their GPU instance). Each model's list must name
// at least one profile, each once.
func CheckOffer(cat *profile.Catalog, offer map[string][]string) error {
	models := make([]string, 0, len(offer))
	for m := range offer {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, name := range models {
		md, ok := cat.Model(name)
		if !ok {
			return fmt.Errorf("fleet.offer: the catalog has no GPU model %q: %w", name, manager.ErrInvalidArgument)
		}
		if len(offer[name]) == 0 {
			return fmt.Errorf("fleet.offer.%s: no profile listed (leave the model out to publish all of them): %w", name, manager.ErrInvalidArgument)
		}
		seen := map[string]bool{}
		for _, p := range offer[name] {
			if err := checkOffered(md, p); err != nil {
				return fmt.Errorf("fleet.offer.%s: %w: %w", name, err, manager.ErrInvalidArgument)
			}
			if seen[offerName(p)] {
				return fmt.Errorf("fleet.offer.%s: %q is listed twice: %w", name, p, manager.ErrInvalidArgument)
			}
			seen[offerName(p)] = true
		}
	}
	return nil
}

func checkOffered(md *profile.Model, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("an empty profile name")
	case p == manager.ProfilePassthrough:
		return nil
	}
	if md.MIG != nil {
		if _, ok := md.GPUInstanceProfileByName(p); ok {
			return nil
		}
		if _, _, ok := md.ComputeInstanceByName(p); ok {
			return fmt.Errorf("compute-instance profile %q is not published to Placement (its GPU instance's profile is)", p)
		}
	}
	if _, ok := md.VGPUTypeByName(p); ok {
		return nil
	}
	return fmt.Errorf("model %s has no profile %q", md.Name, p)
}

// offerSets is offer as sets of offerName, by model.
func offerSets(offer map[string][]string) map[string]map[string]bool {
	if len(offer) == 0 {
		return nil
	}
	out := make(map[string]map[string]bool, len(offer))
	for m, ps := range offer {
		out[m] = map[string]bool{}
		for _, p := range ps {
			out[m][offerName(p)] = true
		}
	}
	return out
}

// offered is view with no room published for the classes a GPU's model
// does not offer (Config.Offer). The classes stay known, with room 0: an
// instance of such a profile still has its allocation and its class a
// total of what is held, a scheduler's allocation written before the
// offer changed is still adopted, and carvable inventories search the
// same classes whatever the offer (their cache is keyed by the rooms).
func (s *Syncer) offered(view []manager.FleetGPU) []manager.FleetGPU {
	if len(s.offer) == 0 {
		return view
	}
	out := make([]manager.FleetGPU, len(view))
	for i, g := range view {
		out[i] = g
		set, ok := s.offer[g.Model]
		if !ok {
			continue
		}
		out[i].Classes = make([]manager.FleetClass, len(g.Classes))
		for j, c := range g.Classes {
			if !set[offerName(c.Profile)] {
				c.Room = 0
			}
			out[i].Classes[j] = c
		}
	}
	return out
}
