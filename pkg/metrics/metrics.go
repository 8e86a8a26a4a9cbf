// Package metrics is vgpud's Prometheus exporter. A background collection
// reads the manager's inventory and the share loop's latest window every
// interval and renders the whole exposition once; /metrics serves that
// rendering, so a scrape never calls NVML, the store or the share loop,
// and costs the same however slow the driver is. NVML call latency and
// manager events (XIDs, lost GPUs, operations) are counted as they happen.
//
// Every family has the vgpud_ prefix; docs/metrics.md lists them. It
// imports pkg/share (for its snapshot and inventory types); cmd/vgpud
// wires it.
package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/vgpud/vgpud/pkg/share"
)

// ErrBadConfig is wrapped by New's validation errors.
var ErrBadConfig = errors.New("invalid metrics configuration")

// Source returns the inventory (the manager's GPUs, instances, tenants).
type Source interface {
	Inventory(ctx context.Context) (share.Inventory, error)
}

// Shares returns the share loop's latest snapshot (nil: no loop).
type Shares interface {
	Snapshot() *share.Snapshot
}

// Config configures a Collector.
type Config struct {
	// Interval is the collection period (default 1s).
	Interval time.Duration
	Source   Source
	// Shares may be nil: share metrics are then absent.
	Shares Shares
	// Version is vgpud's version (vgpud_build_info).
	Version string
	// Hostname, DriverVersion, NVMLVersion and Simulated describe the host.
	Hostname, DriverVersion, NVMLVersion string
	Simulated                            bool
	// Process adds the process_* and go_* families of client_golang.
	Process bool
	Logger  *slog.Logger
	Now     func() time.Time
}

// Collector collects in the background and serves the latest rendering.
type Collector struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	live  *live
	snap  *snapshotCollector
	descs map[string]*prometheus.Desc
	types map[string]prometheus.ValueType

	mu          sync.Mutex // one collection at a time
	collections uint64
	collectors  map[string]collectorRun

	out atomic.Pointer[rendering]
}

type collectorRun struct {
	ok  bool
	dur time.Duration
}

// rendering is one collection's exposition, ready to write.
type rendering struct {
	text []byte
	at   time.Time

	gzOnce sync.Once
	gz     []byte
}

// New returns a collector; call Run (or Collect) to fill it.
func New(cfg Config) (*Collector, error) {
	if cfg.Source == nil {
		return nil, fmt.Errorf("%w: a source is required", ErrBadConfig)
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < 10*time.Millisecond {
		return nil, fmt.Errorf("%w: interval %v is below 10ms", ErrBadConfig, cfg.Interval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Collector{cfg: cfg, log: cfg.Logger, reg: prometheus.NewRegistry(), descs: map[string]*prometheus.Desc{},
		types: map[string]prometheus.ValueType{}, collectors: map[string]collectorRun{}}
	for _, f := range snapshotFamilies() {
		c.descs[f.name] = prometheus.NewDesc(f.name, f.help, f.labels, nil)
		c.types[f.name] = f.typ
	}
	c.live = newLive(c.reg)
	c.snap = &snapshotCollector{}
	c.reg.MustRegister(c.snap)
	if cfg.Process {
		c.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	}
	c.out.Store(&rendering{})
	return c, nil
}

// Run collects every Interval until ctx ends.
func (c *Collector) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		if err := c.Collect(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("metrics collection", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// snapshotCollector hands the registry the metrics one collection built.
type snapshotCollector struct {
	metrics []prometheus.Metric
}

// Describe sends nothing: the families vary with the host, so the
// collector is unchecked.
func (s *snapshotCollector) Describe(chan<- *prometheus.Desc) {}

func (s *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range s.metrics {
		ch <- m
	}
}

// batch accumulates one collection's metrics.
type batch struct {
	c   *Collector
	out []prometheus.Metric
	err error
}

func (b *batch) add(name string, v float64, labels ...string) {
	d := b.c.descs[name]
	if d == nil {
		b.err = errors.Join(b.err, fmt.Errorf("metric %s is not declared", name))
		return
	}
	m, err := prometheus.NewConstMetric(d, b.c.types[name], v, labels...)
	if err != nil {
		b.err = errors.Join(b.err, fmt.Errorf("metric %s: %w", name, err))
		return
	}
	b.out = append(b.out, m)
}

// Collect runs one collection now and publishes its rendering.
func (c *Collector) Collect(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	b := &batch{c: c}
	var errs error

	t0 := time.Now()
	inv, err := c.cfg.Source.Inventory(ctx)
	c.collectors["inventory"] = collectorRun{ok: err == nil, dur: time.Since(t0)}
	if err != nil {
		errs = errors.Join(errs, fmt.Errorf("inventory: %w", err))
	}
	var snap *share.Snapshot
	if c.cfg.Shares != nil {
		snap = c.cfg.Shares.Snapshot()
	}
	t0 = time.Now()
	c.collectInfo(b)
	if err == nil {
		c.collectInventory(b, inv)
	}
	c.collectors["inventory"] = collectorRun{ok: err == nil, dur: c.collectors["inventory"].dur + time.Since(t0)}
	if c.cfg.Shares != nil {
		t0 = time.Now()
		c.collectShares(b, snap)
		c.collectors["shares"] = collectorRun{ok: snap != nil && snap.Windows > 0, dur: time.Since(t0)}
	}
	c.collections++
	names := make([]string, 0, len(c.collectors))
	for n := range c.collectors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := c.collectors[n]
		b.add("vgpud_collector_success", boolf(r.ok), n)
		b.add("vgpud_collector_duration_seconds", r.dur.Seconds(), n)
	}
	now := c.cfg.Now()
	b.add("vgpud_collections_total", float64(c.collections))
	b.add("vgpud_collection_duration_seconds", time.Since(start).Seconds())
	b.add("vgpud_collection_last_success_timestamp_seconds", float64(now.UnixNano())/1e9)
	if b.err != nil {
		errs = errors.Join(errs, b.err)
	}
	c.snap.metrics = b.out
	mfs, gerr := c.reg.Gather()
	c.snap.metrics = nil
	if gerr != nil {
		errs = errors.Join(errs, fmt.Errorf("gather: %w", gerr))
	}
	var buf bytes.Buffer
	buf.Grow(len(c.out.Load().text) + 4096)
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			errs = errors.Join(errs, fmt.Errorf("encode %s: %w", mf.GetName(), err))
		}
	}
	c.out.Store(&rendering{text: buf.Bytes(), at: now})
	return errs
}

func (c *Collector) collectInfo(b *batch) {
	b.add("vgpud_build_info", 1, c.cfg.Version, runtime.Version())
	b.add("vgpud_host_info", 1, c.cfg.Hostname, c.cfg.DriverVersion, c.cfg.NVMLVersion, strconv.FormatBool(c.cfg.Simulated))
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
