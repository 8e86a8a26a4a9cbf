package manager_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// migVirt is one host's libvirt for migration tests: the domains defined
// there and the hostdevs their definitions name, with vgpud's metadata.
type migVirt struct {
	mu   sync.Mutex
	doms map[string]*migDom
	// down: libvirt does not answer (every call fails with it).
	down error
}

type migDom struct {
	name, uuid string
	running    bool
	devs       []virt.Attached
}

func newMigVirt() *migVirt { return &migVirt{doms: map[string]*migDom{}} }

func devKey(h virt.Hostdev) string { return fmt.Sprint(h.Kind, h.MdevUUID, h.PCI) }

// find looks a domain up by name, as libvirt's lookup does.
func (v *migVirt) find(ref string) (*migDom, error) {
	if v.down != nil {
		return nil, v.down
	}
	if d, ok := v.doms[ref]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("domain %s: %w", ref, virt.ErrDomainNotFound)
}

// define defines (and starts) a domain holding devs for instance.
func (v *migVirt) define(name, uuid, instance string, devs ...virt.Hostdev) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := &migDom{name: name, uuid: uuid, running: true}
	for _, h := range devs {
		d.devs = append(d.devs, virt.Attached{Instance: instance, Hostdev: h, Config: true, Live: true, MetadataConfig: true, MetadataLive: true})
	}
	v.doms[name] = d
}

func (v *migVirt) undefine(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.doms, name)
}

func (v *migVirt) URI() string { return "qemu:///system" }
func (v *migVirt) Domain(_ context.Context, ref string) (virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return virt.Domain{}, err
	}
	return virt.Domain{Name: d.name, UUID: d.uuid, Running: d.running, Persistent: true}, nil
}
func (v *migVirt) Attach(_ context.Context, ref string, h virt.Hostdev, instance string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return false, err
	}
	d.devs = append(d.devs, virt.Attached{Instance: instance, Hostdev: h, Config: true, Live: d.running, MetadataConfig: true, MetadataLive: d.running})
	return d.running, nil
}
func (v *migVirt) Detach(_ context.Context, ref string, h virt.Hostdev, _ string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return err
	}
	d.devs = slices.DeleteFunc(d.devs, func(a virt.Attached) bool { return devKey(a.Hostdev) == devKey(h) })
	return nil
}
func (v *migVirt) Attached(_ context.Context, ref string) ([]virt.Attached, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return nil, err
	}
	return slices.Clone(d.devs), nil
}
func (v *migVirt) Domains(context.Context) ([]virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []virt.Domain
	for _, d := range v.doms {
		out = append(out, virt.Domain{Name: d.name, UUID: d.uuid, Running: d.running, Persistent: true})
	}
	return out, nil
}
func (v *migVirt) Events(context.Context) <-chan virt.Event { return nil }
func (v *migVirt) Quiesce(context.Context) error            { return nil }

// migHost is one vgpud host of a migration: the manager on a simulated
// host, with its libvirt.
type migHost struct {
	*env
	v *migVirt
}

func newMigHost(t *testing.T, spec *sim.Spec) *migHost {
	t.Helper()
	return newMigHostHolding(t, spec, 0)
}

// newMigHostHolding is newMigHost with a migration hold (0: the default).
func newMigHostHolding(t *testing.T, spec *sim.Spec, hold time.Duration) *migHost {
	t.Helper()
	e := &env{t: t}
	v := newMigVirt()
	e.host = simhost.Start(t, simhost.Options{
		Spec: spec,
		Manager: manager.Config{
			Crash:         func(p string) { e.crashAt(p) },
			BusyRetry:     1,
			Logger:        testenv.Logger(t),
			Virt:          v,
			MigrationHold: hold,
		},
		SimBootID: true,
	})
	e.cat, e.sim, e.db, e.m = e.host.Catalog, e.host.Sim, e.host.DB, e.host.Manager
	e.tenant("acme", unlimited())
	return &migHost{env: e, v: v}
}

const (
	migVM     = "web1"
	migVMUUID = "3d1c5e7a-8b2f-4c6d-9e0a-1b2c3d4e5f60"
)

