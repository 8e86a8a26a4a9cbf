package sim_test

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// EventSet.Wait blocks until the host changes, as the driver's does: an
// XID injected by this process or by another one sharing the host's
// directory (the `vgpud sim xid` CLI) wakes it long before its timeout.
func TestEventWaitWakesOnChange(t *testing.T) {
	for _, tt := range []struct {
		name string
		// injector returns the host the XID is injected through.
		injector func(t *testing.T, e *env) *sim.Host
	}{
		{"this process", func(_ *testing.T, e *env) *sim.Host { return e.h }},
		{"another process", func(t *testing.T, e *env) *sim.Host {
			h, err := sim.Open(e.h.Dir(), nil, e.cat, sim.OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			return h
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil)
			inj := tt.injector(t, e)
			set, ret := e.lib.EventSetCreate()
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			if ret := e.dev(t, sim.DefaultH100TS).RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			if _, ret := set.Wait(0); ret != nvml.ERROR_TIMEOUT {
				t.Fatalf("Wait on nothing = %v, want TIMEOUT", ret)
			}
			type result struct {
				ev  nvml.EventData
				ret nvml.Return
			}
			got := make(chan result, 1)
			go func() {
				ev, ret := set.Wait(uint32((10 * time.Minute).Milliseconds()))
				got <- result{ev, ret}
			}()
			// Not an assert: it lets the waiter block first, so the wake
			// (not the first look) is what most runs exercise.
			time.Sleep(50 * time.Millisecond)
			if err := inj.InjectXID(sim.DefaultH100TS, 43, -1); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-got:
				if r.ret != nvml.SUCCESS || r.ev.EventData != 43 || r.ev.EventType != nvml.EventTypeXidCriticalError {
					t.Fatalf("Wait = %+v, %v; want XID 43", r.ev, r.ret)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Wait was not woken by the XID (its timeout is 10 minutes)")
			}
		})
	}
}

// Every simulated call goes through the fault and latency hook, GPM's
// library-level calls included, under the name the backend observes.
func TestGPMCallsTakeFaults(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.h.UseManualClock(); err != nil {
		t.Fatal(err)
	}
	d := e.dev(t, sim.DefaultH100MIG)
	gi := mustGI(t, d, p1g, 0)
	info, _ := gi.GetInfo()
	sample := func() nvml.GpmSample {
		s, ret := e.lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			t.Fatalf("GpmSampleAlloc: %v", ret)
		}
		if ret := e.lib.GpmMigSampleGet(d, int(info.Id), s); ret != nvml.SUCCESS {
			t.Fatalf("GpmMigSampleGet: %v", ret)
		}
		return s
	}
	a := sample()
	if err := e.h.Advance(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	b := sample()
	metrics := func() nvml.Return {
		m := nvml.GpmMetricsGetType{Version: nvml.GPM_METRICS_GET_VERSION, NumMetrics: 1, Sample1: a, Sample2: b}
		m.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
		return e.lib.GpmMetricsGet(&m)
	}
	if ret := metrics(); ret != nvml.SUCCESS {
		t.Fatalf("GpmMetricsGet: %v", ret)
	}
	for _, op := range []string{"GpmMetricsGet", "GpmMigSampleGet", "GpmSampleAlloc", "GpmSampleFree"} {
		if err := e.h.AddFault(sim.Fault{Op: op, Return: int(nvml.ERROR_UNKNOWN), Count: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if ret := metrics(); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("GpmMetricsGet under a fault = %v, want UNKNOWN", ret)
	}
	if ret := e.lib.GpmMigSampleGet(d, int(info.Id), a); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("GpmMigSampleGet under a fault = %v, want UNKNOWN", ret)
	}
	if _, ret := e.lib.GpmSampleAlloc(); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("GpmSampleAlloc under a fault = %v, want UNKNOWN", ret)
	}
	if ret := e.lib.GpmSampleFree(a); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("GpmSampleFree under a fault = %v, want UNKNOWN", ret)
	}
	if ret := e.lib.GpmSampleFree(a); ret != nvml.SUCCESS {
		t.Errorf("GpmSampleFree once the fault is spent = %v", ret)
	}
}
