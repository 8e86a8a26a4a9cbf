package manager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/pkg/discover"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/profiles"
)

// The default simulated host (see pkg/gpu/sim).
const (
	h100MIG = "0000:41:00.0"
	h100TS  = "0000:61:00.0"
	l4      = "0000:81:00.0"
	a10     = "0000:a1:00.0"
)

type env struct {
	t     testing.TB
	dir   string
	cat   *profile.Catalog
	sim   *sim.Host
	db    *store.DB
	m     *manager.Manager
	crash func(string)
}

func newEnv(t testing.TB, spec *sim.Spec) *env {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: t.TempDir(), cat: cat}
	e.sim, err = sim.Open(filepath.Join(e.dir, "sim"), spec, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.sim.Close() })
	e.start()
	return e
}

// start opens the store and a manager, as a daemon start does, and reconciles.
func (e *env) start() manager.ReconcileReport {
	e.t.Helper()
	db, err := store.Open(filepath.Join(e.dir, "state.db"), store.Options{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.db = db
	e.t.Cleanup(func() { db.Close() })
	b := nvmlb.New(e.sim.NVML(), e.cat, nvmlb.Options{})
	if err := b.Init(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	fs := sysfs.New(e.sim.FS())
	e.m = manager.New(e.cat, db, b, fs, discover.Host{NVML: b, Sysfs: fs}, nil, manager.Options{
		Crash:     func(p string) { e.crashAt(p) },
		BusyRetry: 1,
		BootID:    func() string { id, _ := e.sim.BootID(); return id },
		Logger:    testenv.Logger(e.t),
	})
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return rep
}

func (e *env) crashAt(p string) {
	if e.crash != nil {
		e.crash(p)
	}
}

// restart simulates the daemon dying and starting again on the same state.
func (e *env) restart() manager.ReconcileReport {
	e.t.Helper()
	e.db.Close()
	e.crash = nil
	return e.start()
}

func (e *env) tenant(name string, q tenant.Quota) {
	e.t.Helper()
	if _, err := e.m.DefineTenant(context.Background(), tenant.Tenant{Name: name, Quota: q}); err != nil {
		e.t.Fatal(err)
	}
}

func unlimited() tenant.Quota {
	return tenant.Quota{VRAMBytes: tenant.Unlimited, ComputeMilli: tenant.Unlimited, MaxInstances: tenant.Unlimited}
}

func (e *env) create(tn, profile, gpu string) (store.Instance, error) {
	return e.m.Create(context.Background(), manager.CreateRequest{Tenant: tn, Profile: profile, GPU: gpu})
}

func (e *env) mustCreate(tn, profile, gpu string) store.Instance {
	e.t.Helper()
	r, err := e.create(tn, profile, gpu)
	if err != nil {
		e.t.Fatalf("create %s: %v", profile, err)
	}
	return r
}

// discovered is the host as discovery (NVML + sysfs) sees it, as JSON.
func (e *env) discovered() string {
	e.t.Helper()
	if err := e.m.Refresh(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	b, err := json.Marshal(e.m.Inventory())
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

// waitIntents waits until n intents are left (background undos finish
// once the host answers).
func (e *env) waitIntents(n int) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var its []store.Intent
		if err := e.db.View(func(tx *store.Tx) (err error) { its, err = tx.Intents(); return err }); err != nil {
			e.t.Fatal(err)
		}
		if len(its) == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d intents left, want %d: %+v", len(its), n, its)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) summary() string {
	e.t.Helper()
	s, err := e.sim.Summary()
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

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
	if made[2].GIID < 0 || made[2].VF == "" || made[4].GPUPCI != l4 || made[5].MdevUUID != made[5].UUID {
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
	if r.Kind != store.KindPassthrough || r.GPUPCI != l4 {
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
	e.mustCreate("acme", "7g.80gb", h100MIG)
	e.mustCreate("acme", "A10-24GB/passthrough", a10)
	if err := e.sim.LoseGPU(l4); err != nil {
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
		{"MIG profile on a GPU with MIG off", "acme", "3g.40gb", h100TS, manager.ErrInvalidArgument, "MIG mode is off"},
		{"lost GPU", "acme", "L4-4Q", l4, manager.ErrGPULost, "lost"},
		{"no such GPU", "acme", "L4-4Q", "0000:ff:00.0", manager.ErrNotFound, "no GPU"},
		{"GPU index out of range", "acme", "L4-4Q", "9", manager.ErrNotFound, "vgpuctl gpus"},
		{"type of another model on a pinned GPU", "acme", "L4-4Q", h100TS, manager.ErrInvalidArgument, "does not offer it"},
		{"GPU passed through", "acme", "A10-4Q", a10, manager.ErrNoCapacity, "passed through"},
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

func TestRebootRecreatesSamePlacement(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	mig := e.mustCreate("acme", "3g.40gb", h100MIG)
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

// assertConsistent checks that every record is on the host and every
// device on the host has a record.
func assertConsistent(t *testing.T, e *env) {
	t.Helper()
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Foreign) != 0 || len(rep.Recreated) != 0 || len(rep.Failed) != 0 || len(rep.Finished)+len(rep.Undone) != 0 {
		t.Fatalf("second reconcile not clean: %+v\n%s", rep, e.summary())
	}
	insts, _ := e.m.AllInstances()
	for _, in := range insts {
		if in.State != store.StateReady {
			t.Fatalf("instance %s is %s", in.UUID, in.State)
		}
	}
}

func TestForeignDevicesCountAgainstCapacity(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	lib := e.sim.NVML()
	lib.Init()
	d, _ := lib.DeviceGetHandleByPciBusId(h100MIG)
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

func TestPlanCapacityAndDefragment(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	p, err := e.m.Plan(ctx, manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb"})
	if err != nil || !p.Fits || p.GPUPCI != h100MIG || p.Start < 0 {
		t.Fatalf("plan %+v, %v", p, err)
	}
	if strings.Contains(e.summary(), "gi") {
		t.Fatal("plan changed the host")
	}
	count := func(profile string) int {
		caps, _ := e.m.Capacity()
		for _, c := range caps {
			if c.Model == "H100-SXM5-80GB" && c.Profile == profile {
				return c.Count
			}
		}
		return -1
	}
	if n := count("1g.10gb"); n != 7 {
		t.Fatalf("capacity 1g.10gb = %d, want 7", n)
	}
	// Seven 1g instances fill slots 0-6; freeing those at 1 and 2 leaves
	// three free slices (1, 2 and 7) and no legal 2g start (0, 2, 4).
	var ones []store.Instance
	for i := 0; i < 7; i++ {
		ones = append(ones, e.mustCreate("acme", "1g.10gb", h100MIG))
	}
	for _, r := range ones {
		if r.GIStart == 1 || r.GIStart == 2 {
			if err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	req := manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: h100MIG}
	if _, err := e.m.Create(ctx, req); !errors.Is(err, manager.ErrNoCapacity) || !strings.Contains(manager.Message(err), "fragment") {
		t.Fatalf("fragmented create: %v", err)
	}
	p, err = e.m.Plan(ctx, req)
	if err != nil || p.Fits || len(p.Moves) == 0 {
		t.Fatalf("plan of a fragmented request: %+v, %v", p, err)
	}
	before := e.summary()
	res, err := e.m.Defragment(ctx, req, false)
	if err != nil || len(res.Moves) == 0 || res.Applied || e.summary() != before {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	res, err = e.m.Defragment(ctx, req, true)
	if err != nil || !res.Applied {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	moved, err := e.m.Instance(res.Moves[0].Instance)
	if err != nil || moved.GIStart != res.Moves[0].ToStart {
		t.Fatalf("moved instance %+v, %v; want start %d", moved, err, res.Moves[0].ToStart)
	}
	e.mustCreate("acme", "2g.20gb", h100MIG)
	assertConsistent(t, e)
}

func TestTenantLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	if _, err := e.m.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: unlimited()}); err != nil {
		t.Fatalf("identical redefine: %v", err)
	}
	if _, err := e.m.DefineTenant(ctx, tenant.Tenant{Name: "acme"}); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("conflicting redefine: %v", err)
	}
	r := e.mustCreate("acme", "L4-4Q", "")
	if err := e.m.UndefineTenant(ctx, "acme", false); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("undefine with instances: %v", err)
	}
	if _, err := e.m.SetQuota(ctx, "acme", tenant.Quota{VRAMBytes: 1 << 30, ComputeMilli: 100, MaxInstances: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create("acme", "L4-4Q", ""); !errors.Is(err, manager.ErrQuotaExceeded) {
		t.Fatalf("after lowering quota: %v", err)
	}
	if err := e.m.UndefineTenant(ctx, "acme", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Instance(r.UUID); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("forced undefine left the instance: %v", err)
	}
	if strings.Contains(e.summary(), " vf0") {
		t.Fatalf("forced undefine left the device:\n%s", e.summary())
	}
}

func TestFailedGPUFailsItsInstancesUntilCleared(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "L4-4Q", "")
	e.m.MarkGPUFailed(r.GPUUUID, "XID 48 (double-bit ECC)")
	if _, err := e.m.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := e.m.Instance(r.UUID)
	if got.State != store.StateFailed || !strings.Contains(got.Reason, "XID 48") {
		t.Fatalf("instance on a failed GPU: %s %q", got.State, got.Reason)
	}
	if _, err := e.create("acme", "L4-4Q", l4); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("carving on a failed GPU: %v", err)
	}
	// A restart of vgpud does not return the GPU to service.
	e.restart()
	if got, _ := e.m.Instance(r.UUID); got.State != store.StateFailed {
		t.Fatalf("after a restart: %s %q", got.State, got.Reason)
	}
	if _, err := e.create("acme", "L4-4Q", l4); !errors.Is(err, manager.ErrNoCapacity) {
		t.Fatalf("carving on a failed GPU after a restart: %v", err)
	}
	// An operator does.
	if _, err := e.m.ClearGPU(context.Background(), l4); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.m.Instance(r.UUID); got.State != store.StateReady {
		t.Fatalf("after the GPU is cleared: %s %q", got.State, got.Reason)
	}
	// So does a host reboot (it resets the GPU): the instance is re-created.
	e.m.MarkGPUFailed(r.GPUUUID, "XID 48 (double-bit ECC)")
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	rep := e.restart()
	got, _ = e.m.Instance(r.UUID)
	if got.State != store.StateReady || len(rep.Recreated) != 1 || len(e.m.FailedGPUs()) != 0 {
		t.Fatalf("after a reboot: %s %q, report %+v, failed %v", got.State, got.Reason, rep, e.m.FailedGPUs())
	}
	if _, err := e.m.ClearGPU(context.Background(), "0000:ff:00.0"); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("clear an unknown GPU: %v", err)
	}
}

// A destroy that fails half-way tells the caller so, and the instance
// stays (its released parts carved again), with no intent left behind.
func TestFailedDestroyKeepsTheInstance(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "3g.40gb", h100MIG)
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

// A reconcile that runs while an operation is in flight (on demand, or on
// a libvirtd reconnect) leaves that operation's intent to it: it neither
// undoes a create half-way nor finishes a destroy underneath.
func TestReconcileLeavesOperationsInFlight(t *testing.T) {
	for _, tc := range []struct {
		point string
		op    func(e *env, uuid string) error
	}{
		{manager.CrashCreateGI, func(e *env, id string) error {
			_, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: h100MIG, UUID: id})
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
				if _, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: h100MIG, UUID: id}); err != nil {
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

// fragmented fills the MIG H100 with 1g instances and frees the slots at
// 1 and 2, so that a 2g request needs a move.
func fragmented(t *testing.T, e *env) manager.CreateRequest {
	t.Helper()
	var ones []store.Instance
	for i := 0; i < 7; i++ {
		ones = append(ones, e.mustCreate("acme", "1g.10gb", h100MIG))
	}
	for _, r := range ones {
		if r.GIStart == 1 || r.GIStart == 2 {
			if err := e.m.Destroy(context.Background(), r.UUID, manager.DestroyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return manager.CreateRequest{Tenant: "acme", Profile: "2g.20gb", GPU: h100MIG}
}

// defragmentAndFit checks the host is consistent, then that defragment
// works and the fragmented request fits after it.
func defragmentAndFit(t *testing.T, e *env, req manager.CreateRequest) {
	t.Helper()
	assertConsistent(t, e)
	if _, err := e.m.Defragment(context.Background(), req, true); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	e.mustCreate("acme", req.Profile, req.GPU)
}

func placements(t *testing.T, e *env) string {
	t.Helper()
	insts, err := e.m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, in := range insts {
		out = append(out, fmt.Sprintf("%s %s:%d %s", in.UUID, in.GPUPCI, in.GIStart, in.State))
	}
	return strings.Join(out, "\n")
}

// A move that fails at any step is undone: the instance is carved again
// where it was, the new placement holds nothing, no intent is left.
func TestFailedMoveIsUndone(t *testing.T) {
	cases := []struct {
		name  string
		fault sim.Fault
	}{
		{"release fails", sim.Fault{Op: "GpuInstanceDestroy", Return: 999, Count: 1}},
		{"GPU instance at the new place fails", sim.Fault{Op: "CreateGpuInstanceWithPlacement", Return: 999, Count: 1}},
		{"compute instance at the new place fails", sim.Fault{Op: "CreateComputeInstance", Return: 999, Count: 1}},
		{"GPU instance at the new place outruns the deadline", sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: "400ms", Count: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			req := fragmented(t, e)
			host, recs := e.discovered(), placements(t, e)
			if err := e.sim.AddFault(c.fault); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if c.fault.Delay != "" {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
			}
			res, err := e.m.Defragment(ctx, req, true)
			if err == nil {
				t.Fatal("defragment succeeded through a fault")
			}
			t.Logf("defragment: %+v: %v", res, err)
			if got := placements(t, e); got != recs {
				t.Fatalf("records after a failed move:\n%s\nwere\n%s", got, recs)
			}
			if got := e.discovered(); got != host {
				t.Fatalf("host after a failed move:\n%s\nwas\n%s", got, host)
			}
			defragmentAndFit(t, e, req)
		})
	}
}

// A crash half-way through a move is settled by the next start: every
// instance is on the host once, nothing is left at the other placement.
func TestCrashedMoveIsSettled(t *testing.T) {
	for _, p := range []string{manager.CrashMoveRelease, manager.CrashMoveCarve} {
		t.Run(p, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			req := fragmented(t, e)
			n := len(strings.Split(placements(t, e), "\n"))
			e.crash = func(at string) {
				if at == p {
					runtime.Goexit()
				}
			}
			done := make(chan struct{})
			go func() { defer close(done); _, _ = e.m.Defragment(context.Background(), req, true) }()
			<-done
			rep := e.restart()
			if len(rep.Finished) != 1 {
				t.Fatalf("start-up reconcile did not settle the move: %+v", rep)
			}
			if got := len(strings.Split(placements(t, e), "\n")); got != n {
				t.Fatalf("%d instances after the crash, want %d", got, n)
			}
			defragmentAndFit(t, e, req)
		})
	}
}

// Operations on GPU modes: MIG mode on and off (with the driver's pending
// change), and the heterogeneous vGPU mode, which vgpud keeps and applies
// again after a host reboot resets it.
func TestGPUModes(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	ctx := context.Background()
	// MIG off on the time-sliced H100 and on again: refused while an
	// instance lives there, done otherwise.
	r := e.mustCreate("acme", "H100XM-20C", h100TS)
	if err := e.m.SetMIGMode(ctx, h100TS, true); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("MIG on under an instance: %v, want ErrBusy", err)
	}
	if err := e.m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	err := e.m.SetMIGMode(ctx, h100TS, true)
	g, _ := e.m.GPU(h100TS)
	switch {
	case err == nil:
		if !g.MIG.Enabled {
			t.Fatalf("MIG on succeeded, GPU shows %+v", g.MIG)
		}
	case errors.Is(err, manager.ErrBusy) && strings.Contains(manager.Message(err), "reset"):
		if !g.MIG.Pending || g.MIG.Enabled {
			t.Fatalf("MIG change pending, GPU shows %+v", g.MIG)
		}
	default:
		t.Fatalf("MIG on: %v", err)
	}
	if err := e.m.SetMIGMode(ctx, l4, true); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("MIG on an L4: %v, want ErrInvalidArgument", err)
	}

	// Heterogeneous mode on the L4: mixed sizes then fit; a reboot resets
	// the mode and vgpud sets it again before re-creating them.
	if err := e.m.SetHeterogeneous(ctx, l4, true); err != nil {
		t.Fatal(err)
	}
	a := e.mustCreate("acme", "L4-4Q", l4)
	b := e.mustCreate("acme", "L4-8Q", l4)
	if err := e.m.SetHeterogeneous(ctx, l4, false); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("mode change under vGPUs: %v, want ErrBusy", err)
	}
	if err := e.sim.Reboot(); err != nil {
		t.Fatal(err)
	}
	rep := e.restart()
	if len(rep.Recreated) != 2 || len(rep.Failed) != 0 {
		t.Fatalf("after a reboot: %+v", rep)
	}
	for _, id := range []string{a.UUID, b.UUID} {
		if got, _ := e.m.Instance(id); got.State != store.StateReady {
			t.Fatalf("instance %s after a reboot: %s %q", id, got.State, got.Reason)
		}
	}
	if g, _ := e.m.GPU(l4); !g.VGPU.Heterogeneous {
		t.Fatal("heterogeneous mode not applied again after the reboot")
	}
	assertConsistent(t, e)
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
		e.mustCreate("acme", "1g.10gb", h100MIG)
		e.mustCreate("acme", "H100XM-1-10C", h100MIG)
	}
	assertConsistent(t, e)
}
