package metrics

import (
	"bytes"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The observed instruments: updated as things happen (NVML calls through
// ObserveNVML, manager events through Observe), read at each collection,
// unlike the snapshot families, which each collection builds afresh.

type observedFamily struct {
	name      string
	histogram bool
}

func observedFamilies() []observedFamily {
	return []observedFamily{
		{"vgpud_nvml_call_duration_seconds", true},
		{"vgpud_nvml_call_errors_total", false},
		{"vgpud_xid_events_total", false},
		{"vgpud_gpu_lost_events_total", false},
		{"vgpud_drift_events_total", false},
		{"vgpud_operations_total", false},
		{"vgpud_operation_duration_seconds", true},
	}
}

// Operations and outcomes vgpud_operations_total is initialised with, so
// that every series exists before the first operation.
var (
	knownOps      = []string{"create", "destroy", "attach", "detach"}
	knownOutcomes = []string{"success", "failure"}
	// knownDrift are the kinds vgpud_drift_events_total is initialised with.
	knownDrift = []string{"missing", "foreign"}
	// watchedXIDs are the XIDs worth a panel (reference 5.5); their
	// counters start at 0 on every GPU. Others appear when they happen.
	watchedXIDs = []uint64{13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
)

type observed struct {
	nvml       nvmlStats
	xid        *prometheus.CounterVec
	lost       *prometheus.CounterVec
	drift      *prometheus.CounterVec
	ops        *prometheus.CounterVec
	opDuration *prometheus.HistogramVec
	gpus       map[string]bool
}

func newObserved(reg *prometheus.Registry) *observed {
	l := &observed{
		nvml: nvmlStats{ops: map[string]*opStats{}},
		xid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_xid_events_total",
			Help: "NVML XID critical error events by GPU and XID code."}, []string{"gpu", "xid"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_gpu_lost_events_total",
			Help: "Times a GPU was marked lost or failed (XID 79, fault watch)."}, []string{"gpu"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_drift_events_total",
			Help: "Changes found on the host that no event reported: instances whose devices vanished (missing), devices no record explains (foreign)."}, []string{"kind"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_operations_total",
			Help: "Finished operations by kind and outcome."}, []string{"op", "outcome"}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vgpud_operation_duration_seconds",
			Help:    "Duration of finished operations by kind and outcome (where the start is known).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}, []string{"op", "outcome"}),
		gpus: map[string]bool{},
	}
	reg.MustRegister(l.xid, l.lost, l.drift, l.ops, l.opDuration)
	for _, k := range knownDrift {
		l.drift.WithLabelValues(k)
	}
	for _, op := range knownOps {
		for _, o := range knownOutcomes {
			l.ops.WithLabelValues(op, o)
			l.opDuration.WithLabelValues(op, o)
		}
	}
	return l
}

// touchGPU creates a GPU's event counters at 0 the first time it is seen.
// Called from the collection goroutine only.
func (l *observed) touchGPU(uuid string) {
	if l.gpus[uuid] {
		return
	}
	l.gpus[uuid] = true
	l.lost.WithLabelValues(uuid)
	for _, x := range watchedXIDs {
		l.xid.WithLabelValues(uuid, strconv.FormatUint(x, 10))
	}
}

// ObserveNVML records one NVML call: its latency, and its return code
// when it failed (code "" means success). Safe for concurrent use.
func (c *Collector) ObserveNVML(op string, took time.Duration, code string) {
	c.observed.nvml.observe(op, took, code)
}

// nvmlBuckets are the NVML call latency histogram's upper bounds (s).
var nvmlBuckets = [...]float64{5e-6, 25e-6, 100e-6, 500e-6, 0.002, 0.01, 0.05, 0.25, 1, 5}

// nvmlStats is the NVML call histogram and error counts. It is rendered
// straight to text: with a series per operation and bucket it is the
// largest observed family, and a registry's Gather of it costs more than the
// rest of a collection.
type nvmlStats struct {
	mu  sync.Mutex
	ops map[string]*opStats
}

type opStats struct {
	buckets [len(nvmlBuckets)]uint64
	count   uint64
	sum     float64
	errs    map[string]uint64
}

func (n *nvmlStats) observe(op string, took time.Duration, code string) {
	s := took.Seconds()
	n.mu.Lock()
	defer n.mu.Unlock()
	o := n.ops[op]
	if o == nil {
		o = &opStats{}
		n.ops[op] = o
	}
	for i, ub := range nvmlBuckets {
		if s <= ub {
			o.buckets[i]++
			break
		}
	}
	o.count++
	o.sum += s
	if code != "" {
		if o.errs == nil {
			o.errs = map[string]uint64{}
		}
		o.errs[code]++
	}
}

// write renders vgpud_nvml_call_duration_seconds and vgpud_nvml_call_errors_total.
func (n *nvmlStats) write(w *bytes.Buffer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	names := make([]string, 0, len(n.ops))
	for op := range n.ops {
		names = append(names, op)
	}
	sort.Strings(names)
	var b []byte
	b = append(b, "# HELP vgpud_nvml_call_duration_seconds Latency of NVML calls by operation.\n# TYPE vgpud_nvml_call_duration_seconds histogram\n"...)
	for _, op := range names {
		o := n.ops[op]
		cum := uint64(0)
		for i, ub := range nvmlBuckets {
			cum += o.buckets[i]
			b = append(b, `vgpud_nvml_call_duration_seconds_bucket{op="`...)
			b = appendEscaped(b, op)
			b = append(b, `",le="`...)
			b = strconv.AppendFloat(b, ub, 'g', -1, 64)
			b = append(b, `"} `...)
			b = strconv.AppendUint(b, cum, 10)
			b = append(b, '\n')
		}
		b = append(b, `vgpud_nvml_call_duration_seconds_bucket{op="`...)
		b = appendEscaped(b, op)
		b = append(b, `",le="+Inf"} `...)
		b = strconv.AppendUint(b, o.count, 10)
		b = append(b, "\nvgpud_nvml_call_duration_seconds_sum{op=\""...)
		b = appendEscaped(b, op)
		b = append(b, `"} `...)
		b = appendFloat(b, o.sum)
		b = append(b, "\nvgpud_nvml_call_duration_seconds_count{op=\""...)
		b = appendEscaped(b, op)
		b = append(b, `"} `...)
		b = strconv.AppendUint(b, o.count, 10)
		b = append(b, '\n')
	}
	errs := false
	for _, op := range names {
		o := n.ops[op]
		codes := make([]string, 0, len(o.errs))
		for c := range o.errs {
			codes = append(codes, c)
		}
		sort.Strings(codes)
		for _, c := range codes {
			if !errs {
				errs = true
				b = append(b, "# HELP vgpud_nvml_call_errors_total NVML calls that failed, by operation and return code.\n# TYPE vgpud_nvml_call_errors_total counter\n"...)
			}
			b = append(b, `vgpud_nvml_call_errors_total{op="`...)
			b = appendEscaped(b, op)
			b = append(b, `",code="`...)
			b = appendEscaped(b, c)
			b = append(b, `"} `...)
			b = strconv.AppendUint(b, o.errs[c], 10)
			b = append(b, '\n')
		}
	}
	if len(names) > 0 {
		w.Write(b)
	}
}

// EventKind names the manager events the collector counts.
type EventKind string

const (
	// EventXID: GPU is the GPU's UUID, XID the code.
	EventXID EventKind = "xid"
	// EventGPULost: GPU was marked lost or failed.
	EventGPULost EventKind = "gpu-lost"
	// EventOperation: an operation finished (OK says how); Duration is
	// its length when known (0: unknown, not observed in the histogram).
	EventOperation EventKind = "operation"
	// EventDrift: the host changed behind vgpud's back; Op is the kind
	// ("missing": an instance's devices vanished; "foreign": a device no
	// record explains appeared).
	EventDrift EventKind = "drift"
)

// Event is something the manager reported.
type Event struct {
	Kind     EventKind
	GPU      string
	XID      uint64
	Op       string
	OK       bool
	Duration time.Duration
}

// Observe counts an event. Safe for concurrent use.
func (c *Collector) Observe(e Event) {
	switch e.Kind {
	case EventXID:
		c.observed.xid.WithLabelValues(e.GPU, strconv.FormatUint(e.XID, 10)).Inc()
	case EventGPULost:
		c.observed.lost.WithLabelValues(e.GPU).Inc()
	case EventDrift:
		c.observed.drift.WithLabelValues(e.Op).Inc()
	case EventOperation:
		outcome := "success"
		if !e.OK {
			outcome = "failure"
		}
		c.observed.ops.WithLabelValues(e.Op, outcome).Inc()
		if e.Duration > 0 {
			c.observed.opDuration.WithLabelValues(e.Op, outcome).Observe(e.Duration.Seconds())
		}
	}
}
