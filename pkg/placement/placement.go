package placement

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Sentinel errors callers tell apart; every returned error wraps one of them
// with the request and what the pool has instead.
var (
	// ErrUnknownProfile: no GPU model in the pool (within the request's
	// constraints) has the requested MIG profile or vGPU type.
	ErrUnknownProfile = errors.New("unknown profile")
	// ErrNoSuchGPU: the request names a GPU that is not in the pool.
	ErrNoSuchGPU = errors.New("no such GPU")
	// ErrNoCapacity: no eligible GPU can take the request; the message says
	// what could still be created instead.
	ErrNoCapacity = errors.New("no capacity")
	// ErrFragmented wraps ErrNoCapacity: the eligible GPUs have enough free
	// slices between them, but no GPU has a legal start for the profile.
	// Defragment can say which moves would admit the request.
	ErrFragmented = fmt.Errorf("%w: free slices are fragmented", ErrNoCapacity)
)

// Slot is one GPU instance occupying part of a GPU's grid.
type Slot struct {
	Start, Size int
	// ProfileID is the real GI profile ID (0 is 7g on H100); -1 when unknown.
	// It counts against that profile's per-GPU instance limit.
	ProfileID int
	// Instance is the identity vgpud keeps across a move.
	Instance string
	// Movable: not attached to a running VM, so it may be destroyed and
	// re-created elsewhere with the same identity.
	Movable bool
	// Foreign: a GI vgpud did not create; it occupies slices and is never moved.
	Foreign bool
	Tenant  string
}

// GPU is one MIG-enabled GPU and what it holds.
type GPU struct {
	// ID is the GPU UUID.
	ID    string
	Model string
	// Grid is the model's slot grid; nil is treated like Unavailable.
	Grid *Grid
	Used []Slot
	// Unavailable: lost, given to a VM whole, or MIG off; never chosen.
	Unavailable bool
}

// Affinity is a tenant's preference for where its instances go.
type Affinity int

const (
	// AffinityNone leaves the choice to the fragmentation score.
	AffinityNone Affinity = iota
	// AffinitySpread prefers GPUs holding fewer of the tenant's instances
	// (failure isolation).
	AffinitySpread
	// AffinityPack prefers GPUs holding more of the tenant's instances
	// (locality, fewer noisy neighbours from other tenants).
	AffinityPack
)

func (a Affinity) String() string {
	switch a {
	case AffinitySpread:
		return "spread"
	case AffinityPack:
		return "pack"
	default:
		return "none"
	}
}

// Request asks for one GPU instance.
type Request struct {
	// Profile is the GI profile name, e.g. "3g.40gb".
	Profile string
	// GPU, when set, is the only GPU (UUID) considered.
	GPU string
	// Models, when set, restricts the choice to these catalog models.
	Models   []string
	Tenant   string
	Affinity Affinity
}

// Decision is where the instance goes.
type Decision struct {
	GPU     string
	Start   int
	Profile Profile
	// Reason says in one line why this slot won.
	Reason string
}

// Free is how many more instances of one profile the pool could create now,
// each profile counted on its own (creating one uses room of others).
type Free struct {
	Model     string
	Profile   string
	ProfileID int
	// Count is the number of instances that fit, summed over GPUs.
	Count int
	// GPUs is how many GPUs could take at least one.
	GPUs int
}

// view is one usable GPU as the scorer sees it.
type view struct {
	idx    int // position in the pool
	gpu    *GPU
	model  string
	grid   *Grid
	mask   uint64
	counts []int
	used   int   // slices occupied
	tenant int   // slots of the request's tenant
	room   []int // room per profile before placing, filled by the scorer
}

