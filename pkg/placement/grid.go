package placement

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/profile"
)

// MaxSlices is the widest slot grid the package handles: occupancy is a
// 64-bit mask.
const MaxSlices = 64

// Profile is one MIG GPU-instance profile as placement sees it.
type Profile struct {
	// ID is the real profile ID the driver takes (19, 14, 9, ...).
	ID int
	// Name without the "MIG " prefix, e.g. "3g.40gb".
	Name string
	// Size is the number of memory slices (placement units) an instance covers.
	Size int
	// Starts are the legal start slots, ascending.
	Starts []int
	// MaxInstances is the per-GPU limit of this profile (1 for +me profiles).
	MaxInstances int
	// ComputeSlices is the "3" of 3g; profiles with 3 or more count as large.
	ComputeSlices int
}

// Large reports whether the profile is one of the large ones (3g and up)
// that fragmentation hurts first.
func (p Profile) Large() bool { return p.ComputeSlices >= 3 }

// Grid is one GPU model's slot grid: the same *Grid is shared by every GPU of
// that model.
type Grid struct {
	// Slices is the number of placement units (8 on H100, 4 on A30, 12 on
	// RTX PRO 6000 Blackwell).
	Slices int
	// Profiles lists every GPU-instance profile of the model.
	Profiles []Profile
}

// Profile returns the profile named name; a leading "MIG " is ignored.
func (g *Grid) Profile(name string) (Profile, bool) {
	i := g.profileIndex(name)
	if i < 0 {
		return Profile{}, false
	}
	return g.Profiles[i], true
}

func (g *Grid) profileIndex(name string) int {
	name = strings.TrimPrefix(name, "MIG ")
	for i := range g.Profiles {
		if g.Profiles[i].Name == name {
			return i
		}
	}
	return -1
}

func (g *Grid) profileIndexByID(id int) int {
	for i := range g.Profiles {
		if g.Profiles[i].ID == id {
			return i
		}
	}
	return -1
}

// Validate checks what the allocator relies on: a grid of 1..64 slices and
// profiles whose every start keeps the instance inside the grid.
func (g *Grid) Validate() error {
	if g.Slices <= 0 || g.Slices > MaxSlices {
		return fmt.Errorf("grid has %d slices; want 1..%d", g.Slices, MaxSlices)
	}
	seen := map[string]bool{}
	for _, p := range g.Profiles {
		if p.Size <= 0 || p.Size > g.Slices {
			return fmt.Errorf("profile %s: size %d outside 1..%d", p.Name, p.Size, g.Slices)
		}
		if p.MaxInstances <= 0 {
			return fmt.Errorf("profile %s: max instances %d must be positive", p.Name, p.MaxInstances)
		}
		if seen[p.Name] {
			return fmt.Errorf("profile %s: listed twice", p.Name)
		}
		seen[p.Name] = true
		if !sort.IntsAreSorted(p.Starts) {
			return fmt.Errorf("profile %s: starts %v are not ascending", p.Name, p.Starts)
		}
		for _, s := range p.Starts {
			if s < 0 || s+p.Size > g.Slices {
				return fmt.Errorf("profile %s: start %d puts the instance outside the %d-slice grid", p.Name, s, g.Slices)
			}
		}
	}
	return nil
}

// GridFromModel builds the slot grid of a catalog model; nil when the model
// has no MIG.
func GridFromModel(m *profile.Model) *Grid {
	if m == nil || m.MIG == nil {
		return nil
	}
	g := &Grid{Slices: m.MIG.MemorySlices}
	for _, p := range m.MIG.GPUInstanceProfiles {
		starts := append([]int(nil), p.Placements...)
		sort.Ints(starts)
		g.Profiles = append(g.Profiles, Profile{
			ID:            p.ID,
			Name:          p.Name,
			Size:          p.Size,
			Starts:        starts,
			MaxInstances:  p.MaxInstances,
			ComputeSlices: p.ComputeSlices,
		})
	}
	return g
}

// span is the mask of [start, start+size).
func span(start, size int) uint64 {
	if size >= 64 {
		return ^uint64(0)
	}
	return ((uint64(1) << size) - 1) << start
}

// fits reports whether profile i of grid g can be created at start on a GPU
// with occupancy mask and per-profile counts: the legality model of the
// driver (start listed, no overlap, instance limit).
func fits(g *Grid, i int, mask uint64, counts []int, start int) bool {
	p := &g.Profiles[i]
	if counts[i] >= p.MaxInstances {
		return false
	}
	if span(start, p.Size)&mask != 0 {
		return false
	}
	for _, s := range p.Starts {
		if s == start {
			return true
		}
	}
	return false
}

// room is how many more instances of profile i fit on a GPU with this
// occupancy, placed alone (each profile counted independently). The starts of
// one profile are same-size intervals sorted by start, so taking every free
// one that does not overlap the previous choice is the maximum.
func room(g *Grid, i int, mask uint64, counts []int) int {
	p := &g.Profiles[i]
	left := p.MaxInstances - counts[i]
	n, end := 0, -1
	for _, s := range p.Starts {
		if n >= left {
			break
		}
		if s < end || span(s, p.Size)&mask != 0 {
			continue
		}
		n++
		end = s + p.Size
	}
	return n
}

// freeSlices counts the unoccupied slices of a grid.
func freeSlices(g *Grid, mask uint64) int {
	return g.Slices - bits.OnesCount64(mask&span(0, g.Slices))
}

// largestFirst returns the profile indexes of g ordered by how much their
// loss costs: larger size first, then more compute, then the profile that
// allows more instances (the +me variants, limited to one, come after their
// plain twins), then name for a stable order.
func largestFirst(g *Grid) []int {
	idx := make([]int, len(g.Profiles))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		pa, pb := &g.Profiles[idx[a]], &g.Profiles[idx[b]]
		if pa.Size != pb.Size {
			return pa.Size > pb.Size
		}
		if pa.ComputeSlices != pb.ComputeSlices {
			return pa.ComputeSlices > pb.ComputeSlices
		}
		if pa.MaxInstances != pb.MaxInstances {
			return pa.MaxInstances > pb.MaxInstances
		}
		return pa.Name < pb.Name
	})
	return idx
}
