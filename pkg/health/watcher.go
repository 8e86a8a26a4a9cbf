package health

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// stormFactor bounds how long a storm may delay its re-read, in settle periods.
const stormFactor = 10

// opTimeout bounds one reconcile or re-read started by a fault. It is not
// cut short when the watcher stops (the operation in flight is finished),
// and it is shorter than the daemon's stop timeout.
const opTimeout = 45 * time.Second

// Manager is what the watcher needs from the manager (*manager.Manager).
// The watcher calls it from one goroutine at a time.
type Manager interface {
	// MarkGPUFailed refuses new carving on a GPU, with why as the reason
	// users read; "" clears the mark.
	MarkGPUFailed(uuid, why string)
	// MarkGPULost is MarkGPUFailed for a GPU that stopped answering.
	MarkGPULost(uuid, why string)
	// FailedGPUs returns the GPUs marked failed, by UUID, those marked
	// before vgpud (re)started included.
	FailedGPUs() map[string]manager.GPUFault
	// Reconcile re-reads the host and brings the records in line. On an
	// error the watcher logs it and leaves the work to the next reconcile.
	Reconcile(ctx context.Context) (manager.ReconcileReport, error)
	// Refresh re-reads the host into the inventory. On an error the
	// previous inventory stays; the watcher logs it.
	Refresh(ctx context.Context) error
	// Publish announces an event (EventXID for each XID seen).
	Publish(e manager.Event)
	// Inventory returns the last inventory read.
	Inventory() gpu.Inventory
	// GPUs lists the GPUs with their instances; the watcher names the
	// instances a failure takes down, and goes without on an error.
	GPUs() ([]manager.GPUView, error)
}

// GPUReader re-reads one GPU (discover.Host). An error, like a GPU that
// reads Lost, means the GPU is not back.
type GPUReader interface {
	GPU(ctx context.Context, uuid string) (gpu.GPU, error)
}

// EventSource is the NVML backend's event loop.
type EventSource interface {
	// WatchEvents calls fn for each event until ctx ends, and then returns
	// nil; the watcher cancels it to make it register every GPU again.
	// gpu.ErrDriverNotLoaded: no driver yet, the watcher asks again soon;
	// any other error is logged and retried with a back-off.
	WatchEvents(ctx context.Context, fn func(nvmlbackend.Event)) error
}

// Settings are what the watcher reads on every use, so a reload applies
// them at once.
type Settings struct {
	// CriticalXIDs are the XIDs after which a GPU needs a reset.
	CriticalXIDs map[uint64]bool
	// UeventSettle is how long a burst of events must be quiet before the
	// host is re-read.
	UeventSettle time.Duration
	// RecoverProbe is how often a failed GPU is re-read.
	RecoverProbe time.Duration
	// DiscoveryInterval paces the periodic discovery (discovery.go).
	DiscoveryInterval time.Duration
}

// Config is the watcher's wiring.
type Config struct {
	Manager Manager
	// GPUs re-reads a failed GPU to see whether it is back.
	GPUs GPUReader
	// Events is the NVML event source; nil: XIDs are not seen.
	Events EventSource
	// OpenUevents opens the uevent source; nil means none.
	OpenUevents func() (uevent.Source, error)
	// Settings returns the settings in force; it must not be nil.
	Settings func() Settings
	// Status is called after a re-read, a failure or a recovery changed
	// what the host looks like (the daemon tells systemd); nil: nothing.
	Status func()
	// Logger; nil discards.
	Logger *slog.Logger
	// Now dates events, batches and failures; time.Now when nil. The
	// timers and back-offs run on real time.
	Now func() time.Time
	// Discovery is the periodic discovery beside the events (discovery.go);
	// its Manager nil: none.
	Discovery Discovery
}

// Stats counts what the watcher saw and did (tests and logs read it).
type Stats struct {
	Uevents    atomic.Int64 // every uevent read
	Relevant   atomic.Int64 // uevents about our GPUs, their VFs and mdevs
	Overflows  atomic.Int64 // times uevents were lost
	XIDs       atomic.Int64
	Failures   atomic.Int64 // GPUs marked failed
	Recoveries atomic.Int64
	Probes     atomic.Int64 // re-reads of failed GPUs
	Refreshes  atomic.Int64
	Reconciles atomic.Int64
	// Batched is how many events the batch waiting for its re-read holds.
	Batched atomic.Int64
}

// Watcher follows uevents and NVML events and acts on them.
type Watcher struct {
	log         *slog.Logger
	mgr         Manager
	gpus        GPUReader
	events      EventSource
	openUevents func() (uevent.Source, error)
	settings    func() Settings
	status      func()
	now         func() time.Time
	discovery   Discovery

	uev      chan uevent.Event
	xidCh    chan nvmlbackend.Event
	overflow chan struct{}
	stats    Stats

	rewatchMu sync.Mutex
	rewatch   context.CancelFunc

	// Owned by the worker goroutine.
	failed map[string]*failure
	// unnamedLost counts the lost GPUs NVML cannot name.
	unnamedLost int
	index       map[string]devRef
	want        resync
	reasons     map[string]int
	first       time.Time
	last        time.Time
}