func newView(idx int, g *GPU, tenant string) (view, bool) {
	if g.Unavailable || g.Grid == nil || g.Grid.Slices <= 0 || g.Grid.Slices > MaxSlices {
		return view{}, false
	}
	v := view{idx: idx, gpu: g, model: g.Model, grid: g.Grid, counts: make([]int, len(g.Grid.Profiles))}
	for _, s := range g.Used {
		if s.Size <= 0 || s.Start < 0 || s.Start >= g.Grid.Slices {
			continue
		}
		v.mask |= span(s.Start, s.Size) & span(0, g.Grid.Slices)
		if i := g.Grid.profileIndexByID(s.ProfileID); i >= 0 {
			v.counts[i]++
		}
		if tenant != "" && s.Tenant == tenant {
			v.tenant++
		}
	}
	v.used = g.Grid.Slices - freeSlices(g.Grid, v.mask)
	return v, true
}

// candidate is one legal (GPU, start) with its score.
type candidate struct {
	v     *view
	pi    int // profile index in v.grid
	start int
	aff   int   // affinity term, lower is better
	loss  []int // room lost per profile, largest profile first
}

// better is the placement order; see the package documentation.
func better(a, b *candidate) bool {
	if a.aff != b.aff {
		return a.aff < b.aff
	}
	// Models that share a profile name share its grid in practice (H100
	// SXM and PCIe); for other grids the vectors still compare position by
	// position, largest profile first.
	for i := 0; i < len(a.loss) && i < len(b.loss); i++ {
		if a.loss[i] != b.loss[i] {
			return a.loss[i] < b.loss[i]
		}
	}
	if (a.v.used == 0) != (b.v.used == 0) {
		return a.v.used != 0
	}
	if a.v.used != b.v.used {
		return a.v.used > b.v.used
	}
	if a.v.idx != b.v.idx {
		return a.v.idx < b.v.idx
	}
	return a.start < b.start
}

// scorer caches, for one call, each grid's profile order.
type scorer struct {
	orders map[*Grid][]int
}

func (sc *scorer) order(g *Grid) []int {
	if sc.orders == nil {
		sc.orders = map[*Grid][]int{}
	}
	o, ok := sc.orders[g]
	if !ok {
		o = largestFirst(g)
		sc.orders[g] = o
	}
	return o
}

// score fills c.loss: for each profile of the grid, largest first, how many
// fewer instances of it the GPU could take after placing c.
func (sc *scorer) score(c *candidate, r *Request) {
	v := c.v
	g := v.grid
	order := sc.order(g)
	if v.room == nil {
		v.room = make([]int, len(g.Profiles))
		for j := range g.Profiles {
			v.room[j] = room(g, j, v.mask, v.counts)
		}
	}
	after := v.mask | span(c.start, g.Profiles[c.pi].Size)
	v.counts[c.pi]++
	if cap(c.loss) < len(order) {
		c.loss = make([]int, len(order))
	}
	c.loss = c.loss[:len(order)]
	for k, j := range order {
		c.loss[k] = v.room[j] - room(g, j, after, v.counts)
	}
	v.counts[c.pi]--
	switch {
	case r.Tenant == "":
	case r.Affinity == AffinitySpread:
		c.aff = v.tenant
	case r.Affinity == AffinityPack:
		c.aff = -v.tenant
	}
}

// eligible returns the views the request may use and the profile index in
// each; it reports ErrNoSuchGPU and ErrUnknownProfile.
func eligible(pool []GPU, r *Request) ([]view, []int, error) {
	if r.GPU != "" {
		found := false
		for i := range pool {
			if pool[i].ID == r.GPU {
				found = true
				break
			}
		}
		if !found {
			return nil, nil, fmt.Errorf("GPU %s is not in the fleet of %d GPUs: %w", r.GPU, len(pool), ErrNoSuchGPU)
		}
	}
	known := false
	var views []view
	var pis []int
	for i := range pool {
		g := &pool[i]
		if r.GPU != "" && g.ID != r.GPU {
			continue
		}
		if len(r.Models) > 0 && !contains(r.Models, g.Model) {
			continue
		}
		if g.Grid == nil {
			continue
		}
		pi := g.Grid.profileIndex(r.Profile)
		if pi < 0 {
			continue
		}
		known = true
		v, ok := newView(i, g, r.Tenant)
		if !ok {
			continue
		}
		views = append(views, v)
		pis = append(pis, pi)
	}
	if !known {
		where := "no GPU model in the fleet offers it"
		switch {
		case r.GPU != "":
			where = fmt.Sprintf("GPU %s does not offer it", r.GPU)
		case len(r.Models) > 0:
			where = fmt.Sprintf("no GPU of model %s is on this host", strings.Join(r.Models, ", "))
		}
		return nil, nil, fmt.Errorf("profile %q: %s: %w", r.Profile, where, ErrUnknownProfile)
	}
	return views, pis, nil
}

