package placement

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestGridFromModel(t *testing.T) {
	c := loadCatalog(t)
	m, ok := c.Model("H100-SXM5-80GB")
	if !ok {
		t.Fatal("catalog has no H100-SXM5-80GB")
	}
	g := GridFromModel(m)
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	want := h100Grid()
	if g.Slices != want.Slices {
		t.Fatalf("slices %d, want %d", g.Slices, want.Slices)
	}
	for _, wp := range want.Profiles {
		p, ok := g.Profile(wp.Name)
		if !ok {
			t.Errorf("catalog grid lacks %s", wp.Name)
			continue
		}
		if !reflect.DeepEqual(p, wp) {
			t.Errorf("%s: catalog %+v, reference %+v", wp.Name, p, wp)
		}
	}
	for _, m := range c.Models() {
		if g := GridFromModel(m); g != nil {
			if err := g.Validate(); err != nil {
				t.Errorf("model %s: %v", m.Name, err)
			}
		}
	}
	if GridFromModel(nil) != nil {
		t.Error("GridFromModel(nil) is not nil")
	}
}

func TestGridValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    Grid
		want string
	}{
		{"no slices", Grid{}, "0 slices"},
		{"too wide", Grid{Slices: 65}, "65 slices"},
		{"start outside", Grid{Slices: 4, Profiles: []Profile{{Name: "x", Size: 2, Starts: []int{3}, MaxInstances: 1}}}, "outside"},
		{"unsorted", Grid{Slices: 4, Profiles: []Profile{{Name: "x", Size: 1, Starts: []int{2, 1}, MaxInstances: 1}}}, "ascending"},
		{"no limit", Grid{Slices: 4, Profiles: []Profile{{Name: "x", Size: 1, Starts: []int{0}}}}, "max instances"},
		{"twice", Grid{Slices: 4, Profiles: []Profile{{Name: "x", Size: 1, Starts: []int{0}, MaxInstances: 1}, {Name: "x", Size: 1, Starts: []int{1}, MaxInstances: 1}}}, "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.g.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if err := h100Grid().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestPlace(t *testing.T) {
	h := h100Grid()
	a := a30Grid()
	for _, tc := range []struct {
		name      string
		fleet     []GPU
		req       Request
		wantGPU   string
		wantStart int
		reason    string // a substring of Decision.Reason
	}{
		{
			name:  "3g on an empty GPU keeps the 4g slot",
			fleet: gpus(h, "H100", nil), req: Request{Profile: "3g.40gb"},
			wantGPU: "GPU-0", wantStart: 4, reason: "opens an empty GPU",
		},
		{
			name:  "first 1g on an empty GPU goes to 6",
			fleet: gpus(h, "H100", nil), req: Request{Profile: "1g.10gb"},
			wantGPU: "GPU-0", wantStart: 6,
		},
		{
			name:    "MIG prefix is ignored",
			fleet:   gpus(h, "H100", nil),
			req:     Request{Profile: "MIG 7g.80gb"},
			wantGPU: "GPU-0", wantStart: 0,
		},
		{
			name:    "4g packs next to a 3g rather than opening an empty GPU",
			fleet:   gpus(h, "H100", nil, []Slot{slot(h, "3g.40gb", 4, "a")}),
			req:     Request{Profile: "4g.40gb"},
			wantGPU: "GPU-1", wantStart: 0, reason: "packs a GPU in use (4 of 8 slices)",
		},
		{
			name: "small instance goes where no large room is lost",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "3g.40gb", 4, "a")},                             // 1g here costs the 4g
				[]Slot{slot(h, "4g.40gb", 0, "b"), slot(h, "2g.20gb", 4, "c")}, // 1g at 6 costs nothing large
			),
			req:     Request{Profile: "1g.10gb"},
			wantGPU: "GPU-1", wantStart: 6, reason: "least room lost for larger profiles: 1g.20gb (fleet keeps 2)",
		},
		{
			name:    "1g fills a hole that costs nothing larger",
			fleet:   gpus(h, "H100", []Slot{slot(h, "4g.40gb", 0, "a"), slot(h, "1g.10gb", 4, "b")}),
			req:     Request{Profile: "1g.10gb"},
			wantGPU: "GPU-0", wantStart: 5, reason: "no larger profile loses room",
		},
		{
			name: "fuller GPU wins a tie",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "4g.40gb", 0, "a")},
				[]Slot{slot(h, "4g.40gb", 0, "b"), slot(h, "1g.20gb", 4, "c")},
			),
			req:     Request{Profile: "1g.20gb"},
			wantGPU: "GPU-1", wantStart: 6,
		},
		{
			name: "7g takes the only empty GPU",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "1g.10gb", 6, "a")},
				nil,
			),
			req:     Request{Profile: "7g.80gb"},
			wantGPU: "GPU-1", wantStart: 0,
		},
		{
			name:    "GPU constraint is honoured even when another GPU is better",
			fleet:   gpus(h, "H100", []Slot{slot(h, "3g.40gb", 4, "a")}, nil),
			req:     Request{Profile: "1g.10gb", GPU: "GPU-1"},
			wantGPU: "GPU-1", wantStart: 6,
		},
		{
			name: "media profile limit sends the second +me elsewhere",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "4g.40gb", 0, "a"), slot(h, "1g.10gb+me", 6, "b")},
				[]Slot{slot(h, "4g.40gb", 0, "c")},
			),
			req:     Request{Profile: "1g.10gb+me"},
			wantGPU: "GPU-1", wantStart: 6,
		},
		{
			name: "foreign instance occupies its slices",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "4g.40gb", 0, "", "f")},
			),
			req:     Request{Profile: "3g.40gb"},
			wantGPU: "GPU-0", wantStart: 4,
		},
		{
			name: "unavailable GPU is never chosen",
			fleet: func() []GPU {
				f := gpus(h, "H100", nil, []Slot{slot(h, "3g.40gb", 4, "a")})
				f[1].Unavailable = true
				return f
			}(),
			req:     Request{Profile: "3g.40gb"},
			wantGPU: "GPU-0", wantStart: 4,
		},
		{
			name: "models filter",
			fleet: append(gpus(h, "H100", nil),
				GPU{ID: "A30-0", Model: "A30", Grid: a}),
			req:     Request{Profile: "4g.24gb", Models: []string{"A30"}},
			wantGPU: "A30-0", wantStart: 0,
		},
		{
			name: "spread puts the tenant's second instance on another GPU",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "4g.40gb", 0, "a", "acme")},
				[]Slot{slot(h, "4g.40gb", 0, "b", "other")},
			),
			req:     Request{Profile: "3g.40gb", Tenant: "acme", Affinity: AffinitySpread},
			wantGPU: "GPU-1", wantStart: 4, reason: "spread: tenant acme has 0 here",
		},
		{
			name: "pack puts it next to the tenant's instance",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "4g.40gb", 0, "a", "other")},
				[]Slot{slot(h, "4g.40gb", 0, "b", "acme")},
			),
			req:     Request{Profile: "3g.40gb", Tenant: "acme", Affinity: AffinityPack},
			wantGPU: "GPU-1", wantStart: 4, reason: "pack: tenant acme has 1 here",
		},
		{
			name: "without affinity the tenant does not matter",
			fleet: gpus(h, "H100",
				[]Slot{slot(h, "4g.40gb", 0, "a", "other")},
				[]Slot{slot(h, "4g.40gb", 0, "b", "acme")},
			),
			req:     Request{Profile: "3g.40gb", Tenant: "acme"},
			wantGPU: "GPU-0", wantStart: 4,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := clonePool(tc.fleet)
			d, err := Place(tc.fleet, tc.req)
			if err != nil {
				t.Fatalf("Place: %v", err)
			}
			if d.GPU != tc.wantGPU || d.Start != tc.wantStart {
				t.Fatalf("Place = %s:%d, want %s:%d (%s)", d.GPU, d.Start, tc.wantGPU, tc.wantStart, d.Reason)
			}
			if !strings.Contains(d.Reason, tc.reason) || strings.Contains(d.Reason, "\n") {
				t.Errorf("reason %q, want one line containing %q", d.Reason, tc.reason)
			}
			if !reflect.DeepEqual(before, tc.fleet) {
				t.Error("Place changed the fleet")
			}
		})
	}
}

