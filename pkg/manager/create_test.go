package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

func TestCreateAndDestroyEveryKind(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	empty := e.summary()
	cases := []struct {
		profile, gpu string
		kind         store.InstanceKind
		onHost       string
	}{
		{"3g.40gb", "", store.KindMIG, "gi"},
		{"H100-1g.10gb", "", store.KindMIG, "gi"},
		{"H100XM-2-20C", "", store.KindMIGVGPU, " vf0"},
		{"H100XM-20C", "", store.KindVGPU, " vf0"},
		{"L4-4Q", "", store.KindVGPU, " vf0"},
		{"NVIDIA A10-8Q", "", store.KindVGPU, "mdev"},
	}
	var made []store.Instance
	for _, c := range cases {
		r := e.mustCreate("acme", c.profile, c.gpu)
		if r.Kind != c.kind || r.State != store.StateReady {
			t.Fatalf("%s: kind %s state %s", c.profile, r.Kind, r.State)
		}
		if !strings.Contains(e.summary(), c.onHost) {
			t.Fatalf("%s: host shows no %s:\n%s", c.profile, c.onHost, e.summary())
		}
		made = append(made, r)
	}
	if made[2].GIID < 0 || made[2].VF == "" || made[4].GPUPCI != sim.DefaultL4 || made[5].MdevUUID != made[5].UUID {
		t.Fatalf("records: %+v", made)
	}
	for _, r := range made {
		if err := e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}); err != nil {
			t.Fatalf("destroy %s: %v", r.Profile, err)
		}
	}
	if got := e.summary(); got != empty {
		t.Fatalf("host not back to empty:\n%s\nwant\n%s", got, empty)
	}
	if err := e.m.Destroy(context.Background(), made[0].UUID, manager.DestroyOptions{}); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("second destroy: %v, want ErrNotFound", err)
	}
}

func TestPassthroughReservesAnEmptyGPU(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "L4-24GB/passthrough", "")
	if r.Kind != store.KindPassthrough || r.GPUPCI != sim.DefaultL4 {
		t.Fatalf("passthrough %+v", r)
	}
	if _, err := e.create("acme", "L4-4Q", ""); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("vGPU on a passed-through GPU: %v, want ErrNoCapacity", err)
	}
	if _, err := e.create("acme", "L4-24GB/passthrough", ""); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("second passthrough: %v", err)
	}
}

func TestRefusalsChangeNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("small", tenant.Quota{VRAMBytes: 20 << 30, ComputeMilli: tenant.Unlimited, MaxInstances: 2})
	e.tenant("acme", unlimited())
	e.mustCreate("acme", "7g.80gb", sim.DefaultH100MIG)
	e.mustCreate("acme", "A10-24GB/passthrough", sim.DefaultA10)
	if err := e.sim.LoseGPU(sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := e.summary()
	cases := []struct {
		name, tenant, profile, gpu string
		want                       error
		msg                        string
	}{
		{"unknown profile", "acme", "9g.900gb", "", manager.ErrInvalidArgument, "unknown profile"},
		{"unknown model", "acme", "Z100/3g.40gb", "", manager.ErrInvalidArgument, "unknown GPU model"},
		{"unknown tenant", "nobody", "1g.10gb", "", manager.ErrNotFound, "tenant define"},
		{"bad tenant name", "Bad_Name", "1g.10gb", "", manager.ErrInvalidArgument, ""},
		{"over VRAM quota", "small", "H100XM-40C", "", manager.ErrQuotaExceeded, "VRAM quota"},
		{"no capacity", "acme", "3g.40gb", "", manager.ErrNoCapacity, "creatable now"},
		{"MIG profile on a GPU with MIG off", "acme", "3g.40gb", sim.DefaultH100TS, manager.ErrInvalidArgument, "MIG mode is off"},
		{"lost GPU", "acme", "L4-4Q", sim.DefaultL4, manager.ErrGPULost, "lost"},
		{"no such GPU", "acme", "L4-4Q", "0000:ff:00.0", manager.ErrNotFound, "no GPU"},
		{"GPU index out of range", "acme", "L4-4Q", "9", manager.ErrNotFound, "vgpuctl gpus"},
		{"type of another model on a pinned GPU", "acme", "L4-4Q", sim.DefaultH100TS, manager.ErrInvalidArgument, "does not offer it"},
		{"GPU passed through", "acme", "A10-4Q", sim.DefaultA10, manager.ErrNoCapacity, "passed through"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.create(c.tenant, c.profile, c.gpu)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if !strings.Contains(manager.Message(err), c.msg) {
				t.Fatalf("message %q lacks %q", manager.Message(err), c.msg)
			}
			t.Logf("%s: %s", c.name, manager.Message(err))
			if got := e.summary(); got != before {
				t.Fatalf("host changed:\n%s\nwas\n%s", got, before)
			}
		})
	}
	insts, _ := e.m.AllInstances()
	if len(insts) != 2 {
		t.Fatalf("%d records, want 2", len(insts))
	}
}

