package main

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/placement"
)

func testGrids(t *testing.T) map[string]*placement.Grid {
	t.Helper()
	grids, _, err := loadGrids()
	if err != nil {
		t.Fatal(err)
	}
	return grids
}

func h100Oracle(t *testing.T) *oracleModel {
	t.Helper()
	g := fallbackGrids()[modelH100]
	var names []string
	for _, p := range g.Profiles {
		names = append(names, p.Name)
	}
	om, err := newOracleModel(modelH100, g, names)
	if err != nil {
		t.Fatal(err)
	}
	return om
}

func (o *oracleModel) vecOf(t *testing.T, counts map[string]int) vec {
	t.Helper()
	var v vec
	for name, n := range counts {
		d, ok := o.dimOf[name]
		if !ok {
			t.Fatalf("no dimension %s", name)
		}
		v = v.add(d, n)
	}
	return v
}

func TestOracleFeasible(t *testing.T) {
	o := h100Oracle(t)
	for _, tc := range []struct {
		name   string
		counts map[string]int
		gpus   int
		want   bool
	}{
		{"nothing", nil, 0, true},
		{"one 7g", map[string]int{"7g.80gb": 1}, 1, true},
		{"two 7g on one GPU", map[string]int{"7g.80gb": 2}, 1, false},
		{"4g and 3g share a GPU", map[string]int{"4g.40gb": 1, "3g.40gb": 1}, 1, true},
		{"two 4g need two GPUs", map[string]int{"4g.40gb": 2}, 1, false},
		{"two 4g, two 3g on two GPUs", map[string]int{"4g.40gb": 2, "3g.40gb": 2}, 2, true},
		{"seven 1g.10gb", map[string]int{"1g.10gb": 7}, 1, true},
		{"eight 1g.10gb do not fit one GPU", map[string]int{"1g.10gb": 8}, 1, false},
		{"six 1g.10gb and a 1g.20gb at 6", map[string]int{"1g.10gb": 6, "1g.20gb": 1}, 1, true},
		{"seven 1g.10gb and a 1g.20gb", map[string]int{"1g.10gb": 7, "1g.20gb": 1}, 1, false},
		{"three 2g and a 1g.20gb", map[string]int{"2g.20gb": 3, "1g.20gb": 1}, 1, true},
		{"four 2g", map[string]int{"2g.20gb": 4}, 1, false},
		{"two +me on one GPU", map[string]int{"1g.10gb+me": 2}, 1, false},
		{"two +me on two GPUs", map[string]int{"1g.10gb+me": 2}, 2, true},
		{"4g blocks the lower half", map[string]int{"4g.40gb": 1, "2g.20gb": 3}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := o.feasible(o.vecOf(t, tc.counts), tc.gpus); got != tc.want {
				t.Fatalf("feasible = %v, want %v", got, tc.want)
			}
		})
	}
}

// bruteFeasible places the instances one by one at every legal start of
// every GPU: slow, obviously right.
func bruteFeasible(fleet []placement.GPU, names []string) bool {
	if len(names) == 0 {
		return true
	}
	p, _ := fleet[0].Grid.Profile(names[0])
	for i := range fleet {
		for _, s := range placement.LegalStarts(fleet[i], names[0]) {
			fleet[i].Used = append(fleet[i].Used, placement.Slot{Start: s, Size: p.Size, ProfileID: p.ID})
			ok := bruteFeasible(fleet, names[1:])
			fleet[i].Used = fleet[i].Used[:len(fleet[i].Used)-1]
			if ok {
				return true
			}
		}
	}
	return false
}

