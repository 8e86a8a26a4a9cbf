package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/vgpud/vgpud/pkg/placement"
)

// arrival is one request of a churn trace.
type arrival struct {
	T, Life float64
	Model   string
	Profile string
	Size    int
	// Weight is the instance's share of its GPU (size / grid slices), so that
	// slice-weighted figures compare models with different grids.
	Weight  float64
	Large   bool
	Movable bool
}

// movableShare is the fraction of instances not attached to a running VM,
// which the defragmenting strategy may move.
const movableShare = 0.3

// genTrace draws a churn trace: for each model of the fleet an independent
// Poisson stream whose offered load is load times the model's slices
// (arrival rate x mean lifetime x mean size = load x slices), exponential
// lifetimes of mean 1, profiles drawn by the mix's weights. The streams are
// merged by drawing the model of each arrival in proportion to its rate.
func genTrace(seed uint64, f fleetSpec, m mix, grids map[string]*placement.Grid, load float64, n int) ([]arrival, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	type stream struct {
		model   string
		rate    float64
		profs   []placement.Profile
		weights []float64
		total   float64
	}
	var streams []stream
	var rate float64
	for _, g := range f.Groups {
		grid := grids[g.Model]
		ws, ok := m.Weights[g.Model]
		if !ok {
			return nil, fmt.Errorf("mix %s has no weights for model %s", m.Name, g.Model)
		}
		s := stream{model: g.Model}
		var meanSize float64
		for _, w := range ws {
			p, ok := grid.Profile(w.Profile)
			if !ok {
				return nil, fmt.Errorf("mix %s: model %s has no profile %s", m.Name, g.Model, w.Profile)
			}
			s.profs = append(s.profs, p)
			s.weights = append(s.weights, w.Weight)
			s.total += w.Weight
			meanSize += w.Weight * float64(p.Size)
		}
		meanSize /= s.total
		s.rate = load * float64(g.Count*grid.Slices) / meanSize
		rate += s.rate
		streams = append(streams, s)
	}
	out := make([]arrival, 0, n)
	t := 0.0
	for len(out) < n {
		t += rng.ExpFloat64() / rate
		x := rng.Float64() * rate
		si := 0
		for si < len(streams)-1 && x >= streams[si].rate {
			x -= streams[si].rate
			si++
		}
		s := &streams[si]
		y := rng.Float64() * s.total
		pi := 0
		for pi < len(s.profs)-1 && y >= s.weights[pi] {
			y -= s.weights[pi]
			pi++
		}
		p := s.profs[pi]
		out = append(out, arrival{
			T:       t,
			Life:    rng.ExpFloat64(),
			Model:   s.model,
			Profile: p.Name,
			Size:    p.Size,
			Weight:  float64(p.Size) / float64(grids[s.model].Slices),
			Large:   p.Large(),
			Movable: rng.Float64() < movableShare,
		})
	}
	return out, nil
}
