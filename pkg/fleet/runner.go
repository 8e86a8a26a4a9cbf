package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/profile"
)

// Settings are what the runner makes a syncer from: the daemon's fleet:
// section (docs/fleet.md); the zero durations are the syncer's defaults.
type Settings struct {
	// Endpoint is Placement's URL; TokenFile holds a keystone token (""
	// is noauth2), read again at each Apply.
	Endpoint, TokenFile string
	// Host names the providers ("": the host name); RootUUID and
	// ParentUUID as in Config.
	Host, RootUUID, ParentUUID string
	// SyncInterval, AuditInterval, Grace and ClaimTimeout are Config's
	// Interval, AuditInterval, Grace and ClaimTimeout; Timeout bounds each
	// Placement request, and twice it is Config's AdoptTimeout (a
	// scheduler's create reads its allocation and may write it once).
	SyncInterval, AuditInterval, Grace, Timeout, ClaimTimeout time.Duration
	// Inventories is Config's ("": the default); Offer Config's, checked
	// against the host's catalog (CheckOffer) when the settings are
	// applied.
	Inventories string
	Offer       map[string][]string
}

// RunnerHost is what the runner needs of the manager (*manager.Manager):
// the host its syncers publish, the hook a running syncer is given to
// (SetFleet; nil drops it), and the instances that keep the provider tree
// from moving.
type RunnerHost interface {
	Source
	SetFleet(f manager.Fleet)
	AllInstances() ([]manager.InstanceView, error)
	// Catalog is the catalog in force, which fleet.offer must name.
	Catalog() *profile.Catalog
}

// RunnerConfig is the runner's wiring.
type RunnerConfig struct {
	Host RunnerHost
	// Logger; the syncers log under component=fleet. nil discards.
	Logger *slog.Logger
	// Crash is given to every syncer (Config.Crash).
	Crash func(point string)
}

// Runner runs the syncer for the settings in force: it builds the
// Placement client and the syncer, checks Placement's version, gives the
// syncer to the manager, and replaces it when a reload changes the
// settings (Apply). The daemon holds one for its life.
type Runner struct {
	host  RunnerHost
	log   *slog.Logger
	crash func(string)

	mu  sync.Mutex
	cfg *Settings
	// token is the token the running syncer's client sends: a reload with
	// the same settings but a rotated token file restarts the syncer.
	token  string
	cancel context.CancelFunc
	done   chan struct{}
	// syncer is the running syncer (nil: none), for fleet status.
	syncer *Syncer
	// metrics and reg outlive syncers, so counters survive a reload.
	metrics *Metrics
	reg     *prometheus.Registry
	// shapes outlives syncers too: a GPU lost before a reload keeps the
	// shape it had while it answered.
	shapes *shapeMemory
	// early is a syncer made for the start-up reconcile (Prepare), not
	// running yet; Apply starts it while its settings are still in force.
	early *builtFleet
}

// builtFleet is a syncer made for a configuration, not running yet.
type builtFleet struct {
	cfg   *Settings
	token string
	host  string
	c     *placementapi.Client
	s     *Syncer
}

// NewRunner returns a runner with no syncer; Prepare and Apply start one.
func NewRunner(cfg RunnerConfig) *Runner {
	r := &Runner{host: cfg.Host, log: cfg.Logger, crash: cfg.Crash, metrics: NewMetrics(), reg: prometheus.NewRegistry(), shapes: &shapeMemory{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if err := r.metrics.Register(r.reg); err != nil {
		panic(err) // a fresh registry: only a programming error fails
	}
	return r
}

// Registry holds the syncers' metrics; it outlives them, so counters
// survive a reload. The daemon serves it beside its own.
func (r *Runner) Registry() *prometheus.Registry { return r.reg }

// Syncer is the running syncer, nil when none runs (no fleet settings,
// or none yet).
func (r *Runner) Syncer() *Syncer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncer
}

// build reads the token file and makes the client and the syncer for cfg
// (an endpoint set); nothing runs yet.
func (r *Runner) build(cfg *Settings) (*builtFleet, error) {
	if err := CheckOffer(r.host.Catalog(), cfg.Offer); err != nil {
		return nil, err
	}
	token, err := readTokenFile(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	c, err := placementapi.New(placementapi.Config{Endpoint: cfg.Endpoint, Token: token, Timeout: cfg.Timeout})
	if err != nil {
		return nil, err
	}
	host := cfg.Host
	if host == "" {
		if host, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("fleet host name: %w", err)
		}
	}
	s, err := New(Config{Host: host, RootUUID: cfg.RootUUID, ParentUUID: cfg.ParentUUID,
		Interval: cfg.SyncInterval, AuditInterval: cfg.AuditInterval, Grace: cfg.Grace, ClaimTimeout: cfg.ClaimTimeout, AdoptTimeout: 2 * cfg.Timeout,
		Inventories: cfg.Inventories, Offer: cfg.Offer, Crash: r.crash},
		c, r.host, r.log.With("component", "fleet"), r.metrics)
	if err != nil {
		return nil, err
	}
	s.shapes = r.shapes
	return &builtFleet{cfg: cfg, token: token, host: host, c: c, s: s}, nil
}

// Prepare gives the manager, before the start-up reconcile, the syncer
// for cfg without starting it: the reconcile asks it whether a fleet
// scheduler's create a crash cut off is still the scheduler's (its
// allocation still names it), and finishes it only then. A syncer that
// cannot be made (a token file or offer refused: what Apply would refuse
// too) is an error, so that the daemon stops before a reconcile without
// the fleet undoes the cut-off creates it would confirm. nil: no fleet.
func (r *Runner) Prepare(cfg *Settings) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cfg == nil || cfg.Endpoint == "" {
		return nil
	}
	b, err := r.build(cfg)
	if err != nil {
		return err
	}
	r.host.SetFleet(b.s)
	r.early = b
	return nil
}

