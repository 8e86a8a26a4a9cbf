package nvml

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// reinitPoll is how often ReopenSession tries Init again while the driver
// is not back from the reset.
const reinitPoll = 200 * time.Millisecond

// maxReinitWait bounds the wait between the tries of Init at the gate's
// entry while NVML stays uninitialized after a reset.
const maxReinitWait = 10 * time.Second

// ReleaseSession lets go of the process's NVML session for the reset of
// GPU id: it closes the gate (calls in flight end first; new ones wait),
// waits for the calls that outran their deadline, and shuts NVML down.
// Every GPU's handles are gone until ReopenSession, whatever its outcome.
// On an error the session is as it was. Releasing again for the same GPU
// is a no-op.
func (b *Backend) ReleaseSession(ctx context.Context, id string) error {
	if err := b.gate.close(ctx, id); err != nil {
		return fmt.Errorf("release the NVML session for the reset of GPU %s: %w", id, err)
	}
	b.mu.Lock()
	down := b.down == id
	b.mu.Unlock()
	if down {
		return nil
	}
	// A call abandoned at its deadline still runs in the driver: NVML
	// must not be shut down under it.
	if err := b.calls.Quiesce(ctx); err != nil {
		b.gate.reopen(false)
		return fmt.Errorf("release the NVML session for the reset of GPU %s: driver calls still running: %w", id, err)
	}
	err := b.do(b.inGate(ctx), "Shutdown", b.lib.Shutdown)
	switch {
	case err == nil:
	case errors.Is(err, gonvml.ERROR_UNINITIALIZED):
		// Down already: an earlier reset could not initialize it again.
		b.log.Info("NVML was not initialized at a GPU reset's release", "gpu", id)
	case b.calls.Abandoned() > 0:
		// The gate was drained and the abandoned calls quiesced, so the
		// one still running is the Shutdown: whether NVML is up is
		// unknown until it returns, and the gate's entry finds out.
		b.mu.Lock()
		gpus := slices.Collect(maps.Values(b.known))
		b.mu.Unlock()
		b.loseSession(true, gpus)
		b.gate.reopen(true)
		return fmt.Errorf("release the NVML session for the reset of GPU %s: shut NVML down: %w", id, err)
	default:
		b.gate.reopen(false)
		return fmt.Errorf("release the NVML session for the reset of GPU %s: shut NVML down: %w", id, err)
	}
	b.mu.Lock()
	b.down = id
	// The reopen takes over: it initializes NVML and looks up again what
	// a lost session was to (lost.gpus).
	b.lost.on = false
	b.lostOn.Store(false)
	b.mu.Unlock()
	b.log.Info("NVML session released for a GPU reset: NVML calls wait", "gpu", id)
	return nil
}

// ReopenSession ends what ReleaseSession for GPU id began: it initializes
// NVML again (trying until Options.ReopenTimeout, as the driver may take a
// moment after the reset; even when ctx has ended, for a failed reset
// too), looks up again every GPU it knew, by UUID, and reopens the gate.
// The gate is reopened whatever happens; the error names the step that
// failed. A no-op when the session is not released for id.
func (b *Backend) ReopenSession(ctx context.Context, id string) error {
	if !b.gate.heldBy(id) {
		return nil
	}
	b.mu.Lock()
	down := b.down == id
	b.down = ""
	old := []gpu.GPU{{UUID: id}}
	for _, k := range append(slices.Collect(maps.Values(b.known)), b.lost.gpus...) {
		switch {
		case k.UUID == id:
			old[0] = k
		case !slices.ContainsFunc(old, func(o gpu.GPU) bool { return o.UUID == k.UUID }):
			old = append(old, k)
		}
	}
	if down {
		b.lost = lostSession{}
		// NVML indexes only bridge one session (lookUpAgain keys them
		// anew); the GPU-instance profile table of a GPU read before a
		// MIG mode change may not hold after it.
		b.known, b.profiles = map[int]gpu.GPU{}, map[string]map[int]int{}
	}
	b.mu.Unlock()
	if !down {
		b.gate.reopen(false)
		return nil
	}
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.reopenTimeout)
	defer cancel()
	ictx = b.inGate(ictx)
	err := b.initAgain(ictx)
	if err != nil {
		// Calls find NVML uninitialized from now on: the gate's entry
		// initializes it again (recoverSession). An Init abandoned at
		// its deadline may yet succeed.
		b.loseSession(b.calls.Abandoned() > 0, old)
	} else {
		err = b.lookUpAgain(ictx, old, true)
	}
	b.gate.reopen(true)
	if err != nil {
		return fmt.Errorf("reopen the NVML session after the reset of GPU %s: %w", id, err)
	}
	b.log.Info("NVML session reopened after a GPU reset", "gpu", id, "gpus", len(old))
	return nil
}

// inGate marks ctx as inside the gate: the reset's own calls (Shutdown,
// Init) pass the gate it holds.
func (b *Backend) inGate(ctx context.Context) context.Context {
	return context.WithValue(ctx, holdKey{}, b)
}

