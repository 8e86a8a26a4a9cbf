// Command candidatecost measures what one GET /allocation_candidates
// costs Placement as a function of how many resource classes each
// matching provider carries, and of how many classes the request group
// asks, on one Placement (PostgreSQL) with nothing else on it: the cause
// of vgpud's allocation-candidates ratio against Nova's one-class pGPU
// model (docs/fleet.md, Scale), measured apart from vgpud.
//
// Each variant is its own set of hosts × GPUs providers with its own
// classes, so no query matches another variant's providers: a GPU
// provider carries the variant's own class A (total 16; "three" adds B
// and C, the GPU-class and framebuffer shape of vgpud's flavors) and Pad
// more classes nobody asks, as vgpud's GPU providers carry the classes of
// the profiles a request does not name. The one-class variant asking A
// and a required trait is Nova's model.
//
// Imports: internal/testenv/placement, pkg/placementapi.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

var ns = uuid.MustParse("4d1c77a0-3a4b-4f33-8f7b-8a3a1c1e2b10")

// Variant is one provider shape and the request that matches it.
type Variant struct {
	Name string `json:"name"`
	// ClassesPerProvider is what each GPU provider carries; Asked what
	// the request group asks (a trait besides, when 1).
	ClassesPerProvider int     `json:"classesPerProvider"`
	Asked              int     `json:"classesAsked"`
	Candidates         int     `json:"candidates"`
	P50Ms              float64 `json:"p50Ms"`
	P90Ms              float64 `json:"p90Ms"`
	// Ratio is P50Ms over the one-class variant's (Nova's model).
	Ratio float64 `json:"ratioP50"`
	pad   int
}

type result struct {
	Cores       int       `json:"cores"`
	Database    string    `json:"database"`
	Hosts       int       `json:"hosts"`
	GPUsPerHost int       `json:"gpusPerHost"`
	Samples     int       `json:"samples"`
	Variants    []Variant `json:"variants"`
	Note        string    `json:"note"`
}

func main() {
	hosts := flag.Int("hosts", 100, "hosts (a root provider each) per variant")
	gpus := flag.Int("gpus", 8, "GPU providers per host")
	samples := flag.Int("samples", 15, "requests per variant, the variants interleaved")
	out := flag.String("out", "bench/candidate-cost.json", "where to write the results")
	flag.Parse()
	if *hosts < 1 || *gpus < 1 || *samples < 1 {
		log.Fatal("-hosts, -gpus and -samples must be at least 1")
	}
	if err := run(*hosts, *gpus, *samples, *out); err != nil {
		log.Fatal(err)
	}
}

