// Command placement is the placement benchmark (make bench-placement). It
// replays seeded churn traces through five strategies and reports, per
// scenario (fleet x profile mix x offered load), acceptance, slice-weighted
// acceptance, acceptance of large profiles (3g and up) and avoidable
// rejections: refusals that the oracle, given the refusing strategy's own live
// set at that moment, would have admitted. It prints a table and writes the
// figures as JSON (-out).
//
// Strategies: first-fit (the lowest legal start on the first GPU that fits:
// what NVML does without an explicit placement), random legal placement,
// vgpud's allocator (placement.Place), the allocator plus
// placement.Defragment on refusals for fragmentation with 30% of instances
// movable, and an oracle that may re-place every live instance on each
// arrival (exact search over single-GPU configurations). Every strategy of a
// scenario replays the same traces.
//
// Each scenario runs several replications with their own seeds (printed and
// recorded); figures are pooled over them. The gap is oracle minus first-fit
// acceptance; a strategy closes (its acceptance - first-fit) / gap of it.
//
// Imports: pkg/placement, pkg/profile, profiles.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vgpud/vgpud/pkg/placement"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-placement:", err)
		os.Exit(1)
	}
}

// Targets of the issue, checked on every run.
const (
	targetNeverBelow  = 0.995 // vgpud acceptance / first-fit acceptance, every scenario
	targetVgpudClose  = 0.40  // gap share closed by vgpud: mixed and large-heavy mixes at load 1.0
	targetDefragClose = 0.60  // gap share closed with defragmentation: loads 0.85 and 1.0
	decisionBudgetUS  = 1000.0

	// Arrivals before this time (in mean lifetimes) fill the fleet and are
	// replayed but not counted.
	warmupLifetimes = 5.0
	defaultArrivals = 20000
	defaultReps     = 5
	defaultSeed     = 20261202
	// minGap: below this the closed share is not a meaningful ratio.
	minGap = 0.001
)

type config struct {
	out      string
	arrivals int
	reps     int
	seed     uint64
	loads    []float64
	fleets   string
	mixes    string
}

type scenarioResult struct {
	Fleet    string            `json:"fleet"`
	Mix      string            `json:"mix"`
	Load     float64           `json:"load"`
	Seeds    []uint64          `json:"seeds"`
	Arrivals int               `json:"arrivals"`
	Measured int               `json:"measured_arrivals"`
	Results  map[string]*stats `json:"results"`
	// Gap is oracle minus first-fit acceptance; GapSE its standard error
	// over the replications.
	Gap   float64 `json:"gap"`
	GapSE float64 `json:"gap_se"`
	// Closed is each strategy's (acceptance - first-fit) / gap; absent when
	// the gap is under minGap.
	Closed map[string]float64 `json:"gap_closed,omitempty"`
	// ClosedSE is the standard error of Closed from the spread of the
	// paired (strategy - first-fit) difference over the replications.
	ClosedSE map[string]float64 `json:"gap_closed_se,omitempty"`
	Ratio    float64            `json:"vgpud_over_first_fit"`
	Checks   []check            `json:"checks"`
	Notes    []string           `json:"notes,omitempty"`
}

type check struct {
	Name string `json:"name"`
	Pass bool   `json:"pass"`
	What string `json:"what"`
}

