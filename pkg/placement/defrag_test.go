package placement

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestDefragment(t *testing.T) {
	h := h100Grid()
	for _, tc := range []struct {
		name      string
		fleet     []GPU
		req       Request
		wantMoves []Move
		wantGPU   string
		wantStart int
	}{
		{
			name:      "fits as it is",
			fleet:     gpus(h, "H100", nil),
			req:       Request{Profile: "4g.40gb"},
			wantGPU:   "GPU-0",
			wantStart: 0,
		},
		{
			name:      "move within the GPU",
			fleet:     gpus(h, "H100", []Slot{slot(h, "1g.10gb", 0, "a", "m")}),
			req:       Request{Profile: "4g.40gb"},
			wantMoves: []Move{{Instance: "a", Profile: "1g.10gb", FromGPU: "GPU-0", FromStart: 0, ToGPU: "GPU-0", ToStart: 6}},
			wantGPU:   "GPU-0", wantStart: 0,
		},
		{
			name: "move to another GPU for a 7g",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "1g.10gb", 6, "a", "m")},
				[]Slot{slot(h, "4g.40gb", 0, "b"), slot(h, "2g.20gb", 4, "c")},
			),
			req:       Request{Profile: "7g.80gb"},
			wantMoves: []Move{{Instance: "a", Profile: "1g.10gb", FromGPU: "GPU-0", FromStart: 6, ToGPU: "GPU-1", ToStart: 6}},
			wantGPU:   "GPU-0", wantStart: 0,
		},
		{
			name: "fewest moves beats staying on one GPU",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "1g.10gb", 0, "a", "m"), slot(h, "1g.10gb", 1, "b", "m")},
				[]Slot{slot(h, "2g.20gb", 0, "c", "m"), slot(h, "3g.40gb", 4, "d")},
				[]Slot{slot(h, "4g.40gb", 0, "e"), slot(h, "3g.40gb", 4, "f")},
			),
			req:       Request{Profile: "4g.40gb"},
			wantMoves: []Move{{Instance: "c", Profile: "2g.20gb", FromGPU: "GPU-1", FromStart: 0, ToGPU: "GPU-0", ToStart: 2}},
			wantGPU:   "GPU-1", wantStart: 0,
		},
		{
			name: "a chain: make room for the blocker first",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "3g.40gb", 4, "a", "m")},
				[]Slot{slot(h, "4g.40gb", 0, "b"), slot(h, "1g.10gb", 4, "c", "m")},
				[]Slot{slot(h, "3g.40gb", 0, "d"), slot(h, "2g.20gb", 4, "e")},
			),
			req: Request{Profile: "7g.80gb"},
			wantMoves: []Move{
				{Instance: "c", Profile: "1g.10gb", FromGPU: "GPU-1", FromStart: 4, ToGPU: "GPU-2", ToStart: 6},
				{Instance: "a", Profile: "3g.40gb", FromGPU: "GPU-0", FromStart: 4, ToGPU: "GPU-1", ToStart: 4},
			},
			wantGPU: "GPU-0", wantStart: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := clonePool(tc.fleet)
			moves, d, err := Defragment(tc.fleet, tc.req)
			if err != nil {
				t.Fatalf("Defragment: %v", err)
			}
			if !reflect.DeepEqual(moves, tc.wantMoves) {
				t.Fatalf("moves\n got %v\nwant %v", moves, tc.wantMoves)
			}
			if d.GPU != tc.wantGPU || d.Start != tc.wantStart {
				t.Fatalf("decision %s:%d, want %s:%d (%s)", d.GPU, d.Start, tc.wantGPU, tc.wantStart, d.Reason)
			}
			if len(moves) > 0 && !strings.Contains(d.Reason, "after") {
				t.Errorf("reason %q does not mention the moves", d.Reason)
			}
			if !reflect.DeepEqual(before, tc.fleet) {
				t.Error("Defragment changed the fleet")
			}
			checkPlan(t, tc.fleet, moves, d)
		})
	}
}