func TestPlaceErrors(t *testing.T) {
	h := h100Grid()
	full := gpus(h, "H100", []Slot{slot(h, "7g.80gb", 0, "a")})
	fragmented := gpus(h, "H100",
		[]Slot{slot(h, "3g.40gb", 4, "a"), slot(h, "1g.10gb", 0, "b")},
		[]Slot{slot(h, "4g.40gb", 0, "c"), slot(h, "1g.10gb", 4, "d")},
	)
	unavailable := gpus(h, "H100", nil)
	unavailable[0].Unavailable = true
	for _, tc := range []struct {
		name     string
		fleet    []GPU
		req      Request
		is       []error
		isNot    []error
		contains string
	}{
		{"unknown profile", full, Request{Profile: "5g.50gb"}, []error{ErrUnknownProfile}, []error{ErrNoCapacity}, "no GPU model in the fleet offers it"},
		{"profile of another model", full, Request{Profile: "3g.40gb", Models: []string{"A30"}}, []error{ErrUnknownProfile}, nil, "no GPU of model A30 is on this host"},
		{"no such GPU", full, Request{Profile: "1g.10gb", GPU: "GPU-9"}, []error{ErrNoSuchGPU}, nil, "GPU-9"},
		{"full", full, Request{Profile: "1g.10gb"}, []error{ErrNoCapacity}, []error{ErrFragmented}, "creatable now: nothing"},
		{"fragmented", fragmented, Request{Profile: "3g.40gb"}, []error{ErrFragmented, ErrNoCapacity}, nil, "6 slices free"},
		{"fragmented lists what fits", fragmented, Request{Profile: "3g.40gb"}, []error{ErrFragmented}, nil, "1g.20gb×2"},
		{"all unavailable", unavailable, Request{Profile: "1g.10gb"}, []error{ErrNoCapacity}, []error{ErrFragmented}, "unavailable"},
		{"requested GPU full", gpus(h, "H100", nil, []Slot{slot(h, "7g.80gb", 0, "a")}), Request{Profile: "1g.10gb", GPU: "GPU-1"}, []error{ErrNoCapacity}, nil, "the 1 eligible GPU(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Place(tc.fleet, tc.req)
			if err == nil {
				t.Fatal("Place succeeded")
			}
			for _, e := range tc.is {
				if !errors.Is(err, e) {
					t.Errorf("error %q is not %v", err, e)
				}
			}
			for _, e := range tc.isNot {
				if errors.Is(err, e) {
					t.Errorf("error %q is %v", err, e)
				}
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Errorf("error %q does not contain %q", err, tc.contains)
			}
		})
	}
}

