package fleet

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
)

// The two ways a MIG GPU's per-profile totals are published (Config.Inventories,
// docs/fleet.md "Exact or carvable inventories").
const (
	// InventoriesExact publishes each profile's room now, counted alone:
	// every room a local create could take is offered, but Placement can
	// accept a mix of claims within the totals and the slice class that
	// the GPU's slot alignment cannot hold together (a stale claim).
	InventoriesExact = "exact"
	// InventoriesCarvable publishes totals, and a slice capacity, such
	// that every mix of claims Placement can accept within them is carved
	// by the host's own placement, in whatever order the creates come.
	// Some room a local create could take is then not offered.
	InventoriesCarvable = "carvable"
)

// carveGroup is the classes that carve one GPU-instance profile: a MIG
// profile and the MIG-backed types alone in that GPU instance.
type carveGroup struct {
	gi      placement.Profile
	classes []int // indexes in gpuUnits.Classes
}

// carver finds carvable totals for one MIG GPU: pg its occupancy now.
type carver struct {
	pg     placement.GPU
	groups []carveGroup
	// floors are, per class, the instances of it Placement already holds
	// that the host has not carved (claims in flight): no total falls
	// below them, and every mix the search checks may hold them.
	floors []int
	places int // placement.Place calls, bounded by budget
}

// carveBudget bounds the engine calls one GPU's search makes: beyond it
// the search gives up and the exact totals stand.
const carveBudget = 20000

// carvable lowers the rooms of u's MIG classes, and the slice capacity so
// that every mix Placement can accept within them is carvable in any order
// (InventoriesCarvable). pg is the GPU's occupancy; uncarved (resource
// class → units, may be nil) what Placement's allocations there hold
// beyond the host's instances: claims accepted, not carved yet, that
// Placement counts in its usage. Their mix with later claims must carve
// too, so the search starts from them: the totals and the slice capacity
// hold at least them, and the classes they take give way last. cache
// (may be nil) keeps results by occupancy, rooms and claims in flight,
// the search being the costly part of a pass.
func carvable(u *gpuUnits, g manager.FleetGPU, cache *carveCache, uncarved map[string]int) {
	pg := g.Pool
	if pg.Grid == nil || pg.Unavailable || !u.MIG || u.State != gpu.StateOK {
		return
	}
	c := carver{pg: pg, floors: make([]int, len(u.Classes))}
	rooms := make([]int, len(u.Classes))
	byGI := map[string]int{}
	for i, uc := range u.Classes {
		rooms[i] = uc.Room
		name := giOfClass(g, uc)
		if name == "" || uc.Room <= 0 {
			// No room: a claim of it in flight is stale already.
			continue
		}
		c.floors[i] = uncarved[ClassName(uc.Kind, uc.Profile)]
		rooms[i] = max(uc.Room, c.floors[i])
		p, _ := pg.Grid.Profile(name)
		k, ok := byGI[name]
		if !ok {
			k = len(c.groups)
			byGI[name] = k
			c.groups = append(c.groups, carveGroup{gi: p})
		}
		c.groups[k].classes = append(c.groups[k].classes, i)
	}
	free := u.Slices - g.SlotsUsed
	if len(c.groups) == 0 || free <= 0 {
		return
	}
	// While a whole GPU is offered (the GPU holds nothing) its claim
	// takes the slots offered: hold back fewer than maxHeldBack, so that
	// it is still told from a partial claim (wholeGPU).
	least := 1
	for _, uc := range u.Classes {
		if uc.Kind == store.KindPassthrough && uc.Room > 0 {
			least = max(1, free-maxHeldBack(u.Slices))
		}
	}
	// The slices claims in flight hold are not held back.
	least = min(free, max(least, uncarved[SliceClass]))
	key := cacheKey(pg, rooms, free) + "|" + strconv.Itoa(least)
	if slices.ContainsFunc(c.floors, func(n int) bool { return n > 0 }) {
		key += "|" + fmt.Sprint(c.floors)
	}
	res, ok := cache.get(key)
	if !ok {
		res = c.search(rooms, free, least)
		cache.put(key, res)
	}
	for i := range u.Classes {
		u.Classes[i].Room = res.rooms[i]
	}
	u.HeldBack = free - res.free
}