func hostdev(rec store.Instance) virt.Hostdev {
	if rec.Flow == store.FlowMdev {
		return virt.Hostdev{Kind: virt.Mdev, MdevUUID: rec.MdevUUID}
	}
	return virt.Hostdev{Kind: virt.VF, PCI: rec.VF}
}

// running creates an instance of profile on the source, attaches it to
// the VM and starts the VM (its vGPU becomes active in NVML).
func (h *migHost) running(profile string) store.Instance {
	h.t.Helper()
	h.v.define(migVM, migVMUUID, "")
	rec := h.mustCreate("acme", profile, "")
	if _, err := h.m.Attach(context.Background(), rec.UUID, migVM, manager.AttachOptions{}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.sim.OpenDevice(hostDevice(rec), migVMUUID, migVM); err != nil {
		h.t.Fatal(err)
	}
	return rec
}

// moveVM is libvirt's migration: the domain defined on dst naming the
// destination's device, running there, and gone from src (its QEMU
// exited, letting go of the source's vGPU).
func moveVM(t *testing.T, src, dst *migHost, from store.Instance, in manager.Incoming) {
	t.Helper()
	dst.v.define(migVM, migVMUUID, in.Instance.UUID, hostdev(in.Instance))
	if err := dst.sim.OpenDevice(in.Device, migVMUUID, migVM); err != nil {
		t.Fatal(err)
	}
	src.v.undefine(migVM)
	if err := src.sim.CloseDevice(hostDevice(from)); err != nil {
		t.Fatal(err)
	}
}

func hostDevice(rec store.Instance) string {
	if rec.Flow == store.FlowMdev {
		return rec.MdevUUID
	}
	return rec.VF
}

// attachment is the instance's attachment record, nil when none.
func attachment(t *testing.T, e *env, id string) *store.Attachment {
	t.Helper()
	var a store.Attachment
	err := e.db.View(func(tx *store.Tx) (err error) { a, err = tx.Attachment(id); return err })
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &a
}

func intents(t *testing.T, e *env) []store.Intent {
	t.Helper()
	var its []store.Intent
	if err := e.db.View(func(tx *store.Tx) (err error) { its, err = tx.Intents(); return err }); err != nil {
		t.Fatal(err)
	}
	return its
}

// A VM moves with its vGPU: the destination carves the same profile
// (the same instance UUID, so an mdev keeps its UUID) on a GPU the driver
// says takes it live, records the VM's attachment once libvirt moved it,
// and the source releases its instance; every call answers the same
// when made again.
func TestMigrationMovesVM(t *testing.T) {
	for _, profile := range []string{"A10-4Q", "L4-4Q", "H100XM-2-20C"} {
		t.Run(profile, func(t *testing.T) {
			ctx := context.Background()
			src, dst := newMigHost(t, nil), newMigHost(t, nil)
			rec := src.running(profile)
			md, err := src.m.MigrationSource(ctx, rec.UUID)
			if err != nil {
				t.Fatal(err)
			}
			if md.Instance != rec.UUID || md.Profile != profile || md.Tenant != "acme" || len(md.VGPU) == 0 || md.DomainUUID != migVMUUID {
				t.Fatalf("metadata %+v", md)
			}
			if md2, err := src.m.MigrationSource(ctx, rec.UUID); err != nil || string(md2.VGPU) != string(md.VGPU) {
				t.Fatalf("second MigrationSource: %v", err)
			}
			if err := src.m.Destroy(ctx, rec.UUID, manager.DestroyOptions{Detach: true}); !errors.Is(err, manager.ErrBusy) {
				t.Fatalf("destroy while moving out: %v, want Busy", err)
			}
			in, err := dst.m.PrepareIncoming(ctx, md, "", "")
			if err != nil {
				t.Fatal(err)
			}
			if in.Instance.UUID != rec.UUID || in.Instance.Profile != profile || in.Device == "" || in.Compatibility.VM&8 == 0 {
				t.Fatalf("incoming %+v", in)
			}
			if rec.Flow == store.FlowMdev && in.Device != rec.MdevUUID {
				t.Fatalf("the mdev's UUID changed: %s, was %s", in.Device, rec.MdevUUID)
			}
			if in2, err := dst.m.PrepareIncoming(ctx, md, "", ""); err != nil || in2.Device != in.Device {
				t.Fatalf("second PrepareIncoming: %+v %v", in2, err)
			}
			if _, err := dst.m.CommitIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrNotFound) {
				t.Fatalf("commit before the VM arrived: %v, want NotFound", err)
			}
			if err := src.m.CompleteOutgoing(ctx, rec.UUID); !errors.Is(err, manager.ErrBusy) {
				t.Fatalf("complete while the VM runs on the source: %v, want Busy", err)
			}
			moveVM(t, src, dst, rec, in)
			a, err := dst.m.CommitIncoming(ctx, rec.UUID)
			if err != nil || a.Domain != migVM || a.DomainUUID != migVMUUID || !a.Live {
				t.Fatalf("commit: %+v %v", a, err)
			}
			if a2, err := dst.m.CommitIncoming(ctx, rec.UUID); err != nil || a2.Domain != migVM {
				t.Fatalf("second commit: %v", err)
			}
			if err := dst.m.AbortIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
				t.Fatalf("abort after commit: %v, want Conflict", err)
			}
			if err := src.m.CompleteOutgoing(ctx, rec.UUID); err != nil {
				t.Fatal(err)
			}
			if err := src.m.CompleteOutgoing(ctx, rec.UUID); err != nil {
				t.Fatalf("second complete: %v", err)
			}
			if _, err := src.m.Instance(rec.UUID); !errors.Is(err, manager.ErrNotFound) {
				t.Fatalf("source instance after the move: %v", err)
			}
			if len(intents(t, src.env)) != 0 || len(intents(t, dst.env)) != 0 {
				t.Fatalf("intents left: %+v / %+v", intents(t, src.env), intents(t, dst.env))
			}
			assertConsistent(t, src.env)
			assertConsistent(t, dst.env)
			if strings.Contains(src.summary(), rec.UUID) || strings.Contains(src.summary(), "vgpu(") {
				t.Fatalf("source host keeps a vGPU:\n%s", src.summary())
			}
		})
	}
}