// randomFleet fills a fleet by placing random profiles at random legal
// starts (not through Place, so that states Place would not build occur too).
func randomFleet(rng *rand.Rand, g *Grid, n int, fill float64) []GPU {
	fleet := make([]GPU, n)
	id := 0
	for i := range fleet {
		fleet[i] = GPU{ID: "GPU-" + string(rune('A'+i)), Model: "H100", Grid: g}
		for try := 0; try < 12; try++ {
			if rng.Float64() > fill {
				continue
			}
			p := g.Profiles[rng.IntN(len(g.Profiles))]
			starts := LegalStarts(fleet[i], p.Name)
			if len(starts) == 0 {
				continue
			}
			id++
			fleet[i].Used = append(fleet[i].Used, Slot{
				Start: starts[rng.IntN(len(starts))], Size: p.Size, ProfileID: p.ID,
				Instance: "i" + string(rune('0'+id%10)) + string(rune('a'+id/10)), Movable: rng.Float64() < 0.5,
			})
		}
	}
	return fleet
}

func TestPlaceDecisionsAreLegal(t *testing.T) {
	h := h100Grid()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		fleet := randomFleet(rng, h, 1+rng.IntN(8), rng.Float64())
		p := h.Profiles[rng.IntN(len(h.Profiles))]
		d, err := Place(fleet, Request{Profile: p.Name})
		anyLegal := false
		for _, g := range fleet {
			anyLegal = anyLegal || len(LegalStarts(g, p.Name)) > 0
		}
		if err != nil {
			if anyLegal || !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("case %d: Place(%s) = %v, but a legal start exists: %v", i, p.Name, err, anyLegal)
			}
			continue
		}
		var g GPU
		for _, x := range fleet {
			if x.ID == d.GPU {
				g = x
			}
		}
		legal := false
		for _, s := range LegalStarts(g, p.Name) {
			legal = legal || s == d.Start
		}
		if !legal {
			t.Fatalf("case %d: Place(%s) chose %s:%d, not a legal start", i, p.Name, d.GPU, d.Start)
		}
		if d.Profile.Name != p.Name {
			t.Fatalf("case %d: decision profile %s, want %s", i, d.Profile.Name, p.Name)
		}
	}
}