func TestDefragmentRefusals(t *testing.T) {
	h := h100Grid()
	blocked := func(opts ...string) []GPU {
		return gpus(h, "H100",
			[]Slot{slot(h, "1g.10gb", 6, "a", opts...)},
			[]Slot{slot(h, "4g.40gb", 0, "b"), slot(h, "2g.20gb", 4, "c")},
		)
	}
	for _, tc := range []struct {
		name     string
		fleet    []GPU
		req      Request
		is       error
		isNot    error
		contains string
	}{
		{"attached instance does not move", blocked(), Request{Profile: "7g.80gb"}, ErrFragmented, nil, "cannot move"},
		{"foreign instance never moves", blocked("m", "f"), Request{Profile: "7g.80gb"}, ErrFragmented, nil, "cannot move"},
		{"nowhere to go", gpus(h, "H100",
			[]Slot{slot(h, "1g.10gb", 6, "a", "m")},
			// Only slice 7 is free here, and no 1g.10gb may start there.
			[]Slot{slot(h, "4g.40gb", 0, "b"), slot(h, "2g.20gb", 4, "c"), slot(h, "1g.10gb", 6, "d")},
		), Request{Profile: "7g.80gb"}, ErrFragmented, nil, "no plan of at most"},
		{"not fragmented", gpus(h, "H100", []Slot{slot(h, "7g.80gb", 0, "a", "m")}), Request{Profile: "1g.10gb"}, ErrNoCapacity, ErrFragmented, "creatable now: nothing"},
		{"unknown profile", blocked(), Request{Profile: "9g"}, ErrUnknownProfile, nil, "9g"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moves, _, err := Defragment(tc.fleet, tc.req)
			if err == nil {
				t.Fatalf("Defragment succeeded with %v", moves)
			}
			if !errors.Is(err, tc.is) || (tc.isNot != nil && errors.Is(err, tc.isNot)) {
				t.Fatalf("error %q: want %v, not %v", err, tc.is, tc.isNot)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Fatalf("error %q does not contain %q", err, tc.contains)
			}
			if strings.Count(err.Error(), ErrFragmented.Error()) > 1 {
				t.Fatalf("error %q names its sentinel twice", err)
			}
		})
	}
}

// checkPlan replays moves as the manager would, failing on any move that is
// not legal at its turn, then checks the decision.
func checkPlan(t *testing.T, fleet []GPU, moves []Move, d Decision) {
	t.Helper()
	work := clonePool(fleet)
	find := func(id string) int {
		for i := range work {
			if work[i].ID == id {
				return i
			}
		}
		t.Fatalf("no GPU %s", id)
		return -1
	}
	seen := map[string]bool{}
	for _, m := range moves {
		if seen[m.Instance] {
			t.Fatalf("%v: instance moved twice", m)
		}
		seen[m.Instance] = true
		from := &work[find(m.FromGPU)]
		var s Slot
		found := false
		for i, x := range from.Used {
			if x.Instance == m.Instance && x.Start == m.FromStart {
				s, found = x, true
				from.Used = append(from.Used[:i], from.Used[i+1:]...)
				break
			}
		}
		if !found || !s.Movable || s.Foreign {
			t.Fatalf("%v: source missing, attached or foreign (%+v)", m, s)
		}
		to := &work[find(m.ToGPU)]
		if !hasInt(LegalStarts(*to, m.Profile), m.ToStart) {
			t.Fatalf("%v: target not legal at its turn", m)
		}
		s.Start = m.ToStart
		to.Used = append(to.Used, s)
	}
	g := work[find(d.GPU)]
	if !hasInt(LegalStarts(g, d.Profile.Name), d.Start) {
		t.Fatalf("decision %s:%d not legal after the moves", d.GPU, d.Start)
	}
}

func hasInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func TestDefragmentPlansAreExecutable(t *testing.T) {
	h := h100Grid()
	rng := rand.New(rand.NewPCG(7, 11))
	planned := 0
	for i := 0; i < 4000; i++ {
		fleet := randomFleet(rng, h, 2+rng.IntN(7), 0.6+0.4*rng.Float64())
		p := h.Profiles[rng.IntN(len(h.Profiles))]
		req := Request{Profile: p.Name}
		placed, perr := Place(fleet, req)
		moves, d, err := Defragment(fleet, req)
		switch {
		case perr == nil:
			if err != nil || len(moves) != 0 || d.GPU != placed.GPU || d.Start != placed.Start {
				t.Fatalf("case %d: Place admits, Defragment = %v, %v", i, moves, err)
			}
		case !errors.Is(perr, ErrFragmented):
			if !errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrFragmented) {
				t.Fatalf("case %d: Place %v, Defragment %v", i, perr, err)
			}
		case err != nil:
			if !errors.Is(err, ErrFragmented) {
				t.Fatalf("case %d: Defragment error %v does not wrap ErrFragmented", i, err)
			}
		default:
			if len(moves) == 0 {
				t.Fatalf("case %d: refused as fragmented, admitted without moves", i)
			}
			planned++
			checkPlan(t, fleet, moves, d)
		}
	}
	if planned < 50 {
		t.Fatalf("only %d cases needed a plan; the test does not exercise Defragment", planned)
	}
}