// giOfClass is the GPU-instance profile one instance of class uc carves
// alone ("" for a class whose instances share GPU instances or take none).
func giOfClass(g manager.FleetGPU, uc unitClass) string {
	switch {
	case uc.Kind == store.KindMIG:
		return uc.Profile
	case uc.Kind == store.KindMIGVGPU && uc.Slices > 0:
		if t := typeByName(g.Spec, uc.Profile); t != nil && t.GPUInstanceProfile != nil {
			for _, p := range g.Grid.Profiles {
				if p.ID == *t.GPUInstanceProfile {
					return p.Name
				}
			}
		}
	}
	return ""
}

type carveResult struct {
	rooms []int
	free  int
}

// search tries each slice capacity from the free slices down to least and, for
// each, starts from the exact rooms and, while some mix within them is not
// carvable, lowers the total of the GPU-instance profile of that mix
// whose loss costs least (its classes, the largest first) to just below
// the mix. It keeps the capacity and totals that offer the most (value).
func (c *carver) search(rooms []int, free, least int) carveResult {
	best, bestV := carveResult{rooms: make([]int, len(rooms))}, -1
	for f := free; f >= least; f-- {
		t, ok := c.cut(rooms, f)
		if !ok {
			// Out of budget: the exact totals stand.
			return carveResult{rooms: rooms, free: free}
		}
		if v := c.value(t, f); v > bestV {
			best, bestV = carveResult{rooms: t, free: f}, v
		}
	}
	// A class whose one instance exceeds the capacity is not offered:
	// its total says so too (claims in flight stay held).
	for _, g := range c.groups {
		for _, i := range g.classes {
			best.rooms[i] = max(c.floors[i], min(best.rooms[i], best.free/g.gi.Size))
		}
	}
	return best
}

// cut lowers totals from rooms until every mix within them and slice
// capacity f is carvable (ok false: out of budget). No total falls below
// its floor: when only the claims in flight make a mix fail (some order
// of them does not carve), the totals are the floors: no MIG class
// offers more than they hold.
func (c *carver) cut(rooms []int, f int) ([]int, bool) {
	t := append([]int(nil), rooms...)
	for {
		q, ok := c.safe(t, f)
		if ok {
			return t, true
		}
		if q == nil {
			return nil, false
		}
		var bestT []int
		bestV := -1
		for k, g := range c.groups {
			if q[k] == 0 || q[k]-1 < c.groupTotal(c.floors, k) {
				continue
			}
			nt := append([]int(nil), t...)
			for c.groupTotal(nt, k) > q[k]-1 {
				// The class with the most, above its floor (one is:
				// the group's total is above the floors').
				most := -1
				for _, i := range g.classes {
					if nt[i] > c.floors[i] && (most < 0 || nt[i] > nt[most]) {
						most = i
					}
				}
				nt[most]--
			}
			if v := c.value(nt, f); v > bestV {
				bestT, bestV = nt, v
			}
		}
		if bestT == nil {
			for _, g := range c.groups {
				for _, i := range g.classes {
					t[i] = c.floors[i]
				}
			}
			return t, true
		}
		t = bestT
	}
}

// value is the rooms totals t and slice capacity f offer: for each class
// the instances Placement would accept of it alone.
func (c *carver) value(t []int, f int) int {
	v := 0
	for _, g := range c.groups {
		for _, i := range g.classes {
			v += min(t[i], f/g.gi.Size)
		}
	}
	return v
}

func (c *carver) groupTotal(t []int, k int) int {
	n := 0
	for _, i := range c.groups[k].classes {
		n += t[i]
	}
	return n
}

