package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vgpud/vgpud/pkg/config"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/health"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/metricsweb"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// stopTimeout bounds a stop (SIGTERM): operations in flight get
// stopTimeout-stopUndo to finish; what is left then is cancelled and has
// stopUndo to answer its callers and undo what it did (the next start
// reconciles what it could not). The unit's TimeoutStopSec is longer, so
// systemd never kills a stop that keeps to this.
const (
	stopTimeout = 70 * time.Second
	stopUndo    = 10 * time.Second
)

// schedulerRetry is how often pending scheduler settings are tried.
const schedulerRetry = 2 * time.Second

// daemon is the running daemon's wiring, one typed struct.
type daemon struct {
	cfg    *config.Config
	log    *slog.Logger
	level  *slog.LevelVar
	host   *host
	db     *store.DB
	virt   *virt.Lazy
	mgr    *manager.Manager
	notify notifier
	// shares is the share loop's view for D-Bus (set by startMetrics).
	shares dbusapi.SharesSource
	// bus is the D-Bus service (set by startDBus; nil without a bus).
	bus *dbusapi.Service
	// reloadedCat is the catalog the last reload applied (nil: none yet,
	// host.cat is in force); read it with catalog().
	reloadedCat atomic.Pointer[profile.Catalog]
	// metricsLn is the metrics endpoint's socket, bound first thing at
	// start so a taken port ends the start before the host is touched.
	metricsLn net.Listener
	// metricsWeb is the web configuration read at start (pkg/metricsweb);
	// metricsGate serves under it and takes what a reload reads.
	metricsWeb  *metricsweb.Web
	metricsGate *metricsweb.Gate
	// fleet runs the Placement sync (set by start, once the manager is).
	fleet *fleet.Runner
	// crash is the crash hook of $VGPUD_CRASH_AT (nil: none), given to the
	// manager and to the fleet's syncer.
	crash func(string)
}

// serve runs the daemon until ctx ends (SIGTERM/SIGINT).
func serve(ctx context.Context, cfg *config.Config) error {
	log, level := newLeveledLogger(cfg)
	d := &daemon{cfg: cfg, log: log, level: level, notify: newNotifier(log)}
	defer d.close()
	if err := d.start(ctx); err != nil {
		return err
	}
	return d.run(ctx)
}

func (d *daemon) start(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	crash, err := manager.CrashAt(os.Getenv("VGPUD_CRASH_AT"), fleet.CrashPoints...)
	if err != nil {
		return usageError{err}
	}
	d.crash = crash
	if cfg.MetricsListen != "" {
		// Bound before anything else: a port another process holds is a
		// configuration error, reported at once rather than after the
		// start-up reconcile.
		// The web configuration first: a file that does not validate is
		// a configuration error, and nothing is bound.
		web, err := metricsweb.Load(cfg.MetricsWebConfigFile)
		if err != nil {
			return usageError{err}
		}
		ln, err := listenMetrics(cfg)
		if errors.Is(err, metricsweb.ErrAccess) {
			return usageError{err} // the socket's group or path as configured
		} else if err != nil {
			return err
		}
		d.metricsLn, d.metricsWeb = ln, web
	}
	if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	d.notify.Status("opening state")
	db, err := store.Open(filepath.Join(cfg.StateDir, "state.db"), store.Options{Logger: log.With("component", "store")})
	if err != nil {
		return err
	}
	d.db = db
	h, err := openHost(cfg, log, nvmlObserver(d))
	if err != nil {
		return err
	}
	d.host = h
	degraded := ""
	ownVFs, err := manager.VFsDisabledByVgpud(db)
	if err != nil {
		return err
	}
	err = health.WaitDriver(ctx, health.Startup{Driver: h.nvml, Inventory: discover.Host{NVML: h.nvml, Sysfs: h.sysfs},
		Catalog: h.cat, OwnVFs: ownVFs, Wait: cfg.DriverWait.Duration, Notify: d.notify, Logger: log})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		degraded = err.Error()
		log.Error("starting degraded: reads are served, carving is refused", "why", degraded)
	}
	var mv manager.Virt
	if cfg.LibvirtSocket != "" {
		vc := virt.Config{URI: cfg.LibvirtURI, Socket: cfg.LibvirtSocket, Logger: log.With("component", "virt")}
		d.virt = virt.NewLazy(vc)
		mv = d.virt
		// A libvirtd that answers now is used from the start-up reconcile on;
		// one that does not (at boot it starts after vgpud) is connected to
		// in the background after READY.
		if exists(vc.SocketPath()) {
			if err := d.virt.TryConnect(ctx, 3*time.Second); err != nil {
				log.Info("libvirt not answering yet; connecting after start-up", "err", err)
			}
		}
	} else {
		log.Info("libvirt disabled (empty libvirtSocket): attach and detach are refused")
	}
	d.mgr = manager.New(manager.Config{
		Catalog: h.cat, Store: db, NVML: h.nvml, Sysfs: h.sysfs, Virt: mv,
		Logger: log.With("component", "manager"), Crash: crash, Degraded: degraded, BootID: h.bootID,
		UndefinePolicy: d.cfg.UndefinePolicy, RecoveryConcurrency: d.cfg.GPUConcurrency,
		Reset: h.reset, GPUReset: d.cfg.GPUReset,
	})
	d.fleet = fleet.NewRunner(fleet.RunnerConfig{Host: d.mgr, Logger: log, Crash: crash})
	if degraded == "" {
		d.notify.Status("reconciling")
		// A fleet scheduler's create a crash cut off is settled against
		// its allocation (docs/fleet.md): the syncer is there, not running.
		if err := d.fleet.Prepare(fleetSettings(cfg.Fleet)); err != nil {
			return fmt.Errorf("fleet: %w", err)
		}
		rep, err := d.mgr.Reconcile(ctx)
		if err != nil {
			return fmt.Errorf("reconcile at start: %w", err)
		}
		log.Info("start-up reconcile done", "took", rep.Duration, "recreated", len(rep.Recreated), "foreign", len(rep.Foreign))
	} else if err := d.mgr.Refresh(ctx); err != nil {
		log.Warn("inventory unavailable while degraded", "err", err)
	}
	return nil
}

