package placement

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
)

// Move relocates one movable instance: destroy it at From and re-create it,
// with the same identity and profile, at To. Moves are applied in order; each
// one's target is free once the moves before it are done.
type Move struct {
	Instance  string
	Profile   string
	FromGPU   string
	FromStart int
	ToGPU     string
	ToStart   int
}

func (m Move) String() string {
	return fmt.Sprintf("move %s (%s) from %s:%d to %s:%d", m.Instance, m.Profile, m.FromGPU, m.FromStart, m.ToGPU, m.ToStart)
}

// Limits of the defragmentation search. They bound a refused request's cost
// to a few milliseconds on a crowded 8-GPU pool.
const (
	// maxExtraMoves: plans may move up to this many instances beyond those
	// blocking the target slot (to make room for a blocker elsewhere).
	maxExtraMoves = 2
	// maxChain: a blocker may displace instances at its destination, and
	// those must then go to free slots: chains of two moves at most.
	maxChain = 2
	// searchNodes bounds the relocation attempts of one Defragment call.
	searchNodes = 200
)

// Defragment answers a request that Place refuses for fragmentation: the
// fewest moves of movable instances (never foreign ones) after which the
// request fits, and the decision for the request once they are done. When
// Place admits the request as it is, moves is empty.
//
// The search clears a target slot for the request: each instance blocking it
// moves to a free slot, its own GPU first, else where the allocator would put
// it; failing that, to a slot that is cleared in turn by moving its movable
// occupants to free slots. Plans with fewer moves win, then plans with fewer
// moves across GPUs, then the target the allocator scores best. Every move is
// legal at its turn: the plan runs as listed.
//
// Errors are Place's; when no plan exists within the search limits the error
// still wraps ErrFragmented and says that the blocking instances cannot move.
func Defragment(pool []GPU, r Request) (moves []Move, d Decision, err error) {
	d, err = Place(pool, r)
	if err == nil || !errors.Is(err, ErrFragmented) {
		return nil, d, err
	}
	work := clonePool(pool)
	views, pis, verr := eligible(work, &r)
	if verr != nil {
		return nil, Decision{}, verr
	}
	targets := clearTargets(work, views, pis, &r)
	if len(targets) == 0 {
		return nil, Decision{}, withDetail(err, "every slot that could take it holds an instance that cannot move")
	}

	pl := &planner{work: work, budget: searchNodes}
	var best []Move
	bestTarget, bestCross := -1, 0
	minBlockers := len(targets[0].blockers)
	for limit := minBlockers; limit <= minBlockers+maxExtraMoves && bestTarget < 0; limit++ {
		for ti := range targets {
			t := &targets[ti]
			if len(t.blockers) > limit {
				continue
			}
			plan, ok := pl.clear(t, r.Profile, limit)
			if !ok {
				continue
			}
			cross := 0
			for _, m := range plan {
				if m.FromGPU != m.ToGPU {
					cross++
				}
			}
			if bestTarget < 0 || len(plan) < len(best) || (len(plan) == len(best) && cross < bestCross) {
				best, bestTarget, bestCross = plan, ti, cross
			}
			if cross == 0 && len(plan) == limit {
				break
			}
		}
	}
	if bestTarget < 0 {
		return nil, Decision{}, withDetail(err, fmt.Sprintf("no plan of at most %d moves of movable instances clears a slot", minBlockers+maxExtraMoves))
	}

	after := clonePool(pool)
	for _, m := range best {
		applyMove(after, m)
	}
	t := targets[bestTarget]
	views, pis, _ = eligible(after, &r)
	k := 0
	for k < len(views)-1 && views[k].idx != t.gpu {
		k++
	}
	var sc scorer
	c := candidate{v: &views[k], pi: pis[k], start: t.start}
	sc.score(&c, &r)
	prefix := fmt.Sprintf("after %d move(s), %d across GPUs", len(best), bestCross)
	return best, decide(&sc, views, c, &r, prefix), nil
}

// target is a slot the request could take once its blockers move.
type target struct {
	gpu      int // pool index
	start    int
	blockers []Slot
	score    candidate // the request's score there once cleared
}

