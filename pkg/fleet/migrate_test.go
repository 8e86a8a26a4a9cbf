package fleet

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/virt"
)

// Moving a VM between two hosts of one Placement: the allocation moves
// as Nova moves it (docs/fleet.md, "Moving a VM").

// fakeVirt is one host's libvirt: the domains defined there and the
// hostdevs their definitions name.
type fakeVirt struct {
	mu   sync.Mutex
	doms map[string]*fakeDom
}

type fakeDom struct {
	name, uuid string
	devs       []virt.Attached
}

func (v *fakeVirt) find(ref string) (*fakeDom, error) {
	if d, ok := v.doms[ref]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("domain %s: %w", ref, virt.ErrDomainNotFound)
}

func (v *fakeVirt) define(name, uuid, instance string, devs ...virt.Hostdev) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d := &fakeDom{name: name, uuid: uuid}
	for _, h := range devs {
		d.devs = append(d.devs, virt.Attached{Instance: instance, Hostdev: h, Config: true, Live: true, MetadataConfig: true, MetadataLive: true})
	}
	v.doms[name] = d
}

func (v *fakeVirt) undefine(name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.doms, name)
}

func (v *fakeVirt) URI() string { return "qemu:///system" }
func (v *fakeVirt) Domain(_ context.Context, ref string) (virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return virt.Domain{}, err
	}
	return virt.Domain{Name: d.name, UUID: d.uuid, Running: true, Persistent: true}, nil
}
func (v *fakeVirt) Attach(_ context.Context, ref string, h virt.Hostdev, instance string) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return false, err
	}
	d.devs = append(d.devs, virt.Attached{Instance: instance, Hostdev: h, Config: true, Live: true, MetadataConfig: true, MetadataLive: true})
	return true, nil
}
func (v *fakeVirt) Detach(_ context.Context, ref string, h virt.Hostdev, _ string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return err
	}
	d.devs = slices.DeleteFunc(d.devs, func(a virt.Attached) bool { return a.Hostdev == h })
	return nil
}
func (v *fakeVirt) Attached(_ context.Context, ref string) ([]virt.Attached, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	d, err := v.find(ref)
	if err != nil {
		return nil, err
	}
	return slices.Clone(d.devs), nil
}
func (v *fakeVirt) Domains(context.Context) ([]virt.Domain, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []virt.Domain
	for _, d := range v.doms {
		out = append(out, virt.Domain{Name: d.name, UUID: d.uuid, Running: true, Persistent: true})
	}
	return out, nil
}
func (v *fakeVirt) Events(context.Context) <-chan virt.Event { return nil }
func (v *fakeVirt) Quiesce(context.Context) error            { return nil }

// migHost is a crashHost with its libvirt.
type migHost struct {
	*crashHost
	v *fakeVirt
}