// safe walks every state the host can reach carving, one by one in any
// order, a mix within totals t and slice capacity f, with the host's own
// engine (placement.Place pinned to this GPU), from the occupancy now. It
// returns ok, or the first mix (per group) whose last carve the engine
// refuses; nil and not ok when the budget ran out.
func (c *carver) safe(t []int, f int) ([]int, bool) {
	caps := make([]int, len(c.groups))
	for k := range c.groups {
		caps[k] = min(c.groupTotal(t, k), f/c.groups[k].gi.Size)
	}
	seen := map[string]bool{}
	var fail []int
	var walk func(pg placement.GPU, p []int, used int) bool
	walk = func(pg placement.GPU, p []int, used int) bool {
		key := stateKey(pg, p)
		if seen[key] {
			return true
		}
		seen[key] = true
		for k, g := range c.groups {
			if p[k] >= caps[k] || used+g.gi.Size > f {
				continue
			}
			if c.places++; c.places > carveBudget {
				return false
			}
			d, err := placement.Place([]placement.GPU{pg}, placement.Request{Profile: g.gi.Name, GPU: pg.ID})
			q := append([]int(nil), p...)
			q[k]++
			if err != nil {
				fail = q
				return false
			}
			next := pg
			next.Used = append(append([]placement.Slot(nil), pg.Used...), placement.Slot{Start: d.Start, Size: g.gi.Size,
				ProfileID: g.gi.ID, Instance: "claim-" + strconv.Itoa(len(pg.Used))})
			if !walk(next, q, used+g.gi.Size) {
				return false
			}
		}
		return true
	}
	if walk(c.pg, make([]int, len(c.groups)), 0) {
		return nil, true
	}
	return fail, false
}

// stateKey names a carving state: the slots held and the mix carved.
func stateKey(pg placement.GPU, p []int) string {
	s := make([]string, 0, len(pg.Used))
	for _, sl := range pg.Used {
		s = append(s, fmt.Sprintf("%d/%d/%d", sl.Start, sl.Size, sl.ProfileID))
	}
	sort.Strings(s)
	return strings.Join(s, ",") + "|" + fmt.Sprint(p)
}

func cacheKey(pg placement.GPU, rooms []int, free int) string {
	return pg.Model + "|" + stateKey(pg, rooms) + "|" + strconv.Itoa(free)
}

// carveCache keeps search results by occupancy, rooms and free slices:
// a GPU's occupancy repeats across passes, and the search is the costly
// part of one.
type carveCache struct {
	mu sync.Mutex
	m  map[string]carveResult
}

const carveCacheSize = 1024

func (cc *carveCache) get(key string) (carveResult, bool) {
	if cc == nil {
		return carveResult{}, false
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	r, ok := cc.m[key]
	return r, ok
}

func (cc *carveCache) put(key string, r carveResult) {
	if cc == nil {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.m == nil || len(cc.m) >= carveCacheSize {
		cc.m = map[string]carveResult{}
	}
	cc.m[key] = r
}

// offeredCarves keeps Offered's searches.
var offeredCarves = &carveCache{}

// Offered is, per profile g offers, how many instances of it alone
// Placement accepts on g with the inventories of mode: the room with
// exact inventories, what the carvable totals and slice capacity leave
// with carvable ones (bench/fleet compares the two).
func Offered(g manager.FleetGPU, mode string) map[string]int {
	u := unitsIn(g, nil, mode, offeredCarves)
	out := make(map[string]int, len(u.Classes))
	for _, c := range u.Classes {
		out[c.Profile] = c.Room
	}
	return out
}

// maxHeldBack is the most slots carvable inventories hold back on a free
// GPU of a grid of slices: less than the largest GPU instance that does
// not cover the whole grid, so a whole GPU's claim there is told from a
// partial one.
func maxHeldBack(slices int) int { return max(0, slices/2-1) }