func TestFailedStepIsUndone(t *testing.T) {
	cases := []struct {
		name    string
		profile string
		fault   sim.Fault
	}{
		{"compute instance fails after GPU instance", "3g.40gb", sim.Fault{Op: "CreateComputeInstance", Return: 999, Count: 1}},
		{"VF write fails after GPU instance", "H100XM-3-40C", sim.Fault{Op: "write:current_vgpu_type", Errno: int(syscall.ENOMEM), Count: 1}},
		{"VF write fails", "L4-8Q", sim.Fault{Op: "write:current_vgpu_type", Errno: int(syscall.EIO), Count: 1}},
		{"mdev create fails", "A10-4Q", sim.Fault{Op: "write:create", Errno: int(syscall.ENOMEM), Count: 1}},
		{"GPU instance create fails", "1g.10gb", sim.Fault{Op: "CreateGpuInstanceWithPlacement", Return: 999, Count: 1}},
		// A host call that outruns the caller's deadline goes on in the
		// driver and may still land: the undo waits for it and takes away
		// what it made.
		{"GPU instance create outruns the deadline", "3g.40gb", sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: "400ms", Count: 1}},
		{"compute instance create outruns the deadline", "3g.40gb", sim.Fault{Op: "CreateComputeInstance", Delay: "400ms", Count: 1}},
		{"VF write outruns the deadline", "L4-8Q", sim.Fault{Op: "write:current_vgpu_type", Delay: "400ms", Count: 1}},
		{"mdev create outruns the deadline", "A10-4Q", sim.Fault{Op: "write:create", Delay: "400ms", Count: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			before := e.discovered()
			if err := e.sim.AddFault(c.fault); err != nil {
				t.Fatal(err)
			}
			if c.fault.Delay == "" {
				if _, err := e.create("acme", c.profile, ""); err == nil {
					t.Fatal("create succeeded through a fault")
				}
			} else {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				r, err := e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: c.profile})
				if !errors.Is(err, manager.ErrBackendFailure) {
					t.Fatalf("create past its deadline: %v, want ErrBackendFailure", err)
				}
				// The caller is answered at once; the undo waits for the driver.
				if insts, _ := e.m.AllInstances(); len(insts) != 1 || insts[0].State != store.StateCreating {
					t.Fatalf("records right after the timeout: %+v (%+v), want the one being undone", insts, r)
				}
			}
			e.waitIntents(0)
			if got := e.discovered(); got != before {
				t.Fatalf("host not restored (as discovery sees it):\n%s\nwas\n%s", got, before)
			}
			insts, _ := e.m.AllInstances()
			if len(insts) != 0 {
				t.Fatalf("records left: %+v", insts)
			}
			// And the same request works once the fault is gone.
			e.mustCreate("acme", c.profile, "")
		})
	}
}

func TestIdempotentCreateByUUID(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	req := manager.CreateRequest{UUID: "9a1f0b62-9a5d-4b53-8f3c-2f1e1e0c0001", Tenant: "acme", Profile: "L4-4Q"}
	a, err := e.m.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.m.Create(context.Background(), req)
	if err != nil || b.UUID != a.UUID || b.VF != a.VF {
		t.Fatalf("retry: %+v, %v", b, err)
	}
	req.Profile = "L4-8Q"
	if _, err := e.m.Create(context.Background(), req); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("same UUID, other profile: %v", err)
	}
}

