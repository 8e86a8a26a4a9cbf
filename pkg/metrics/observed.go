package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The observed instruments: updated as things happen (NVML calls through
// ObserveNVML, manager events through Observe), read at each collection,
// unlike the snapshot families, which each collection builds afresh.

type observedFamily struct {
	name string
	// histogram: classic buckets (_bucket, _sum, _count); native: also a
	// native histogram, which a protobuf scrape ingests under name.
	histogram, native bool
}

func observedFamilies() []observedFamily {
	return []observedFamily{
		{"vgpud_nvml_call_duration_seconds", true, true},
		{"vgpud_nvml_call_errors_total", false, false},
		{"vgpud_xid_events_total", false, false},
		{"vgpud_gpu_lost_events_total", false, false},
		{"vgpud_drift_events_total", false, false},
		{"vgpud_settings_restored_total", false, false},
		{"vgpud_operations_total", false, false},
		{"vgpud_operation_duration_seconds", true, false},
	}
}

// Operations and outcomes vgpud_operations_total is initialised with, so
// that every series exists before the first operation.
var (
	knownOps      = []string{"create", "destroy", "attach", "detach"}
	knownOutcomes = []string{"success", "failure"}
	// knownDrift are the kinds vgpud_drift_events_total is initialised with.
	knownDrift = []string{"missing", "foreign", "settings"}
	// knownSettings and knownCauses: the series of
	// vgpud_settings_restored_total that exist from the start.
	knownSettings = []string{"heterogeneous", "scheduler"}
	knownCauses   = []string{"drift", "reconcile"}
	// watchedXIDs are the XIDs worth a panel (reference 5.5); their
	// counters start at 0 on every GPU. Others appear when they happen.
	watchedXIDs = []uint64{13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
)

// nvmlBuckets are the NVML call latency histogram's classic upper bounds (s).
var nvmlBuckets = []float64{5e-6, 25e-6, 100e-6, 500e-6, 0.002, 0.01, 0.05, 0.25, 1, 5}

type observed struct {
	nvml       *prometheus.HistogramVec
	nvmlErrs   *prometheus.CounterVec
	xid        *prometheus.CounterVec
	lost       *prometheus.CounterVec
	drift      *prometheus.CounterVec
	restored   *prometheus.CounterVec
	ops        *prometheus.CounterVec
	opDuration *prometheus.HistogramVec
	gpus       map[string]bool
}

func newObserved(reg *prometheus.Registry) *observed {
	l := &observed{
		nvml: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vgpud_nvml_call_duration_seconds",
			Help:    "Latency of NVML calls by operation.",
			Buckets: nvmlBuckets,
			// Also native: factor 1.1 resolves the microsecond calls
			// and the second-long ones in one histogram; 160 buckets
			// bound its size, an hour between resets its churn.
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  160,
			NativeHistogramMinResetDuration: time.Hour}, []string{"op"}),
		nvmlErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_nvml_call_errors_total",
			Help: "NVML calls that failed, by operation and return code."}, []string{"op", "code"}),
		// The event counters are kept by GPU UUID (what the events carry);
		// label adds the GPU's index and bus id when they are served.
		xid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_xid_events_total",
			Help: "NVML XID critical error events by GPU and XID code."}, []string{"UUID", "xid"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_gpu_lost_events_total",
			Help: "Times a GPU was marked lost or failed (XID 79, fault watch)."}, []string{"UUID"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_drift_events_total",
			Help: "Changes found on the host that no event reported: instances whose devices vanished (missing), devices no record explains (foreign)."}, []string{"kind"}),
		restored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_settings_restored_total",
			Help: "GPU settings the driver lost (GPU reset, VF rebind, driver reload, reboot) and vgpud set again, by setting and by the pass that found the loss (drift: the periodic check; reconcile: start-up or fault recovery)."}, []string{"setting", "event"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_operations_total",
			Help: "Finished operations by kind and outcome."}, []string{"op", "outcome"}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vgpud_operation_duration_seconds",
			Help:    "Duration of finished operations by kind and outcome (where the start is known).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}, []string{"op", "outcome"}),
		gpus: map[string]bool{},
	}
	reg.MustRegister(l.nvml, l.nvmlErrs, l.xid, l.lost, l.drift, l.restored, l.ops, l.opDuration)
	for _, k := range knownDrift {
		l.drift.WithLabelValues(k)
	}
	for _, s := range knownSettings {
		for _, c := range knownCauses {
			l.restored.WithLabelValues(s, c)
		}
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

// label adds gpu and pci_bus_id to the gathered GPU event counters, as
// every GPU family has them. The families are the Gather's own copies.
func (l *observed) label(mfs []*dto.MetricFamily, gpus map[string]gpuIdent) {
	gpuName, busName := "gpu", "pci_bus_id"
	for _, mf := range mfs {
		if n := mf.GetName(); n != "vgpud_xid_events_total" && n != "vgpud_gpu_lost_events_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, lp := range m.Label {
				if lp.GetName() != "UUID" {
					continue
				}
				id, ok := gpus[lp.GetValue()]
				if !ok {
					break
				}
				m.Label = append(m.Label, &dto.LabelPair{Name: &gpuName, Value: &id.index}, &dto.LabelPair{Name: &busName, Value: &id.pciBusID})
				break
			}
		}
	}
}

// ObserveNVML records one NVML call: its latency, and its return code
// when it failed (code "" means success). Safe for concurrent use.
func (c *Collector) ObserveNVML(op string, took time.Duration, code string) {
	c.observed.nvml.WithLabelValues(op).Observe(took.Seconds())
	if code != "" {
		c.observed.nvmlErrs.WithLabelValues(op, code).Inc()
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
	// EventSettingRestored: a GPU setting the driver lost was set again;
	// Op is the setting, Cause the pass that found it lost.
	EventSettingRestored EventKind = "setting-restored"
)

// Event is something the manager reported.
type Event struct {
	Kind     EventKind
	GPU      string
	XID      uint64
	Op       string
	OK       bool
	Duration time.Duration
	Cause    string
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
	case EventSettingRestored:
		c.observed.restored.WithLabelValues(e.Op, e.Cause).Inc()
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