func TestOracleMatchesBruteForce(t *testing.T) {
	for _, model := range []string{modelH100, modelA30, modelRTX} {
		t.Run(model, func(t *testing.T) {
			g := fallbackGrids()[model]
			var profiles []string
			for _, m := range benchMixes() {
				for _, w := range m.Weights[model] {
					if !contains(profiles, w.Profile) {
						profiles = append(profiles, w.Profile)
					}
				}
			}
			o, err := newOracleModel(model, g, profiles)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			outcomes := map[bool]int{}
			for i := 0; i < 300; i++ {
				n := 1 + rng.IntN(3)
				counts := map[string]int{}
				var names []string
				slices := 0
				for slices < n*g.Slices-rng.IntN(g.Slices/2+1) {
					p, _ := g.Profile(profiles[rng.IntN(len(profiles))])
					counts[p.Name]++
					names = append(names, p.Name)
					slices += p.Size
				}
				// Largest first keeps the brute force quick.
				sortBySize(g, names)
				fleet := make([]placement.GPU, n)
				for k := range fleet {
					fleet[k] = placement.GPU{ID: "g", Model: model, Grid: g}
				}
				want := bruteFeasible(fleet, names)
				outcomes[want]++
				if got := o.feasible(o.vecOf(t, counts), n); got != want {
					t.Fatalf("case %d: %v on %d GPUs: oracle %v, brute force %v", i, counts, n, got, want)
				}
			}
			if outcomes[true] < 30 || outcomes[false] < 30 {
				t.Fatalf("outcomes %v: the cases do not exercise both answers", outcomes)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortBySize(g *placement.Grid, names []string) {
	size := func(n string) int { p, _ := g.Profile(n); return p.Size }
	for i := 1; i < len(names); i++ {
		for j := i; j > 0 && size(names[j]) > size(names[j-1]); j-- {
			names[j], names[j-1] = names[j-1], names[j]
		}
	}
}

func TestTrace(t *testing.T) {
	grids := testGrids(t)
	for _, f := range benchFleets() {
		for _, m := range benchMixes() {
			a, err := genTrace(42, f, m, grids, 1.0, 20000)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := genTrace(42, f, m, grids, 1.0, 20000)
			if len(a) != len(b) || a[100] != b[100] || a[len(a)-1] != b[len(b)-1] {
				t.Fatalf("%s/%s: same seed, different traces", f.Name, m.Name)
			}
			// Offered load: slice-time demanded per unit of time over the fleet's slices.
			var demand, movable float64
			for _, x := range a {
				demand += x.Life * float64(x.Size) / float64(grids[x.Model].Slices)
				if x.Movable {
					movable++
				}
			}
			gpus := 0
			for _, g := range f.Groups {
				gpus += g.Count
			}
			load := demand / a[len(a)-1].T / float64(gpus)
			if math.Abs(load-1.0) > 0.05 {
				t.Errorf("%s/%s: offered load %.3f, want 1.0", f.Name, m.Name, load)
			}
			if share := movable / float64(len(a)); math.Abs(share-movableShare) > 0.02 {
				t.Errorf("%s/%s: movable share %.3f, want %.2f", f.Name, m.Name, share, movableShare)
			}
		}
	}
}

func TestRunWritesReport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "placement.json")
	var stdout bytes.Buffer
	err := run([]string{"-arrivals", "1500", "-reps", "2", "-loads", "1.0", "-fleets", "8xH100", "-mixes", "mixed", "-out", out}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"base seed", "first-fit", "vgpud+defrag", "oracle", "checks:"} {
		if !strings.Contains(stdout.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, stdout.String())
		}
	}
	rep := readReport(t, out)
	if len(rep.Scenarios) != 1 {
		t.Fatalf("%d scenarios, want 1", len(rep.Scenarios))
	}
	checkScenario(t, rep.Scenarios[0])
}

func readReport(t *testing.T, path string) *report {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	return &rep
}

func checkScenario(t *testing.T, sr *scenarioResult) {
	t.Helper()
	for _, name := range strategyOrder {
		s, ok := sr.Results[name]
		if !ok {
			t.Fatalf("%s/%s/%.2f: no %s", sr.Fleet, sr.Mix, sr.Load, name)
		}
		if s.Arrivals != sr.Measured || s.Accepted+s.Refusals != s.Arrivals {
			t.Errorf("%s: %d accepted + %d refused != %d arrivals", name, s.Accepted, s.Refusals, s.Arrivals)
		}
		if s.Acceptance < 0 || s.Acceptance > 1 || s.LargeAcceptance > 1 || s.SliceAcceptance > 1 {
			t.Errorf("%s: figures out of range: %+v", name, s)
		}
		if s.Avoidable > s.Refusals {
			t.Errorf("%s: %d avoidable of %d refusals", name, s.Avoidable, s.Refusals)
		}
		if len(s.ByReplication) != len(sr.Seeds) {
			t.Errorf("%s: %d replication figures for %d seeds", name, len(s.ByReplication), len(sr.Seeds))
		}
	}
	if a := sr.Results[stratOracle].Avoidable; a != 0 {
		t.Errorf("the oracle has %d avoidable rejections", a)
	}
	if sr.Results[stratDefrag].Moves == 0 {
		t.Error("defragmentation never moved anything")
	}
	if len(sr.Checks) == 0 {
		t.Error("no checks")
	}
}

// TestCommittedReport checks bench/placement.json, the figures the issue's
// done criteria refer to: produced by the default command, complete, and
// passing.
func TestCommittedReport(t *testing.T) {
	rep := readReport(t, filepath.Join("..", "placement.json"))
	if rep.Arrivals != defaultArrivals || rep.Reps != defaultReps || rep.Seed != defaultSeed {
		t.Fatalf("report made with %d arrivals x %d reps, seed %d; want the defaults", rep.Arrivals, rep.Reps, rep.Seed)
	}
	if want := len(benchFleets()) * len(benchMixes()) * 3; len(rep.Scenarios) != want {
		t.Fatalf("%d scenarios, want %d", len(rep.Scenarios), want)
	}
	for _, sr := range rep.Scenarios {
		checkScenario(t, sr)
		for _, c := range sr.Checks {
			if !c.Pass {
				t.Errorf("%s/%s/%.2f: %s: %s", sr.Fleet, sr.Mix, sr.Load, c.Name, c.What)
			}
		}
	}
	if !rep.AllChecksPass {
		t.Error("all_checks_pass is false")
	}
}
