package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// Host faults and host readiness: what the kernel (uevents) and the driver
// (NVML events, XIDs) say about the GPUs while vgpud runs, and, at start,
// whether the SR-IOV virtual functions the vGPUs need are there yet.
//
// A GPU that fell off the bus or reported a critical XID is marked failed
// in the manager (new carving there is refused, the GPU reads "failed" or
// "lost" with the reason), and the host is reconciled, which marks the
// instances of a lost GPU lost. A failed GPU is re-read every RecoverProbe;
// when it is back (a lost GPU answers again; a GPU that reported an XID
// was re-bound to its driver, i.e. reset, or was lost and came back) it is
// cleared and reconciled, which re-creates its instances.
//
// Uevents are debounced: a burst is handled once it has been quiet for
// UeventSettle, and a storm at least every ten settle periods, so a
// thousand events cause a handful of re-reads, not a thousand.

// stormFactor bounds how long a storm may delay its re-read, in settle periods.
const stormFactor = 10

// faultOpTimeout bounds one reconcile or re-read started by a fault. It is
// not cut short by SIGTERM (the operation in flight is finished), and it is
// shorter than the daemon's stop timeout.
const faultOpTimeout = 45 * time.Second

// faultManager is what the fault watcher needs from the manager.
type faultManager interface {
	MarkGPUFailed(uuid, why string)
	MarkGPULost(uuid, why string)
	FailedGPUs() map[string]manager.GPUFault
	Reconcile(ctx context.Context) (manager.ReconcileReport, error)
	Refresh(ctx context.Context) error
	Publish(e manager.Event)
	Inventory() gpu.Inventory
	GPUs() ([]manager.GPUView, error)
}

// gpuReader re-reads one GPU (discover.Host).
type gpuReader interface {
	GPU(ctx context.Context, uuid string) (gpu.GPU, error)
}

// xidWatcher is the NVML backend's event loop.
type xidWatcher interface {
	WatchEvents(ctx context.Context, fn func(nvmlbackend.Event)) error
}

