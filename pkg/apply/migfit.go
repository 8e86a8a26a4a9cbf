package apply

import (
	"sort"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// Which of several interchangeable MIG instances to keep matters: two
// 1g.10gb kept at slots 4 and 6 leave no room for the 3g.40gb and 2g.20gb
// a mixed layout adds, while two kept at 0 and 1 do. Diff therefore picks,
// among the ways of keeping the instances the layout still wants, one
// under which the instances to create find slots on the GPU's grid (as
// NVML reports its placements), preferring attached and older instances.
// Only when no way of keeping them leaves room does it re-create them.

// slotMask is a set of a GPU's MIG memory slices.
type slotMask uint64

func rangeMask(start, size int) slotMask {
	if start < 0 || size <= 0 || start+size > 64 {
		return 0
	}
	return slotMask((uint64(1)<<size)-1) << start
}

// migFit holds the GPU's grid: each GPU-instance profile's legal placements.
type migFit struct {
	placements map[string][]slotMask
	size       map[string]int
}

func newMIGFit(g manager.GPUView) *migFit {
	f := &migFit{placements: map[string][]slotMask{}, size: map[string]int{}}
	for _, p := range g.MIG.Profiles {
		if p.Name == "" {
			continue
		}
		for _, pl := range p.Placements {
			f.placements[p.Name] = append(f.placements[p.Name], rangeMask(pl.Start, pl.Size))
		}
		f.size[p.Name] = p.Slices
	}
	return f
}

// feasible reports whether GPU instances of the named profiles all fit
// beside the occupied slices. Largest first prunes the search early; the
// grid has eight slices, so the search is small.
func (f *migFit) feasible(occupied slotMask, needs []string) bool {
	needs = append([]string(nil), needs...)
	sort.SliceStable(needs, func(i, j int) bool { return f.size[needs[i]] > f.size[needs[j]] })
	var place func(i int, used slotMask) bool
	place = func(i int, used slotMask) bool {
		if i == len(needs) {
			return true
		}
		for _, m := range f.placements[needs[i]] {
			if m&used == 0 && place(i+1, used|m) {
				return true
			}
		}
		return false
	}
	return place(0, occupied)
}

// slots is the range an instance's GPU instance holds, 0 if none.
func slots(in manager.InstanceView) slotMask {
	if in.Kind != store.KindMIG && in.Kind != store.KindMIGVGPU {
		return 0
	}
	return rangeMask(in.GIStart, in.GISize)
}

// maxChoices bounds the ways of keeping tried on one GPU.
const maxChoices = 4096

// chooseKeeps returns, per group, which of its (preference-ordered)
// instances to keep. fixed is what stays occupied whatever is chosen;
// creates names the profiles of instances created in any case, and
// perMissing the profile a group creates for each instance it does not
// keep. ok is false when the grid cannot be reasoned about (a profile
// without known placements), and the default (first n) applies.
func (f *migFit) chooseKeeps(fixed slotMask, groups [][]manager.InstanceView, want []int, creates []string, profiles []string) ([][]bool, bool) {
	for _, p := range creates {
		if len(f.placements[p]) == 0 {
			return nil, false
		}
	}
	for i, p := range profiles {
		if want[i] > 0 && len(f.placements[p]) == 0 {
			return nil, false
		}
	}
	choice := make([][]bool, len(groups))
	// The options of each group: subsets of size n = min(want, len), those
	// keeping every attached instance first, in preference order.
	opts := make([][][]bool, len(groups))
	for i, g := range groups {
		n := min(want[i], len(g))
		opts[i] = subsets(g, n)
	}
	tried := 0
	var search func(i int, occ slotMask, needs []string) bool
	search = func(i int, occ slotMask, needs []string) bool {
		if tried >= maxChoices {
			return false
		}
		if i == len(groups) {
			tried++
			return f.feasible(occ, needs)
		}
		for _, o := range opts[i] {
			m := occ
			n := needs
			kept := 0
			for j, k := range o {
				if k {
					m |= slots(groups[i][j])
					kept++
				}
			}
			for ; kept < want[i]; kept++ {
				n = append(n[:len(n):len(n)], profiles[i])
			}
			if search(i+1, m, n) {
				choice[i] = o
				return true
			}
		}
		return false
	}
	if search(0, fixed, creates) {
		return choice, true
	}
	// No way of keeping them leaves room: keep only the attached ones
	// (destroying those is refused) and re-create the rest.
	occ, needs := fixed, append([]string(nil), creates...)
	for i, g := range groups {
		choice[i] = make([]bool, len(g))
		kept := 0
		for j, in := range g {
			if in.Attachment != nil && kept < want[i] {
				choice[i][j] = true
				occ |= slots(in)
				kept++
			}
		}
		for ; kept < want[i]; kept++ {
			needs = append(needs, profiles[i])
		}
	}
	if f.feasible(occ, needs) {
		return choice, true
	}
	return nil, false
}

// subsets lists the ways of keeping n of g, each keeping every attached
// instance (as far as n allows), in lexicographic order of g's preference.
func subsets(g []manager.InstanceView, n int) [][]bool {
	var out [][]bool
	att := 0
	for _, in := range g {
		if in.Attachment != nil {
			att++
		}
	}
	needAtt := min(att, n)
	cur := make([]bool, len(g))
	var rec func(i, left, attLeft int)
	rec = func(i, left, attLeft int) {
		if len(out) >= maxChoices {
			return
		}
		if left == 0 {
			if attLeft <= 0 {
				out = append(out, append([]bool(nil), cur...))
			}
			return
		}
		if len(g)-i < left {
			return
		}
		cur[i] = true
		a := attLeft
		if g[i].Attachment != nil {
			a--
		}
		rec(i+1, left-1, a)
		cur[i] = false
		rec(i+1, left, attLeft)
	}
	rec(0, n, needAtt)
	return out
}