func TestLegalStarts(t *testing.T) {
	h := h100Grid()
	for _, tc := range []struct {
		name    string
		used    []Slot
		profile string
		want    []int
	}{
		{"empty 1g", nil, "1g.10gb", []int{0, 1, 2, 3, 4, 5, 6}},
		{"empty 3g", nil, "3g.40gb", []int{0, 4}},
		{"overlap", []Slot{slot(h, "2g.20gb", 2, "a")}, "3g.40gb", []int{4}},
		{"limit", []Slot{slot(h, "1g.10gb+me", 0, "a")}, "1g.10gb+me", nil},
		{"slice 7 only for 1g.20gb", []Slot{slot(h, "4g.40gb", 0, "a"), slot(h, "2g.20gb", 4, "b"), slot(h, "1g.10gb", 6, "c")}, "1g.10gb", nil},
		{"unknown profile", nil, "9g", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LegalStarts(GPU{ID: "g", Grid: h, Used: tc.used}, tc.profile)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("LegalStarts = %v, want %v", got, tc.want)
			}
		})
	}
	if got := LegalStarts(GPU{ID: "g", Grid: h, Unavailable: true}, "1g.10gb"); got != nil {
		t.Fatalf("unavailable GPU: %v", got)
	}
}

func TestCapacity(t *testing.T) {
	h := h100Grid()
	a := a30Grid()
	fleet := append(gpus(h, "H100",
		nil,
		[]Slot{slot(h, "3g.40gb", 4, "a"), slot(h, "1g.10gb+me", 0, "b")},
	), GPU{ID: "A30-0", Model: "A30", Grid: a, Used: []Slot{slot(a, "2g.12gb", 0, "c")}},
		GPU{ID: "A30-1", Model: "A30", Grid: a, Unavailable: true})
	got := map[string]Free{}
	for _, f := range Capacity(fleet) {
		got[f.Model+"/"+f.Profile] = f
	}
	for key, want := range map[string][2]int{ // count, GPUs
		"H100/7g.80gb":    {1, 1},
		"H100/4g.40gb":    {1, 1},
		"H100/3g.40gb":    {2, 1},
		"H100/2g.20gb":    {4, 2},
		"H100/1g.20gb":    {5, 2},
		"H100/1g.10gb":    {10, 2},
		"H100/1g.10gb+me": {1, 1},
		"A30/4g.24gb":     {0, 0},
		"A30/2g.12gb":     {1, 1},
		"A30/1g.6gb":      {2, 1},
	} {
		f, ok := got[key]
		if !ok {
			t.Errorf("%s missing", key)
			continue
		}
		if f.Count != want[0] || f.GPUs != want[1] {
			t.Errorf("%s: %d on %d GPUs, want %d on %d", key, f.Count, f.GPUs, want[0], want[1])
		}
	}
}
