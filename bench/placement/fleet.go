package main

import (
	"fmt"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// Catalog names of the models the benchmark fleets use.
const (
	modelH100 = "H100-SXM5-80GB"
	modelA30  = "A30-24GB"
	modelRTX  = "RTX-PRO-6000-BSE-96GB"
)

// fallbackGrids are the MIG tables of the host-interfaces reference (section
// 3.2), used only for models the embedded catalog does not have yet.
func fallbackGrids() map[string]*placement.Grid {
	p := func(id int, name string, size int, starts []int, maxN, cs int) placement.Profile {
		return placement.Profile{ID: id, Name: name, Size: size, Starts: starts, MaxInstances: maxN, ComputeSlices: cs}
	}
	rtx1 := []int{0, 3, 6, 9}
	rtx2 := []int{0, 6}
	return map[string]*placement.Grid{
		modelH100: {Slices: 8, Profiles: []placement.Profile{
			p(19, "1g.10gb", 1, []int{0, 1, 2, 3, 4, 5, 6}, 7, 1),
			p(20, "1g.10gb+me", 1, []int{0, 1, 2, 3, 4, 5, 6}, 1, 1),
			p(15, "1g.20gb", 2, []int{0, 2, 4, 6}, 4, 1),
			p(14, "2g.20gb", 2, []int{0, 2, 4}, 3, 2),
			p(9, "3g.40gb", 4, []int{0, 4}, 2, 3),
			p(5, "4g.40gb", 4, []int{0}, 1, 4),
			p(0, "7g.80gb", 8, []int{0}, 1, 7),
		}},
		modelA30: {Slices: 4, Profiles: []placement.Profile{
			p(14, "1g.6gb", 1, []int{0, 1, 2, 3}, 4, 1),
			p(21, "1g.6gb+me", 1, []int{0, 1, 2, 3}, 1, 1),
			p(5, "2g.12gb", 2, []int{0, 2}, 2, 2),
			p(6, "2g.12gb+me", 2, []int{0, 2}, 1, 2),
			p(0, "4g.24gb", 4, []int{0}, 1, 4),
		}},
		modelRTX: {Slices: 12, Profiles: []placement.Profile{
			p(14, "1g.24gb", 3, rtx1, 4, 1),
			p(21, "1g.24gb+me", 3, rtx1, 1, 1),
			p(47, "1g.24gb+gfx", 3, rtx1, 4, 1),
			p(65, "1g.24gb+me.all", 3, rtx1, 1, 1),
			p(67, "1g.24gb-me", 3, rtx1, 4, 1),
			p(5, "2g.48gb", 6, rtx2, 2, 2),
			p(35, "2g.48gb+gfx", 6, rtx2, 2, 2),
			p(64, "2g.48gb+me.all", 6, rtx2, 1, 2),
			p(66, "2g.48gb-me", 6, rtx2, 2, 2),
			p(0, "4g.96gb", 12, []int{0}, 1, 4),
			p(32, "4g.96gb+gfx", 12, []int{0}, 1, 4),
		}},
	}
}

// loadGrids returns the grid of every benchmark model and where it came
// from: the embedded catalog when it has the model, the reference tables
// otherwise.
func loadGrids() (map[string]*placement.Grid, map[string]string, error) {
	// A catalog that does not load (being edited) must not stop the
	// benchmark of the allocator: the reference tables stand in, and the
	// report says so.
	cat, catErr := profile.Load(profiles.FS)
	fb := fallbackGrids()
	grids := map[string]*placement.Grid{}
	source := map[string]string{}
	for _, name := range []string{modelH100, modelA30, modelRTX} {
		if catErr != nil {
			grids[name] = fb[name]
			source[name] = fmt.Sprintf("reference tables (the embedded catalog does not load: %v)", catErr)
			continue
		}
		if m, ok := cat.Model(name); ok && m.MIG != nil {
			grids[name] = placement.GridFromModel(m)
			source[name] = "catalog " + m.Source()
			continue
		}
		grids[name] = fb[name]
		source[name] = "reference tables (not yet in the catalog)"
	}
	for name, g := range grids {
		if err := g.Validate(); err != nil {
			return nil, nil, fmt.Errorf("grid %s: %w", name, err)
		}
	}
	return grids, source, nil
}

// fleetSpec is a fleet: how many GPUs of each model, in fleet order.
type fleetSpec struct {
	Name   string
	Groups []fleetGroup
}

type fleetGroup struct {
	Model string
	Count int
}

func benchFleets() []fleetSpec {
	return []fleetSpec{
		{Name: "8xH100", Groups: []fleetGroup{{modelH100, 8}}},
		{Name: "mixed", Groups: []fleetGroup{{modelH100, 4}, {modelA30, 2}, {modelRTX, 2}}},
	}
}

// build makes an empty fleet of placement GPUs.
func (f fleetSpec) build(grids map[string]*placement.Grid) []placement.GPU {
	var out []placement.GPU
	for _, g := range f.Groups {
		for i := 0; i < g.Count; i++ {
			out = append(out, placement.GPU{
				ID:    fmt.Sprintf("GPU-%s-%d", g.Model, i),
				Model: g.Model,
				Grid:  grids[g.Model],
			})
		}
	}
	return out
}

// mix is a profile mix: per model, request weight per profile.
type mix struct {
	Name    string
	Weights map[string][]weighted
}

type weighted struct {
	Profile string  `json:"profile"`
	Weight  float64 `json:"weight"`
}

func benchMixes() []mix {
	w := func(pairs ...any) []weighted {
		var out []weighted
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, weighted{pairs[i].(string), float64(pairs[i+1].(int))})
		}
		return out
	}
	return []mix{
		{Name: "small-heavy", Weights: map[string][]weighted{
			modelH100: w("1g.10gb", 40, "1g.10gb+me", 5, "1g.20gb", 15, "2g.20gb", 20, "3g.40gb", 10, "4g.40gb", 5, "7g.80gb", 5),
			modelA30:  w("1g.6gb", 55, "1g.6gb+me", 5, "2g.12gb", 30, "4g.24gb", 10),
			modelRTX:  w("1g.24gb", 60, "2g.48gb", 30, "4g.96gb", 10),
		}},
		{Name: "mixed", Weights: map[string][]weighted{
			modelH100: w("1g.10gb", 20, "1g.10gb+me", 5, "1g.20gb", 10, "2g.20gb", 20, "3g.40gb", 20, "4g.40gb", 10, "7g.80gb", 15),
			modelA30:  w("1g.6gb", 35, "1g.6gb+me", 5, "2g.12gb", 30, "4g.24gb", 30),
			modelRTX:  w("1g.24gb", 40, "2g.48gb", 30, "4g.96gb", 30),
		}},
		{Name: "large-heavy", Weights: map[string][]weighted{
			modelH100: w("1g.10gb", 10, "1g.20gb", 5, "2g.20gb", 10, "3g.40gb", 30, "4g.40gb", 20, "7g.80gb", 25),
			modelA30:  w("1g.6gb", 20, "2g.12gb", 30, "4g.24gb", 50),
			modelRTX:  w("1g.24gb", 20, "2g.48gb", 30, "4g.96gb", 50),
		}},
	}
}