func (d *daemon) run(ctx context.Context) error {
	if d.fleet == nil {
		d.fleet = fleet.NewRunner(fleet.RunnerConfig{Host: d.mgr, Logger: d.log, Crash: d.crash})
	}
	stopMetrics, err := startMetrics(ctx, d)
	if err != nil {
		return err
	}
	defer stopMetrics()
	stopBus, err := startDBus(ctx, d)
	if err != nil {
		return err
	}
	defer stopBus()
	fleetUp := make(chan struct{})
	stopFaults := startFaultWatch(ctx, d, fleetUp)
	defer stopFaults()
	err = d.fleet.Apply(ctx, fleetSettings(d.cfg.Fleet))
	close(fleetUp)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	defer d.fleet.Stop()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if d.virt != nil {
		// Connected after READY: libvirtd starts after vgpud at boot.
		go d.virt.Connect(wctx, func() {
			go d.mgr.WatchVirt(wctx, d.cfg.UndefinePolicy)
			if _, err := d.mgr.Reconcile(wctx); err != nil {
				d.log.Warn("reconcile once libvirt is connected", "err", err)
			}
		})
	}
	// A pinned scheduler setting the driver refused while VMs ran is set
	// once they stop; not every stop is a libvirt event vgpud sees.
	go d.mgr.WatchSchedulers(wctx, schedulerRetry)

	// SIGHUP is caught before READY=1: a reload asked for as soon as the
	// unit is up must not meet the default action, which ends the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	d.notify.Ready(d.statusLine())
	interval, watchdog := d.notify.WatchdogInterval()
	tick := time.NewTicker(max(interval/2, 100*time.Millisecond))
	if !watchdog {
		tick.Reset(30 * time.Second)
	}
	defer tick.Stop()
	// A reload runs beside the loop, which keeps the watchdog fed while it
	// re-reads the host (up to reloadTimeout, longer than WatchdogSec);
	// one at a time, and a SIGHUP during one asks for another after it.
	reloaded := make(chan struct{}, 1)
	reloading, again := false, false
	startReload := func() {
		reloading = true
		go func() {
			d.reload(wctx)
			reloaded <- struct{}{}
		}()
	}
	for {
		select {
		case <-ctx.Done():
			if reloading {
				<-reloaded // cut short by ctx
			}
			d.stop()
			return nil
		case <-hup:
			if reloading {
				again = true
				continue
			}
			startReload()
		case <-reloaded:
			reloading = false
			if again {
				again = false
				startReload()
			}
		case <-tick.C:
			if watchdog {
				d.notify.Watchdog()
			}
			d.notify.Status(d.statusLine())
		}
	}
}

// stop finishes the operations in flight (new ones are refused) within
// the grace; then it cancels what is left, so each caller is answered with
// a named error while the daemon is still on the bus (run closes the bus
// after stop returns), and waits up to stopUndo for the undos.
func (d *daemon) stop() {
	d.notify.Stopping()
	grace := stopTimeout - stopUndo
	d.log.Info("stopping: finishing operations in flight", "grace", grace)
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	err := d.mgr.Shutdown(ctx)
	cancel()
	if err == nil {
		return
	}
	d.log.Warn("stopping: operations still in flight after the grace; cancelling them", "grace", grace)
	ctx, cancel = context.WithTimeout(context.Background(), stopUndo)
	defer cancel()
	if d.bus != nil {
		if _, err := d.bus.CancelAll(ctx, "vgpud is stopping"); err != nil {
			d.log.Error("stopping: callers left without an answer", "err", err)
		}
	}
	if err := d.mgr.Shutdown(ctx); err != nil {
		d.log.Error("stopping with undos unfinished; the next start reconciles them", "err", err)
	}
}

// statusLine is the short STATUS= summary systemctl shows.
func (d *daemon) statusLine() string {
	gpus, _ := d.mgr.GPUs()
	insts, _ := d.mgr.AllInstances()
	lost := 0
	for _, g := range gpus {
		if g.State != gpu.StateOK && g.State != gpu.StatePassthrough {
			lost++
		}
	}
	s := fmt.Sprintf("%d GPUs, %d instances", len(gpus), len(insts))
	if lost > 0 {
		s += fmt.Sprintf(", %d GPUs lost or failed", lost)
	}
	if why := d.mgr.Degraded(); why != "" {
		s += "; degraded: " + why
	}
	return s
}

func (d *daemon) close() {
	if d.metricsLn != nil {
		d.metricsLn.Close() // the server closed it already when it ran
	}
	if d.virt != nil {
		d.virt.Close()
	}
	if d.host != nil {
		d.host.Close()
	}
	if d.db != nil {
		d.db.Close()
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