// A migration libvirt gave up on: the destination releases what it
// carved, the source keeps its instance and attachment; both answer the
// same again.
func TestMigrationAborted(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	before := dst.summary()
	rec := src.running("L4-4Q")
	md, err := src.m.MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.m.PrepareIncoming(ctx, md, migVM, "acme"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := dst.m.AbortIncoming(ctx, rec.UUID); err != nil {
			t.Fatalf("abort %d: %v", i, err)
		}
		if err := src.m.CancelOutgoing(ctx, rec.UUID); err != nil {
			t.Fatalf("cancel %d: %v", i, err)
		}
	}
	if got := dst.summary(); got != before {
		t.Fatalf("destination after the abort:\n%s\nbefore:\n%s", got, before)
	}
	if _, err := dst.m.CommitIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("commit after abort: %v, want NotFound", err)
	}
	if err := src.m.CompleteOutgoing(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("complete after cancel: %v, want Conflict", err)
	}
	if a := attachment(t, src.env, rec.UUID); a == nil || a.Domain != migVM {
		t.Fatalf("source attachment after the cancel: %+v", a)
	}
	if len(intents(t, src.env))+len(intents(t, dst.env)) != 0 {
		t.Fatal("intents left")
	}
	assertConsistent(t, src.env)
	assertConsistent(t, dst.env)
}

func l4(mod func(*sim.GPUSpec)) *sim.Spec {
	g := sim.GPUSpec{Model: "L4-24GB", PCI: sim.DefaultL4, Flavour: gpu.FlavourVFIO}
	if mod != nil {
		mod(&g)
	}
	return &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{g}}
}