func run(hosts, gpus, samples int, out string) error {
	vs := []Variant{
		{Name: "nova", ClassesPerProvider: 1, Asked: 1},
		{Name: "pad2", ClassesPerProvider: 3, Asked: 1, pad: 2},
		{Name: "pad8", ClassesPerProvider: 9, Asked: 1, pad: 8},
		{Name: "pad16", ClassesPerProvider: 17, Asked: 1, pad: 16},
		{Name: "pad32", ClassesPerProvider: 33, Asked: 1, pad: 32},
		{Name: "three", ClassesPerProvider: 3, Asked: 3},
		{Name: "three-pad30", ClassesPerProvider: 33, Asked: 3, pad: 30},
	}
	dir, err := os.MkdirTemp("", "vgpud-bench-candidatecost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := tplacement.OpenWith(filepath.Join(dir, "placement"), tplacement.Options{Postgres: true, Processes: 2})
	if err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	defer srv.Close()
	c, err := placementapi.New(placementapi.Config{Endpoint: srv.URL(), Timeout: 2 * time.Minute, MaxBody: 512 << 20})
	if err != nil {
		return err
	}
	ctx := context.Background()
	for i := range 32 {
		if err := c.EnsureResourceClass(ctx, fmt.Sprintf("CUSTOM_CCOST_PAD_%d", i)); err != nil {
			return err
		}
	}
	start := time.Now()
	for _, v := range vs {
		if err := publish(ctx, c, v, hosts, gpus); err != nil {
			return fmt.Errorf("%s: %w", v.Name, err)
		}
	}
	log.Printf("published %d variants × %d providers in %v (%d requests)", len(vs), hosts*(gpus+1), time.Since(start).Round(time.Second), c.Requests())
	times := make([][]float64, len(vs))
	for range samples {
		for i, v := range vs {
			t := time.Now()
			cands, err := c.AllocationCandidates(ctx, query(v))
			if err != nil {
				return fmt.Errorf("%s: %w", v.Name, err)
			}
			times[i] = append(times[i], float64(time.Since(t).Microseconds())/1000)
			vs[i].Candidates = len(cands)
		}
	}
	for i := range vs {
		sort.Float64s(times[i])
		vs[i].P50Ms, vs[i].P90Ms = times[i][len(times[i])/2], times[i][len(times[i])*9/10]
	}
	for i := range vs {
		vs[i].Ratio = vs[i].P50Ms / vs[0].P50Ms
		log.Printf("%-12s classes %2d asked %d: %d candidates p50 %.1f ms p90 %.1f ms (%.2f×)", vs[i].Name, vs[i].ClassesPerProvider, vs[i].Asked, vs[i].Candidates, vs[i].P50Ms, vs[i].P90Ms, vs[i].Ratio)
	}
	data, err := json.MarshalIndent(result{Cores: runtime.NumCPU(), Database: "postgresql", Hosts: hosts, GPUsPerHost: gpus, Samples: samples, Variants: vs,
		Note: "GET /allocation_candidates?limit=1000 at microversion 1.39; each variant has its own hosts × GPU providers and classes on the same Placement; classesPerProvider counts every class a GPU provider carries, classesAsked those the numbered group asks (1: with a required trait, as Nova's pGPU flavors ask)"}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

func class(v Variant, s string) string {
	return "CUSTOM_CCOST_" + strings.ToUpper(strings.ReplaceAll(v.Name, "-", "_")) + "_" + s
}

func trait(v Variant) string { return class(v, "T") }

func query(v Variant) string {
	q := url.Values{"limit": {"1000"}}
	if v.Asked == 3 {
		q.Set("resources1", class(v, "A")+":1,"+class(v, "B")+":1,"+class(v, "C")+":4096")
	} else {
		q.Set("resources1", class(v, "A")+":1")
		q.Set("required1", trait(v))
	}
	return q.Encode()
}

func publish(ctx context.Context, c *placementapi.Client, v Variant, hosts, gpus int) error {
	names := []string{"A"}
	if v.Asked == 3 {
		names = append(names, "B", "C")
	}
	for _, s := range names {
		if err := c.EnsureResourceClass(ctx, class(v, s)); err != nil {
			return err
		}
	}
	if err := c.EnsureTrait(ctx, trait(v)); err != nil {
		return err
	}
	inv := map[string]placementapi.Inventory{class(v, "A"): {Total: 16, MinUnit: 1, MaxUnit: 16, StepSize: 1, AllocationRatio: 1}}
	if v.Asked == 3 {
		inv[class(v, "B")] = placementapi.Inventory{Total: 64, MinUnit: 1, MaxUnit: 64, StepSize: 1, AllocationRatio: 1}
		inv[class(v, "C")] = placementapi.Inventory{Total: 81920, MinUnit: 1, MaxUnit: 81920, StepSize: 1, AllocationRatio: 1}
	}
	for i := range v.pad {
		inv[fmt.Sprintf("CUSTOM_CCOST_PAD_%d", i)] = placementapi.Inventory{Total: 4, MinUnit: 1, MaxUnit: 1, StepSize: 1, AllocationRatio: 1}
	}
	errs := make(chan error, hosts)
	sem := make(chan struct{}, 8)
	for h := range hosts {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			errs <- publishHost(ctx, c, v, h, gpus, inv)
		}()
	}
	var first error
	for range hosts {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func publishHost(ctx context.Context, c *placementapi.Client, v Variant, h, gpus int, inv map[string]placementapi.Inventory) error {
	root := uuid.NewSHA1(ns, []byte(fmt.Sprintf("%s/%d", v.Name, h))).String()
	if err := c.CreateProvider(ctx, root, fmt.Sprintf("ccost-%s-%d", v.Name, h), ""); err != nil {
		return err
	}
	for g := range gpus {
		id := uuid.NewSHA1(ns, []byte(fmt.Sprintf("%s/%d/%d", v.Name, h, g))).String()
		if err := c.CreateProvider(ctx, id, fmt.Sprintf("ccost-%s-%d-%d", v.Name, h, g), root); err != nil {
			return err
		}
		gen, err := c.SetInventories(ctx, id, 0, inv)
		if err != nil {
			return err
		}
		if _, err := c.SetTraits(ctx, id, gen, []string{trait(v)}); err != nil {
			return err
		}
	}
	return nil
}