// race runs n concurrent creates and counts the outcomes.
func race(t *testing.T, e *env, n int, tn, profile string) (ok, quota, capacity int) {
	t.Helper()
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := e.create(tn, profile, "")
			results <- err
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	for err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, manager.ErrQuotaExceeded):
			quota++
		case errors.Is(err, manager.ErrNoCapacity):
			capacity++
		default:
			t.Errorf("unexpected: %v", err)
		}
	}
	return ok, quota, capacity
}

// 64 clients race for the last quota, then 64 for the last capacity:
// exactly the admissible number succeed, every other one is refused with
// the named reason, and the host holds exactly what the records say.
func TestConcurrentAdmission(t *testing.T) {
	e := newEnv(t, nil)
	// Quota: five instances, on a host with room for many more.
	e.tenant("quota", tenant.Quota{VRAMBytes: tenant.Unlimited, ComputeMilli: tenant.Unlimited, MaxInstances: 5})
	if ok, quota, capacity := race(t, e, 64, "quota", "1g.10gb"); ok != 5 || quota != 59 || capacity != 0 {
		t.Fatalf("quota race: ok %d (want 5), quota exceeded %d (want 59), no capacity %d (want 0)", ok, quota, capacity)
	}
	// Capacity: L4-4Q fits six times on the one L4 (homogeneous), for a
	// tenant with no limit.
	e.tenant("cap", unlimited())
	m, _ := e.cat.Model("L4-24GB")
	q4, _ := m.VGPUTypeByName("L4-4Q")
	if ok, quota, capacity := race(t, e, 64, "cap", "L4-4Q"); ok != q4.MaxInstances || capacity != 64-q4.MaxInstances || quota != 0 {
		t.Fatalf("capacity race: ok %d (want %d), no capacity %d (want %d), quota exceeded %d", ok, q4.MaxInstances, capacity, 64-q4.MaxInstances, quota)
	}
	views, _ := e.m.Tenants()
	for _, v := range views {
		want := map[string]uint64{"quota": 5, "cap": uint64(q4.MaxInstances)}[v.Name]
		if v.Usage.Instances != want {
			t.Fatalf("tenant %s holds %d instances, want %d", v.Name, v.Usage.Instances, want)
		}
	}
	assertConsistent(t, e)
}

// A destroy that fails half-way tells the caller so, and the instance
// stays (its released parts carved again), with no intent left behind.
func TestFailedDestroyKeepsTheInstance(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "3g.40gb", sim.DefaultH100MIG)
	before := e.discovered()
	if err := e.sim.AddFault(sim.Fault{Op: "GpuInstanceDestroy", Return: 999, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}); err == nil {
		t.Fatal("destroy succeeded through a fault")
	}
	got, err := e.m.Instance(r.UUID)
	if err != nil || got.State != store.StateReady {
		t.Fatalf("after a failed destroy: %+v, %v", got, err)
	}
	if after := e.discovered(); after != before {
		t.Fatalf("host not restored:\n%s\nwas\n%s", after, before)
	}
	rep, err := e.m.Reconcile(context.Background())
	if err != nil || len(rep.Finished)+len(rep.Undone)+len(rep.Recreated) != 0 {
		t.Fatalf("reconcile after a failed destroy: %+v, %v", rep, err)
	}
	if err := e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatalf("destroy once the fault is gone: %v", err)
	}
}

// A MIG-backed vGPU lands on the GPU instance vgpud made for it, beside
// plain MIG instances of the same profile (whose compute instances serve
// the host): the driver picks a free GPU instance of the profile.
func TestMIGBackedVGPUBesidePlainMIG(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	// Interleaved, so that plain instances hold GPU-instance ids both
	// below and above those of the vGPUs'.
	for i := 0; i < 3; i++ {
		e.mustCreate("acme", "1g.10gb", sim.DefaultH100MIG)
		e.mustCreate("acme", "H100XM-1-10C", sim.DefaultH100MIG)
	}
	assertConsistent(t, e)
}