func startMigHost(t *testing.T, name string, c *placementapi.Client) *migHost {
	t.Helper()
	mh := &migHost{crashHost: &crashHost{host: host{name: name}}, v: &fakeVirt{doms: map[string]*fakeDom{}}}
	ch := mh.crashHost
	ch.h = simhost.Start(t, simhost.Options{
		Manager: manager.Config{Crash: ch.crash, Virt: mh.v, BusyRetry: 1, Logger: quietLog(t)},
		BeforeReconcile: func(m *manager.Manager) {
			s, err := New(Config{Host: name, Grace: time.Hour}, c, m, quietLog(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			ch.s = s
			m.SetFleet(s)
		},
	})
	simhost.DefineTenant(t, ch.h.Manager, "acme")
	return mh
}

func (h *migHost) m() *manager.Manager { return h.h.Manager }

const (
	fleetVM     = "web1"
	fleetVMUUID = "3d1c5e7a-8b2f-4c6d-9e0a-1b2c3d4e5f61"
)

func devOf(rec store.Instance) virt.Hostdev {
	if rec.Flow == store.FlowMdev {
		return virt.Hostdev{Kind: virt.Mdev, MdevUUID: rec.MdevUUID}
	}
	return virt.Hostdev{Kind: virt.VF, PCI: rec.VF}
}

func deviceOf(rec store.Instance) string {
	if rec.Flow == store.FlowMdev {
		return rec.MdevUUID
	}
	return rec.VF
}

// running creates an L4-4Q on h (a local create: claimed first), attached
// to the running VM.
func (h *migHost) running(t *testing.T) store.Instance {
	t.Helper()
	ctx := context.Background()
	h.v.define(fleetVM, fleetVMUUID, "")
	rec, err := h.m().Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m().Attach(ctx, rec.UUID, fleetVM, manager.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.h.Sim.OpenDevice(deviceOf(rec), fleetVMUUID, fleetVM); err != nil {
		t.Fatal(err)
	}
	return rec
}

// moveVM is libvirt's migration: the domain defined on dst naming the
// destination's device, gone from src.
func moveVM(t *testing.T, src, dst *migHost, from store.Instance, in manager.Incoming) {
	t.Helper()
	dst.v.define(fleetVM, fleetVMUUID, in.Instance.UUID, devOf(in.Instance))
	if err := dst.h.Sim.OpenDevice(in.Device, fleetVMUUID, fleetVM); err != nil {
		t.Fatal(err)
	}
	src.v.undefine(fleetVM)
	if err := src.h.Sim.CloseDevice(deviceOf(from)); err != nil {
		t.Fatal(err)
	}
}

// cut runs op on h, which dies at point (false: op ran to its end).
func (h *migHost) cut(point string, op func()) bool {
	h.mu.Lock()
	h.at = point
	h.mu.Unlock()
	done := make(chan struct{})
	finished := false
	go func() {
		defer close(done)
		op()
		finished = true
	}()
	<-done
	h.mu.Lock()
	h.at = ""
	h.mu.Unlock()
	return !finished
}

// holder is the one host whose provider holds consumer in Placement ("":
// none), failing when several do or the consumer holds anything on a
// provider of neither host.
func holder(t *testing.T, c *placementapi.Client, consumer string, hosts ...*migHost) string {
	t.Helper()
	cons, err := c.Consumer(context.Background(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for pu := range cons.Allocations {
		found := ""
		for _, h := range hosts {
			for _, g := range h.h.Manager.Inventory().GPUs {
				if GPUProviderUUID(h.s.top(), g.PCI) == pu {
					found = h.name
				}
			}
		}
		if found == "" {
			t.Fatalf("consumer %s holds %v on provider %s of neither host", consumer, cons.Allocations[pu].Resources, pu)
		}
		on = append(on, found)
	}
	if len(on) > 1 {
		t.Fatalf("consumer %s is allocated on %v: on two hosts", consumer, on)
	}
	if len(on) == 0 {
		return ""
	}
	return on[0]
}

// settled checks that Placement equals both hosts' records, that the
// instance is allocated only on want's host and that no migration consumer
// is left, and that fleet status is clean on both.
func settled(t *testing.T, c *placementapi.Client, id string, want *migHost, hosts ...*migHost) {
	t.Helper()
	var hs []*host
	for _, h := range hosts {
		hs = append(hs, &h.host)
	}
	converged(t, c, hs...)
	wantName := ""
	if want != nil {
		wantName = want.name
	}
	if got := holder(t, c, id, hosts...); got != wantName {
		t.Fatalf("instance %s is allocated on %q, want only on %q", id, got, wantName)
	}
	for _, h := range hosts {
		if _, err := h.m().Instance(id); (err == nil) != (h == want) {
			t.Fatalf("%s has instance %s: %v, want %v", h.name, id, err == nil, h == want)
		}
		view, err := h.m().FleetView()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range view {
			for _, r := range g.Records {
				if r.Record.MigrationConsumer != "" {
					t.Fatalf("%s: record %s still names migration consumer %s", h.name, r.Record.UUID, r.Record.MigrationConsumer)
				}
			}
		}
		st, err := h.s.Status(context.Background())
		if err != nil || len(st.Differences) != 0 {
			t.Fatalf("%s: fleet status: %+v %v", h.name, st.Differences, err)
		}
	}
}

// migrationConsumerOf is the consumer the source's allocation of id is
// held under while it moves ("" none).
func migrationConsumerOf(t *testing.T, h *migHost, id string) string {
	t.Helper()
	rec, err := h.m().Instance(id)
	if err != nil {
		t.Fatal(err)
	}
	return rec.MigrationConsumer
}

// TestFleetMigrationMovesAllocation: a VM moving with its vGPU moves its
// allocation as Nova's does: at MigrationSource the source's allocation
// moves in one request to a migration consumer, the destination claims the
// instance on its GPU before carving, and CompleteOutgoing removes the
// migration consumer: the instance is allocated on the destination alone.
// A pass at every step writes nothing under the instance on the source.
func TestFleetMigrationMovesAllocation(t *testing.T) {
	_, c := startPlacement(t)
	ctx := context.Background()
	src, dst := startMigHost(t, "mig-src", c), startMigHost(t, "mig-dst", c)
	src.pass(t)
	dst.pass(t)
	rec := src.running(t)
	settled(t, c, rec.UUID, src, src, dst)

	md, err := src.m().MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if got := holder(t, c, rec.UUID, src, dst); got != "" {
		t.Fatalf("instance still allocated on %s after MigrationSource", got)
	}
	mc := migrationConsumerOf(t, src, rec.UUID)
	if mc == "" || mc == rec.UUID {
		t.Fatalf("migration consumer %q", mc)
	}
	if got := holder(t, c, mc, src, dst); got != src.name {
		t.Fatalf("migration consumer allocated on %q, want %s", got, src.name)
	}
	cons, err := c.Consumer(ctx, mc)
	if err != nil || cons.ConsumerType != MigrationConsumerType {
		t.Fatalf("migration consumer: %+v %v", cons, err)
	}
	src.pass(t)
	if got := holder(t, c, rec.UUID, src, dst); got != "" {
		t.Fatalf("a pass on the source wrote the instance's allocation again (on %s)", got)
	}
	in, err := dst.m().PrepareIncoming(ctx, md, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := holder(t, c, rec.UUID, src, dst); got != dst.name {
		t.Fatalf("after PrepareIncoming the instance is allocated on %q, want %s", got, dst.name)
	}
	src.pass(t)
	dst.pass(t)
	if got := holder(t, c, rec.UUID, src, dst); got != dst.name {
		t.Fatalf("after the passes the instance is allocated on %q, want %s", got, dst.name)
	}
	moveVM(t, src, dst, rec, in)
	if _, err := dst.m().CommitIncoming(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	if err := src.m().CompleteOutgoing(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	if got := holder(t, c, mc, src, dst); got != "" {
		t.Fatalf("migration consumer still allocated on %s after CompleteOutgoing", got)
	}
	settled(t, c, rec.UUID, dst, src, dst)
}

// TestFleetMigrationAborted: libvirt gave up: AbortIncoming removes the
// destination's claim and CancelOutgoing moves the migration consumer's
// allocation back to the instance on the source.
func TestFleetMigrationAborted(t *testing.T) {
	_, c := startPlacement(t)
	ctx := context.Background()
	src, dst := startMigHost(t, "abort-src", c), startMigHost(t, "abort-dst", c)
	src.pass(t)
	dst.pass(t)
	rec := src.running(t)
	md, err := src.m().MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	mc := migrationConsumerOf(t, src, rec.UUID)
	if _, err := dst.m().PrepareIncoming(ctx, md, "", ""); err != nil {
		t.Fatal(err)
	}
	if err := dst.m().AbortIncoming(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	if got := holder(t, c, rec.UUID, src, dst); got != "" {
		t.Fatalf("after AbortIncoming the instance is allocated on %s", got)
	}
	if err := src.m().CancelOutgoing(ctx, rec.UUID); err != nil {
		t.Fatal(err)
	}
	if got := holder(t, c, rec.UUID, src, dst); got != src.name {
		t.Fatalf("after CancelOutgoing the instance is allocated on %q, want %s", got, src.name)
	}
	if got := holder(t, c, mc, src, dst); got != "" {
		t.Fatalf("migration consumer still allocated on %s", got)
	}
	settled(t, c, rec.UUID, src, src, dst)
}

// TestFleetMigrationCrashPoints: either end killed at each crash point of
// a migration, restarted (its reconcile resolves the migration by where
// libvirt has the VM) and the migration ended as vgpuctl migrate run ends
// it (the calls of the other end, which answer again on the restarted
// one): after the passes Placement equals both hosts' records, the
// instance allocated only where it is, the migration consumer gone.
func TestFleetMigrationCrashPoints(t *testing.T) {
	_, c := startPlacement(t)
	ctx := context.Background()
	type step struct {
		point string
		// dst: the destination dies (else the source); moved: libvirt
		// moved the VM (before the crash, or while the host was down).
		dst, moved bool
	}
	steps := []step{
		{manager.CrashOutgoingIntent, false, false},
		{manager.CrashOutgoingMove, false, false},
		// libvirt moved the VM while the source was down, with no
		// destination's instance: the source releases it, and it is
		// allocated nowhere.
		{manager.CrashOutgoingMove, false, true},
		{manager.CrashIncomingIntent, true, false},
		{manager.CrashIncomingCarve, true, false},
		{manager.CrashIncomingCarve, true, true},
		{manager.CrashIncomingCommit, true, true},
		{manager.CrashMigrationRelease, false, true}, // CompleteOutgoing
		{manager.CrashMigrationRelease, true, false}, // AbortIncoming
	}
	for i, st := range steps {
		t.Run(fmt.Sprintf("%s/dst=%v,moved=%v", st.point, st.dst, st.moved), func(t *testing.T) {
			src, dst := startMigHost(t, fmt.Sprintf("c%d-src", i), c), startMigHost(t, fmt.Sprintf("c%d-dst", i), c)
			src.pass(t)
			dst.pass(t)
			rec := src.running(t)
			dying := src
			if st.dst {
				dying = dst
			}
			var md manager.MigrationMetadata
			var in manager.Incoming
			var err error
			// The migration up to the crash, as vgpuctl migrate run makes it.
			cut := false
			run := func(h *migHost, op func()) {
				if cut {
					return
				}
				if h == dying {
					cut = h.cut(st.point, op)
					return
				}
				op()
			}
			must := func(err error) {
				if err != nil {
					t.Error(err)
				}
			}
			run(src, func() { md, err = src.m().MigrationSource(ctx, rec.UUID); must(err) })
			run(dst, func() { in, err = dst.m().PrepareIncoming(ctx, md, "", ""); must(err) })
			if st.moved {
				if !cut {
					moveVM(t, src, dst, rec, in)
				}
				run(dst, func() { _, err = dst.m().CommitIncoming(ctx, rec.UUID); must(err) })
				run(src, func() { must(src.m().CompleteOutgoing(ctx, rec.UUID)) })
			} else {
				run(dst, func() { must(dst.m().AbortIncoming(ctx, rec.UUID)) })
				run(src, func() { must(src.m().CancelOutgoing(ctx, rec.UUID)) })
			}
			if t.Failed() {
				t.FailNow()
			}
			if !cut {
				t.Fatalf("never reached %s", st.point)
			}
			nowhere := false
			if _, err := src.v.Domain(ctx, fleetVM); st.moved && err == nil {
				// libvirt moves the VM while the host is down.
				if got, err := dst.m().Instance(rec.UUID); err == nil {
					in = manager.Incoming{Instance: got, Device: deviceOf(got)}
					moveVM(t, src, dst, rec, in)
				} else {
					nowhere = true
					src.v.undefine(fleetVM)
					if err := src.h.Sim.CloseDevice(deviceOf(rec)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := dying.h.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			if nowhere {
				settled(t, c, rec.UUID, nil, src, dst)
				return
			}
			// The migration's other calls, answered again by the end that
			// resolved its part at restart.
			if st.moved {
				if _, err := dst.m().CommitIncoming(ctx, rec.UUID); err != nil {
					t.Fatal(err)
				}
				if err := src.m().CompleteOutgoing(ctx, rec.UUID); err != nil {
					t.Fatal(err)
				}
				settled(t, c, rec.UUID, dst, src, dst)
				return
			}
			if err := dst.m().AbortIncoming(ctx, rec.UUID); err != nil {
				t.Fatal(err)
			}
			if err := src.m().CancelOutgoing(ctx, rec.UUID); err != nil {
				t.Fatal(err)
			}
			settled(t, c, rec.UUID, src, src, dst)
		})
	}
}

// TestFleetMigrationPlacementDown: a Placement that does not answer fails
// none of the migration's calls (each tells its caller that Placement
// lags); once it answers again the passes converge: the instance
// allocated on the destination alone, no migration consumer left.
func TestFleetMigrationPlacementDown(t *testing.T) {
	srv, c := startPlacement(t)
	src, dst := startMigHost(t, "down-src", c), startMigHost(t, "down-dst", c)
	src.pass(t)
	dst.pass(t)
	rec := src.running(t)
	settled(t, c, rec.UUID, src, src, dst)
	srv.Stop()
	ctx, outcome := manager.WithPlacementOutcome(context.Background())
	md, err := src.m().MigrationSource(ctx, rec.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if outcome.Behind() == "" {
		t.Fatal("MigrationSource did not say Placement lags")
	}
	in, err := dst.m().PrepareIncoming(context.Background(), md, "", "")
	if err != nil {
		t.Fatal(err)
	}
	moveVM(t, src, dst, rec, in)
	if _, err := dst.m().CommitIncoming(context.Background(), rec.UUID); err != nil {
		t.Fatal(err)
	}
	if err := src.m().CompleteOutgoing(context.Background(), rec.UUID); err != nil {
		t.Fatal(err)
	}
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	settled(t, c, rec.UUID, dst, src, dst)
}
