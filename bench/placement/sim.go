package main

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vgpud/vgpud/pkg/placement"
)

// Strategy names, in report order.
const (
	stratFirstFit = "first-fit"
	stratRandom   = "random"
	stratVgpud    = "vgpud"
	stratDefrag   = "vgpud+defrag"
	stratOracle   = "oracle"
)

var strategyOrder = []string{stratFirstFit, stratRandom, stratVgpud, stratDefrag, stratOracle}

// stats are one strategy's figures over the measured arrivals.
type stats struct {
	Arrivals        int     `json:"arrivals"`
	Accepted        int     `json:"accepted"`
	Acceptance      float64 `json:"acceptance"`
	SliceAcceptance float64 `json:"slice_weighted_acceptance"`
	LargeArrivals   int     `json:"large_arrivals"`
	LargeAccepted   int     `json:"large_accepted"`
	LargeAcceptance float64 `json:"large_acceptance"`
	Refusals        int     `json:"refusals"`
	// Avoidable are refusals the oracle would have admitted given this
	// strategy's own live set at that moment.
	Avoidable          int     `json:"avoidable_rejections"`
	AvoidableShare     float64 `json:"avoidable_share_of_refusals"`
	Fragmented         int     `json:"refused_as_fragmented"`
	DefragAdmitted     int     `json:"admitted_by_defrag,omitempty"`
	Moves              int     `json:"moves,omitempty"`
	MeanDecisionMicros float64 `json:"mean_decision_us"`
	// ByReplication is the acceptance of each replication (its own seed).
	ByReplication []float64 `json:"acceptance_by_replication"`
	// ByProfile breaks refusals down by profile.
	ByProfile map[string]*profileStats `json:"by_profile"`

	offeredW, acceptedW float64
	decisions           int
	decisionTime        time.Duration
}

func (s *stats) finish() {
	if s.Arrivals > 0 {
		s.Acceptance = float64(s.Accepted) / float64(s.Arrivals)
	}
	if s.offeredW > 0 {
		s.SliceAcceptance = s.acceptedW / s.offeredW
	}
	if s.LargeArrivals > 0 {
		s.LargeAcceptance = float64(s.LargeAccepted) / float64(s.LargeArrivals)
	}
	if s.Refusals > 0 {
		s.AvoidableShare = float64(s.Avoidable) / float64(s.Refusals)
	}
	if s.decisions > 0 {
		s.MeanDecisionMicros = float64(s.decisionTime.Microseconds()) / float64(s.decisions)
	}
}

// profileStats is one profile's share of a strategy's figures.
type profileStats struct {
	Arrivals  int `json:"arrivals"`
	Refusals  int `json:"refusals"`
	Avoidable int `json:"avoidable"`
}

// departure is a live instance's end.
type departure struct {
	t  float64
	id int
}

type departures []departure

func (h departures) Len() int           { return len(h) }
func (h departures) Less(i, j int) bool { return h[i].t < h[j].t }
func (h departures) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *departures) Push(x any)        { *h = append(*h, x.(departure)) }
func (h *departures) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// runner replays one trace through one strategy.
type runner struct {
	name   string
	or     *oracle
	fleet  []placement.GPU
	gpuOf  map[string]int // instance -> fleet index
	live   live
	rng    *rand.Rand
	warmup float64
	st     *stats // shared by the replications of a scenario
}

func instanceName(id int) string { return fmt.Sprintf("i%d", id) }

// run replays trace; arrivals before warmup build up state but are not counted.
func (r *runner) run(trace []arrival) error {
	var deps departures
	for id := range trace {
		a := &trace[id]
		for len(deps) > 0 && deps[0].t <= a.T {
			d := heap.Pop(&deps).(departure)
			r.depart(&trace[d.id], d.id)
		}
		ok, err := r.admit(a, id)
		if err != nil {
			return fmt.Errorf("%s: arrival %d (%s): %w", r.name, id, a.Profile, err)
		}
		if ok {
			heap.Push(&deps, departure{t: a.T + a.Life, id: id})
		}
	}
	return nil
}

func (r *runner) depart(a *arrival, id int) {
	r.live.add(r.or, a, -1)
	if r.name == stratOracle {
		return
	}
	name := instanceName(id)
	g := &r.fleet[r.gpuOf[name]]
	for i := range g.Used {
		if g.Used[i].Instance == name {
			g.Used = append(g.Used[:i], g.Used[i+1:]...)
			break
		}
	}
	delete(r.gpuOf, name)
}

func (r *runner) admit(a *arrival, id int) (bool, error) {
	counted := a.T >= r.warmup
	var ok, fragmented bool
	var err error
	start := time.Now()
	switch r.name {
	case stratOracle:
		ok = r.or.admits(r.live, a)
	case stratFirstFit:
		ok = r.firstFit(a, id)
	case stratRandom:
		ok = r.random(a, id)
	case stratVgpud, stratDefrag:
		ok, fragmented, err = r.vgpud(a, id, counted)
	}
	elapsed := time.Since(start)
	if err != nil {
		return false, err
	}
	if ok {
		r.live.add(r.or, a, 1)
	}
	if !counted {
		return ok, nil
	}
	s := r.st
	s.decisions++
	s.decisionTime += elapsed
	s.Arrivals++
	if s.ByProfile == nil {
		s.ByProfile = map[string]*profileStats{}
	}
	ps := s.ByProfile[a.Model+"/"+a.Profile]
	if ps == nil {
		ps = &profileStats{}
		s.ByProfile[a.Model+"/"+a.Profile] = ps
	}
	ps.Arrivals++
	s.offeredW += a.Weight
	if a.Large {
		s.LargeArrivals++
	}
	if ok {
		s.Accepted++
		s.acceptedW += a.Weight
		if a.Large {
			s.LargeAccepted++
		}
		return true, nil
	}
	s.Refusals++
	ps.Refusals++
	if fragmented {
		s.Fragmented++
	}
	if r.name != stratOracle && r.or.admits(r.live, a) {
		s.Avoidable++
		ps.Avoidable++
	}
	return false, nil
}