// clearTargets lists the slots whose occupants are all movable, fewest
// blockers first, then in the allocator's order.
func clearTargets(work []GPU, views []view, pis []int, r *Request) []target {
	var sc scorer
	var out []target
	for k := range views {
		v := &views[k]
		pi := pis[k]
		p := &v.grid.Profiles[pi]
		g := &work[v.idx]
		for _, s := range p.Starts {
			bl, ok := movableOccupants(g, span(s, p.Size), nil)
			if !ok || len(bl) == 0 {
				continue
			}
			// The request's score on the GPU without its blockers.
			cleared := *g
			cleared.Used = nil
			for _, sl := range g.Used {
				if span(sl.Start, sl.Size)&span(s, p.Size) == 0 {
					cleared.Used = append(cleared.Used, sl)
				}
			}
			cv, _ := newView(v.idx, &cleared, r.Tenant)
			if cv.counts[pi] >= p.MaxInstances {
				continue
			}
			c := candidate{v: &cv, pi: pi, start: s}
			sc.score(&c, r)
			out = append(out, target{gpu: v.idx, start: s, blockers: bl, score: c})
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		if len(out[a].blockers) != len(out[b].blockers) {
			return len(out[a].blockers) < len(out[b].blockers)
		}
		return better(&out[a].score, &out[b].score)
	})
	return out
}

// movableOccupants returns the slots of g overlapping mask, largest first;
// ok is false when one of them may not move (foreign, attached, unknown
// profile, or already moved in this plan).
func movableOccupants(g *GPU, mask uint64, moved map[string]bool) ([]Slot, bool) {
	var out []Slot
	for _, sl := range g.Used {
		if span(sl.Start, sl.Size)&mask == 0 {
			continue
		}
		if sl.Foreign || !sl.Movable || sl.Instance == "" || g.Grid.profileIndexByID(sl.ProfileID) < 0 || moved[sl.Instance] {
			return nil, false
		}
		out = append(out, sl)
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Size > out[b].Size })
	return out, true
}

// planner searches move plans on a private copy of the pool. Its state is
// always the pool as it would be after the moves recorded so far, so every
// recorded move is legal at its turn.
type planner struct {
	work      []GPU
	moves     []Move
	moved     map[string]bool
	movesLeft int
	budget    int
	reserves  int
}

// clear finds a plan of at most limit moves that empties target t.
func (pl *planner) clear(t *target, profile string, limit int) ([]Move, bool) {
	g := &pl.work[t.gpu]
	p, _ := g.Grid.Profile(profile)
	pl.moves = pl.moves[:0]
	pl.moved = map[string]bool{}
	pl.movesLeft = limit
	res := pl.reserve(t.gpu, t.start, p.Size, p.ID)
	var plan []Move
	ok := pl.relocateAll(t.blockers, 1, func() bool {
		plan = append([]Move(nil), pl.moves...)
		return true
	})
	pl.unreserve(t.gpu, res)
	if !ok {
		return nil, false
	}
	// The search left the state as the plan leaves it; undo it so that the
	// next target starts from the pool as it is.
	for i := len(plan) - 1; i >= 0; i-- {
		m := plan[i]
		applyMove(pl.work, Move{Instance: m.Instance, FromGPU: m.ToGPU, FromStart: m.ToStart, ToGPU: m.FromGPU, ToStart: m.FromStart})
	}
	return plan, true
}

// reserve holds a range with a placeholder slot so that no relocated
// instance lands in it; the placeholder counts against profile id's limit.
func (pl *planner) reserve(gpu, start, size, id int) string {
	pl.reserves++
	name := fmt.Sprintf("\x00reserved-%d", pl.reserves)
	g := &pl.work[gpu]
	g.Used = append(g.Used, Slot{Start: start, Size: size, ProfileID: id, Instance: name, Foreign: true})
	return name
}

func (pl *planner) unreserve(gpu int, name string) { removeSlot(&pl.work[gpu], name) }