// New returns a watcher over cfg; Start starts it.
func New(cfg Config) *Watcher {
	w := &Watcher{
		log:         cfg.Logger,
		mgr:         cfg.Manager,
		gpus:        cfg.GPUs,
		events:      cfg.Events,
		openUevents: cfg.OpenUevents,
		settings:    cfg.Settings,
		status:      cfg.Status,
		now:         cfg.Now,
		discovery:   cfg.Discovery,
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.status == nil {
		w.status = func() {}
	}
	if w.now == nil {
		w.now = time.Now
	}
	return w
}

// Stats returns the watcher's counters.
func (w *Watcher) Stats() *Stats { return &w.stats }

// Start follows uevents and NVML events, and runs the periodic discovery,
// until ctx ends; stop waits for the operation in flight to finish. Start
// is called once.
func (w *Watcher) Start(ctx context.Context) (stop func()) {
	w.uev = make(chan uevent.Event, 4096)
	w.xidCh = make(chan nvmlbackend.Event, 256)
	w.overflow = make(chan struct{}, 1)
	w.failed, w.index, w.reasons = map[string]*failure{}, map[string]devRef{}, map[string]int{}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// The worker starts first and indexes the host before the sources
	// deliver anything, so no early event is judged against an empty index.
	indexed := make(chan struct{})
	wg.Add(1)
	go func() { defer wg.Done(); w.work(ctx, indexed) }()
	<-indexed
	// The uevent source is open when Start returns: nothing the kernel
	// sends after that is missed.
	if w.openUevents != nil {
		src, err := w.openUevents()
		if err != nil {
			w.log.Warn("uevents unavailable: GPU, VF and mdev changes are seen only by periodic discovery", "err", err)
		} else {
			wg.Add(1)
			go func() { defer wg.Done(); defer src.Close(); w.readUevents(ctx, src) }()
		}
	}
	if w.events != nil {
		wg.Add(1)
		go func() { defer wg.Done(); w.watchXIDs(ctx) }()
	}
	if w.discovery.Manager != nil {
		wg.Add(1)
		go func() { defer wg.Done(); w.discover(ctx) }()
	}
	return func() { cancel(); wg.Wait() }
}

// readUevents forwards the uevents about PCI functions and mdevs to the
// worker. It never blocks on the worker: when the worker is behind, the
// event is dropped and a full reconcile asked for instead.
func (w *Watcher) readUevents(ctx context.Context, src uevent.Source) {
	backoff := time.Second
	for {
		ev, err := src.Next(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, uevent.ErrOverflow):
			w.stats.Overflows.Add(1)
			w.signalOverflow()
			continue
		case errors.Is(err, uevent.ErrMalformed):
			w.log.Debug("uevent skipped", "err", err)
			continue
		case errors.Is(err, uevent.ErrClosed):
			return
		case err != nil:
			w.log.Warn("reading uevents", "err", err, "retry_in", backoff)
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		if ev.Subsystem == "pci" || ev.Subsystem == "mdev" {
			select {
			case w.uev <- ev:
			default:
				w.signalOverflow()
			}
		}
		// Counted once handed on, so a reader that sees the count sees
		// the event queued.
		w.stats.Uevents.Add(1)
	}
}

func (w *Watcher) signalOverflow() {
	select {
	case w.overflow <- struct{}{}:
	default:
	}
}

// watchXIDs runs the NVML event loop, starting it again when it ends (the
// driver is not loaded yet, a GPU came back and must be registered again).
func (w *Watcher) watchXIDs(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		w.rewatchMu.Lock()
		w.rewatch = cancel
		w.rewatchMu.Unlock()
		started := time.Now()
		err := w.events.WatchEvents(wctx, func(e nvmlbackend.Event) {
			select {
			case w.xidCh <- e:
			case <-wctx.Done():
			}
		})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = time.Second
			continue // asked to start over
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		if errors.Is(err, gpu.ErrDriverNotLoaded) {
			w.log.Debug("NVML events unavailable until the driver is loaded", "err", err)
			backoff = min(backoff, 2*time.Second)
		} else if errors.Is(err, gpu.ErrResetting) {
			// A GPU reset took the session; the next start waits for it.
			w.log.Info("NVML events paused for a GPU reset", "err", err)
			backoff = time.Second
		} else {
			w.log.Warn("NVML events unavailable: XIDs are not seen", "err", err, "retry_in", backoff)
		}
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// restartXIDWatch makes the NVML event loop register every GPU again.
func (w *Watcher) restartXIDWatch() {
	w.rewatchMu.Lock()
	defer w.rewatchMu.Unlock()
	if w.rewatch != nil {
		w.rewatch()
	}
}

// work is the one goroutine that acts on events, so the manager sees the
// fault path's calls one at a time.
func (w *Watcher) work(ctx context.Context, indexed chan<- struct{}) {
	// Work in flight is finished, not cut short, when the watcher stops.
	opCtx := context.WithoutCancel(ctx)
	w.reindex()
	// A GPU failed before vgpud (re)started stays failed until it recovers
	// (a reset) or an operator clears it: follow it like one failed now.
	for uuid, f := range w.mgr.FailedGPUs() {
		if w.failed[uuid] == nil {
			w.failed[uuid] = &failure{why: f.Why, since: w.now(), lost: f.Lost}
		}
	}
	// A GPU start-up reconcile found lost (it fell off the bus while vgpud
	// was down) is followed like one that is lost now.
	w.noticeLost(true)
	close(indexed)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	probe := time.NewTimer(w.settings().RecoverProbe)
	defer settle.Stop()
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-w.uev:
			w.onUevent(ev)
		case <-w.overflow:
			w.ask(reconcile, "uevents lost")
		case x := <-w.xidCh:
			w.onXID(opCtx, x)
		case <-settle.C:
			w.resync(opCtx)
		case <-probe.C:
			w.probe(opCtx)
			// A loss that a periodic re-read found, without an event.
			w.noticeLost(false)
			probe.Reset(w.settings().RecoverProbe)
		}
		w.arm(settle)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
