package manager_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

func TestRebootRecreatesSamePlacement(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	mig := e.mustCreate("acme", "3g.40gb", sim.DefaultH100MIG)
	migv := e.mustCreate("acme", "H100XM-2-20C", "")
	vf := e.mustCreate("acme", "L4-4Q", "")
	md := e.mustCreate("acme", "A10-4Q", "")
	before := e.summary()
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(e.summary(), "gi") {
		t.Fatal("reboot kept GPU instances")
	}
	rep := e.restart()
	if len(rep.Recreated) != 4 || len(rep.Failed) != 0 {
		t.Fatalf("report %+v", rep)
	}
	if got := e.summary(); got != before {
		t.Fatalf("after reboot:\n%s\nbefore:\n%s", got, before)
	}
	for _, want := range []store.Instance{mig, migv, vf, md} {
		got, err := e.m.Instance(want.UUID)
		if err != nil || got.GIStart != want.GIStart || got.VF != want.VF || got.MdevUUID != want.MdevUUID || got.State != store.StateReady {
			t.Fatalf("record %+v after reboot, was %+v (%v)", got, want, err)
		}
	}
}

// A crash at each crash point of create and destroy is finished or undone
// by the next start: no leak, no ghost.
func TestCrashPointsReconcile(t *testing.T) {
	points := []string{manager.CrashCreateIntent, manager.CrashCreateGI, manager.CrashCreateCI, manager.CrashCreateVGPU,
		manager.CrashCreateCommit, manager.CrashDestroyStart, manager.CrashDestroyVGPU, manager.CrashDestroyCI, manager.CrashDestroyGI}
	for _, p := range points {
		for _, prof := range []string{"3g.40gb", "H100XM-3-40C", "L4-4Q", "A10-4Q"} {
			t.Run(p+"/"+prof, func(t *testing.T) {
				e := newEnv(t, nil)
				e.tenant("acme", unlimited())
				var keep store.Instance
				if strings.HasPrefix(p, "destroy") {
					keep = e.mustCreate("acme", prof, "")
				}
				e.crash = func(at string) {
					if at == p {
						runtime.Goexit()
					}
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					if keep.UUID != "" {
						_ = e.m.Destroy(context.Background(), keep.UUID, manager.DestroyOptions{})
					} else {
						_, _ = e.create("acme", prof, "")
					}
				}()
				<-done
				e.restart()
				assertConsistent(t, e)
			})
		}
	}
}

func TestForeignDevicesCountAgainstCapacity(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	lib := e.sim.NVML()
	lib.Init()
	d, _ := lib.DeviceGetHandleByPciBusId(sim.DefaultH100MIG)
	info, _ := d.GetGpuInstanceProfileInfo(4) // 7g
	if _, r := d.CreateGpuInstance(&info); r != 0 {
		t.Fatalf("foreign GI: %v", r)
	}
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Foreign) != 1 || rep.Foreign[0].Kind != "gpu-instance" {
		t.Fatalf("foreign = %+v", rep.Foreign)
	}
	if _, err := e.create("acme", "1g.10gb", ""); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("create over a foreign 7g: %v", err)
	}
	if !strings.Contains(e.summary(), "gi0(p0@0+8") {
		t.Fatalf("foreign GI touched:\n%s", e.summary())
	}
}

// A reconcile that runs while an operation is in flight (on demand, or on
// a libvirtd reconnect) leaves that operation's intent to it: it neither
// undoes a create half-way nor finishes a destroy underneath.
func TestReconcileLeavesOperationsInFlight(t *testing.T) {
	for _, tc := range []struct {
		point string
		op    func(e *env, uuid string) error
	}{
		{manager.CrashCreateGI, func(e *env, id string) error {
			_, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: sim.DefaultH100MIG, UUID: id})
			return err
		}},
		{manager.CrashDestroyCI, func(e *env, id string) error {
			return e.m.Destroy(context.Background(), id, manager.DestroyOptions{})
		}},
	} {
		t.Run(tc.point, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			id := "6f1b2c3d-0000-4000-8000-00000000a001"
			if tc.point == manager.CrashDestroyCI {
				if _, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: sim.DefaultH100MIG, UUID: id}); err != nil {
					t.Fatal(err)
				}
			}
			paused, resume := make(chan struct{}), make(chan struct{})
			e.crash = func(p string) {
				if p == tc.point {
					close(paused)
					<-resume
				}
			}
			done := make(chan error, 1)
			go func() { done <- tc.op(e, id) }()
			<-paused
			rep, err := e.m.Reconcile(context.Background())
			close(resume)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Finished)+len(rep.Undone)+len(rep.Recreated)+len(rep.Lost) != 0 {
				t.Fatalf("reconcile touched the operation in flight: %+v", rep)
			}
			if err := <-done; err != nil {
				t.Fatalf("operation after a concurrent reconcile: %v", err)
			}
			e.crash = nil
			got, err := e.m.Instance(id)
			switch tc.point {
			case manager.CrashCreateGI:
				if err != nil || got.State != store.StateReady {
					t.Fatalf("created instance: %+v, %v", got, err)
				}
			default:
				if !errors.Is(err, manager.ErrNotFound) {
					t.Fatalf("destroyed instance: %+v, %v", got, err)
				}
			}
			if rep, err := e.m.Reconcile(context.Background()); err != nil || len(rep.Finished)+len(rep.Undone)+len(rep.Recreated)+len(rep.Foreign) != 0 {
				t.Fatalf("reconcile afterwards: %+v, %v", rep, err)
			}
		})
	}
}
