package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/config"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/metrics/forward"
	"github.com/vgpud/vgpud/pkg/metricsweb"
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
			Process: true, Extra: d.fleet.Registry(), Logger: d.log.With("component", "metrics"),
		})
		if err != nil {
			cancel()
			unsubscribe()
			return nil, err
		}
		web := d.metricsWeb
		if web == nil {
			if web, err = metricsweb.Load(d.cfg.MetricsWebConfigFile); err != nil {
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
			col.ObserveNVML(op, took, metrics.ReturnCode(ret))
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
		gate := metricsweb.NewGate(web, mux)
		d.metricsGate = gate
		srv = &http.Server{Handler: gate, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
			ErrorLog: slog.NewLogLogger(d.log.With("component", "metrics").Handler(), slog.LevelDebug)}
		run(func() { col.Run(rctx) })
		run(func() {
			if err := srv.Serve(gate.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Error("metrics endpoint", "err", err)
			}
		})
		d.log.Info("metrics endpoint listening", "addr", ln.Addr().String(), "interval", d.cfg.CollectInterval.Duration,
			"tls", web.TLS(), "basicAuthUsers", web.Users(), "webConfig", web.File())
	}
	run(func() {
		if err := loop.Run(rctx); err != nil {
			d.log.Error("share loop", "err", err)
		}
	})
	run(func() { forward.Events(rctx, events, col, loop, src, d.log) })
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

// inventoryMaxAge bounds how long a cached inventory is used without a
// manager event saying it changed (events a slow subscriber lost).
const inventoryMaxAge = 30 * time.Second

// nvmlObserver is the NVML hook the backend starts with: until the
// metrics run (startMetrics chains them in), it logs calls slow enough
// to delay start-up.
func nvmlObserver(d *daemon) nvmlbackend.Observer {
	return func(op string, took time.Duration, ret gonvml.Return) {
		if took >= slowNVMLCall {
			d.log.Warn("slow NVML call", "op", op, "took", took, "ret", metrics.ReturnCode(ret))
		}
	}
}

// listenMetrics binds cfg's metrics endpoint (pkg/metricsweb).
func listenMetrics(cfg *config.Config) (net.Listener, error) {
	return metricsweb.Listen(cfg.MetricsListen, cfg.MetricsSocketMode.FileMode(), cfg.MetricsSocketGroup)
}
