package fleet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vgpud/vgpud/pkg/placementapi"
)

// Metrics are the fleet sync's Prometheus families, in a collector of
// their own that the daemon registers beside pkg/metrics' families.
type Metrics struct {
	lag       prometheus.Histogram
	conflicts prometheus.Counter
	failures  *prometheus.CounterVec
	passes    prometheus.Counter
	orphans   prometheus.Counter
	claims    *prometheus.CounterVec
	lastOK    prometheus.Gauge
	duration  prometheus.Histogram
	// writeFailures are single writes a pass could not make, by write
	// (provider, inventory, traits, allocation, removal, read) and kind.
	writeFailures *prometheus.CounterVec
	// settles are Settle's outcomes (done, failed) and settleTime its
	// duration.
	settles    *prometheus.CounterVec
	settleTime prometheus.Histogram
}

// NewMetrics makes the families (not registered).
func NewMetrics() *Metrics {
	return &Metrics{
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vgpud_fleet_sync_lag_seconds",
			Help:    "Time from a host change to the Placement sync pass that published it.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpud_fleet_generation_conflicts_total",
			Help: "Placement generation conflicts (409 placement.concurrent_update) re-read and retried."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_fleet_sync_failures_total",
			Help: "Placement sync passes that failed, by error kind."}, []string{"kind"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpud_fleet_sync_passes_total",
			Help: "Placement sync passes that succeeded."}),
		orphans: prometheus.NewCounter(prometheus.CounterOpts{Name: "vgpud_fleet_orphan_allocations_removed_total",
			Help: "Allocations on this host's GPU providers removed because no instance held them."}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_fleet_claims_total",
			Help: "Claims written before local creates, by outcome."}, []string{"outcome"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vgpud_fleet_last_success_timestamp_seconds",
			Help: "When the last Placement sync pass succeeded (Unix time)."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vgpud_fleet_sync_duration_seconds",
			Help: "How long one Placement sync pass took.", Buckets: prometheus.DefBuckets}),
		writeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_fleet_write_failures_total",
			Help: "Single Placement writes (or a provider's reads) a sync pass could not make, by write and error kind; the pass goes on with the others."},
			[]string{"write", "kind"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vgpud_fleet_settles_total",
			Help: "GPU providers brought up to date by a create or destroy before it returned, by outcome (done, failed: left to the next pass)."},
			[]string{"outcome"}),
		settleTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vgpud_fleet_settle_duration_seconds",
			Help:    "How long a create or destroy waited for its GPU's provider to be brought up to date.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
	}
}

// Register adds the families to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.lag, m.conflicts, m.failures, m.passes, m.orphans, m.claims, m.lastOK, m.duration,
		m.writeFailures, m.settles, m.settleTime} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *Metrics) pass(err error, took time.Duration) {
	m.duration.Observe(took.Seconds())
	if err != nil {
		m.failures.WithLabelValues(placementapi.Kind(err)).Inc()
		return
	}
	m.passes.Inc()
	m.lastOK.SetToCurrentTime()
}