type report struct {
	Command        string                           `json:"command"`
	Seed           uint64                           `json:"seed"`
	Arrivals       int                              `json:"arrivals_per_replication"`
	Reps           int                              `json:"replications"`
	Warmup         string                           `json:"warmup"`
	Lifetime       string                           `json:"lifetime"`
	Load           string                           `json:"offered_load"`
	Movable        float64                          `json:"movable_share"`
	Weights        string                           `json:"slice_weight"`
	Large          string                           `json:"large_profiles"`
	Avoidable      string                           `json:"avoidable_rejections"`
	Fleets         map[string][]string              `json:"fleets"`
	GridSources    map[string]string                `json:"grid_sources"`
	Mixes          map[string]map[string][]weighted `json:"mixes"`
	Strategies     map[string]string                `json:"strategies"`
	Scenarios      []*scenarioResult                `json:"scenarios"`
	AllChecksPass  bool                             `json:"all_checks_pass"`
	ElapsedSeconds float64                          `json:"elapsed_seconds"`
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("placement", flag.ContinueOnError)
	var cfg config
	var loads string
	fs.StringVar(&cfg.out, "out", "", "write the JSON report to this file")
	fs.IntVar(&cfg.arrivals, "arrivals", defaultArrivals, "arrivals per replication")
	fs.IntVar(&cfg.reps, "reps", defaultReps, "replications (seeds) per scenario")
	fs.Uint64Var(&cfg.seed, "seed", defaultSeed, "base seed; every replication's seed derives from it")
	fs.StringVar(&loads, "loads", "0.85,1.0,1.2", "offered loads, comma separated")
	fs.StringVar(&cfg.fleets, "fleets", "", "only these fleets (comma separated)")
	fs.StringVar(&cfg.mixes, "mixes", "", "only these mixes (comma separated)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.arrivals <= 0 || cfg.reps <= 0 {
		return fmt.Errorf("-arrivals and -reps must be positive")
	}
	for _, f := range strings.Split(loads, ",") {
		var x float64
		if _, err := fmt.Sscan(strings.TrimSpace(f), &x); err != nil || x <= 0 {
			return fmt.Errorf("bad load %q", f)
		}
		cfg.loads = append(cfg.loads, x)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	grids, sources, err := loadGrids()
	if err != nil {
		return err
	}
	rep := newReport(args, &cfg, sources)
	mixes := benchMixes()
	for _, m := range mixes {
		rep.Mixes[m.Name] = m.Weights
	}
	for fi, f := range benchFleets() {
		if cfg.fleets != "" && !inList(cfg.fleets, f.Name) {
			continue
		}
		for _, g := range f.Groups {
			rep.Fleets[f.Name] = append(rep.Fleets[f.Name], fmt.Sprintf("%dx %s", g.Count, g.Model))
		}
		or, err := newOracle(f, grids, mixes)
		if err != nil {
			return err
		}
		for mi, m := range mixes {
			if cfg.mixes != "" && !inList(cfg.mixes, m.Name) {
				continue
			}
			for li, load := range cfg.loads {
				var seeds []uint64
				for r := 0; r < cfg.reps; r++ {
					seeds = append(seeds, cfg.seed+uint64(10000*fi+1000*mi+100*li+r))
				}
				sr, err := runScenario(f, m, load, seeds, cfg.arrivals, grids, or)
				if err != nil {
					return err
				}
				rep.Scenarios = append(rep.Scenarios, sr)
				for _, c := range sr.Checks {
					rep.AllChecksPass = rep.AllChecksPass && c.Pass
				}
			}
		}
	}
	rep.ElapsedSeconds = math.Round(time.Since(started).Seconds()*10) / 10
	printTable(stdout, rep)
	if cfg.out != "" {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
		if err := os.WriteFile(cfg.out, buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", cfg.out)
	}
	return nil
}

func newReport(args []string, cfg *config, sources map[string]string) *report {
	return &report{
		Command:  strings.TrimSpace("go run ./bench/placement " + strings.Join(args, " ")),
		Seed:     cfg.seed,
		Arrivals: cfg.arrivals,
		Reps:     cfg.reps,
		Warmup:   fmt.Sprintf("arrivals before t=%g mean lifetimes are replayed but not counted", warmupLifetimes),
		Lifetime: "exponential, mean 1; Poisson arrivals",
		Load:     "per model: arrival rate x mean lifetime x mean profile size / (GPUs x grid slices)",
		Movable:  movableShare,
		Weights:  "profile size / grid slices (the instance's share of one GPU)",
		Large:    "3g and up (compute slices >= 3)",
		Avoidable: "refusals the oracle would have admitted given the refusing strategy's own live set at that moment; " +
			"avoidable_share_of_refusals = avoidable / refusals",
		Fleets:      map[string][]string{},
		GridSources: sources,
		Mixes:       map[string]map[string][]weighted{},
		Strategies: map[string]string{
			stratFirstFit: "lowest legal free start on the first GPU that fits (NVML without a placement)",
			stratRandom:   "uniformly random legal (GPU, start)",
			stratVgpud:    "placement.Place",
			stratDefrag: fmt.Sprintf("placement.Place, then placement.Defragment on ErrFragmented; %.0f%% of instances movable (drawn per instance in the trace)",
				100*movableShare),
			stratOracle: "re-places every live instance on each arrival: admits iff the live multiset plus the request splits into legal single-GPU configurations",
		},
		AllChecksPass: true,
	}
}

func inList(list, s string) bool {
	for _, x := range strings.Split(list, ",") {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}

// newOracle builds the oracle for a fleet over every profile any mix asks of
// each model, so that its memo serves every scenario of the fleet.
func newOracle(f fleetSpec, grids map[string]*placement.Grid, mixes []mix) (*oracle, error) {
	or := &oracle{models: map[string]*oracleModel{}, gpus: map[string]int{}}
	for _, g := range f.Groups {
		seen := map[string]bool{}
		var names []string
		for _, m := range mixes {
			for _, w := range m.Weights[g.Model] {
				if !seen[w.Profile] {
					seen[w.Profile] = true
					names = append(names, w.Profile)
				}
			}
		}
		if or.models[g.Model] == nil {
			om, err := newOracleModel(g.Model, grids[g.Model], names)
			if err != nil {
				return nil, err
			}
			or.models[g.Model] = om
		}
		or.gpus[g.Model] += g.Count
	}
	return or, nil
}

func runScenario(f fleetSpec, m mix, load float64, seeds []uint64, n int, grids map[string]*placement.Grid, or *oracle) (*scenarioResult, error) {
	sr := &scenarioResult{Fleet: f.Name, Mix: m.Name, Load: load, Seeds: seeds, Results: map[string]*stats{}}
	for _, name := range strategyOrder {
		sr.Results[name] = &stats{}
	}
	for _, seed := range seeds {
		trace, err := genTrace(seed, f, m, grids, load, n)
		if err != nil {
			return nil, err
		}
		sr.Arrivals += n
		for si, name := range strategyOrder {
			st := sr.Results[name]
			before := *st
			r := &runner{
				name:   name,
				or:     or,
				fleet:  f.build(grids),
				gpuOf:  map[string]int{},
				live:   live{},
				rng:    rand.New(rand.NewPCG(seed, uint64(si))),
				warmup: warmupLifetimes,
				st:     st,
			}
			if err := r.run(trace); err != nil {
				return nil, fmt.Errorf("%s/%s/%.2f seed %d: %w", f.Name, m.Name, load, seed, err)
			}
			st.ByReplication = append(st.ByReplication,
				round4(float64(st.Accepted-before.Accepted)/float64(max(1, st.Arrivals-before.Arrivals))))
		}
	}
	for _, name := range strategyOrder {
		sr.Results[name].finish()
	}
	sr.Measured = sr.Results[stratFirstFit].Arrivals
	evaluate(sr)
	return sr, nil
}

// evaluate computes the gap, the shares closed, the checks and the notes.
func evaluate(sr *scenarioResult) {
	res := sr.Results
	ff := res[stratFirstFit].Acceptance
	sr.Gap = round4(res[stratOracle].Acceptance - ff)
	sr.GapSE = round4(pairedSE(res[stratOracle].ByReplication, res[stratFirstFit].ByReplication))
	if sr.Gap >= minGap {
		sr.Closed = map[string]float64{}
		sr.ClosedSE = map[string]float64{}
		gap := res[stratOracle].Acceptance - ff
		for _, s := range []string{stratRandom, stratVgpud, stratDefrag} {
			sr.Closed[s] = round4((res[s].Acceptance - ff) / gap)
			sr.ClosedSE[s] = round4(pairedSE(res[s].ByReplication, res[stratFirstFit].ByReplication) / gap)
		}
	}
	if ff > 0 {
		sr.Ratio = round4(res[stratVgpud].Acceptance / ff)
	}
	sr.Checks = append(sr.Checks, check{
		Name: "vgpud >= 0.995 x first-fit",
		Pass: sr.Ratio >= targetNeverBelow,
		What: fmt.Sprintf("%.4f / %.4f = %.4f", res[stratVgpud].Acceptance, ff, sr.Ratio),
	})
	closes := func(s string, target float64) check {
		c := check{Name: fmt.Sprintf("%s closes >= %.0f%% of the gap", s, 100*target)}
		if sr.Gap < minGap {
			// No gap to close: the strategy must simply not fall below first-fit.
			c.Pass = res[s].Acceptance >= ff-minGap
			c.What = fmt.Sprintf("gap %.4f < %.3f; %s %.4f vs first-fit %.4f", sr.Gap, minGap, s, res[s].Acceptance, ff)
			return c
		}
		c.Pass = sr.Closed[s] >= target
		c.What = fmt.Sprintf("gap %.4f (se %.4f), closed %.2f (se %.2f)", sr.Gap, sr.GapSE, sr.Closed[s], sr.ClosedSE[s])
		return c
	}
	if sr.Load == 1.0 && (sr.Mix == "mixed" || sr.Mix == "large-heavy") {
		sr.Checks = append(sr.Checks, closes(stratVgpud, targetVgpudClose))
	}
	if sr.Load == 0.85 || sr.Load == 1.0 {
		sr.Checks = append(sr.Checks, closes(stratDefrag, targetDefragClose))
	}
	mean := res[stratVgpud].MeanDecisionMicros
	sr.Checks = append(sr.Checks, check{
		Name: "vgpud mean decision under 1 ms",
		Pass: mean < decisionBudgetUS,
		What: fmt.Sprintf("%.1f us", mean),
	})
	sr.Notes = notes(sr)
}

// notes explain, by rule, the figures that need it.
func notes(sr *scenarioResult) []string {
	res := sr.Results
	ff := res[stratFirstFit]
	or := res[stratOracle]
	var out []string
	if sr.Gap < 2*sr.GapSE || sr.Gap < 0.005 {
		out = append(out, fmt.Sprintf("the gap (%.4f) is within about two standard errors (%.4f) or under half a point: "+
			"the shares closed are dominated by noise here", sr.Gap, sr.GapSE))
	}
	if or.Acceptance < ff.Acceptance {
		out = append(out, "the oracle accepts fewer requests than first-fit: it admits every large instance that fits "+
			"and the slices those take turn away more small requests later (compare slice-weighted and large acceptance, where it leads)")
	}
	if ff.Refusals > 0 {
		out = append(out, fmt.Sprintf("%.0f%% of first-fit's refusals were avoidable; the rest had no room under any placement",
			100*ff.AvoidableShare))
	}
	return out
}

// pairedSE is the standard error of the mean difference of two per-replication series.
func pairedSE(a, b []float64) float64 {
	n := min(len(a), len(b))
	if n < 2 {
		return 0
	}
	var mean float64
	d := make([]float64, n)
	for i := range d {
		d[i] = a[i] - b[i]
		mean += d[i]
	}
	mean /= float64(n)
	var ss float64
	for _, x := range d {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

func printTable(w io.Writer, rep *report) {
	fmt.Fprintf(w, "placement benchmark: base seed %d, %d replications x %d arrivals per scenario (warm-up t<%g not counted), %.0f%% movable\n",
		rep.Seed, rep.Reps, rep.Arrivals, warmupLifetimes, 100*movableShare)
	models := make([]string, 0, len(rep.GridSources))
	for m := range rep.GridSources {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, m := range models {
		fmt.Fprintf(w, "  grid %s: %s\n", m, rep.GridSources[m])
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fleet\tmix\tload\tstrategy\taccept\tslice-w\tlarge\trefused\tavoidable\tclosed\tmoves\tus/dec\t")
	for _, sr := range rep.Scenarios {
		for _, name := range strategyOrder {
			s := sr.Results[name]
			closed := "-"
			if c, ok := sr.Closed[name]; ok {
				closed = fmt.Sprintf("%.2f", c)
			}
			moves := "-"
			if name == stratDefrag {
				moves = fmt.Sprint(s.Moves)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%.4f\t%.4f\t%.4f\t%d\t%d\t%s\t%s\t%.1f\t\n",
				sr.Fleet, sr.Mix, sr.Load, name, s.Acceptance, s.SliceAcceptance, s.LargeAcceptance,
				s.Refusals, s.Avoidable, closed, moves, s.MeanDecisionMicros)
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "checks:")
	for _, sr := range rep.Scenarios {
		for _, c := range sr.Checks {
			mark := "ok  "
			if !c.Pass {
				mark = "FAIL"
			}
			fmt.Fprintf(w, "  %s %s/%s/%.2f: %s: %s\n", mark, sr.Fleet, sr.Mix, sr.Load, c.Name, c.What)
		}
	}
	fmt.Fprintln(w, "notes:")
	for _, sr := range rep.Scenarios {
		for _, n := range sr.Notes {
			fmt.Fprintf(w, "  %s/%s/%.2f: %s\n", sr.Fleet, sr.Mix, sr.Load, n)
		}
	}
	fmt.Fprintf(w, "all checks pass: %v (%.1fs)\n", rep.AllChecksPass, rep.ElapsedSeconds)
}
