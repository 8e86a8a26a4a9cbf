package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/share"
	"github.com/vgpud/vgpud/pkg/share/managersource"
	"github.com/vgpud/vgpud/pkg/share/nvmldriver"
	"github.com/vgpud/vgpud/pkg/version"
)

// slowNVMLCall is how long an NVML call may take before the start-up
// observer logs it (metrics count every call once they run).
const slowNVMLCall = time.Second

// startMetrics starts the share loop (measurement and scheduler policy
// enforcement, always) and, when cfg.MetricsListen is set, the metrics
// collection every CollectInterval and the /metrics endpoint serving
// its latest collection. stop shuts them down.
func startMetrics(ctx context.Context, d *daemon) (stop func(), err error) {
	src := share.NewCache(managersource.New(d.mgr, d.catalog), inventoryMaxAge)
	loop, err := share.New(src, nvmldriver.New(d.host.nvml), share.Config{
		Mode:   share.Adaptive,
		Logger: d.log.With("component", "share"),
		// An operator's pin holds from the moment it is set, not from the
		// loop's next inventory.
		Guard: d.mgr.UnlessPinned,
		OnEvent: func(e share.Event) {
			d.mgr.Publish(manager.Event{Kind: manager.EventPolicySwitched, ID: e.GPU, Op: e.Kind, Detail: e.String(), Time: e.Time})
		},
	})
	if err != nil {
		return nil, fmt.Errorf("share loop: %w", err)
	}
	d.shares = loopShares{loop: loop}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn()
		}()
	}
	events, unsubscribe := d.mgr.Subscribe()
	var srv *http.Server
	var col *metrics.Collector
	if d.cfg.MetricsListen != "" {
		host, _ := os.Hostname()
		drv, _ := d.host.nvml.Driver(ctx)
		col, err = metrics.New(metrics.Config{
			Interval: d.cfg.CollectInterval.Duration, Source: src, Shares: loop, Version: version.Version,
			Hostname: host, DriverVersion: drv.Version, NVMLVersion: drv.NVMLVersion, Simulated: d.host.sim != nil,
			Process: true, Extra: d.fleet.reg, Logger: d.log.With("component", "metrics"),
		})
		if err != nil {
			cancel()
			unsubscribe()
			return nil, err
		}
		web := d.metricsWeb
		if web == nil {
			if web, err = loadMetricsWeb(d.cfg.MetricsWebConfigFile); err != nil {
				cancel()
				unsubscribe()
				return nil, err
			}
		}
		ln := d.metricsLn
		if ln == nil {
			if ln, err = listenMetrics(d.cfg); err != nil {
				cancel()
				unsubscribe()
				return nil, err
			}
		}
		prev := d.host.nvml.Observer()
		d.host.nvml.SetObserver(func(op string, took time.Duration, ret gonvml.Return) {
			if prev != nil {
				prev(op, took, ret)
			}
			col.ObserveNVML(op, took, returnCode(ret))
		})
		mux := http.NewServeMux()
		mux.Handle("/metrics", col.Handler())
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintln(w, "vgpud: metrics at /metrics")
		})
		gate := newMetricsGate(web, mux)
		d.metricsGate = gate
		srv = &http.Server{Handler: gate, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
			ErrorLog: slog.NewLogLogger(d.log.With("component", "metrics").Handler(), slog.LevelDebug)}
		run(func() { col.Run(rctx) })
		run(func() {
			if err := srv.Serve(gate.listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Error("metrics endpoint", "err", err)
			}
		})
		d.log.Info("metrics endpoint listening", "addr", ln.Addr().String(), "interval", d.cfg.CollectInterval.Duration,
			"tls", web.tls != nil, "basicAuthUsers", len(web.users), "webConfig", web.file)
	}
	run(func() {
		if err := loop.Run(rctx); err != nil {
			d.log.Error("share loop", "err", err)
		}
	})
	run(func() { forwardEvents(rctx, d, events, col, loop, src) })
	return func() {
		cancel()
		unsubscribe()
		if srv != nil {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = srv.Shutdown(sctx)
			scancel()
		}
		wg.Wait()
	}, nil
}

