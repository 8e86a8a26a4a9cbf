// Command fleetscale measures vgpud's Placement sync (docs/fleet.md) at
// fleet scale: for each step, that many hosts, each with vgpud's own
// manager, store, simulated GPUs (eight, mixed) and syncer in one process,
// publish to one real Placement on PostgreSQL as production runs it.
// Reported per step: GET /allocation_candidates for every flavor of the
// flavor table, limit=1000 as Nova asks, against the same fleet published
// Nova's way on the same Placement (the anchor); a host's first publish;
// Placement requests at steady churn; the stale fraction, sync lag and
// over-commit under churn; and the whole fleet's resync after Placement
// restarted on an empty database, with local operations going on.
//
// Imports: internal/testenv/placement, internal/testenv/simhost, pkg/fleet, pkg/gpu, pkg/gpu/sim, pkg/manager, pkg/placementapi, pkg/profile, pkg/tenant, profiles.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Publish is the hosts' first publish to an empty Placement.
type Publish struct {
	// AloneMs and AloneRequests: the first host, alone.
	AloneMs       float64 `json:"aloneMs"`
	AloneRequests uint64  `json:"aloneRequests"`
	// The rest, Parallel at a time: the wall time, and per host.
	Parallel        int     `json:"parallel"`
	WallS           float64 `json:"wallS"`
	HostP50Ms       float64 `json:"hostP50Ms"`
	HostP99Ms       float64 `json:"hostP99Ms"`
	RequestsPerHost float64 `json:"requestsPerHost"`
	// AnchorS and AnchorRequests: the same fleet published Nova's way.
	AnchorS        float64 `json:"anchorS"`
	AnchorRequests uint64  `json:"anchorRequests"`
}

// Step is one fleet size's results.
type Step struct {
	Hosts       int            `json:"hosts"`
	GPUsPerHost int            `json:"gpusPerHost"`
	OpenS       float64        `json:"openS"`
	Publish     Publish        `json:"firstPublish"`
	Candidates  []FlavorTiming `json:"allocationCandidates"`
	Churn       Churn          `json:"churn"`
	Resync      Resync         `json:"resync"`
	WallS       float64        `json:"wallS"`
}

type result struct {
	Cores              int    `json:"cores"`
	Database           string `json:"database"`
	PlacementProcesses int    `json:"placementProcesses"`
	SyncInterval       string `json:"syncInterval"`
	RetryJitter        bool   `json:"retryJitter"`
	// Offer is the hosts' fleet.offer ("all": none, every profile).
	Offer        string              `json:"offer"`
	OfferByModel map[string][]string `json:"offerByModel,omitempty"`
	Phases       string              `json:"phases"`
	Samples      int                 `json:"candidateSamples"`
	Steps        []Step              `json:"steps"`
	Note         string              `json:"note"`
}

type options struct {
	out                     string
	steps                   []int
	gpus, ops, schedulers   int
	samples, processes, par int
	interval, resyncTimeout time.Duration
	keep, jitter            bool
	offer, phases           string
}

// benchMaxBody bounds the bench's own answers: a fleet-wide listing at a
// thousand hosts (the providers of a class, allocation candidates with the
// summaries of every provider in their trees) is tens of MiB, far over the
// client's default, which the hosts' syncers keep.
const benchMaxBody = 512 << 20

func main() {
	var o options
	steps := flag.String("steps", "100,300,1000", "fleet sizes (hosts), comma-separated")
	flag.StringVar(&o.out, "out", "bench/fleet-scale.json", "where to write the results")
	flag.IntVar(&o.gpus, "gpus", 8, "GPUs per host")
	flag.IntVar(&o.ops, "ops", 400, "scheduler operations of the churn")
	flag.IntVar(&o.schedulers, "schedulers", 8, "fleet schedulers of the churn")
	flag.IntVar(&o.samples, "samples", 10, "allocation candidate requests per flavor and way")
	flag.IntVar(&o.processes, "processes", 2, "uwsgi processes serving Placement (8 threads each)")
	flag.IntVar(&o.par, "publish-parallel", 8, "hosts publishing at once at the first publish")
	flag.DurationVar(&o.interval, "interval", time.Minute, "the hosts' sync interval (vgpud's default: 60s)")
	flag.DurationVar(&o.resyncTimeout, "resync-timeout", 10*time.Minute, "how long the resync may take")
	flag.BoolVar(&o.jitter, "retry-jitter", true, "the syncers draw their retry waits at random (false: the undrawn doubling, every host in step)")
	flag.StringVar(&o.offer, "offer", "all", "the hosts' fleet.offer: all (none set: every profile) or flavors (each model offers the flavor table's profiles it has)")
	flag.StringVar(&o.phases, "phases", "churn,resync", "what runs after the first publish and the candidates: churn, resync, churn,resync, or none")
	flag.BoolVar(&o.keep, "keep", false, "keep each step's directory (Placement's uwsgi.log) and print where")
	flag.Parse()
	for _, s := range strings.Split(*steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			log.Fatalf("-steps: %q is not a host count", s)
		}
		o.steps = append(o.steps, n)
	}
	if err := run(o); err != nil {
		log.Fatal(err)
	}
}

