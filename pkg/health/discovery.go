package health

import (
	"context"
	"log/slog"
	"time"

	"github.com/vgpud/vgpud/pkg/manager"
)

// The periodic discovery: every DiscoveryInterval the whole host is
// re-read and the records compared with it (manager.CheckDrift), so
// devices that vanish or appear without an event are repaired or reported
// within one interval; uevents and NVML events refine this. While the
// manager is degraded (no driver at start) it looks for the driver every
// driverPoll instead, so a driver that loads late is picked up within
// seconds.

// Discoverer is what the periodic discovery needs from the manager
// (*manager.Manager). It is called from the discovery's own goroutine,
// beside the watcher's.
type Discoverer interface {
	// CheckDrift re-reads the host, compares the records with it and
	// repairs what drifted.
	CheckDrift(ctx context.Context) (manager.DriftReport, error)
	// Degraded is why carving is refused ("": it is not); SetDegraded
	// sets or clears it.
	Degraded() string
	SetDegraded(why string)
	// Reconcile runs once the driver appeared.
	Reconcile(ctx context.Context) (manager.ReconcileReport, error)
}

// Driver loads the driver's library (the NVML backend's Init): nil once
// the driver answers.
type Driver interface {
	Init(ctx context.Context) error
}

// Discovery is the periodic discovery's wiring (Config.Discovery).
type Discovery struct {
	// Manager is compared with the host; nil: no periodic discovery.
	Manager Discoverer
	// Driver is polled while the manager is degraded.
	Driver Driver
	// Logger; nil: the watcher's.
	Logger *slog.Logger
	// After, when not nil, holds the discovery back until it is closed:
	// the daemon closes it once the fleet's syncer is set up, so that no
	// reconcile the discovery starts resolves a fleet create without the
	// scheduler's allocation.
	After <-chan struct{}
}

// driverPoll is how often a degraded daemon looks for the driver.
const driverPoll = 2 * time.Second

// driftTimeout bounds one periodic discovery and the repair it starts
// (a reconcile re-creating what a reboot took).
const driftTimeout = 2 * time.Minute

// discover runs the periodic discovery until ctx ends. The interval is
// read again after each pass, so a reload that changes it applies from
// the next one.
func (w *Watcher) discover(ctx context.Context) {
	d, log := w.discovery, w.discovery.Logger
	if log == nil {
		log = w.log
	}
	if d.After != nil {
		select {
		case <-d.After:
		case <-ctx.Done():
			return
		}
	}
	t := time.NewTimer(w.discoveryInterval())
	defer t.Stop()
	poll := time.NewTicker(driverPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			if d.Manager.Degraded() == "" || d.Driver == nil {
				continue
			}
			if err := d.Driver.Init(ctx); err == nil {
				log.Info("NVIDIA driver appeared: leaving degraded mode")
				d.Manager.SetDegraded("")
				if _, err := d.Manager.Reconcile(ctx); err != nil {
					log.Warn("reconcile", "err", err)
				}
				w.status()
			}
		case <-t.C:
			if d.Manager.Degraded() == "" {
				w.checkDrift(ctx, log)
			}
			t.Reset(w.discoveryInterval())
		}
	}
}

// minDiscoveryInterval bounds the periodic discovery from below whatever a
// caller sets (the daemon's configuration allows 1s..1h): a zero interval
// would compare without pause.
const minDiscoveryInterval = time.Second

func (w *Watcher) discoveryInterval() time.Duration {
	return max(w.settings().DiscoveryInterval, minDiscoveryInterval)
}

// checkDrift runs one periodic comparison, bounded by driftTimeout.
func (w *Watcher) checkDrift(ctx context.Context, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, driftTimeout)
	defer cancel()
	rep, err := w.discovery.Manager.CheckDrift(ctx)
	if err != nil {
		log.Warn("periodic discovery", "err", err)
		return
	}
	if rep.Reconcile != nil {
		r := rep.Reconcile
		log.Info("host changed: reconciled", "vanished", len(rep.Missing), "recreated", len(r.Recreated),
			"lost", len(r.Lost), "failed", len(r.Failed), "foreign", len(r.Foreign), "pending", len(r.Pending))
		w.status()
	}
}