func (b *Backend) initAgain(ctx context.Context) error {
	for {
		err := b.do(ctx, "Init", b.lib.Init)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("initialize NVML again: %w", err)
		case <-time.After(reinitPoll):
		}
	}
}

// lookUpAgain resolves, in the new session, the handle of every GPU the
// backend knew (old; the reset GPU first), by UUID, and keeps each
// identity under its new index: indexes may change across a session. The
// reset GPU must be back when first is set; another one that is not is
// logged (discovery reports it).
func (b *Backend) lookUpAgain(ctx context.Context, old []gpu.GPU, first bool) error {
	for i, k := range old {
		d, err := b.device(ctx, k.UUID)
		idx := -1
		if err == nil && k.PCI != "" {
			idx, err = call(ctx, b, "GetIndex", d.GetIndex)
		}
		if err != nil {
			if i == 0 && first {
				return fmt.Errorf("the GPU is not back in NVML: %w", err)
			}
			b.log.Warn("GPU not found again in NVML after another GPU's reset", "gpu", k.UUID, "reset", old[0].UUID, "err", err)
			continue
		}
		if idx >= 0 {
			k.Index = idx
			b.mu.Lock()
			b.known[idx] = k
			b.mu.Unlock()
		}
	}
	return nil
}

// lostSession is NVML left uninitialized by a reset (its Init failed past
// Options.ReopenTimeout), or maybe so (its Shutdown outran its deadline),
// with the gate open: nothing else would initialize it again, so the
// gate's entry does (recoverSession).
type lostSession struct {
	on bool
	// unknown: whether NVML is up is unknown (the Shutdown's outcome).
	unknown bool
	// gpus are looked up again, by UUID, in the new session.
	gpus []gpu.GPU
	// next is when Init may be tried again; wait the last backoff; err
	// the last try's error.
	next time.Time
	wait time.Duration
	err  error
}

func (b *Backend) loseSession(unknown bool, gpus []gpu.GPU) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lost = lostSession{on: true, unknown: unknown, gpus: gpus}
	b.lostOn.Store(true)
	b.log.Warn("NVML is not initialized after a GPU reset: the next NVML call initializes it again", "unknown", unknown)
}

// recoverSession initializes NVML again, inside the gate, when a reset
// left it uninitialized, and looks every GPU up again as ReopenSession
// does. A try that fails makes the calls until the next try (backoff up
// to maxReinitWait) fail at once with gpu.ErrDriverNotLoaded. wctx bounds
// the wait for another caller's try.
func (b *Backend) recoverSession(ctx, wctx context.Context) error {
	if !b.lostOn.Load() {
		return nil
	}
	select {
	case b.reinit <- struct{}{}:
	case <-wctx.Done():
		return fmt.Errorf("%w: NVML is being initialized again after a GPU reset: %w", gpu.ErrDriverNotLoaded, wctx.Err())
	}
	defer func() { <-b.reinit }()
	b.mu.Lock()
	l := b.lost
	b.mu.Unlock()
	if !l.on {
		return nil
	}
	if wait := time.Until(l.next); wait > 0 {
		return fmt.Errorf("%w: NVML is not initialized since a GPU reset (next try in %v): %w", gpu.ErrDriverNotLoaded, wait.Round(time.Millisecond), l.err)
	}
	err := b.initLost(ctx, l)
	b.mu.Lock()
	if b.lost.on {
		if err != nil {
			b.lost.wait = min(max(2*b.lost.wait, reinitPoll), maxReinitWait)
			b.lost.next, b.lost.err = time.Now().Add(b.lost.wait), err
			// An Init abandoned at its deadline may yet succeed: the
			// next try asks first.
			b.lost.unknown = b.lost.unknown || b.calls.Abandoned() > 0
		} else {
			b.lost = lostSession{}
			b.lostOn.Store(false)
		}
	}
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: NVML is not initialized since a GPU reset: %w", gpu.ErrDriverNotLoaded, err)
	}
	b.gate.renew()
	b.log.Info("NVML initialized again after a GPU reset", "gpus", len(l.gpus))
	return nil
}

// initLost is one try of recoverSession.
func (b *Backend) initLost(ctx context.Context, l lostSession) error {
	needInit := true
	if l.unknown {
		if n := b.calls.Abandoned(); n > 0 {
			return fmt.Errorf("%d NVML calls (the Shutdown among them) still run in the driver: %w", n, gpu.ErrTimeout)
		}
		// A Shutdown that failed left NVML up: another Init would
		// count twice, and a later reset's Shutdown would not close it.
		_, err := call(ctx, b, "DeviceGetCount", b.lib.DeviceGetCount)
		if err != nil && !errors.Is(err, gonvml.ERROR_UNINITIALIZED) {
			return fmt.Errorf("ask whether NVML is up: %w", err)
		}
		needInit = err != nil
	}
	if needInit {
		if err := b.do(ctx, "Init", b.lib.Init); err != nil {
			return fmt.Errorf("initialize NVML again: %w", err)
		}
	}
	b.mu.Lock()
	b.known, b.profiles = map[int]gpu.GPU{}, map[string]map[int]int{}
	b.mu.Unlock()
	return b.lookUpAgain(ctx, l.gpus, false)
}