func run(o options) error {
	var offer map[string][]string
	switch o.offer {
	case "all":
	case "flavors":
		var err error
		if offer, err = flavorOffer(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-offer: %q is not all or flavors", o.offer)
	}
	for _, p := range strings.Split(o.phases, ",") {
		switch strings.TrimSpace(p) {
		case "churn", "resync", "none":
		default:
			return fmt.Errorf("-phases: %q is not churn, resync or none", p)
		}
	}
	res := result{Cores: runtime.NumCPU(), Database: "postgresql", PlacementProcesses: o.processes, SyncInterval: o.interval.String(), RetryJitter: o.jitter, Samples: o.samples,
		Offer: o.offer, OfferByModel: offer, Phases: o.phases,
		Note: "one process holds every host (each its own store, simulated GPUs, manager, Placement client and syncer) and shares the machine's cores with Placement and PostgreSQL; the anchor is the same GPUs as Nova's pGPU providers (VGPU and a CUSTOM trait per type) on the same Placement; candidates are timed on the empty fleet after the first publish"}
	for _, n := range o.steps {
		st, err := step(o, n, offer)
		if err != nil {
			return fmt.Errorf("%d hosts: %w", n, err)
		}
		res.Steps = append(res.Steps, st)
		data, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.out, append(data, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func step(o options, n int, offer map[string][]string) (Step, error) {
	begin := time.Now()
	st := Step{Hosts: n, GPUsPerHost: o.gpus}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "vgpud-bench-fleetscale-")
	if err != nil {
		return st, err
	}
	if o.keep {
		log.Printf("%d hosts: keeping %s", n, dir)
	} else {
		defer os.RemoveAll(dir)
	}
	srv, err := tplacement.OpenWith(filepath.Join(dir, "placement"), tplacement.Options{Postgres: true, Processes: o.processes})
	if err != nil {
		return st, fmt.Errorf("placement: %w", err)
	}
	defer srv.Close()
	c, err := placementapi.New(placementapi.Config{Endpoint: srv.URL(), Timeout: 2 * time.Minute, MaxBody: benchMaxBody})
	if err != nil {
		return st, err
	}
	t := time.Now()
	hosts, err := openHosts(ctx, dir, n, hostConfig{url: srv.URL(), gpus: o.gpus, interval: o.interval, jitter: o.jitter, offer: offer})
	defer closeHosts(hosts)
	if err != nil {
		return st, err
	}
	st.OpenS = time.Since(t).Seconds()
	log.Printf("%d hosts: opened in %.1fs", n, st.OpenS)
	if st.Publish, err = firstPublish(ctx, hosts, o.par); err != nil {
		return st, err
	}
	// The daemons' loops start spread over one interval, as a fleet's
	// daemons start at different times: their periodic passes do not all
	// fall together.
	started := make(chan struct{})
	go func() {
		defer close(started)
		for _, h := range hosts {
			select {
			case <-ctx.Done():
				return
			case <-time.After(o.interval / time.Duration(n)):
			}
			go h.s.Run(ctx)
		}
	}()
	t = time.Now()
	if st.Publish.AnchorRequests, err = publishAnchor(ctx, c, hosts); err != nil {
		return st, err
	}
	st.Publish.AnchorS = time.Since(t).Seconds()
	log.Printf("%d hosts: first publish %+v", n, st.Publish)
	if st.Candidates, err = timeCandidates(ctx, c, o.samples); err != nil {
		return st, err
	}
	for _, f := range st.Candidates {
		log.Printf("%d hosts: %s: %d candidates p50 %.1f ms p99 %.1f ms; anchor %d p50 %.1f ms; ratio %.2f",
			n, f.Profile, f.Candidates, f.P50Ms, f.P99Ms, f.AnchorCandidates, f.AnchorP50Ms, f.RatioP50)
	}
	<-started
	if strings.Contains(o.phases, "churn") {
		if st.Churn, err = runChurn(ctx, c, hosts, o.schedulers, o.ops, o.interval); err != nil {
			return st, err
		}
		log.Printf("%d hosts: churn %+v", n, st.Churn)
	}
	if strings.Contains(o.phases, "resync") {
		if st.Resync, err = runResync(ctx, srv, c, hosts, o.resyncTimeout); err != nil {
			return st, err
		}
		log.Printf("%d hosts: resync %+v", n, st.Resync)
	}
	st.WallS = time.Since(begin).Seconds()
	return st, nil
}

// firstPublish runs each host's first pass: the first host alone, the
// rest par at a time.
func firstPublish(ctx context.Context, hosts []*host, par int) (Publish, error) {
	p := Publish{Parallel: par}
	t := time.Now()
	if err := hosts[0].s.Pass(ctx); err != nil {
		return p, fmt.Errorf("%s: first pass: %w", hosts[0].name, err)
	}
	p.AloneMs, p.AloneRequests = ms(time.Since(t)), hosts[0].c.Requests()
	rest := hosts[1:]
	if len(rest) == 0 {
		return p, nil
	}
	d := make([]float64, len(rest))
	t = time.Now()
	err := each(len(rest), par, func(i int) error {
		s := time.Now()
		if err := rest[i].s.Pass(ctx); err != nil {
			return fmt.Errorf("%s: first pass: %w", rest[i].name, err)
		}
		d[i] = ms(time.Since(s))
		return nil
	})
	p.WallS = time.Since(t).Seconds()
	p.HostP50Ms, p.HostP99Ms = quantile(d, 0.5), quantile(d, 0.99)
	p.RequestsPerHost = float64(hostRequests(rest)) / float64(len(rest))
	return p, err
}