// Place chooses the GPU and start slot for one GPU instance so that the
// largest profiles stay creatable as long as possible (see the package
// documentation for the order). It does not change pool.
//
// Errors: ErrNoSuchGPU, ErrUnknownProfile, ErrFragmented (wraps
// ErrNoCapacity) when the eligible GPUs have the free slices but no legal
// start, ErrNoCapacity otherwise; capacity errors say what could be created.
func Place(pool []GPU, r Request) (Decision, error) {
	views, pis, err := eligible(pool, &r)
	if err != nil {
		return Decision{}, err
	}
	var sc scorer
	best, ok := bestCandidate(&sc, views, pis, &r)
	if !ok {
		return Decision{}, refusal(views, pis, &r)
	}
	return decide(&sc, views, best, &r, ""), nil
}

// bestCandidate scores every legal (GPU, start) and returns the best.
func bestCandidate(sc *scorer, views []view, pis []int, r *Request) (candidate, bool) {
	var best candidate
	var scratch, kept []int
	found := false
	for k := range views {
		v := &views[k]
		pi := pis[k]
		for _, s := range v.grid.Profiles[pi].Starts {
			if !fits(v.grid, pi, v.mask, v.counts, s) {
				continue
			}
			c := candidate{v: v, pi: pi, start: s, loss: scratch}
			sc.score(&c, r)
			scratch = c.loss
			if !found || better(&c, &best) {
				kept = append(kept[:0], c.loss...)
				best, found = c, true
				best.loss = kept
			}
		}
	}
	return best, found
}

// decide turns the winning candidate into a Decision with its reason.
func decide(sc *scorer, views []view, c candidate, r *Request, prefix string) Decision {
	g := c.v.grid
	p := g.Profiles[c.pi]
	var why []string
	if prefix != "" {
		why = append(why, prefix)
	}
	switch {
	case r.Tenant == "" || r.Affinity == AffinityNone:
	case r.Affinity == AffinitySpread:
		why = append(why, fmt.Sprintf("spread: tenant %s has %d here", r.Tenant, c.v.tenant))
	case r.Affinity == AffinityPack:
		why = append(why, fmt.Sprintf("pack: tenant %s has %d here", r.Tenant, c.v.tenant))
	}
	var lost []string
	for k, j := range sc.order(g) {
		q := &g.Profiles[j]
		if j == c.pi || c.loss[k] == 0 || q.Size < p.Size || (q.Size == p.Size && q.ComputeSlices <= p.ComputeSlices) {
			continue
		}
		left := 0
		for i := range views {
			if views[i].grid == g {
				left += room(g, j, views[i].mask, views[i].counts)
			}
		}
		lost = append(lost, fmt.Sprintf("%s (fleet keeps %d)", q.Name, left-c.loss[k]))
	}
	if len(lost) == 0 {
		why = append(why, "no larger profile loses room")
	} else {
		why = append(why, "least room lost for larger profiles: "+strings.Join(lost, ", "))
	}
	if c.v.used > 0 {
		why = append(why, fmt.Sprintf("packs a GPU in use (%d of %d slices)", c.v.used, g.Slices))
	} else {
		why = append(why, "opens an empty GPU")
	}
	return Decision{
		GPU:     c.v.gpu.ID,
		Start:   c.start,
		Profile: cloneProfile(p),
		Reason:  fmt.Sprintf("%s at %d:%d on %s: %s", p.Name, c.start, p.Size, c.v.gpu.ID, strings.Join(why, "; ")),
	}
}

