package main

import (
	"fmt"
	"sort"

	"github.com/vgpud/vgpud/pkg/placement"
)

// The oracle decides whether a multiset of instances (counts per profile)
// can be split across a model's GPUs into legal single-GPU configurations,
// as if every live instance could be re-placed on each arrival.
//
// A configuration is the count vector of a set of non-overlapping legal
// placements that respects the per-profile instance limits. The set of
// configurations is closed under removing instances, so the multiset N is
// feasible on k GPUs iff N is covered by k maximal configurations; the
// search puts one instance of the largest remaining profile on the next GPU
// (GPUs of a model are interchangeable), tries each maximal configuration
// holding that profile, takes as much of N as it allows (taking more is
// never worse) and recurses, memoized on (N, k).

const (
	dimBits = 7 // count per profile per model: up to 127
	maxDims = 8
	dimMask = 1<<dimBits - 1
)

type vec uint64

func (v vec) get(d int) int { return int(v>>(d*dimBits)) & dimMask }

func (v vec) add(d, n int) vec { return v + vec(n)<<(d*dimBits) }

// oracleModel is the oracle for one GPU model.
type oracleModel struct {
	model   string
	grid    *placement.Grid
	dims    []string // profile names, largest first
	dimOf   map[string]int
	sizes   []int
	configs []vec // maximal configurations
	memo    map[uint64]bool
	calls   int
}

func newOracleModel(model string, grid *placement.Grid, profiles []string) (*oracleModel, error) {
	if len(profiles) > maxDims {
		return nil, fmt.Errorf("oracle: %d profiles for %s, at most %d", len(profiles), model, maxDims)
	}
	o := &oracleModel{model: model, grid: grid, dimOf: map[string]int{}, memo: map[uint64]bool{}}
	var ps []placement.Profile
	for _, name := range profiles {
		p, ok := grid.Profile(name)
		if !ok {
			return nil, fmt.Errorf("oracle: model %s has no profile %s", model, name)
		}
		ps = append(ps, p)
	}
	sort.SliceStable(ps, func(a, b int) bool {
		if ps[a].Size != ps[b].Size {
			return ps[a].Size > ps[b].Size
		}
		return ps[a].ComputeSlices > ps[b].ComputeSlices
	})
	for d, p := range ps {
		o.dims = append(o.dims, p.Name)
		o.dimOf[p.Name] = d
		o.sizes = append(o.sizes, p.Size)
	}
	o.configs = maximal(enumerate(ps))
	return o, nil
}

// enumerate lists the count vector of every legal single-GPU configuration.
func enumerate(ps []placement.Profile) []vec {
	type pl struct {
		d    int
		mask uint64
	}
	var pls []pl
	for d, p := range ps {
		for _, s := range p.Starts {
			pls = append(pls, pl{d, ((uint64(1) << p.Size) - 1) << s})
		}
	}
	seen := map[vec]bool{}
	var out []vec
	var rec func(i int, mask uint64, v vec)
	rec = func(i int, mask uint64, v vec) {
		if i == len(pls) {
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
			return
		}
		rec(i+1, mask, v)
		p := pls[i]
		if p.mask&mask == 0 && v.get(p.d) < ps[p.d].MaxInstances {
			rec(i+1, mask|p.mask, v.add(p.d, 1))
		}
	}
	rec(0, 0, 0)
	return out
}

func dominates(a, b vec, dims int) bool {
	for d := 0; d < dims; d++ {
		if a.get(d) < b.get(d) {
			return false
		}
	}
	return true
}

// maximal keeps the configurations no other one contains.
func maximal(all []vec) []vec {
	var out []vec
	for i, a := range all {
		dominated := false
		for j, b := range all {
			if i != j && a != b && dominates(b, a, maxDims) {
				dominated = true
				break
			}
		}
		if !dominated {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a] > out[b] })
	return out
}

// feasible reports whether n fits on k GPUs of the model.
func (o *oracleModel) feasible(n vec, k int) bool {
	if n == 0 {
		return true
	}
	if k == 0 {
		return false
	}
	slices := 0
	first := -1
	for d := range o.dims {
		c := n.get(d)
		slices += c * o.sizes[d]
		if c > 0 && first < 0 {
			first = d
		}
	}
	if slices > k*o.grid.Slices {
		return false
	}
	key := uint64(n) | uint64(k)<<(maxDims*dimBits)
	if r, ok := o.memo[key]; ok {
		return r
	}
	o.calls++
	res := false
	for _, c := range o.configs {
		if c.get(first) == 0 {
			continue
		}
		rest := n
		for d := range o.dims {
			rest -= vec(min(n.get(d), c.get(d))) << (d * dimBits)
		}
		if o.feasible(rest, k-1) {
			res = true
			break
		}
	}
	o.memo[key] = res
	return res
}

// oracle is the fleet-wide oracle: one oracleModel per model, GPUs of
// different models never share instances (profile names are per model).
type oracle struct {
	models map[string]*oracleModel
	gpus   map[string]int
}

// live is a strategy's live multiset per model.
type live map[string]vec

func (l live) add(o *oracle, a *arrival, n int) {
	m := o.models[a.Model]
	l[a.Model] = l[a.Model].add(m.dimOf[a.Profile], n)
}

// admits reports whether the live set plus a fits the fleet.
func (o *oracle) admits(l live, a *arrival) bool {
	m := o.models[a.Model]
	return m.feasible(l[a.Model].add(m.dimOf[a.Profile], 1), o.gpus[a.Model])
}
