package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/profiles"
)

// host is one vgpud host: its own simulated GPUs, store, manager, Placement
// client and syncer, as a daemon has them; only the process is shared.
type host struct {
	name  string
	h     *simhost.Host
	s     *fleet.Syncer
	c     *placementapi.Client
	reg   *prometheus.Registry
	owned map[string]bool
	// gpus are the host's GPU provider UUIDs by PCI address.
	gpus map[string]string
}

func (h *host) Name() string       { return h.name }
func (h *host) Owns(p string) bool { return h.owned[p] }

func (h *host) Create(ctx context.Context, consumer, profile string) error {
	_, err := h.h.Manager.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: profile, PlacementConsumer: consumer})
	return err
}

func (h *host) Destroy(ctx context.Context, id string) error {
	return h.h.Manager.Destroy(ctx, id, manager.DestroyOptions{})
}

// lastSync is when the host's syncer last finished a pass that succeeded
// (its vgpud_fleet_last_success_timestamp_seconds), zero before the first.
func (h *host) lastSync() (time.Time, error) {
	mfs, err := h.reg.Gather()
	if err != nil {
		return time.Time{}, err
	}
	for _, mf := range mfs {
		if mf.GetName() == "vgpud_fleet_last_success_timestamp_seconds" && len(mf.GetMetric()) == 1 {
			v := mf.GetMetric()[0].GetGauge().GetValue()
			if v == 0 {
				return time.Time{}, nil
			}
			return time.Unix(0, int64(v*1e9)), nil
		}
	}
	return time.Time{}, nil
}

// settles is how many of the host's settles (a create's or destroy's
// bringing its GPU's provider up to date before returning) ended done and
// how many were left for the next pass (vgpud_fleet_settles_total).
func (h *host) settles() (done, failed float64, err error) {
	mfs, err := h.reg.Gather()
	if err != nil {
		return 0, 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "vgpud_fleet_settles_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() != "outcome":
				case l.GetValue() == "done":
					done += m.GetCounter().GetValue()
				case l.GetValue() == "failed":
					failed += m.GetCounter().GetValue()
				}
			}
		}
	}
	return done, failed, nil
}

// mixedSpec is one host's eight GPUs: three H100 in MIG mode, two H100
// time-sliced, two L4 and an RTX PRO 6000 in MIG mode (MIG-backed vGPU),
// every flow the flavor table asks for.
func mixedSpec(gpus int) *sim.Spec {
	kinds := []sim.GPUSpec{
		{Model: "H100-SXM5-80GB", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", Flavour: gpu.FlavourVFIO},
		{Model: "L4-24GB", Flavour: gpu.FlavourVFIO},
		{Model: "RTX-PRO-6000-BSE-96GB", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "L4-24GB", Flavour: gpu.FlavourVFIO},
		{Model: "H100-SXM5-80GB", Flavour: gpu.FlavourVFIO, MIG: true},
		{Model: "H100-SXM5-80GB", Flavour: gpu.FlavourVFIO},
	}
	spec := &sim.Spec{Version: "v1"}
	for i := range gpus {
		g := kinds[i%len(kinds)]
		g.PCI = fmt.Sprintf("0000:%02x:00.0", 0x41+i)
		spec.GPUs = append(spec.GPUs, g)
	}
	return spec
}

// hostConfig is how each host's syncer and client are set up.
type hostConfig struct {
	url      string
	gpus     int
	interval time.Duration
	// jitter: the syncer's own random retry waits; false draws 1 every
	// time, the undrawn doubling.
	jitter bool
	// offer is the hosts' fleet.offer (nil: every profile).
	offer map[string][]string
}

// flavorOffer is the fleet.offer of an operator who sells the flavor
// table's profiles: each model of the mixed host offers those of them it
// has.
func flavorOffer() (map[string][]string, error) {
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		return nil, err
	}
	offer := map[string][]string{}
	for _, g := range mixedSpec(8).GPUs {
		if _, done := offer[g.Model]; done {
			continue
		}
		for _, f := range tplacement.ProfileFlavors {
			if fleet.CheckOffer(cat, map[string][]string{g.Model: {f.Profile}}) == nil {
				offer[g.Model] = append(offer[g.Model], f.Profile)
			}
		}
	}
	return offer, fleet.CheckOffer(cat, offer)
}

func openHost(ctx context.Context, dir string, i int, hc hostConfig) (*host, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	name := fmt.Sprintf("scale%04d", i)
	h, err := simhost.Open(ctx, simhost.Options{Dir: filepath.Join(dir, name), Spec: mixedSpec(hc.gpus), Manager: manager.Config{Logger: quiet}})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if _, err := h.Manager.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: tenant.UnlimitedQuota()}); err != nil {
		return nil, err
	}
	c, err := placementapi.New(placementapi.Config{Endpoint: hc.url, Timeout: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	met, reg := fleet.NewMetrics(), prometheus.NewRegistry()
	if err := met.Register(reg); err != nil {
		return nil, err
	}
	cfg := fleet.Config{Host: name, Grace: time.Hour, Interval: hc.interval, Offer: hc.offer}
	if !hc.jitter {
		cfg.Rand = func() float64 { return 1 }
	}
	s, err := fleet.New(cfg, c, h.Manager, quiet, met)
	if err != nil {
		return nil, err
	}
	h.Manager.SetFleet(s)
	hh := &host{name: name, h: h, s: s, c: c, reg: reg, owned: map[string]bool{}, gpus: map[string]string{}}
	for _, g := range h.Manager.Inventory().GPUs {
		p := fleet.GPUProviderUUID(fleet.RootUUID(name), g.PCI)
		hh.owned[p], hh.gpus[g.PCI] = true, p
	}
	return hh, nil
}

// openHosts opens n hosts, a few at a time.
func openHosts(ctx context.Context, dir string, n int, hc hostConfig) ([]*host, error) {
	hosts := make([]*host, n)
	err := each(n, 4, func(i int) error {
		h, err := openHost(ctx, dir, i, hc)
		hosts[i] = h
		return err
	})
	return hosts, err
}

// each runs f(0..n-1) on par workers and returns the first error.
func each(n, par int, f func(i int) error) error {
	var (
		mu    sync.Mutex
		first error
		next  int
		wg    sync.WaitGroup
	)
	for range min(par, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func closeHosts(hosts []*host) {
	for _, h := range hosts {
		if h != nil {
			_ = h.h.Close()
		}
	}
}
