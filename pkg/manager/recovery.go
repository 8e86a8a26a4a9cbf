package manager

import (
	"context"
	"sync"

	"github.com/vgpud/vgpud/pkg/store"
)

// DefaultRecoveryConcurrency is how many GPUs reconcile restores at once
// when Config.RecoveryConcurrency is 0.
const DefaultRecoveryConcurrency = 16

// restoreAll checks every record against the host, one worker per GPU and
// at most m.recovery GPUs at once. The driver serialises the calls of one
// GPU and runs those of different GPUs side by side, so after a reboot the
// pass takes about as long as its slowest GPU rather than the sum of all.
// A GPU's records are restored one after another, in record order, each
// under the GPU's lock: a GPU instance is back before the compute
// instances and MIG-backed vGPUs that share it look for it, and the
// heterogeneous mode (applyVGPUModes, before this pass) before any vGPU.
// Each worker re-reads its GPU once at its end when it carved there.
// It returns the context's error when the pass was cut short.
func (m *Manager) restoreAll(ctx context.Context, recs []store.Instance, rep *ReconcileReport) error {
	var order []string
	byGPU := map[string][]*store.Instance{}
	for i := range recs {
		u := recs[i].GPUUUID
		if _, ok := byGPU[u]; !ok {
			order = append(order, u)
		}
		byGPU[u] = append(byGPU[u], &recs[i])
	}
	reps := make([]gpuReport, len(order))
	sem := make(chan struct{}, max(1, m.recovery))
	var wg sync.WaitGroup
	for i, u := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			m.restoreGPU(ctx, u, byGPU[u], &reps[i])
		}()
	}
	wg.Wait()
	// The report lists each GPU's instances together, GPUs in record order.
	for i := range reps {
		rep.Recreated = append(rep.Recreated, reps[i].Recreated...)
		rep.Lost = append(rep.Lost, reps[i].Lost...)
		rep.Failed = append(rep.Failed, reps[i].Failed...)
	}
	return ctx.Err()
}

// gpuReport is what one worker of restoreAll found and did on its GPU.
type gpuReport struct {
	ReconcileReport
	// carved: the worker changed the GPU (it re-reads it at its end).
	carved bool
}

// restoreGPU is one worker of restoreAll: the records of one GPU, in order.
func (m *Manager) restoreGPU(ctx context.Context, gpuUUID string, recs []*store.Instance, rep *gpuReport) {
	for _, r := range recs {
		if ctx.Err() != nil {
			break
		}
		if m.inflight.busy(r.UUID) {
			continue // an operation in flight owns it
		}
		n := len(rep.Recreated)
		_ = m.restore(ctx, r, rep) // a failure is recorded on the instance and in rep
		if len(rep.Recreated) > n {
			m.crash(CrashRestore)
		}
	}
	if rep.carved {
		// The GPU is re-read once at the end, not per instance: the
		// records already hold the devices this pass handed out.
		m.refreshGPU(ctx, gpuUUID)
	}
}
