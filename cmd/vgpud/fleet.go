package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
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
	mu  sync.Mutex
	cfg *FleetConfig
	// token is the token the running syncer's client sends: a reload with
	// the same settings but a rotated token file restarts the syncer.
	token  string
	cancel context.CancelFunc
	done   chan struct{}
	// syncer is the running syncer (nil: none), for fleet status.
	syncer *fleet.Syncer
	// metrics and reg outlive syncers, so counters survive a reload.
	metrics *fleet.Metrics
	reg     *prometheus.Registry
	// early is a syncer made for the start-up reconcile (prepare), not
	// running yet; apply starts it while its settings are still in force.
	early *builtFleet
}

// builtFleet is a syncer made for a configuration, not running yet.
type builtFleet struct {
	cfg   *FleetConfig
	token string
	host  string
	c     *placementapi.Client
	s     *fleet.Syncer
}

func newFleetRunner() *fleetRunner {
	r := &fleetRunner{metrics: fleet.NewMetrics(), reg: prometheus.NewRegistry()}
	if err := r.metrics.Register(r.reg); err != nil {
		panic(err) // a fresh registry: only a programming error fails
	}
	return r
}

// build reads the token file and makes the client and the syncer for cfg
// (an endpoint set); nothing runs yet.
func (r *fleetRunner) build(d *daemon, cfg *FleetConfig) (*builtFleet, error) {
	token, err := readTokenFile(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	c, err := placementapi.New(placementapi.Config{Endpoint: cfg.Endpoint, Token: token, Timeout: cfg.Timeout.Duration})
	if err != nil {
		return nil, err
	}
	host := cfg.Host
	if host == "" {
		if host, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("fleet host name: %w", err)
		}
	}
	s, err := fleet.New(fleet.Config{Host: host, RootUUID: cfg.RootUUID, ParentUUID: cfg.ParentUUID,
		Interval: cfg.SyncInterval.Duration, Grace: cfg.Grace.Duration, ClaimTimeout: cfg.ClaimTimeout.Duration,
		Crash: d.crash},
		c, d.mgr, d.log.With("component", "fleet"), r.metrics)
	if err != nil {
		return nil, err
	}
	return &builtFleet{cfg: cfg, token: token, host: host, c: c, s: s}, nil
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
	b, err := r.build(d, cfg)
	if err != nil {
		return
	}
	d.mgr.SetFleet(b.s)
	r.early = b
}

// apply starts, restarts or stops the syncer for cfg (nil: none). The new
// settings (and the token file) are read in full before the running
// syncer is touched: settings that cannot be used are refused with the
// running syncer kept as it is.
func (r *fleetRunner) apply(ctx context.Context, d *daemon, cfg *FleetConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	early := r.early
	r.early = nil
	if cfg == nil || cfg.Endpoint == "" {
		if early != nil {
			d.mgr.SetFleet(nil)
		}
		r.stopLocked(d)
		r.cfg, r.token = cfg, ""
		return nil
	}
	b := early
	if b == nil || !reflect.DeepEqual(b.cfg, cfg) {
		if early != nil {
			d.mgr.SetFleet(nil)
		}
		var err error
		if b, err = r.build(d, cfg); err != nil {
			return err
		}
	}
	if r.cancel != nil && reflect.DeepEqual(cfg, r.cfg) && b.token == r.token {
		return nil // nothing changed: the running syncer goes on
	}
	if old := r.syncer; old != nil && old.Top() != b.s.Top() {
		if err := r.retireLocked(ctx, d, old); err != nil {
			return err
		}
	}
	r.stopLocked(d)
	r.startLocked(ctx, d, b)
	return nil
}

// errFleetTreeInUse: new settings would move the host's providers to
// another tree while instances hold allocations in the running one.
var errFleetTreeInUse = errors.New("fleet: the provider tree cannot change while instances hold allocations in it")