// Every refusal of a destination is named, and carves nothing: the host,
// the records and the intents are as before.
func TestPrepareIncomingRefusals(t *testing.T) {
	ctx := context.Background()
	src := newMigHost(t, nil)
	l4rec := src.running("L4-4Q")
	l4md, err := src.m.MigrationSource(ctx, l4rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	src2 := newMigHost(t, nil)
	migrec := src2.running("H100XM-2-20C")
	migmd, err := src2.m.MigrationSource(ctx, migrec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	newer := l4(nil)
	newer.Driver.Version = "590.10.01"
	for _, tt := range []struct {
		name   string
		spec   *sim.Spec
		md     manager.MigrationMetadata
		before func(h *migHost, md *manager.MigrationMetadata)
		vm, tn string
		want   []error
	}{
		{name: "another GPU type", spec: &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: "A10-24GB", PCI: sim.DefaultA10, Flavour: gpu.FlavourMdev}}},
			md: l4md, want: []error{manager.ErrConflict, manager.ErrIncompatibleGPU}},
		{name: "ECC off", spec: l4(func(g *sim.GPUSpec) { g.ECCOff = true }), md: l4md, want: []error{manager.ErrConflict, manager.ErrIncompatibleGPU}},
		{name: "another driver branch", spec: newer, md: l4md, want: []error{manager.ErrConflict, manager.ErrIncompatibleDriver}},
		{name: "live not supported", spec: l4(func(g *sim.GPUSpec) { g.NoLiveMigration = true }), md: l4md, want: []error{manager.ErrConflict, manager.ErrLiveUnsupported}},
		{name: "MIG-backed vGPU, MIG off here", spec: &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: "H100-SXM5-80GB", PCI: sim.DefaultH100TS, Flavour: gpu.FlavourVFIO}}},
			md: migmd, want: []error{manager.ErrConflict, manager.ErrOtherMIGLayout}},
		{name: "another GPU-instance profile", md: migmd, before: func(_ *migHost, md *manager.MigrationMetadata) { md.GIProfileID, md.GISize = 9, 4 },
			want: []error{manager.ErrConflict, manager.ErrOtherMIGLayout}},
		{name: "no room", spec: l4(nil), md: l4md, before: func(h *migHost, _ *manager.MigrationMetadata) { h.mustCreate("acme", "L4-24Q", "") },
			want: []error{manager.ErrNoCapacity}},
		{name: "over quota", md: l4md, tn: "tight", before: func(h *migHost, _ *manager.MigrationMetadata) {
			q := unlimited()
			q.MaxInstances = 0
			h.tenant("tight", q)
		}, want: []error{manager.ErrQuotaExceeded}},
		{name: "unknown tenant", md: l4md, tn: "nobody", want: []error{manager.ErrNotFound}},
		{name: "not the driver's metadata", md: l4md, before: func(_ *migHost, md *manager.MigrationMetadata) { md.VGPU = []byte("not the driver's") },
			want: []error{manager.ErrInvalidArgument}},
		{name: "another metadata version", md: l4md, before: func(_ *migHost, md *manager.MigrationMetadata) { md.Version = 2 }, want: []error{manager.ErrInvalidArgument}},
		{name: "a VM that cannot be one", md: l4md, vm: " web1", want: []error{manager.ErrInvalidArgument}},
		{name: "the instance exists here", md: l4md, before: func(h *migHost, md *manager.MigrationMetadata) {
			if _, err := h.m.Create(ctx, manager.CreateRequest{UUID: md.Instance, Tenant: "acme", Profile: "L4-2Q"}); err != nil {
				t.Fatal(err)
			}
		}, want: []error{manager.ErrConflict}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dst := newMigHost(t, tt.spec)
			md := tt.md
			md.VGPU = slices.Clone(md.VGPU)
			if tt.before != nil {
				tt.before(dst, &md)
			}
			before, recs := dst.summary(), instances(t, dst.env)
			_, err := dst.m.PrepareIncoming(ctx, md, tt.vm, tt.tn)
			t.Logf("refused: %s", manager.Message(err))
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Fatalf("PrepareIncoming: %v, want %v", err, w)
				}
			}
			// Over D-Bus a Conflict's reason travels in its message only:
			// the message opens with it.
			if len(tt.want) == 2 && !strings.HasPrefix(manager.Message(err), tt.want[1].Error()+": ") {
				t.Fatalf("the message does not open with the reason %q: %s", tt.want[1], manager.Message(err))
			}
			if got := dst.summary(); got != before {
				t.Fatalf("a refusal changed the host:\n%s\nbefore:\n%s", got, before)
			}
			if got := instances(t, dst.env); !slices.Equal(got, recs) {
				t.Fatalf("a refusal changed the records: %v, before %v", got, recs)
			}
			if its := intents(t, dst.env); len(its) != 0 {
				t.Fatalf("a refusal left intents: %+v", its)
			}
		})
	}
}