// forwardEvents counts the manager's events in the metrics and lets the
// share loop retry a pending policy switch as soon as a VM changes state.
func forwardEvents(ctx context.Context, d *daemon, events <-chan manager.Event, col *metrics.Collector, loop *share.Loop, inv *share.Cache) {
	for {
		var e manager.Event
		var ok bool
		select {
		case <-ctx.Done():
			return
		case e, ok = <-events:
			if !ok {
				return
			}
		}
		switch e.Kind {
		case manager.EventVM:
			loop.Kick()
		case manager.EventInstanceAdded, manager.EventInstanceChanged, manager.EventInstanceRemoved,
			manager.EventTenantAdded, manager.EventTenantChanged, manager.EventTenantRemoved, manager.EventGPUChanged, manager.EventGPULost:
			inv.Invalidate()
		}
		if col == nil {
			continue
		}
		switch e.Kind {
		case manager.EventXID:
			code, err := strconv.ParseUint(e.Detail, 10, 64)
			if err != nil {
				d.log.Debug("XID event without a number", "detail", e.Detail)
				continue
			}
			col.Observe(metrics.Event{Kind: metrics.EventXID, GPU: e.ID, XID: code})
		case manager.EventGPULost:
			col.Observe(metrics.Event{Kind: metrics.EventGPULost, GPU: e.ID})
		case manager.EventDrift:
			col.Observe(metrics.Event{Kind: metrics.EventDrift, Op: e.Op})
		case manager.EventOperationDone, manager.EventOperationFailed:
			col.Observe(metrics.Event{Kind: metrics.EventOperation, Op: e.Op, OK: e.Kind == manager.EventOperationDone, Duration: e.Took})
		}
	}
}

// inventoryMaxAge bounds how long a cached inventory is used without a
// manager event saying it changed (events a slow subscriber lost).
const inventoryMaxAge = 30 * time.Second

// nvmlObserver is the NVML hook the backend starts with: until the
// metrics run (startMetrics chains them in), it logs calls slow enough
// to delay start-up.
func nvmlObserver(d *daemon) nvmlbackend.Observer {
	return func(op string, took time.Duration, ret gonvml.Return) {
		if took >= slowNVMLCall {
			d.log.Warn("slow NVML call", "op", op, "took", took, "ret", returnCode(ret))
		}
	}
}

// returnCode is an NVML return code as a metric label ("" for success).
func returnCode(ret gonvml.Return) string {
	switch ret {
	case gonvml.SUCCESS:
		return ""
	case gonvml.ERROR_NOT_SUPPORTED:
		return "not_supported"
	case gonvml.ERROR_INVALID_ARGUMENT:
		return "invalid_argument"
	case gonvml.ERROR_NOT_FOUND:
		return "not_found"
	case gonvml.ERROR_GPU_IS_LOST:
		return "gpu_is_lost"
	case gonvml.ERROR_TIMEOUT:
		return "timeout"
	case gonvml.ERROR_IN_USE:
		return "in_use"
	case gonvml.ERROR_INSUFFICIENT_RESOURCES:
		return "insufficient_resources"
	case gonvml.ERROR_UNINITIALIZED:
		return "uninitialized"
	case gonvml.ERROR_NO_PERMISSION:
		return "no_permission"
	case gonvml.ERROR_RESET_REQUIRED:
		return "reset_required"
	case gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED:
		return "driver_not_loaded"
	case gonvml.ERROR_ARGUMENT_VERSION_MISMATCH:
		return "argument_version_mismatch"
	case gonvml.ERROR_UNKNOWN:
		return "unknown"
	}
	return "code_" + strconv.Itoa(int(ret))
}