// retireLocked removes the running syncer's provider tree from Placement
// before settings that publish the host under another one (fleet.host,
// rootUUID or parentUUID changed) take over, so that Placement does not
// keep advertising the old tree's room. Refused while the host has
// instances: their allocations (a scheduler's among them) name the old
// providers, and moving them behind the schedulers' backs is not
// vgpud's to do. On a refusal or a failure the running settings are kept.
func (r *fleetRunner) retireLocked(ctx context.Context, d *daemon, old *fleet.Syncer) error {
	views, err := d.mgr.AllInstances()
	if err != nil {
		return fmt.Errorf("fleet: count the instances before the provider tree changes: %w", err)
	}
	if len(views) > 0 {
		return fmt.Errorf("%w: %d instances on this host; destroy them first, or keep fleet.host, rootUUID and parentUUID as they are", errFleetTreeInUse, len(views))
	}
	r.stopLocked(d)
	rctx, cancel := context.WithTimeout(ctx, retireTimeout)
	err = old.Retire(rctx)
	cancel()
	if err == nil {
		return nil
	}
	if b, berr := r.build(d, r.cfg); berr == nil {
		r.startLocked(ctx, d, b)
	}
	return fmt.Errorf("fleet: the provider tree of the running settings could not be removed from Placement (%w); they stay in force, reload again once Placement answers", err)
}

// retireTimeout bounds the removal of the old provider tree.
const retireTimeout = 30 * time.Second

// startLocked runs syncer b and gives it to the manager.
func (r *fleetRunner) startLocked(ctx context.Context, d *daemon, b *builtFleet) {
	// The version check is informative: a Placement that is down now is
	// synced with when it answers.
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if v, err := b.c.CheckVersion(vctx); err != nil {
		d.log.Warn("placement not usable yet; the sync retries", "endpoint", b.c.Endpoint(), "err", err, "kind", placementapi.Kind(err))
	} else {
		d.log.Info("placement", "endpoint", b.c.Endpoint(), "maxVersion", v, "using", placementapi.Version, "host", b.host)
	}
	cancel()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.s.Run(rctx) }()
	d.mgr.SetFleet(b.s)
	r.cfg, r.token, r.cancel, r.done, r.syncer = b.cfg, b.token, stop, done, b.s
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

// The token file's refusals.
var (
	// errTokenFileKind: not a regular file (a FIFO would block the read,
	// a device or directory is a mistake).
	errTokenFileKind = errors.New("fleet token file is not a regular file")
	// errTokenFileMode: readable or writable by others, as ssh refuses a
	// private key that is.
	errTokenFileMode = errors.New("fleet token file is accessible to other users")
	// errTokenFileSize: empty, or larger than any keystone token.
	errTokenFileSize = errors.New("fleet token file has no usable size")
)

// maxTokenFile bounds what is read of the token file: keystone's Fernet
// tokens are under 300 bytes, PKI ones a few KiB.
const maxTokenFile = 64 << 10

// readTokenFile reads the keystone token ("" for no file: noauth2). Only a
// regular file is read, never past maxTokenFile, and one that others may
// read or write is refused: it is a credential. It is opened without
// blocking, so a FIFO is refused at once rather than holding the reload
// (and with it the daemon's shutdown).
func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("fleet token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("fleet token file: %w", err)
	}
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("%s (%s): %w; point fleet.tokenFile at a plain file", path, fi.Mode().Type(), errTokenFileKind)
	case fi.Mode().Perm()&0o007 != 0:
		return "", fmt.Errorf("%s has mode %04o: %w; run chmod 600 %s (or 640 with group vgpud)", path, fi.Mode().Perm(), errTokenFileMode, path)
	case fi.Size() > maxTokenFile:
		return "", fmt.Errorf("%s is %d bytes, more than %d: %w", path, fi.Size(), maxTokenFile, errTokenFileSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("fleet token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" || len(b) > maxTokenFile {
		return "", fmt.Errorf("%s holds %d bytes and no token: %w", path, len(b), errTokenFileSize)
	}
	return token, nil
}