// instances are the host's instance UUIDs.
func instances(t *testing.T, e *env) []string {
	t.Helper()
	all, err := e.m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range all {
		out = append(out, v.UUID)
	}
	return out
}

// A crash at each of a migration's crash points is resolved at the next
// start by where libvirt has the VM: the source keeps its instance while
// the VM is defined there and releases it once the VM is gone; the
// destination records the VM's attachment once the VM is there with the
// instance's device and releases the instance otherwise. Either way no
// intent, device or record is left over.
func TestMigrationCrashPoints(t *testing.T) {
	for _, tc := range []struct {
		point string
		// source: the crash is the source's (MigrationSource, or
		// CompleteOutgoing once moved); else the destination's
		// (PrepareIncoming, CommitIncoming once moved, or AbortIncoming).
		source, moved, abort bool
		// kept: the crashed host keeps the instance afterwards, attached.
		kept bool
	}{
		{point: manager.CrashOutgoingIntent, source: true, kept: true},
		{point: manager.CrashOutgoingIntent, source: true, moved: true},
		{point: manager.CrashOutgoingMove, source: true, kept: true},
		{point: manager.CrashOutgoingMove, source: true, moved: true},
		{point: manager.CrashMigrationRelease, source: true, moved: true},
		{point: manager.CrashIncomingIntent},
		{point: manager.CrashCreateVGPU},
		{point: manager.CrashIncomingCarve},
		{point: manager.CrashIncomingCarve, moved: true, kept: true},
		{point: manager.CrashIncomingCommit, moved: true, kept: true},
		{point: manager.CrashMigrationRelease, abort: true},
	} {
		name := fmt.Sprintf("%s/source=%v,moved=%v,abort=%v", tc.point, tc.source, tc.moved, tc.abort)
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			src, dst := newMigHost(t, nil), newMigHost(t, nil)
			rec := src.running("L4-4Q")
			crashed := dst
			if tc.source {
				crashed = src
			}
			crashed.crash = func(at string) {
				if at == tc.point {
					runtime.Goexit()
				}
			}
			run := func(fn func()) {
				done := make(chan struct{})
				go func() { defer close(done); fn() }()
				<-done
			}
			var md manager.MigrationMetadata
			var in manager.Incoming
			var err error
			run(func() { md, err = src.m.MigrationSource(ctx, rec.UUID) })
			outgoing := tc.point == manager.CrashOutgoingIntent || tc.point == manager.CrashOutgoingMove
			if outgoing {
				if tc.moved {
					// libvirt moved the VM while the source was down.
					src.v.undefine(migVM)
					if err := src.sim.CloseDevice(hostDevice(rec)); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				run(func() { in, err = dst.m.PrepareIncoming(ctx, md, "", "") })
			}
			if tc.moved && !outgoing {
				if in.Instance.UUID == "" {
					if in.Instance, err = dst.m.Instance(rec.UUID); err != nil {
						t.Fatalf("destination instance: %v", err)
					}
					in.Device = hostDevice(in.Instance)
				}
				moveVM(t, src, dst, rec, in)
				run(func() {
					if tc.source {
						_ = src.m.CompleteOutgoing(ctx, rec.UUID)
					} else {
						_, _ = dst.m.CommitIncoming(ctx, rec.UUID)
					}
				})
			}
			if tc.abort {
				run(func() { _ = dst.m.AbortIncoming(ctx, rec.UUID) })
			}
			crashed.restart()
			if its := intents(t, crashed.env); len(its) != 0 {
				t.Fatalf("intents left after the restart: %+v", its)
			}
			_, ierr := crashed.m.Instance(rec.UUID)
			a := attachment(t, crashed.env, rec.UUID)
			if tc.kept != (ierr == nil) || tc.kept != (a != nil) {
				t.Fatalf("after the restart: instance %v, attachment %+v; want kept=%v", ierr, a, tc.kept)
			}
			assertConsistent(t, crashed.env)
		})
	}
}

