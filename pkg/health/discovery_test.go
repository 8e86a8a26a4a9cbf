package health

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
)

// discoverer counts the periodic discovery's calls; degraded until
// SetDegraded clears it.
type discoverer struct {
	mu         sync.Mutex
	degraded   string
	checks     int
	reconciles int
}

func (d *discoverer) CheckDrift(context.Context) (manager.DriftReport, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checks++
	return manager.DriftReport{Missing: []string{"i"}, Reconcile: &manager.ReconcileReport{}}, nil
}

func (d *discoverer) Degraded() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.degraded
}

func (d *discoverer) SetDegraded(why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.degraded = why
}

func (d *discoverer) Reconcile(context.Context) (manager.ReconcileReport, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reconciles++
	return manager.ReconcileReport{}, nil
}

func (d *discoverer) counts() (checks, reconciles int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.checks, d.reconciles
}

// driver fails Init until loaded.
type driver struct{ loaded atomic.Bool }

func (d *driver) Init(context.Context) error {
	if d.loaded.Load() {
		return nil
	}
	return gpu.ErrDriverNotLoaded
}

// TestPeriodicDiscovery: the records are compared with the host every
// discoveryInterval, read again after each pass (a reload applies from the
// next one), and a change is told to systemd; while degraded nothing is
// compared, and the driver, once it loads, ends degraded mode with a
// reconcile.
func TestPeriodicDiscovery(t *testing.T) {
	e := newSimEnv(t)
	var interval atomic.Int64
	interval.Store(int64(30 * time.Millisecond))
	var statuses atomic.Int64
	disc := &discoverer{degraded: "no driver"}
	drv := &driver{}
	w := New(Config{
		Manager: e.mgr,
		GPUs:    noGPUs{},
		Settings: func() Settings {
			s := testSettings()
			s.DiscoveryInterval = time.Duration(interval.Load())
			return s
		},
		Status:    func() { statuses.Add(1) },
		Logger:    e.log,
		Discovery: Discovery{Manager: disc, Driver: drv},
	})
	stop := w.Start(context.Background())
	t.Cleanup(stop)

	time.Sleep(300 * time.Millisecond)
	if checks, _ := disc.counts(); checks != 0 {
		t.Fatalf("%d drift checks while degraded, want none", checks)
	}
	drv.loaded.Store(true)
	testenv.WaitFor(t, "degraded mode left", 10*time.Second, func() bool { return disc.Degraded() == "" })
	if _, reconciles := disc.counts(); reconciles != 1 {
		t.Fatalf("%d reconciles once the driver appeared, want 1", reconciles)
	}
	if !strings.Contains(e.logs.String(), "NVIDIA driver appeared: leaving degraded mode") {
		t.Fatal("no log line for leaving degraded mode")
	}
	testenv.WaitFor(t, "three periodic comparisons", 10*time.Second, func() bool { c, _ := disc.counts(); return c >= 3 })
	if statuses.Load() < 3 || !strings.Contains(e.logs.String(), `msg="host changed: reconciled" vanished=1`) {
		t.Fatalf("%d status updates; log:\n%s", statuses.Load(), e.logs.String())
	}
	// A longer interval applies from the next pass on.
	interval.Store(int64(time.Hour))
	time.Sleep(100 * time.Millisecond)
	before, _ := disc.counts()
	time.Sleep(300 * time.Millisecond)
	if after, _ := disc.counts(); after != before {
		t.Fatalf("%d comparisons after the interval became an hour", after-before)
	}
}

// noGPUs is a GPUReader for a watcher that has no failed GPU to re-read.
type noGPUs struct{}

func (noGPUs) GPU(context.Context, string) (gpu.GPU, error) {
	return gpu.GPU{}, errors.New("no GPU re-read in this test")
}

// TestDiscoveryWaitsForAfter: the periodic discovery (and the driver poll
// with its reconcile) starts only once After is closed: the daemon sets up
// the fleet's syncer first, so no reconcile resolves a fleet create
// without the scheduler's allocation.
func TestDiscoveryWaitsForAfter(t *testing.T) {
	e := newSimEnv(t)
	disc := &discoverer{degraded: "no driver"}
	drv := &driver{}
	drv.loaded.Store(true)
	after := make(chan struct{})
	w := New(Config{
		Manager: e.mgr,
		GPUs:    noGPUs{},
		Settings: func() Settings {
			s := testSettings()
			s.DiscoveryInterval = time.Second
			return s
		},
		Logger:    e.log,
		Discovery: Discovery{Manager: disc, Driver: drv, After: after},
	})
	stop := w.Start(context.Background())
	t.Cleanup(stop)
	time.Sleep(2500 * time.Millisecond) // past a driver poll and two intervals
	if checks, reconciles := disc.counts(); checks != 0 || reconciles != 0 || disc.Degraded() == "" {
		t.Fatalf("before After closed: %d checks, %d reconciles, degraded %q; want none and still degraded", checks, reconciles, disc.Degraded())
	}
	close(after)
	testenv.WaitFor(t, "degraded mode left once After closed", 10*time.Second, func() bool { return disc.Degraded() == "" })
	testenv.WaitFor(t, "a periodic comparison", 10*time.Second, func() bool { c, _ := disc.counts(); return c >= 1 })
}
