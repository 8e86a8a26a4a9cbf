package nvml

import (
	"context"
	"fmt"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// reinitPoll is how often ReopenSession tries Init again while the driver
// is not back from the reset.
const reinitPoll = 200 * time.Millisecond

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
	if err := b.do(b.inGate(ctx), "Shutdown", b.lib.Shutdown); err != nil {
		b.gate.reopen(false)
		return fmt.Errorf("release the NVML session for the reset of GPU %s: shut NVML down: %w", id, err)
	}
	b.mu.Lock()
	b.down = id
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
	for _, k := range b.known {
		if k.UUID != id {
			old = append(old, k)
		} else {
			old[0] = k
		}
	}
	if down {
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
	if err == nil {
		err = b.lookUpAgain(ictx, old)
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
// reset GPU must be back; another one that is not is logged (discovery
// reports it).
func (b *Backend) lookUpAgain(ctx context.Context, old []gpu.GPU) error {
	for i, k := range old {
		d, err := b.device(ctx, k.UUID)
		idx := -1
		if err == nil && k.PCI != "" {
			idx, err = call(ctx, b, "GetIndex", d.GetIndex)
		}
		if err != nil {
			if i == 0 {
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