func (pl *planner) relocateAll(list []Slot, depth int, k func() bool) bool {
	if len(list) == 0 {
		return k()
	}
	return pl.relocate(list[0], depth, func() bool { return pl.relocateAll(list[1:], depth, k) })
}

// relocate moves slot b (still in place) somewhere legal, then continues
// with k; on failure of every option it restores the state and returns false.
func (pl *planner) relocate(b Slot, depth int, k func() bool) bool {
	if pl.movesLeft == 0 || pl.budget <= 0 {
		return false
	}
	pl.budget--
	home := pl.gpuOf(b.Instance)
	if home < 0 {
		return false
	}
	hg := &pl.work[home]
	name := hg.Grid.Profiles[hg.Grid.profileIndexByID(b.ProfileID)].Name
	pl.movesLeft--
	defer func() { pl.movesLeft++ }()

	// A free slot now.
	removeSlot(hg, b.Instance)
	for _, dst := range destinations(pl.work, home, b, name) {
		if pl.step(b, home, name, dst, k) {
			return true
		}
	}
	hg.Used = append(hg.Used, b)
	if depth >= maxChain || pl.budget <= 0 {
		return false
	}

	// A slot cleared by moving its movable occupants to free slots first.
	for _, dst := range displaceable(pl.work, home, b, name) {
		g := &pl.work[dst.gpu]
		occ, ok := movableOccupants(g, span(dst.start, b.Size), pl.moved)
		if !ok || len(occ) == 0 || len(occ) > pl.movesLeft {
			continue
		}
		res := pl.reserve(dst.gpu, dst.start, b.Size, b.ProfileID)
		done := pl.relocateAll(occ, depth+1, func() bool {
			pl.unreserve(dst.gpu, res)
			removeSlot(&pl.work[home], b.Instance)
			if pl.step(b, home, name, dst, k) {
				return true
			}
			pl.work[home].Used = append(pl.work[home].Used, b)
			res = pl.reserve(dst.gpu, dst.start, b.Size, b.ProfileID)
			return false
		})
		if done {
			return true
		}
		pl.unreserve(dst.gpu, res)
	}
	return false
}

// step records b's move to dst (b already removed from home) and continues;
// it undoes the move when the continuation fails.
func (pl *planner) step(b Slot, home int, name string, dst dest, k func() bool) bool {
	ng := &pl.work[dst.gpu]
	placed := b
	placed.Start = dst.start
	ng.Used = append(ng.Used, placed)
	pl.moves = append(pl.moves, Move{
		Instance: b.Instance, Profile: name,
		FromGPU: pl.work[home].ID, FromStart: b.Start, ToGPU: ng.ID, ToStart: dst.start,
	})
	pl.moved[b.Instance] = true
	if k() {
		return true
	}
	delete(pl.moved, b.Instance)
	pl.moves = pl.moves[:len(pl.moves)-1]
	removeSlot(ng, b.Instance)
	return false
}

func (pl *planner) gpuOf(instance string) int {
	for i := range pl.work {
		for _, s := range pl.work[i].Used {
			if s.Instance == instance {
				return i
			}
		}
	}
	return -1
}

type dest struct{ gpu, start int }

// sameModelViews returns views of the GPUs that can hold profile name of
// home's model.
func sameModelViews(pool []GPU, home int, name string) ([]view, []int) {
	hg := &pool[home]
	views := make([]view, 0, len(pool))
	pis := make([]int, 0, len(pool))
	for i := range pool {
		g := &pool[i]
		if g.Model != hg.Model || g.Grid == nil {
			continue
		}
		pi := g.Grid.profileIndex(name)
		if pi < 0 {
			continue
		}
		v, ok := newView(i, g, "")
		if !ok {
			continue
		}
		views = append(views, v)
		pis = append(pis, pi)
	}
	return views, pis
}