// Apply starts, restarts or stops the syncer for cfg (nil: none). The new
// settings (and the token file) are read in full before the running
// syncer is touched: settings that cannot be used are refused with the
// running syncer kept as it is.
func (r *Runner) Apply(ctx context.Context, cfg *Settings) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	early := r.early
	r.early = nil
	if cfg == nil || cfg.Endpoint == "" {
		if early != nil {
			r.host.SetFleet(nil)
		}
		r.stopLocked()
		r.cfg, r.token = cfg, ""
		return nil
	}
	b := early
	if b == nil || !reflect.DeepEqual(b.cfg, cfg) {
		if early != nil {
			r.host.SetFleet(nil)
		}
		var err error
		if b, err = r.build(cfg); err != nil {
			return err
		}
	}
	if r.cancel != nil && reflect.DeepEqual(cfg, r.cfg) && b.token == r.token {
		return nil // nothing changed: the running syncer goes on
	}
	if old := r.syncer; old != nil && old.Top() != b.s.Top() {
		if err := r.retireLocked(ctx, old); err != nil {
			return err
		}
	}
	r.stopLocked()
	r.startLocked(ctx, b)
	return nil
}

// errTreeInUse: new settings would move the host's providers to
// another tree while instances hold allocations in the running one.
var errTreeInUse = errors.New("fleet: the provider tree cannot change while instances hold allocations in it")

// retireLocked removes the running syncer's provider tree from Placement
// before settings that publish the host under another one (fleet.host,
// rootUUID or parentUUID changed) take over, so that Placement does not
// keep advertising the old tree's room. Refused while the host has
// instances: their allocations (a scheduler's among them) name the old
// providers, and moving them behind the schedulers' backs is not
// vgpud's to do. On a refusal or a failure the running settings are kept.
func (r *Runner) retireLocked(ctx context.Context, old *Syncer) error {
	views, err := r.host.AllInstances()
	if err != nil {
		return fmt.Errorf("fleet: count the instances before the provider tree changes: %w", err)
	}
	if len(views) > 0 {
		return fmt.Errorf("%w: %d instances on this host; destroy them first, or keep fleet.host, rootUUID and parentUUID as they are", errTreeInUse, len(views))
	}
	r.stopLocked()
	rctx, cancel := context.WithTimeout(ctx, retireTimeout)
	err = old.Retire(rctx)
	cancel()
	if err == nil {
		return nil
	}
	b, berr := r.build(r.cfg)
	if berr != nil {
		return fmt.Errorf("fleet: the provider tree of the running settings could not be removed from Placement (%w), and they could not be started again (%w): nothing is published until a reload", err, berr)
	}
	r.startLocked(ctx, b)
	return fmt.Errorf("fleet: the provider tree of the running settings could not be removed from Placement (%w); they stay in force, reload again once Placement answers", err)
}

// retireTimeout bounds the removal of the old provider tree.
const retireTimeout = 30 * time.Second

// startLocked runs syncer b and gives it to the manager.
func (r *Runner) startLocked(ctx context.Context, b *builtFleet) {
	// The version check is informative: a Placement that is down now is
	// synced with when it answers.
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if v, err := b.c.CheckVersion(vctx); err != nil {
		r.log.Warn("placement not usable yet; the sync retries", "endpoint", b.c.Endpoint(), "err", err, "kind", placementapi.Kind(err))
	} else {
		r.log.Info("placement", "endpoint", b.c.Endpoint(), "maxVersion", v, "using", placementapi.Version, "host", b.host)
	}
	cancel()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.s.Run(rctx) }()
	r.host.SetFleet(b.s)
	r.cfg, r.token, r.cancel, r.done, r.syncer = b.cfg, b.token, stop, done, b.s
}

func (r *Runner) stopLocked() {
	if r.cancel == nil {
		return
	}
	r.host.SetFleet(nil)
	r.cancel()
	<-r.done
	r.cancel, r.done, r.syncer = nil, nil, nil
}

// Stop ends the syncer (daemon shutdown).
func (r *Runner) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopLocked()
}
