package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// FleetConfig is the `fleet:` section of vgpud.yaml: OpenStack Placement
// (docs/fleet.md). Absent, or with no endpoint, the host is not published.
type FleetConfig struct {
	// Endpoint is Placement's URL, e.g. http://controller:8778.
	Endpoint string `json:"endpoint,omitempty"`
	// TokenFile holds a keystone token sent as X-Auth-Token ("": noauth2,
	// token "admin").
	TokenFile string `json:"tokenFile,omitempty"`
	// Host names the providers (default: the host name).
	Host string `json:"host,omitempty"`
	// RootUUID is the root provider's UUID (default: derived from Host,
	// stable across restarts); ParentUUID an existing provider (e.g.
	// nova-compute's) to publish the GPUs under instead.
	RootUUID   string `json:"rootUUID,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
	// SyncInterval is the periodic full pass (default 60s); changes are
	// published as they happen.
	SyncInterval Duration `json:"syncInterval,omitempty"`
	// Grace is how long an allocation without an instance may live on the
	// host's providers (default 2m).
	Grace Duration `json:"grace,omitempty"`
	// Timeout bounds each Placement request (default 5s); ClaimTimeout a
	// create's claim (default 2s).
	Timeout      Duration `json:"timeout,omitempty"`
	ClaimTimeout Duration `json:"claimTimeout,omitempty"`
}

// validate checks the section before anything uses it, so a reload with a
// broken one is refused as a whole (nil: no fleet).
func (f *FleetConfig) validate() error {
	if f == nil || f.Endpoint == "" {
		return nil
	}
	if _, err := placementapi.New(placementapi.Config{Endpoint: f.Endpoint}); err != nil {
		return fmt.Errorf("fleet.endpoint: %w", err)
	}
	for key, v := range map[string]string{"fleet.rootUUID": f.RootUUID, "fleet.parentUUID": f.ParentUUID} {
		if _, err := uuid.Parse(v); v != "" && err != nil {
			return fmt.Errorf("%s: %q is not a UUID", key, v)
		}
	}
	if f.RootUUID != "" && f.ParentUUID != "" {
		return errors.New("fleet: rootUUID and parentUUID exclude each other (parentUUID publishes under nova-compute's provider)")
	}
	for key, d := range map[string]time.Duration{"fleet.syncInterval": f.SyncInterval.Duration, "fleet.grace": f.Grace.Duration,
		"fleet.timeout": f.Timeout.Duration, "fleet.claimTimeout": f.ClaimTimeout.Duration} {
		if d < 0 || d > 24*time.Hour {
			return fmt.Errorf("%s: %s must be 0 (the default) to 24h", key, d)
		}
	}
	return nil
}

// fleetRunner is the running syncer; reload replaces it.
type fleetRunner struct {
	mu     sync.Mutex
	cfg    *FleetConfig
	cancel context.CancelFunc
	done   chan struct{}
	// syncer is the running syncer (nil: none), for fleet status.
	syncer *fleet.Syncer
	// metrics and reg outlive syncers, so counters survive a reload.
	metrics *fleet.Metrics
	reg     *prometheus.Registry
	// early is a syncer made for the start-up reconcile (prepare), not
	// running yet; apply starts it when its configuration is still cfg.
	early    *fleet.Syncer
	earlyCfg *FleetConfig
}

func newFleetRunner() *fleetRunner {
	r := &fleetRunner{metrics: fleet.NewMetrics(), reg: prometheus.NewRegistry()}
	if err := r.metrics.Register(r.reg); err != nil {
		panic(err) // a fresh registry: only a programming error fails
	}
	return r
}

// prepare gives the manager, before the start-up reconcile, the syncer
// for cfg without starting it: the reconcile asks it whether a fleet
// scheduler's create a crash cut off is still the scheduler's (its
// allocation still names it), and finishes it only then. A syncer that
// cannot be made is left to apply, which reports it.
func (r *fleetRunner) prepare(d *daemon, cfg *FleetConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cfg == nil || cfg.Endpoint == "" {
		return
	}
	s, _, err := r.build(d, cfg)
	if err != nil {
		return
	}
	d.mgr.SetFleet(s)
	r.early, r.earlyCfg = s, cfg
}

// apply starts, restarts or stops the syncer for cfg (nil: none).
func (r *fleetRunner) apply(ctx context.Context, d *daemon, cfg *FleetConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reflect.DeepEqual(cfg, r.cfg) && (cfg == nil || r.cancel != nil) {
		return nil
	}
	early, earlyCfg := r.early, r.earlyCfg
	r.early, r.earlyCfg = nil, nil
	r.stopLocked(d)
	if early != nil && !reflect.DeepEqual(cfg, earlyCfg) {
		d.mgr.SetFleet(nil)
		early = nil
	}
	if cfg == nil || cfg.Endpoint == "" {
		r.cfg = cfg
		return nil
	}
	s, c, err := early, (*placementapi.Client)(nil), error(nil)
	if s == nil {
		if s, c, err = r.build(d, cfg); err != nil {
			return err
		}
	} else {
		c = r.earlyClient
	}
	token := ""
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("fleet token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	c, err := placementapi.New(placementapi.Config{Endpoint: cfg.Endpoint, Token: token, Timeout: cfg.Timeout.Duration})
	if err != nil {
		return err
	}
	host := cfg.Host
	if host == "" {
		if host, err = os.Hostname(); err != nil {
			return fmt.Errorf("fleet host name: %w", err)
		}
	}
	s, err := fleet.New(fleet.Config{Host: host, RootUUID: cfg.RootUUID, ParentUUID: cfg.ParentUUID,
		Interval: cfg.SyncInterval.Duration, Grace: cfg.Grace.Duration, ClaimTimeout: cfg.ClaimTimeout.Duration,
		Crash: d.crash},
		c, d.mgr, d.log.With("component", "fleet"), r.metrics)
	if err != nil {
		return err
	}
	// The version check is informative: a Placement that is down now is
	// synced with when it answers.
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if v, err := c.CheckVersion(vctx); err != nil {
		d.log.Warn("placement not usable yet; the sync retries", "endpoint", cfg.Endpoint, "err", err, "kind", placementapi.Kind(err))
	} else {
		d.log.Info("placement", "endpoint", cfg.Endpoint, "maxVersion", v, "using", placementapi.Version, "host", host)
	}
	cancel()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(rctx) }()
	d.mgr.SetFleet(s)
	r.cfg, r.cancel, r.done, r.syncer = cfg, stop, done, s
	return nil
}

func (r *fleetRunner) stopLocked(d *daemon) {
	if r.cancel == nil {
		return
	}
	d.mgr.SetFleet(nil)
	r.cancel()
	<-r.done
	r.cancel, r.done, r.syncer = nil, nil, nil
}

// stop ends the syncer (daemon shutdown).
func (r *fleetRunner) stop(d *daemon) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked(d)
}
