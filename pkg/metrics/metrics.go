// Package metrics is vgpud's Prometheus exporter. A background collection
// reads the manager's inventory and the share loop's latest window every
// interval; the first scrape after a collection turns it into metric
// families, once, and later scrapes serve those families. A scrape never
// calls NVML, the store or the share loop, and costs the same however slow
// the driver is; an exporter nobody scrapes builds nothing. NVML call
// latency and manager events (XIDs, lost GPUs, operations) are counted as
// they happen.
//
// The families are served through client_golang's promhttp behind the
// Collector's Gatherer, which negotiates the format (text, OpenMetrics,
// protobuf with the native NVML latency histogram) and the encoding
// (gzip, zstd) with each scraper.
//
// Every family has the vgpud_ prefix; docs/metrics.md lists them. GPU
// labels are dcgm-exporter's (gpu: the NVML index, UUID, pci_bus_id), so
// vgpud's series join with DCGM's. It imports pkg/share (for its snapshot
// and inventory types) and pkg/gpu (for the GPU states); the manager's
// events reach it through pkg/metrics/forward; cmd/vgpud wires it.
//
// Imports: pkg/gpu, pkg/share.
package metrics

import (
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
	dto "github.com/prometheus/client_model/go"

	"github.com/vgpud/vgpud/pkg/share"
)

// processEvery is how many collections the process_* and go_* families
// are kept for before they are gathered again.
const processEvery = 10

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
	// Extra are families kept elsewhere (the fleet sync's), gathered at
	// each scrape and served after the collection with its age; nil: none.
	// They must be cheap to gather (counters and gauges in memory) and
	// named apart from the collector's.
	Extra  prometheus.Gatherer
	Logger *slog.Logger
	Now    func() time.Time
}

// Collector collects in the background and serves the latest collection's
// families.
type Collector struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	observed *observed
	// fams are the snapshot families in the order they are served, and
	// famIdx finds one by name.
	fams   []family
	famIdx map[string]int

	mu          sync.Mutex // one collection at a time; guards what follows
	collections uint64
	lastSuccess time.Time
	// gpus are the GPUs' DCGM labels by UUID from the last inventory read
	// that succeeded (replaced, never changed: collections share it).
	gpus map[string]gpuIdent

	// latest is the latest collection, not built yet if out is older.
	latest atomic.Pointer[collection]

	buildMu sync.Mutex // one build at a time; guards what follows
	// proc holds the process_* and go_* collectors; reading /proc and the
	// runtime costs more than the rest, so they are gathered every
	// processEvery collections and the families kept.
	proc    *prometheus.Registry
	procMFs []*dto.MetricFamily
	procAt  uint64

	out atomic.Pointer[built]
	// encSize is the largest encoding yet with room to grow: a new
	// collection's buffer starts at it.
	encSize atomic.Int64
}

// collection is what one collection read: the data its families show.
type collection struct {
	n    uint64
	at   time.Time
	inv  share.Inventory
	gpus map[string]gpuIdent
	// invOK: the inventory read succeeded (else its families are left out).
	invOK bool
	snap  *share.Snapshot
	// runs are the collectors' results, by name.
	runs map[string]collectorRun
	// took is how long the collection took; lastSuccess when the last one
	// that read the inventory finished (zero: none yet).
	took        time.Duration
	lastSuccess time.Time
}

type collectorRun struct {
	ok  bool
	dur time.Duration
}