// destinations lists the free slots where b (already removed from home)
// could be re-created: on home first, then on other GPUs of the same model,
// each group in the allocator's order.
func destinations(pool []GPU, home int, b Slot, name string) []dest {
	r := Request{Profile: name}
	var sc scorer
	var same, other []candidate
	views, pis := sameModelViews(pool, home, name)
	for k := range views {
		v := &views[k]
		for _, s := range v.grid.Profiles[pis[k]].Starts {
			if (v.idx == home && s == b.Start) || !fits(v.grid, pis[k], v.mask, v.counts, s) {
				continue
			}
			c := candidate{v: v, pi: pis[k], start: s}
			sc.score(&c, &r)
			if v.idx == home {
				same = append(same, c)
			} else {
				other = append(other, c)
			}
		}
	}
	return orderDests(same, other)
}

// displaceable lists the occupied slots where b could go once their
// occupants move: starts of b's profile not overlapping b itself, where the
// per-profile limit would allow b; home first, then by fewest occupied
// slices.
func displaceable(pool []GPU, home int, b Slot, name string) []dest {
	views, pis := sameModelViews(pool, home, name)
	type opt struct {
		d        dest
		occupied int
	}
	var opts []opt
	for k := range views {
		v := &views[k]
		p := &v.grid.Profiles[pis[k]]
		for _, s := range p.Starts {
			m := span(s, p.Size)
			if m&v.mask == 0 {
				continue // free: destinations covered it
			}
			if v.idx == home && m&span(b.Start, b.Size) != 0 {
				continue
			}
			n := v.counts[pis[k]]
			if v.idx == home {
				n-- // b leaves
			}
			for _, sl := range pool[v.idx].Used {
				if sl.ProfileID == p.ID && span(sl.Start, sl.Size)&m != 0 {
					n--
				}
			}
			if n >= p.MaxInstances {
				continue
			}
			opts = append(opts, opt{dest{v.idx, s}, bits.OnesCount64(m & v.mask)})
		}
	}
	sort.SliceStable(opts, func(a, c int) bool {
		if (opts[a].d.gpu == home) != (opts[c].d.gpu == home) {
			return opts[a].d.gpu == home
		}
		return opts[a].occupied < opts[c].occupied
	})
	out := make([]dest, len(opts))
	for i, o := range opts {
		out[i] = o.d
	}
	return out
}

func orderDests(same, other []candidate) []dest {
	less := func(list []candidate) func(a, b int) bool {
		return func(a, b int) bool { return better(&list[a], &list[b]) }
	}
	sort.SliceStable(same, less(same))
	sort.SliceStable(other, less(other))
	out := make([]dest, 0, len(same)+len(other))
	for _, c := range same {
		out = append(out, dest{gpu: c.v.idx, start: c.start})
	}
	for _, c := range other {
		out = append(out, dest{gpu: c.v.idx, start: c.start})
	}
	return out
}

func removeSlot(g *GPU, instance string) {
	for i := range g.Used {
		if g.Used[i].Instance == instance {
			g.Used = append(g.Used[:i], g.Used[i+1:]...)
			return
		}
	}
}

// applyMove performs m on pool (a copy the caller owns).
func applyMove(pool []GPU, m Move) {
	var moved Slot
	found := false
	for i := range pool {
		g := &pool[i]
		if g.ID != m.FromGPU {
			continue
		}
		for j := range g.Used {
			if g.Used[j].Instance == m.Instance {
				moved, found = g.Used[j], true
				g.Used = append(g.Used[:j], g.Used[j+1:]...)
				break
			}
		}
	}
	if !found {
		return
	}
	moved.Start = m.ToStart
	for i := range pool {
		if pool[i].ID == m.ToGPU {
			pool[i].Used = append(pool[i].Used, moved)
			return
		}
	}
}

func clonePool(pool []GPU) []GPU {
	out := make([]GPU, len(pool))
	for i, g := range pool {
		out[i] = g
		out[i].Used = append([]Slot(nil), g.Used...)
	}
	return out
}

// withDetail adds a clause to a refusal from Place, keeping its sentinel.
func withDetail(err error, detail string) error {
	var re *refusalError
	if !errors.As(err, &re) {
		return fmt.Errorf("%s: %w", detail, err)
	}
	c := *re
	c.detail = detail
	return &c
}
