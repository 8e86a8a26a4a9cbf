// Package metrics is vgpud's Prometheus exporter. A background collection
// reads the manager's inventory and the share loop's latest window every
// interval; the first scrape after a collection renders it, once, and
// later scrapes serve that rendering. A scrape never calls NVML, the store
// or the share loop, and costs the same however slow the driver is; an
// exporter nobody scrapes renders nothing. NVML call latency and manager
// events (XIDs, lost GPUs, operations) are counted as they happen.
//
// Every family has the vgpud_ prefix; docs/metrics.md lists them. It
// imports pkg/share (for its snapshot and inventory types) and pkg/gpu (for
// the GPU states); cmd/vgpud wires it.
//
// Imports: pkg/gpu, pkg/share.
package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// processEvery is how many collections the process_* and go_* families
// are kept for before a rendering reads them again.
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
	Logger  *slog.Logger
	Now     func() time.Time
}

// Collector collects in the background and serves the latest rendering.
type Collector struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	observed *observed
	// fams are the snapshot families in the order they are rendered, and
	// famIdx finds one by name.
	fams   []family
	famIdx map[string]int

	mu          sync.Mutex // one collection at a time; guards what follows
	collections uint64
	lastSuccess time.Time

	// latest is the latest collection, not rendered yet if out is older.
	latest atomic.Pointer[collection]

	renderMu sync.Mutex // one rendering at a time; guards what follows
	// proc holds the process_* and go_* collectors; reading /proc and the
	// runtime costs more than the rest, so they are read every
	// processEvery collections and the rendering kept.
	proc     *prometheus.Registry
	procText []byte
	procAt   uint64
	// bufs are the family buffers of the last rendering, reused.
	bufs [][]byte

	out   atomic.Pointer[rendering]
	gzips sync.Pool // *gzip.Writer, for a rendering's first gzip scrape
}

// collection is what one collection read: the data a rendering shows.
type collection struct {
	n   uint64
	at  time.Time
	inv share.Inventory
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

// rendering is one collection's exposition, ready to write.
type rendering struct {
	col  *collection
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

// batch accumulates one collection's snapshot families, rendered in the
// text exposition format as they are added (one buffer per family, so a
// family's series stay together whatever order they come in).
type batch struct {
	c    *Collector
	bufs [][]byte
	err  error
}

func (b *batch) add(name string, v float64, labels ...string) {
	i, ok := b.c.famIdx[name]
	if !ok {
		b.err = errors.Join(b.err, fmt.Errorf("metric %s is not declared", name))
		return
	}
	f := &b.c.fams[i]
	if len(labels) != len(f.labels) {
		b.err = errors.Join(b.err, fmt.Errorf("metric %s: %d label values for %d labels", name, len(labels), len(f.labels)))
		return
	}
	if b.bufs == nil {
		b.bufs = make([][]byte, len(b.c.fams))
	}
	buf := b.bufs[i]
	buf = append(buf, name...)
	if len(labels) > 0 {
		buf = append(buf, '{')
		for j, l := range f.labels {
			if j > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, l...)
			buf = append(buf, '=', '"')
			buf = appendEscaped(buf, labels[j])
			buf = append(buf, '"')
		}
		buf = append(buf, '}')
	}
	buf = append(buf, ' ')
	buf = appendFloat(buf, v)
	buf = append(buf, '\n')
	b.bufs[i] = buf
}

// appendEscaped escapes a label value as the text format wants.
func appendEscaped(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			buf = append(buf, '\\', '\\')
		case '"':
			buf = append(buf, '\\', '"')
		case '\n':
			buf = append(buf, '\\', 'n')
		default:
			buf = append(buf, c)
		}
	}
	return buf
}

func appendFloat(buf []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		return append(buf, "NaN"...)
	case math.IsInf(v, 1):
		return append(buf, "+Inf"...)
	case math.IsInf(v, -1):
		return append(buf, "-Inf"...)
	}
	return strconv.AppendFloat(buf, v, 'g', -1, 64)
}

// write renders the families that have series, with their HELP and TYPE.
func (b *batch) write(w *bytes.Buffer) {
	for i, buf := range b.bufs {
		if len(buf) == 0 {
			continue
		}
		f := &b.c.fams[i]
		typ := "gauge"
		if f.typ == prometheus.CounterValue {
			typ = "counter"
		}
		w.WriteString("# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + typ + "\n")
		w.Write(buf)
	}
}

// Collect runs one collection now: it reads the inventory and the share
// loop's snapshot, and leaves them for the next scrape to render.
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
	}
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

// current returns the rendering of the latest collection, rendering it if
// no scrape has since it was collected.
func (c *Collector) current() *rendering {
	col := c.latest.Load()
	if r := c.out.Load(); r != nil && r.col == col {
		return r
	}
	c.renderMu.Lock()
	defer c.renderMu.Unlock()
	col = c.latest.Load()
	if r := c.out.Load(); r != nil && r.col == col {
		return r // another scrape rendered it meanwhile
	}
	r := c.render(col)
	c.out.Store(r)
	return r
}

// render writes a collection's exposition, with the observed families as
// they are now. Callers hold renderMu.
func (c *Collector) render(col *collection) *rendering {
	if col == nil {
		return &rendering{}
	}
	b := &batch{c: c, bufs: c.bufs}
	for i := range b.bufs {
		b.bufs[i] = b.bufs[i][:0]
	}
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
	mfs, gerr := c.reg.Gather()
	if gerr != nil {
		errs = errors.Join(errs, fmt.Errorf("gather: %w", gerr))
	}
	var buf bytes.Buffer
	if prev := c.out.Load(); prev != nil {
		buf.Grow(len(prev.text) + 4096)
	}
	b.write(&buf)
	c.observed.nvml.write(&buf)
	c.bufs = b.bufs // the next rendering reuses their memory
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			errs = errors.Join(errs, fmt.Errorf("encode %s: %w", mf.GetName(), err))
		}
	}
	if c.proc != nil {
		if c.procText == nil || col.n >= c.procAt+processEvery {
			var pb bytes.Buffer
			pmfs, err := c.proc.Gather()
			if err != nil {
				errs = errors.Join(errs, fmt.Errorf("gather process metrics: %w", err))
			}
			penc := expfmt.NewEncoder(&pb, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, mf := range pmfs {
				if err := penc.Encode(mf); err != nil {
					errs = errors.Join(errs, fmt.Errorf("encode %s: %w", mf.GetName(), err))
				}
			}
			c.procText, c.procAt = pb.Bytes(), col.n
		}
		buf.Write(c.procText)
	}
	if errs != nil {
		c.log.Error("metrics rendering is incomplete", "err", errs)
	}
	return &rendering{col: col, text: buf.Bytes(), at: col.at}
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