// built is one collection's metric families, ready to encode. They are
// shared by every scrape of the collection and never changed.
type built struct {
	col *collection
	mfs []*dto.MetricFamily
	at  time.Time
	// enc are the families' encodings by format, made by the first scrape
	// that asks for each.
	enc encodings
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
	c := &Collector{cfg: cfg, log: cfg.Logger, reg: prometheus.NewRegistry(), famIdx: map[string]int{}}
	c.fams = snapshotFamilies()
	for i, f := range c.fams {
		c.famIdx[f.name] = i
	}
	c.observed = newObserved(c.reg)
	if cfg.Process {
		c.proc = prometheus.NewRegistry()
		c.proc.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	}
	c.out.Store(&built{})
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

// Collect runs one collection now: it reads the inventory and the share
// loop's snapshot, and leaves them for the next scrape to build families of.
func (c *Collector) Collect(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	col := &collection{runs: map[string]collectorRun{}}
	inv, err := c.cfg.Source.Inventory(ctx)
	col.runs["inventory"] = collectorRun{ok: err == nil, dur: time.Since(start)}
	if err != nil {
		err = fmt.Errorf("inventory: %w", err)
	} else {
		col.inv, col.invOK = inv, true
		c.gpus = gpuIdents(inv.GPUs)
	}
	col.gpus = c.gpus
	if c.cfg.Shares != nil {
		t0 := time.Now()
		col.snap = c.cfg.Shares.Snapshot()
		col.runs["shares"] = collectorRun{ok: col.snap != nil && col.snap.Windows > 0, dur: time.Since(t0)}
	}
	c.collections++
	col.n = c.collections
	col.at = c.cfg.Now()
	// Only a collection that read the inventory is a success: the stale
	// alert watches this stamp.
	if err == nil {
		c.lastSuccess = col.at
	}
	col.lastSuccess = c.lastSuccess
	col.took = time.Since(start)
	c.latest.Store(col)
	return err
}

// current returns the families of the latest collection, building them
// if no scrape has since it was collected.
func (c *Collector) current() *built {
	col := c.latest.Load()
	if r := c.out.Load(); r != nil && r.col == col {
		return r
	}
	c.buildMu.Lock()
	defer c.buildMu.Unlock()
	col = c.latest.Load()
	if r := c.out.Load(); r != nil && r.col == col {
		return r // another scrape built them meanwhile
	}
	r := c.build(col)
	c.out.Store(r)
	return r
}

// build turns a collection into metric families, with the observed
// families as they are now. Callers hold buildMu.
func (c *Collector) build(col *collection) *built {
	if col == nil {
		return &built{}
	}
	b := newBatch(c, col.gpus)
	c.collectInfo(b)
	if col.invOK {
		c.collectInventory(b, col.inv)
	}
	if c.cfg.Shares != nil {
		c.collectShares(b, col.snap)
	}
	names := make([]string, 0, len(col.runs))
	for n := range col.runs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		r := col.runs[n]
		b.add("vgpud_collector_success", boolf(r.ok), n)
		b.add("vgpud_collector_duration_seconds", r.dur.Seconds(), n)
	}
	b.add("vgpud_collections_total", float64(col.n))
	b.add("vgpud_collection_duration_seconds", col.took.Seconds())
	if !col.lastSuccess.IsZero() {
		b.add("vgpud_collection_last_success_timestamp_seconds", float64(col.lastSuccess.UnixNano())/1e9)
	}
	errs := b.err
	mfs := b.families()
	omfs, err := c.reg.Gather()
	if err != nil {
		errs = errors.Join(errs, fmt.Errorf("gather: %w", err))
	}
	c.observed.label(omfs, col.gpus)
	mfs = append(mfs, omfs...)
	if c.proc != nil {
		if c.procMFs == nil || col.n >= c.procAt+processEvery {
			pmfs, err := c.proc.Gather()
			if err != nil {
				errs = errors.Join(errs, fmt.Errorf("gather process metrics: %w", err))
			}
			c.procMFs, c.procAt = withoutShadowed(pmfs), col.n
		}
		mfs = append(mfs, c.procMFs...)
	}
	if errs != nil {
		c.log.Error("metrics collection is incomplete", "err", errs)
	}
	return &built{col: col, mfs: mfs, at: col.at}
}

// shadowedGoFamily is the Go collector's gauge that OpenMetrics cannot
// carry beside its counter: OpenMetrics names a counter's family without
// "_total", so go_memstats_alloc_bytes_total's family is
// go_memstats_alloc_bytes too, and an exposition with both has two HELP
// and two TYPE lines for one family, which OpenMetrics parsers (promtool's
// among them) refuse. client_golang serves both in every format
// (prometheus/client_golang#829, open). The gauge is the one dropped, in
// every format so that all serve the same families: client_golang sets it
// to HeapAlloc, which go_memstats_heap_alloc_bytes serves as well, while
// the counter (bytes allocated since start) exists nowhere else.
const shadowedGoFamily = "go_memstats_alloc_bytes"

// withoutShadowed returns mfs less shadowedGoFamily.
func withoutShadowed(mfs []*dto.MetricFamily) []*dto.MetricFamily {
	out := mfs[:0]
	for _, mf := range mfs {
		if mf.GetName() != shadowedGoFamily {
			out = append(out, mf)
		}
	}
	return out
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