// refusal explains why no eligible GPU can take the request.
func refusal(views []view, pis []int, r *Request) error {
	if len(views) == 0 {
		what := "every GPU that has it is unavailable"
		if r.GPU != "" {
			what = fmt.Sprintf("GPU %s is unavailable", r.GPU)
		}
		return fmt.Errorf("profile %s: %s: %w", r.Profile, what, ErrNoCapacity)
	}
	e := &refusalError{profile: r.Profile, size: views[0].grid.Profiles[pis[0]].Size, views: views}
	for k := range views {
		v := &views[k]
		e.free += freeSlices(v.grid, v.mask)
		if v.counts[pis[k]] >= v.grid.Profiles[pis[k]].MaxInstances {
			e.limited++
		}
	}
	return e
}

// refusalError is a capacity refusal. Its message, which lists what could be
// created instead, is built only when read: callers that go on to
// Defragment or try elsewhere mostly only test it with errors.Is. It holds
// copies of the GPUs' occupancy, so the message describes the pool as it
// was at the refusal.
type refusalError struct {
	profile    string
	size, free int
	limited    int
	views      []view
	detail     string // added by Defragment
}

func (e *refusalError) fragmented() bool { return e.free >= e.size }

func (e *refusalError) Unwrap() error {
	if e.fragmented() {
		return ErrFragmented
	}
	return ErrNoCapacity
}

func (e *refusalError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "profile %s (%d slices) fits on none of the %d eligible GPU(s): %d slices free", e.profile, e.size, len(e.views), e.free)
	if e.limited > 0 {
		fmt.Fprintf(&b, ", %d at the profile's per-GPU instance limit", e.limited)
	}
	b.WriteString("; creatable now: ")
	n := 0
	for _, f := range capacity(e.views) {
		if f.Count > 0 {
			if n > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s×%d", f.Profile, f.Count)
			n++
		}
	}
	if n == 0 {
		b.WriteString("nothing")
	}
	if e.detail != "" {
		b.WriteString("; ")
		b.WriteString(e.detail)
	}
	b.WriteString(": ")
	b.WriteString(e.Unwrap().Error())
	return b.String()
}

// Capacity reports, per model and profile, how many more instances fit now
// (each profile counted independently), for orchestrators. Unavailable GPUs
// count nothing. Models appear in pool order, profiles in grid order.
func Capacity(pool []GPU) []Free {
	var views []view
	for i := range pool {
		if v, ok := newView(i, &pool[i], ""); ok {
			views = append(views, v)
		}
	}
	return capacity(views)
}

func capacity(views []view) []Free {
	var out []Free
	at := map[string]int{} // model+profile -> index in out
	for k := range views {
		v := &views[k]
		for j, p := range v.grid.Profiles {
			key := v.model + "\x00" + p.Name
			i, ok := at[key]
			if !ok {
				i = len(out)
				at[key] = i
				out = append(out, Free{Model: v.model, Profile: p.Name, ProfileID: p.ID})
			}
			if n := room(v.grid, j, v.mask, v.counts); n > 0 {
				out[i].Count += n
				out[i].GPUs++
			}
		}
	}
	return out
}

// LegalStarts returns the starts at which profile could be created on g now,
// ascending: what NVML would accept with an explicit placement. It is empty
// when the GPU is unavailable or its model lacks the profile.
func LegalStarts(g GPU, profile string) []int {
	v, ok := newView(0, &g, "")
	if !ok {
		return nil
	}
	pi := g.Grid.profileIndex(profile)
	if pi < 0 {
		return nil
	}
	var out []int
	for _, s := range g.Grid.Profiles[pi].Starts {
		if fits(g.Grid, pi, v.mask, v.counts, s) {
			out = append(out, s)
		}
	}
	return out
}

func cloneProfile(p Profile) Profile {
	p.Starts = append([]int(nil), p.Starts...)
	return p
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sortedKeys returns the keys of m in order, for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
