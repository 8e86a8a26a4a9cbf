package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// The anchor is the same fleet published Nova's way, on the same
// Placement: a root per host and a provider per physical GPU with one
// class, VGPU, and a CUSTOM trait per type the GPU offers (the trait an
// operator sets on Nova's pGPU providers for a flavor's
// trait:CUSTOM_...=required). Each GPU carries the trait of every flavor
// vgpud publishes a class for on it, so both ways match the same GPUs.

var anchorNS = uuid.MustParse("0b6f6a4e-6a51-4c38-9a3c-2d6b7f0e4a11")

func anchorTrait(f tplacement.ProfileFlavor) string {
	return "CUSTOM_NOVA_" + strings.TrimPrefix(fleet.ClassName(f.Kind, f.Profile), "CUSTOM_VGPUD_")
}

// publishAnchor writes the anchor for hosts; it returns the requests made.
func publishAnchor(ctx context.Context, c *placementapi.Client, hosts []*host) (uint64, error) {
	before := c.Requests()
	// Which of vgpud's GPU providers offers each flavor's class.
	offers := map[string][]string{} // provider → traits
	for _, f := range tplacement.ProfileFlavors {
		var out struct {
			Providers []struct {
				UUID string `json:"uuid"`
			} `json:"resource_providers"`
		}
		q := url.Values{"resources": {fleet.ClassName(f.Kind, f.Profile) + ":1"}}
		if err := c.Do(ctx, "GET", "/resource_providers?"+q.Encode(), nil, &out); err != nil {
			return 0, fmt.Errorf("providers offering %s: %w", f.Profile, err)
		}
		t := anchorTrait(f)
		if err := c.EnsureTrait(ctx, t); err != nil {
			return 0, err
		}
		for _, p := range out.Providers {
			offers[p.UUID] = append(offers[p.UUID], t)
		}
	}
	err := each(len(hosts), 8, func(i int) error {
		h := hosts[i]
		root := uuid.NewSHA1(anchorNS, []byte("root:"+h.name)).String()
		if err := c.CreateProvider(ctx, root, "nova-"+h.name, ""); err != nil {
			return fmt.Errorf("anchor root %s: %w", h.name, err)
		}
		pcis := make([]string, 0, len(h.gpus))
		for pci := range h.gpus {
			pcis = append(pcis, pci)
		}
		sort.Strings(pcis)
		for _, pci := range pcis {
			traits := offers[h.gpus[pci]]
			if len(traits) == 0 {
				continue
			}
			id := uuid.NewSHA1(anchorNS, []byte("gpu:"+h.gpus[pci])).String()
			if err := c.CreateProvider(ctx, id, fleet.GPUProviderName("nova-"+h.name, pci), root); err != nil {
				return fmt.Errorf("anchor pGPU %s %s: %w", h.name, pci, err)
			}
			gen, err := c.SetInventories(ctx, id, 0, map[string]placementapi.Inventory{
				"VGPU": {Total: 16, MinUnit: 1, MaxUnit: 16, StepSize: 1, AllocationRatio: 1}})
			if err != nil {
				return fmt.Errorf("anchor inventory %s %s: %w", h.name, pci, err)
			}
			if _, err := c.SetTraits(ctx, id, gen, traits); err != nil {
				return fmt.Errorf("anchor traits %s %s: %w", h.name, pci, err)
			}
		}
		return nil
	})
	return c.Requests() - before, err
}

// FlavorTiming is GET /allocation_candidates for one flavor of the table,
// asked vgpud's way and the anchor's (Nova's pGPU providers).
type FlavorTiming struct {
	Profile          string  `json:"profile"`
	Query            string  `json:"query"`
	Candidates       int     `json:"candidates"`
	P50Ms            float64 `json:"p50Ms"`
	P99Ms            float64 `json:"p99Ms"`
	AnchorQuery      string  `json:"anchorQuery"`
	AnchorCandidates int     `json:"anchorCandidates"`
	AnchorP50Ms      float64 `json:"anchorP50Ms"`
	AnchorP99Ms      float64 `json:"anchorP99Ms"`
	// RatioP50 and RatioP99 are vgpud's time over the anchor's.
	RatioP50 float64 `json:"ratioP50"`
	RatioP99 float64 `json:"ratioP99"`
}

// timeCandidates asks every flavor of the table, limit=1000 as Nova
// does, samples times each way, the two ways interleaved.
func timeCandidates(ctx context.Context, c *placementapi.Client, samples int) ([]FlavorTiming, error) {
	var out []FlavorTiming
	for _, f := range tplacement.ProfileFlavors {
		r := f.Request(fleet.ClassName, tplacement.WithFramebuffer)
		q := url.Values{"resources1": {r.Resources}, "limit": {"1000"}}.Encode()
		aq := url.Values{"resources1": {"VGPU:1"}, "required1": {anchorTrait(f)}, "limit": {"1000"}}.Encode()
		ft := FlavorTiming{Profile: f.Profile, Query: q, AnchorQuery: aq}
		var mine, theirs []float64
		for range samples {
			d, n, err := candidates(ctx, c, q)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Profile, err)
			}
			mine, ft.Candidates = append(mine, d), n
			if d, n, err = candidates(ctx, c, aq); err != nil {
				return nil, fmt.Errorf("%s (anchor): %w", f.Profile, err)
			}
			theirs, ft.AnchorCandidates = append(theirs, d), n
		}
		ft.P50Ms, ft.P99Ms = quantile(mine, 0.5), quantile(mine, 0.99)
		ft.AnchorP50Ms, ft.AnchorP99Ms = quantile(theirs, 0.5), quantile(theirs, 0.99)
		if ft.AnchorP50Ms > 0 {
			ft.RatioP50, ft.RatioP99 = ft.P50Ms/ft.AnchorP50Ms, ft.P99Ms/ft.AnchorP99Ms
		}
		out = append(out, ft)
	}
	return out, nil
}

func candidates(ctx context.Context, c *placementapi.Client, q string) (float64, int, error) {
	start := time.Now()
	cands, err := c.AllocationCandidates(ctx, q)
	return ms(time.Since(start)), len(cands), err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}
