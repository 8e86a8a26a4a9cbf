package manager_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// Heterogeneous mode and a pinned scheduler, which the driver forgets on a
// GPU reset, a VF rebind and a driver reload, are set again by the
// periodic check while the daemon runs, before the instances the event
// took are re-created (a mixed-size pair fits only in heterogeneous
// mode), and each restore is announced.
func TestSettingsBackAfterEvents(t *testing.T) {
	for _, tt := range []struct {
		name string
		// instances: the event leaves the GPU's vGPUs (a reset is refused
		// while they exist; the simulated unload keeps them, so neither
		// has any).
		instances bool
		event     func(h *sim.Host) error
	}{
		{"reset", false, resetL4},
		{"vf-rebind", true, func(h *sim.Host) error { return h.RebindVFs(sim.DefaultL4) }},
		{"driver-reload", false, func(h *sim.Host) error {
			if err := h.SetDriverLoaded(false); err != nil {
				return err
			}
			return h.SetDriverLoaded(true)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			ctx := context.Background()
			g, err := e.m.GPU(sim.DefaultL4)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.m.SetHeterogeneous(ctx, sim.DefaultL4, true); err != nil {
				t.Fatal(err)
			}
			if _, err := e.m.SetGPUScheduler(ctx, sim.DefaultL4, manager.SchedulerRequest{Policy: "fixed_share", Timeslice: 4 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			var ids []string
			if tt.instances {
				ids = append(ids, e.mustCreate("acme", "L4-4Q", sim.DefaultL4).UUID, e.mustCreate("acme", "L4-8Q", sim.DefaultL4).UUID)
			}
			events, stop := e.m.Subscribe()
			defer stop()

			if err := tt.event(e.sim); err != nil {
				t.Fatal(err)
			}
			// The driver lost both (the simulator models the driver).
			if s, _ := e.host.NVML.VGPUScheduler(ctx, g.UUID); s.Policy != "best_effort" {
				t.Fatalf("after the event the driver's scheduler is %+v, want best_effort", s)
			}

			rep, err := e.m.CheckDrift(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(rep.SettingsLost, g.UUID) || rep.Reconcile == nil {
				t.Fatalf("the check did not find the lost settings: %+v", rep)
			}
			if g, _ := e.m.GPU(sim.DefaultL4); !g.VGPU.Heterogeneous {
				t.Fatal("heterogeneous mode not set again")
			}
			if s, err := e.host.NVML.VGPUScheduler(ctx, g.UUID); err != nil || s.Policy != "fixed_share" || s.Timeslice != 4*time.Millisecond {
				t.Fatalf("scheduler not set again: %+v, %v", s, err)
			}
			for _, id := range ids {
				if r, _ := e.m.Instance(id); r.State != store.StateReady {
					t.Fatalf("instance %s after the event: %s %q", id, r.State, r.Reason)
				}
			}

			// Announced: one HostDrift of op settings per setting.
			got := map[string]manager.Event{}
			for len(got) < 2 {
				select {
				case ev := <-events:
					if ev.Kind == manager.EventDrift && ev.Op == manager.DriftSettings {
						got[ev.Setting] = ev
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("settings events: %+v", got)
				}
			}
			for _, s := range []string{manager.SettingHeterogeneous, manager.SettingScheduler} {
				if ev, ok := got[s]; !ok || ev.ID != g.UUID || ev.Cause != manager.CauseDrift {
					t.Fatalf("event for %s: %+v", s, ev)
				}
			}

			// The same event again at once: found and put back again.
			if err := tt.event(e.sim); err != nil {
				t.Fatal(err)
			}
			if rep, err := e.m.CheckDrift(ctx); err != nil || !slices.Contains(rep.SettingsLost, g.UUID) {
				t.Fatalf("check after the event again: %+v, %v", rep, err)
			}
			if s, err := e.host.NVML.VGPUScheduler(ctx, g.UUID); err != nil || s.Policy != "fixed_share" {
				t.Fatalf("scheduler not set again after the event again: %+v, %v", s, err)
			}

			// Idempotent: the next check finds nothing to do.
			rep, err = e.m.CheckDrift(ctx)
			if err != nil || len(rep.SettingsLost) != 0 || rep.Reconcile != nil {
				t.Fatalf("second check: %+v, %v", rep, err)
			}
			assertConsistent(t, e)
		})
	}
}

// A lost heterogeneous mode the driver refuses to take again is reported
// pending by the check's reconcile and not tried at every later check
// while the GPU stays as it is; once the GPU changes, it is tried again.
func TestSettingsRefusedNotRetriedEveryCheck(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	if err := e.m.SetHeterogeneous(ctx, sim.DefaultL4, true); err != nil {
		t.Fatal(err)
	}
	if err := resetL4(e.sim); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.AddFault(sim.Fault{Op: "SetVgpuHeterogeneousMode", Return: 999}); err != nil {
		t.Fatal(err)
	}
	rep, err := e.m.CheckDrift(ctx)
	if err != nil || rep.Reconcile == nil || len(rep.Reconcile.Pending) == 0 {
		t.Fatalf("first check: %+v, %v; want a reconcile leaving the mode pending", rep, err)
	}
	for i := range 2 {
		if rep, err := e.m.CheckDrift(ctx); err != nil || rep.Reconcile != nil {
			t.Fatalf("check %d after the refusal: %+v, %v; want no reconcile", i+2, rep, err)
		}
	}
	// The GPU changes (its VFs are rebound): the next check tries again.
	if err := e.sim.ClearFaults(); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.SetVFs(sim.DefaultL4, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.CheckDrift(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.SetVFs(sim.DefaultL4, true); err != nil {
		t.Fatal(err)
	}
	if rep, err := e.m.CheckDrift(ctx); err != nil || rep.Reconcile == nil {
		t.Fatalf("check after the GPU changed: %+v, %v; want a reconcile", rep, err)
	}
	if g, _ := e.m.GPU(sim.DefaultL4); !g.VGPU.Heterogeneous {
		t.Fatal("heterogeneous mode not set again after the GPU changed")
	}
	assertConsistent(t, e)
}

// resetL4 resets the L4 as an operator must: the driver refuses a reset
// while the GPU's VFs are enabled, so they are disabled around it.
func resetL4(h *sim.Host) error {
	if err := h.SetVFs(sim.DefaultL4, false); err != nil {
		return err
	}
	if err := h.ResetGPU(sim.DefaultL4); err != nil {
		return err
	}
	return h.SetVFs(sim.DefaultL4, true)
}
