package placement

import (
	"fmt"
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// h100Grid is the H100 table of the host-interfaces reference (3.2), kept
// here so that the tests do not depend on catalog edits; TestGridFromModel
// checks that the catalog agrees.
func h100Grid() *Grid {
	return &Grid{Slices: 8, Profiles: []Profile{
		{ID: 19, Name: "1g.10gb", Size: 1, Starts: []int{0, 1, 2, 3, 4, 5, 6}, MaxInstances: 7, ComputeSlices: 1},
		{ID: 20, Name: "1g.10gb+me", Size: 1, Starts: []int{0, 1, 2, 3, 4, 5, 6}, MaxInstances: 1, ComputeSlices: 1},
		{ID: 15, Name: "1g.20gb", Size: 2, Starts: []int{0, 2, 4, 6}, MaxInstances: 4, ComputeSlices: 1},
		{ID: 14, Name: "2g.20gb", Size: 2, Starts: []int{0, 2, 4}, MaxInstances: 3, ComputeSlices: 2},
		{ID: 9, Name: "3g.40gb", Size: 4, Starts: []int{0, 4}, MaxInstances: 2, ComputeSlices: 3},
		{ID: 5, Name: "4g.40gb", Size: 4, Starts: []int{0}, MaxInstances: 1, ComputeSlices: 4},
		{ID: 0, Name: "7g.80gb", Size: 8, Starts: []int{0}, MaxInstances: 1, ComputeSlices: 7},
	}}
}

// a30Grid is the A30 table of the reference (3.2).
func a30Grid() *Grid {
	return &Grid{Slices: 4, Profiles: []Profile{
		{ID: 14, Name: "1g.6gb", Size: 1, Starts: []int{0, 1, 2, 3}, MaxInstances: 4, ComputeSlices: 1},
		{ID: 21, Name: "1g.6gb+me", Size: 1, Starts: []int{0, 1, 2, 3}, MaxInstances: 1, ComputeSlices: 1},
		{ID: 5, Name: "2g.12gb", Size: 2, Starts: []int{0, 2}, MaxInstances: 2, ComputeSlices: 2},
		{ID: 0, Name: "4g.24gb", Size: 4, Starts: []int{0}, MaxInstances: 1, ComputeSlices: 4},
	}}
}

// slot builds a used slot of a profile of g; opts: "m" movable, "f" foreign.
func slot(g *Grid, name string, start int, instance string, opts ...string) Slot {
	p, ok := g.Profile(name)
	if !ok {
		panic("no profile " + name)
	}
	s := Slot{Start: start, Size: p.Size, ProfileID: p.ID, Instance: instance}
	for _, o := range opts {
		switch o {
		case "m":
			s.Movable = true
		case "f":
			s.Foreign = true
		default:
			s.Tenant = o
		}
	}
	return s
}

func gpus(g *Grid, model string, used ...[]Slot) []GPU {
	out := make([]GPU, len(used))
	for i, u := range used {
		out[i] = GPU{ID: fmt.Sprintf("GPU-%d", i), Model: model, Grid: g, Used: u}
	}
	return out
}

func loadCatalog(t testing.TB) *profile.Catalog {
	t.Helper()
	c, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatalf("load catalog: %v", err)
	}
	return c
}