func (r *runner) create(a *arrival, id, gpu, start int) {
	name := instanceName(id)
	p, _ := r.fleet[gpu].Grid.Profile(a.Profile)
	r.fleet[gpu].Used = append(r.fleet[gpu].Used, placement.Slot{
		Start: start, Size: p.Size, ProfileID: p.ID, Instance: name, Movable: a.Movable,
	})
	r.gpuOf[name] = gpu
}

// firstFit is what NVML does without an explicit placement: the lowest legal
// start on the first GPU that fits.
func (r *runner) firstFit(a *arrival, id int) bool {
	for i := range r.fleet {
		if r.fleet[i].Model != a.Model {
			continue
		}
		if starts := placement.LegalStarts(r.fleet[i], a.Profile); len(starts) > 0 {
			r.create(a, id, i, starts[0])
			return true
		}
	}
	return false
}

// random picks uniformly among every legal (GPU, start).
func (r *runner) random(a *arrival, id int) bool {
	type opt struct{ gpu, start int }
	var opts []opt
	for i := range r.fleet {
		if r.fleet[i].Model != a.Model {
			continue
		}
		for _, s := range placement.LegalStarts(r.fleet[i], a.Profile) {
			opts = append(opts, opt{i, s})
		}
	}
	if len(opts) == 0 {
		return false
	}
	o := opts[r.rng.IntN(len(opts))]
	r.create(a, id, o.gpu, o.start)
	return true
}

// createChecked creates the instance where the allocator decided, after
// checking that NVML would accept that placement.
func (r *runner) createChecked(a *arrival, id int, d placement.Decision) error {
	g := r.index(d.GPU)
	if g < 0 || r.fleet[g].Model != a.Model {
		return fmt.Errorf("decision %s:%d names a GPU of the wrong model", d.GPU, d.Start)
	}
	for _, s := range placement.LegalStarts(r.fleet[g], a.Profile) {
		if s == d.Start {
			r.create(a, id, g, d.Start)
			return nil
		}
	}
	return fmt.Errorf("decision %s:%d is not a legal free start for %s", d.GPU, d.Start, a.Profile)
}

func (r *runner) index(gpuID string) int {
	for i := range r.fleet {
		if r.fleet[i].ID == gpuID {
			return i
		}
	}
	return -1
}

// vgpud runs the real allocator; the defragmenting strategy asks Defragment
// for moves when a request is refused for fragmentation.
func (r *runner) vgpud(a *arrival, id int, counted bool) (ok, fragmented bool, err error) {
	req := placement.Request{Profile: a.Profile, Models: []string{a.Model}}
	d, err := placement.Place(r.fleet, req)
	if err == nil {
		if err := r.createChecked(a, id, d); err != nil {
			return false, false, err
		}
		return true, false, nil
	}
	if !errors.Is(err, placement.ErrNoCapacity) {
		return false, false, err
	}
	fragmented = errors.Is(err, placement.ErrFragmented)
	if r.name != stratDefrag || !fragmented {
		return false, fragmented, nil
	}
	moves, d, err := placement.Defragment(r.fleet, req)
	if err != nil {
		if errors.Is(err, placement.ErrNoCapacity) {
			return false, true, nil
		}
		return false, true, err
	}
	for _, m := range moves {
		if err := r.move(m); err != nil {
			return false, true, err
		}
	}
	if err := r.createChecked(a, id, d); err != nil {
		return false, true, err
	}
	if counted {
		r.st.DefragAdmitted++
		r.st.Moves += len(moves)
	}
	return true, true, nil
}

// move applies one Move, checking that the target is legal at that moment
// as NVML would.
func (r *runner) move(m placement.Move) error {
	from, to := r.index(m.FromGPU), r.index(m.ToGPU)
	if from < 0 || to < 0 {
		return fmt.Errorf("move %v names an unknown GPU", m)
	}
	g := &r.fleet[from]
	var s placement.Slot
	found := false
	for i := range g.Used {
		if g.Used[i].Instance == m.Instance && g.Used[i].Start == m.FromStart {
			s, found = g.Used[i], true
			if !s.Movable {
				return fmt.Errorf("move %v: instance is not movable", m)
			}
			g.Used = append(g.Used[:i], g.Used[i+1:]...)
			break
		}
	}
	if !found {
		return fmt.Errorf("move %v: no such instance at the source", m)
	}
	legal := false
	for _, st := range placement.LegalStarts(r.fleet[to], m.Profile) {
		legal = legal || st == m.ToStart
	}
	if !legal {
		return fmt.Errorf("move %v: target is not a legal free start", m)
	}
	s.Start = m.ToStart
	r.fleet[to].Used = append(r.fleet[to].Used, s)
	r.gpuOf[m.Instance] = to
	return nil
}