// A reconcile while a migration is under way (on demand, a VM starting,
// libvirtd coming back) leaves it to its calls: neither the source's
// intent (its VM is still here) nor the destination's instance (its VM
// has not come yet) is resolved underneath.
func TestReconcileLeavesMigrationUnderWay(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	rec := src.running("A10-4Q")
	md, err := src.m.MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dst.m.PrepareIncoming(ctx, md, "", ""); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*migHost{src, dst} {
		if _, err := h.m.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if its := intents(t, h.env); len(its) != 1 {
			t.Fatalf("intents after a reconcile: %+v", its)
		}
		if _, err := h.m.Instance(rec.UUID); err != nil {
			t.Fatal(err)
		}
	}
}

// The destination's ends ask libvirt where the VM is: a commit while the
// VM here names another device is Conflict, an abort while it runs here
// with the instance's device is Busy; neither changes anything.
func TestIncomingEndsAskLibvirt(t *testing.T) {
	ctx := context.Background()
	src, dst := newMigHost(t, nil), newMigHost(t, nil)
	rec := src.running("L4-4Q")
	md, err := src.m.MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	in, err := dst.m.PrepareIncoming(ctx, md, "", "")
	if err != nil {
		t.Fatal(err)
	}
	dst.v.define(migVM, migVMUUID, rec.UUID, virt.Hostdev{Kind: virt.VF, PCI: "0000:81:00.7"})
	if _, err := dst.m.CommitIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("commit while the VM names another device: %v, want Conflict", err)
	}
	moveVM(t, src, dst, rec, in)
	if err := dst.m.AbortIncoming(ctx, rec.UUID); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("abort while the VM runs here with it: %v, want Busy", err)
	}
	if _, err := dst.m.Instance(rec.UUID); err != nil || len(intents(t, dst.env)) != 1 || attachment(t, dst.env, rec.UUID) != nil {
		t.Fatalf("a refused end changed the destination: %v, intents %+v", err, intents(t, dst.env))
	}
	if _, err := dst.m.CommitIncoming(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
}

// Calls that never come back: once the hold has passed, a reconcile
// resolves the migration by where libvirt has the VM, and a repeated
// call holds it again.
func TestMigrationHoldExpires(t *testing.T) {
	ctx := context.Background()
	src := newMigHostHolding(t, nil, 20*time.Millisecond)
	rec := src.running("L4-4Q")
	if _, err := src.m.MigrationSource(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	rep, err := src.m.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.Undone, rec.UUID) || len(intents(t, src.env)) != 0 || attachment(t, src.env, rec.UUID) == nil {
		t.Fatalf("after the hold, the VM still here: report %+v, intents %+v", rep, intents(t, src.env))
	}
	assertConsistent(t, src.env)
}

// libvirt finds a VM by its name: at the source's restart a domain of that
// name with another UUID is another VM, and the one that moved is gone.
func TestOutgoingNameReused(t *testing.T) {
	ctx := context.Background()
	src := newMigHost(t, nil)
	rec := src.running("L4-4Q")
	src.crash = func(at string) {
		if at == manager.CrashOutgoingIntent {
			runtime.Goexit()
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = src.m.MigrationSource(ctx, rec.UUID) }()
	<-done
	src.v.undefine(migVM)
	if err := src.sim.CloseDevice(hostDevice(rec)); err != nil {
		t.Fatal(err)
	}
	src.v.define(migVM, "5e4d3c2b-1a09-4f8e-8d7c-6b5a49382716", "")
	src.restart()
	if _, err := src.m.Instance(rec.UUID); !errors.Is(err, manager.ErrNotFound) || len(intents(t, src.env)) != 0 {
		t.Fatalf("after the restart: %v, intents %+v; want the instance released", err, intents(t, src.env))
	}
	assertConsistent(t, src.env)
}