// faultStats counts what the watcher saw and did (tests and logs read it).
type faultStats struct {
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

// failure is a GPU the watcher marked failed.
type failure struct {
	why   string
	since time.Time
	// lost: the GPU stopped answering (fell off the bus, removed); it is
	// back when it answers again.
	lost bool
	// reset: its PCI function was added or bound to its driver again
	// since it failed, which is how a reset shows in sysfs.
	reset bool
}

// devRef is what a PCI address is to vgpud.
type devRef struct {
	uuid string
	pf   bool
}

// resync is the work a batch of events asks for.
type resync int

const (
	noResync  resync = iota
	refresh          // re-read the host
	reconcile        // re-read it and bring the records in line
)

type faultWatch struct {
	log  *slog.Logger
	mgr  faultManager
	disc gpuReader
	xids xidWatcher
	// open opens the uevent source; nil means none.
	open func() (uevent.Source, error)
	live func() *Live
	// status tells systemd the new state after a failure or recovery.
	status func()

	uev      chan uevent.Event
	xidCh    chan nvmlbackend.Event
	overflow chan struct{}
	stats    faultStats

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

// startFaultWatch follows uevents and NVML events until ctx ends; stop
// waits for the operation in flight to finish.
func startFaultWatch(ctx context.Context, d *daemon) (stop func()) {
	return newFaultWatch(d).start(ctx)
}

func newFaultWatch(d *daemon) *faultWatch {
	w := &faultWatch{
		log:    d.log.With("component", "faults"),
		mgr:    d.mgr,
		disc:   discover.Host{NVML: d.host.nvml, Sysfs: d.host.sysfs},
		xids:   d.host.nvml,
		live:   d.cfg.Live,
		status: func() { d.notify.Status(d.statusLine()) },
	}
	if h := d.host.sim; h != nil {
		w.open = func() (uevent.Source, error) { return uevent.NewWakingPoller(simUevents(h), h.Changed) }
	} else {
		w.open = func() (uevent.Source, error) { return uevent.OpenNetlink(uevent.NetlinkOptions{}) }
	}
	return w
}

func (w *faultWatch) start(ctx context.Context) (stop func()) {
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
	// The uevent source is open when start returns: nothing the kernel
	// sends after that is missed.
	if w.open != nil {
		src, err := w.open()
		if err != nil {
			w.log.Warn("uevents unavailable: GPU, VF and mdev changes are seen only by periodic discovery", "err", err)
		} else {
			wg.Add(1)
			go func() { defer wg.Done(); defer src.Close(); w.readUevents(ctx, src) }()
		}
	}
	if w.xids != nil {
		wg.Add(1)
		go func() { defer wg.Done(); w.watchXIDs(ctx) }()
	}
	return func() { cancel(); wg.Wait() }
}

// readUevents forwards the uevents about PCI functions and mdevs to the
// worker. It never blocks on the worker: when the worker is behind, the
// event is dropped and a full reconcile asked for instead.
func (w *faultWatch) readUevents(ctx context.Context, src uevent.Source) {
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

func (w *faultWatch) signalOverflow() {
	select {
	case w.overflow <- struct{}{}:
	default:
	}
}

// watchXIDs runs the NVML event loop, starting it again when it ends (the
// driver is not loaded yet, a GPU came back and must be registered again).
func (w *faultWatch) watchXIDs(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		w.rewatchMu.Lock()
		w.rewatch = cancel
		w.rewatchMu.Unlock()
		started := time.Now()
		err := w.xids.WatchEvents(wctx, func(e nvmlbackend.Event) {
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
func (w *faultWatch) restartXIDWatch() {
	w.rewatchMu.Lock()
	defer w.rewatchMu.Unlock()
	if w.rewatch != nil {
		w.rewatch()
	}
}

// work is the one goroutine that acts on events, so the manager sees the
// fault path's calls one at a time.
func (w *faultWatch) work(ctx context.Context, indexed chan<- struct{}) {
	// Work in flight is finished, not cut short, when the daemon stops.
	opCtx := context.WithoutCancel(ctx)
	w.reindex()
	// A GPU failed before vgpud (re)started stays failed until it recovers
	// (a reset) or an operator clears it: follow it like one failed now.
	for uuid, f := range w.mgr.FailedGPUs() {
		if w.failed[uuid] == nil {
			w.failed[uuid] = &failure{why: f.Why, since: time.Now(), lost: f.Lost}
		}
	}
	// A GPU start-up reconcile found lost (it fell off the bus while vgpud
	// was down) is followed like one that is lost now.
	w.noticeLost(true)
	close(indexed)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	probe := time.NewTimer(w.live().RecoverProbe)
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
			probe.Reset(w.live().RecoverProbe)
		}
		w.arm(settle)
	}
}

// ask adds work to the batch.
func (w *faultWatch) ask(r resync, why string) {
	now := time.Now()
	if w.want == noResync {
		w.first = now
	}
	w.last = now
	w.want = max(w.want, r)
	w.reasons[why]++
	w.stats.Batched.Add(1)
}

// arm (re)sets the settle timer: quiet for UeventSettle after the last
// event, but no later than stormFactor settle periods after the first.
func (w *faultWatch) arm(t *time.Timer) {
	if w.want == noResync {
		return
	}
	settle := w.live().UeventSettle
	due := w.last.Add(settle)
	if latest := w.first.Add(stormFactor * settle); due.After(latest) {
		due = latest
	}
	t.Reset(max(time.Until(due), 0))
}

// resync runs the batch's work.
func (w *faultWatch) resync(ctx context.Context) {
	want, reasons := w.want, w.reasons
	n := 0
	for _, c := range reasons {
		n += c
	}
	w.want, w.reasons = noResync, map[string]int{}
	defer w.stats.Batched.Add(-int64(n))
	if want == noResync {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, faultOpTimeout)
	defer cancel()
	why := describe(reasons)
	if want == reconcile {
		w.stats.Reconciles.Add(1)
		rep, err := w.mgr.Reconcile(ctx)
		if err != nil {
			w.log.Warn("host changed: reconcile failed", "events", n, "why", why, "err", err)
		} else {
			w.log.Info("host changed: reconciled", "events", n, "why", why, "lost", len(rep.Lost), "recreated", len(rep.Recreated), "failed", len(rep.Failed))
		}
	} else {
		w.stats.Refreshes.Add(1)
		if err := w.mgr.Refresh(ctx); err != nil {
			w.log.Warn("host changed: re-read failed", "events", n, "why", why, "err", err)
		} else {
			w.log.Debug("host changed: re-read", "events", n, "why", why)
		}
	}
	w.reindex()
	w.noticeLost(want == reconcile)
	if len(w.failed) > 0 {
		w.probe(ctx)
	}
	w.status()
}

// noticeLost marks the GPUs discovery found lost that no event reported.
// A GPU that was lost before vgpud started has no name NVML can give (it
// answers nothing, and this process never saw it healthy): it is counted,
// and the host is re-read on every probe until it is back.
func (w *faultWatch) noticeLost(reconciled bool) {
	unnamed := 0
	for _, g := range w.mgr.Inventory().GPUs {
		switch {
		case !g.Lost:
		case g.UUID == "":
			unnamed++
		case w.failed[g.UUID] == nil:
			w.fail(g, "GPU is lost: NVML answers GPU_IS_LOST (fell off the bus)", true)
			if !reconciled {
				w.ask(reconcile, "GPU lost")
			}
		}
	}
	if unnamed > w.unnamedLost {
		w.log.Error("GPU lost before vgpud started: NVML cannot say which; its instances read lost, and the host is re-read until it is back",
			"lost", unnamed)
		w.stats.Failures.Add(int64(unnamed - w.unnamedLost))
	}
	w.unnamedLost = unnamed
}

// reindex maps every PCI address of the host's GPUs to its GPU.
func (w *faultWatch) reindex() {
	idx := map[string]devRef{}
	for _, g := range w.mgr.Inventory().GPUs {
		if g.PCI == "" {
			continue
		}
		idx[g.PCI] = devRef{uuid: g.UUID, pf: true}
		for _, vf := range g.VGPU.VFs {
			idx[vf.PCI] = devRef{uuid: g.UUID}
		}
		for _, p := range g.VGPU.MdevParents {
			if _, ok := idx[p.PCI]; !ok {
				idx[p.PCI] = devRef{uuid: g.UUID}
			}
		}
	}
	// A failed GPU keeps its entries: its PCI functions may be gone from
	// discovery, and their return is what the index must recognise.
	for pci, r := range w.index {
		if _, ok := idx[pci]; !ok && w.failed[r.uuid] != nil {
			idx[pci] = r
		}
	}
	w.index = idx
}

// onUevent decides what a uevent asks for.
func (w *faultWatch) onUevent(ev uevent.Event) {
	name := ev.Name()
	switch ev.Subsystem {
	case "mdev":
		w.stats.Relevant.Add(1)
		if ev.Action == uevent.Remove {
			w.ask(reconcile, "mdev removed")
		} else {
			w.ask(refresh, "mdev "+string(ev.Action))
		}
		return
	case "pci":
	default:
		return
	}
	ref, known := w.index[name]
	if !known && !strings.HasPrefix(strings.ToUpper(ev.Env["PCI_ID"]), "10DE:") {
		return // not an NVIDIA function
	}
	w.stats.Relevant.Add(1)
	if known && ref.pf {
		switch ev.Action {
		case uevent.Remove, uevent.Unbind:
			w.fail(w.gpuOf(ref.uuid, name), fmt.Sprintf("PCI function %s %s (removed from the bus or unbound from its driver)", name, pastTense(ev.Action)), true)
			w.ask(reconcile, "GPU "+string(ev.Action))
		case uevent.Add, uevent.Bind:
			if f := w.failed[ref.uuid]; f != nil {
				f.reset = true
				w.log.Info("failed GPU re-appeared on the bus; checking it", "gpu", name, "action", ev.Action)
			}
			w.ask(reconcile, "GPU "+string(ev.Action))
		default:
			w.ask(refresh, "GPU "+string(ev.Action))
		}
		return
	}
	switch {
	case ev.Action == uevent.Change && ev.Env["NVIDIA_VGPU_TYPE"] != "0":
		w.ask(refresh, "VF vGPU type set")
	case ev.Action == uevent.Change:
		w.ask(reconcile, "VF vGPU type cleared")
	case !known && (ev.Action == uevent.Add || ev.Action == uevent.Bind):
		w.ask(reconcile, "NVIDIA PCI function appeared")
	default:
		w.ask(reconcile, "VF "+string(ev.Action))
	}
}

func pastTense(a uevent.Action) string {
	switch a {
	case uevent.Remove:
		return "removed"
	case uevent.Unbind:
		return "unbound"
	}
	return string(a)
}

// gpuOf returns the inventory's GPU, or one with just the identity.
func (w *faultWatch) gpuOf(uuid, pci string) gpu.GPU {
	for _, g := range w.mgr.Inventory().GPUs {
		if g.UUID == uuid {
			return g
		}
	}
	return gpu.GPU{UUID: uuid, PCI: pci}
}

// xidMeaning names the XIDs an operator is most likely to see.
var xidMeaning = map[uint64]string{
	13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing", 45: "preemptive cleanup",
	48: "double-bit ECC error", 62: "internal micro-controller halt", 63: "ECC page retirement or row remapping pending",
	64: "ECC page retirement or row remapping failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
	92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
	119: "GSP RPC timeout", 120: "GSP error", 999: "unknown XID",
}

func xidText(x uint64) string {
	if m, ok := xidMeaning[x]; ok {
		return fmt.Sprintf("XID %d (%s)", x, m)
	}
	return fmt.Sprintf("XID %d", x)
}

// onXID handles one NVML event.
func (w *faultWatch) onXID(ctx context.Context, x nvmlbackend.Event) {
	if x.Type&gonvml.EventMigConfigChange != 0 {
		w.ask(reconcile, "MIG configuration changed")
		return
	}
	g := gpu.GPU{UUID: x.GPU, PCI: x.PCI}
	if x.GPU == "" {
		g = w.identifyLost(ctx)
		if g.UUID == "" && !x.IsXID() {
			w.log.Debug("a lost GPU was reported that is already followed")
			return
		}
	}
	if x.IsXID() {
		w.stats.XIDs.Add(1)
		// Metrics count XIDs from this event; Detail is the bare number.
		w.mgr.Publish(manager.Event{Kind: manager.EventXID, ID: g.UUID, Detail: strconv.FormatUint(x.XID, 10)})
	}
	lost := x.Lost || x.XID == 79 || x.Type&gonvml.EventTypeGpuUnavailableError != 0
	var why string
	switch {
	case x.IsXID() && (w.live().CriticalXIDs[x.XID] || lost):
		why = xidText(x.XID)
	case x.Type&gonvml.EventTypeDoubleBitEccError != 0:
		why = "double-bit ECC error"
	case lost:
		why = "GPU is lost: NVML answers GPU_IS_LOST (fell off the bus)"
	}
	log := w.log.With("gpu", g.PCI, "uuid", g.UUID, "xid", x.XID, "gpu_instance", x.GPUInstance)
	if why == "" {
		log.Info("XID reported; the GPU stays in service", "what", xidText(x.XID))
		return
	}
	if g.UUID == "" {
		log.Error("critical error from a GPU NVML cannot name; re-reading the host", "what", why)
		w.ask(reconcile, why)
		return
	}
	if x.GPUInstance >= 0 {
		why += fmt.Sprintf(" on GPU instance %d", x.GPUInstance)
	}
	w.fail(g, why, lost)
	w.ask(reconcile, why)
}

// identifyLost re-reads the host to find which GPU an unnamed event came
// from: the one GPU that is lost now and was not before.
func (w *faultWatch) identifyLost(ctx context.Context) gpu.GPU {
	ctx, cancel := context.WithTimeout(ctx, faultOpTimeout)
	defer cancel()
	w.stats.Refreshes.Add(1)
	if err := w.mgr.Refresh(ctx); err != nil {
		w.log.Warn("re-read the host", "err", err)
		return gpu.GPU{}
	}
	var found []gpu.GPU
	for _, g := range w.mgr.Inventory().GPUs {
		if g.Lost && w.failed[g.UUID] == nil {
			found = append(found, g)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return gpu.GPU{}
}

// fail marks a GPU failed (once per reason) and says which instances it
// takes down with it.
func (w *faultWatch) fail(g gpu.GPU, why string, lost bool) {
	f := w.failed[g.UUID]
	if f == nil {
		f = &failure{since: time.Now()}
		w.failed[g.UUID] = f
		w.stats.Failures.Add(1)
	}
	f.lost = f.lost || lost
	f.reset = false
	if _, marked := w.mgr.FailedGPUs()[g.UUID]; f.why == why && marked {
		return
	}
	f.why = why
	if !lost {
		why += "; reset the GPU (stop its VMs, then nvidia-smi -r) to return it to service"
	}
	if f.lost {
		w.mgr.MarkGPULost(g.UUID, why)
	} else {
		w.mgr.MarkGPUFailed(g.UUID, why)
	}
	var insts []string
	if views, err := w.mgr.GPUs(); err == nil {
		for _, v := range views {
			if v.UUID == g.UUID {
				insts = v.Instances
			}
		}
	}
	w.log.Error("GPU failed: new carving there is refused", "gpu", g.PCI, "uuid", g.UUID, "why", why, "lost", f.lost, "instances", insts)
}

// probe re-reads each failed GPU and returns those that are back.
func (w *faultWatch) probe(ctx context.Context) {
	marked := w.mgr.FailedGPUs()
	for u, f := range w.failed {
		if _, ok := marked[u]; !ok && !f.lost {
			delete(w.failed, u) // an operator cleared it (ClearGPU)
		}
	}
	if len(w.failed) == 0 && w.unnamedLost == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, faultOpTimeout)
	defer cancel()
	if w.unnamedLost > 0 {
		w.probeUnnamed(ctx)
	}
	uuids := make([]string, 0, len(w.failed))
	for u := range w.failed {
		uuids = append(uuids, u)
	}
	sort.Strings(uuids)
	for _, u := range uuids {
		f := w.failed[u]
		w.stats.Probes.Add(1)
		g, err := w.disc.GPU(ctx, u)
		if err != nil || g.Lost {
			f.lost = true
			continue
		}
		if !f.lost && !f.reset {
			continue // an XID on a GPU that still answers: back only after a reset
		}
		w.recover(ctx, g, f)
	}
}

// probeUnnamed re-reads the host for the lost GPUs NVML cannot name.
func (w *faultWatch) probeUnnamed(ctx context.Context) {
	w.stats.Probes.Add(1)
	before := w.unnamedLost
	if err := w.mgr.Refresh(ctx); err != nil {
		w.log.Debug("re-read the host", "err", err)
		return
	}
	w.noticeLost(true)
	if w.unnamedLost >= before {
		return
	}
	w.stats.Recoveries.Add(int64(before - w.unnamedLost))
	w.stats.Reconciles.Add(1)
	rep, err := w.mgr.Reconcile(ctx)
	if err != nil {
		w.log.Warn("lost GPU back, reconcile failed; instances are restored at the next reconcile", "err", err)
	} else {
		w.log.Info("lost GPU back in service", "recreated", len(rep.Recreated), "failed", len(rep.Failed))
	}
	w.reindex()
	w.restartXIDWatch()
	w.status()
}

// recover clears a GPU that came back and reconciles, which re-creates
// the instances it lost.
func (w *faultWatch) recover(ctx context.Context, g gpu.GPU, f *failure) {
	delete(w.failed, g.UUID)
	w.mgr.MarkGPUFailed(g.UUID, "")
	w.stats.Recoveries.Add(1)
	w.stats.Reconciles.Add(1)
	rep, err := w.mgr.Reconcile(ctx)
	if err != nil {
		w.log.Warn("GPU back, reconcile failed; instances are restored at the next reconcile", "gpu", g.PCI, "err", err)
	} else {
		w.log.Info("GPU back in service", "gpu", g.PCI, "uuid", g.UUID, "was", f.why, "down", time.Since(f.since).Round(time.Millisecond),
			"recreated", len(rep.Recreated), "failed", len(rep.Failed))
	}
	w.reindex()
	w.restartXIDWatch()
	w.status()
}

func describe(reasons map[string]int) string {
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, reasons[k])
	}
	return strings.Join(parts, ", ")
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

// simUevents reads the simulated host's uevent ring.
func simUevents(h *sim.Host) uevent.FetchFunc {
	return func(after uint64) ([]uevent.Event, uint64, error) {
		us, newest, err := h.UeventsSince(after)
		if err != nil {
			return nil, 0, err
		}
		out := make([]uevent.Event, len(us))
		for i, u := range us {
			env := map[string]string{"ACTION": u.Action, "DEVPATH": u.DevPath, "SUBSYSTEM": u.Subsystem, "SEQNUM": strconv.FormatUint(u.Seq, 10)}
			for k, v := range u.Env {
				env[k] = v
			}
			out[i] = uevent.Event{Action: uevent.Action(u.Action), DevPath: u.DevPath, Subsystem: u.Subsystem, Seq: u.Seq, Env: env}
		}
		return out, newest, nil
	}
}

// Driver readiness at start: the NVIDIA driver's units may still be
// enabling SR-IOV when vgpud starts, and a vGPU needs its VF.

// awaitingVFs lists the GPUs whose VFs should be there and are not: the
// PCI function offers SR-IOV (sriov_totalvfs > 0), the vGPU manager is
// loaded (NVML lists vGPU types for the GPU), and no VF is enabled yet.
func awaitingVFs(inv gpu.Inventory, cat *profile.Catalog) []string {
	var out []string
	for _, g := range inv.GPUs {
		if g.Lost || g.VGPU.TotalVFs == 0 || g.VGPU.NumVFs > 0 || len(g.VGPU.Supported) == 0 {
			continue
		}
		if m, ok := cat.Model(g.Model); ok && (m.VGPU == nil || m.VGPU.SRIOVVFs == 0) {
			continue
		}
		out = append(out, g.PCI)
	}
	sort.Strings(out)
	return out
}

// waitVFs waits, until deadline, for the SR-IOV VFs of every GPU that
// should have them. It never fails the start: a GPU without VFs takes no
// vGPU, which its capacity shows; the log says what to run.
func (d *daemon) waitVFs(ctx context.Context, deadline time.Time) {
	disc := discover.Host{NVML: d.host.nvml, Sysfs: d.host.sysfs}
	var missing []string
	for attempt := 1; ; attempt++ {
		inv, err := disc.Inventory(ctx)
		if err == nil {
			missing = awaitingVFs(inv, d.host.cat)
			if len(missing) == 0 {
				if attempt > 1 {
					d.log.Info("SR-IOV virtual functions are ready", "after", attempt)
				}
				return
			}
		}
		if attempt == 1 {
			d.log.Warn("waiting for the SR-IOV virtual functions of GPUs (the NVIDIA units run sriov-manage -e)",
				"gpus", missing, "err", err, "up to", time.Until(deadline).Round(time.Second))
		}
		if !time.Now().Before(deadline) {
			d.log.Error("SR-IOV virtual functions did not appear: no vGPU can be created on these GPUs until they do; run /usr/lib/nvidia/sriov-manage -e ALL",
				"gpus", missing, "err", err)
			return
		}
		d.notify.Status("waiting for SR-IOV virtual functions on " + strings.Join(missing, ", "))
		d.notify.ExtendTimeout(time.Until(deadline) + startMargin)
		if !sleepCtx(ctx, min(time.Second, time.Until(deadline))) {
			return
		}
	}
}

// startMargin is what EXTEND_TIMEOUT_USEC adds beyond a wait's deadline:
// time for the start-up reconcile that follows.
const startMargin = 2 * time.Minute
