package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

const (
	// novaInterval and novaGrace are the daemons' sync interval and grace
	// period in TestFleetNovaFaults. The grace period is well beyond one
	// interval plus novaMargin, so that what converges only once grace
	// removed something does not pass for converging within an interval.
	novaInterval = 4 * time.Second
	novaGrace    = 40 * time.Second
	// novaMargin is, on top of one interval, what the pass itself takes
	// (after a wipe it publishes three trees again, and a Placement just
	// started may take seconds to answer on a loaded machine) and what a
	// check takes there (Placement reads, three vgpuctl runs).
	novaMargin = 15 * time.Second
	// nameStaleClaim is the D-Bus error name of a stale fleet claim (a
	// scheduler deletes its allocation and tries its next candidate).
	nameStaleClaim = "StaleClaim"
)

// novaLoadFlavors are the flavors the scheduler load asks for: documented
// forms (numbered groups) for every flow.
var novaLoadFlavors = []struct {
	profile string
	flavor  tplacement.Flavor
}{
	{"1g.10gb", novaFlavor("1g.10gb", tplacement.WithFramebuffer)},
	{"3g.40gb", novaFlavor("3g.40gb", tplacement.WithFramebuffer, "trait1:CUSTOM_VGPUD_MODEL_H100_SXM5_80GB", "required")},
	{"L4-4Q", novaFlavor("L4-4Q", tplacement.WithFramebuffer)},
	{"H100XM-8C", novaFlavor("H100XM-8C", tplacement.ClassAlone)},
	{"H100XM-2-20C", novaFlavor("H100XM-2-20C", tplacement.WithFramebuffer)},
}

// novaFlavor is profile's flavor from the one flavor table, in form, with
// extra specs kv added.
func novaFlavor(profile string, form tplacement.Form, kv ...string) tplacement.Flavor {
	s := tplacement.FlavorOf(profile).ExtraSpecs(fleet.ClassName, form)
	for k, v := range specs(kv...) {
		s[k] = v
	}
	return tplacement.Flavor{ExtraSpecs: s}
}

// novaReschedules is what Nova retries on another host: a stale claim
// (named StaleClaim; before that name, NoCapacity), a compute host that
// died under the build, and a build that failed on the host's side
// (BackendFailure: vgpud could not read the allocation in time, say, on a
// loaded Placement); Nova's compute raises RescheduledException for such a
// failed build and the conductor tries an alternate.
func novaReschedules(err error) bool {
	name := dbusapi.ErrorName(err)
	return name == nameStaleClaim || name == dbusapi.NameNoCapacity || name == dbusapi.NameBackendFailure || isGone(err)
}

// novaFleet is the fault test's fleet: Placement, the three hosts of
// fleetHosts (fleet-b reaches Placement through a proxy the test can cut
// or hold), Nova's driver and a scheduler on it.
type novaFleet struct {
	srv   *tplacement.Server
	proxy *tplacement.Proxy
	pc    *placementapi.Client
	hosts []*fleetDaemon
	nova  *tplacement.Nova
	sched *tplacement.NovaScheduler
}

func startNovaFleet(t *testing.T) *novaFleet {
	t.Helper()
	f := &novaFleet{srv: tplacement.Start(t)}
	var err error
	if f.pc, err = placementapi.New(placementapi.Config{Endpoint: f.srv.URL(), Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f.proxy = tplacement.StartProxy(t, f.srv)
	var nh []tplacement.NovaHost
	for _, h := range fleetHosts {
		endpoint := f.srv.URL()
		if h.name == "fleet-b" {
			endpoint = f.proxy.URL()
		}
		d := startFleetDaemonWith(t, h.name, h.spec, endpoint, novaInterval.String(), novaGrace.String(), "")
		f.hosts = append(f.hosts, d)
		nh = append(nh, d)
	}
	for _, d := range f.hosts {
		d.learnProviders(t)
	}
	f.nova = tplacement.StartNova(t, f.srv.URL())
	f.sched = &tplacement.NovaScheduler{Nova: f.nova, Hosts: nh, Reschedule: novaReschedules}
	awaitFleet(t, f.pc, f.hosts, 20*time.Second)
	return f
}

func (f *novaFleet) host(name string) *fleetDaemon {
	for _, d := range f.hosts {
		if d.name == name {
			return d
		}
	}
	panic(name)
}

// place schedules one instance of the i-th load flavor with Nova, trying
// first (when not nil) first.
func (f *novaFleet) place(t *testing.T, i int, first *fleetDaemon) (string, *fleetDaemon) {
	t.Helper()
	s := &tplacement.NovaScheduler{Nova: f.nova, Hosts: f.sched.Hosts, Reschedule: novaReschedules}
	if first != nil {
		s.First = first
	}
	id := uuid.NewString()
	h, _, err := s.Place(ctxFleet(t), novaLoadFlavors[i].flavor, novaLoadFlavors[i].profile, id, nil)
	if err != nil {
		t.Fatalf("nova: place %s: %v\n%s", novaLoadFlavors[i].profile, err, tailText(f.nova.Log.String(), 2000))
	}
	return id, h.(*fleetDaemon)
}

// reset brings the fleet back to a known state before a fault, whatever
// an earlier one left (so that each subtest stands alone): Placement up
// and reachable, every daemon running without a crash point, no instance
// and no allocation on the hosts, and the fleet converged.
func (f *novaFleet) reset(t *testing.T) {
	t.Helper()
	ctx := ctxFleet(t)
	f.proxy.Release()
	f.proxy.Restore()
	if !f.srv.Running() {
		if err := f.srv.Run(); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range f.hosts {
		select {
		case <-d.done:
			d.restart(t, "")
		default:
			if d.env != nil {
				d.stop(t)
				d.restart(t, "")
			}
		}
		insts, err := d.client.Instances(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range insts {
			if err := d.Destroy(ctx, in.UUID); err != nil {
				t.Fatalf("%s: destroy %s: %v", d.name, in.UUID, err)
			}
		}
	}
	holds, err := placementHolds(ctx, f.pc)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.hosts {
		for p := range d.providers {
			for consumer := range holds[p] {
				if err := f.pc.PutConsumer(ctx, consumer, placementapi.Consumer{}); err != nil && !errors.Is(err, placementapi.ErrNotFound) {
					t.Fatal(err)
				}
			}
		}
	}
	awaitFleet(t, f.pc, f.hosts, 30*time.Second)
}

// converged waits until the fleet converges, within one sync interval
// (and the margin) from now.
func (f *novaFleet) converged(t *testing.T, what string) {
	t.Helper()
	t.Logf("%s: converged in %s (sync interval %s, grace %s)", what, awaitFleet(t, f.pc, f.hosts, novaInterval+novaMargin), novaInterval, novaGrace)
}

// convergedExcept is converged, but the differences drop matches may
// remain (a grace case the caller bounds itself).
func (f *novaFleet) convergedExcept(t *testing.T, what string, drop func(string) bool) {
	t.Helper()
	start := time.Now()
	for {
		msg := filterLines(fleetDiffers(t, f.pc, f.hosts), drop)
		if msg == "" {
			t.Logf("%s: converged in %s (sync interval %s, grace %s)", what, time.Since(start).Round(time.Millisecond), novaInterval, novaGrace)
			return
		}
		if time.Since(start) > novaInterval+novaMargin {
			t.Fatalf("%s: Placement still differs from the hosts after %s:\n%s", what, novaInterval+novaMargin, msg)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestFleetNovaFaults: three vgpud processes, one real Placement and
// Nova's own scheduler code as the fleet's scheduler (claims at
// microversion 1.36, a stale or dead host's claim deleted and the same
// instance UUID rescheduled on the next host, up to three). Each fault is
// a subtest (runnable alone: -run 'TestFleetNovaFaults/stall'); after each,
// within one sync interval, vgpuctl fleet status names no difference on
// any host, no consumer is allocated on two hosts, every instance has its
// allocation and every allocation its instance (fleetDiffers). The only
// waits for the grace period are a scheduler's claim whose create never
// came (the stall; a scheduler that lost Placement between its claim and
// its delete while Placement was down), each bounded by grace plus one
// interval.
func TestFleetNovaFaults(t *testing.T) {
	f := startNovaFleet(t)
	t.Run("stall", func(t *testing.T) { f.reset(t); novaStall(t, f) })
	t.Run("stale", func(t *testing.T) { f.reset(t); novaStale(t, f) })
	t.Run("crash-create", func(t *testing.T) { novaCrashCreate(t, f) })
	t.Run("restart-window", func(t *testing.T) { f.reset(t); novaRestartWindow(t, f) })
	t.Run("placement-down", func(t *testing.T) { f.reset(t); novaPlacementDown(t, f) })
	t.Run("placement-wiped", func(t *testing.T) { f.reset(t); novaPlacementWiped(t, f) })
	f.reset(t)
	for _, h := range f.hosts {
		h.stopAndCheck(t)
	}
}

// novaStall: fleet-b carves a whole GPU while Placement is down (for it);
// before it can write that allocation, a scheduler claims the same GPU in
// Placement and dies without creating. The claim stays refused until
// grace removes the scheduler's allocation; meanwhile every other
// provider, consumer and local claim of the host goes on: a fleet create,
// a local create (its claim written before it returns) and a destroy (its
// allocation gone before it returns) on the host's other GPU, and the
// fleet equal to the hosts within one interval apart from that GPU.
func novaStall(t *testing.T, f *novaFleet) {
	b, ctx := f.host("fleet-b"), ctxFleet(t)
	gpuA, gpuB := "0000:41:00.0", "0000:42:00.0"
	provA := fleet.GPUProviderUUID(b.root, gpuA)
	// Something of the host's to destroy during the stall.
	doomed := uuid.NewString()
	if err := b.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: gpuB, UUID: doomed}); err != nil {
		t.Fatal(err)
	}
	f.converged(t, "before the stall")

	f.proxy.Cut()
	whole := uuid.NewString()
	if err := b.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: "passthrough", GPU: gpuA, UUID: whole}); err != nil {
		t.Fatalf("local create of a whole GPU while Placement is down: %v", err)
	}
	// The scheduler's claim on the same GPU, as a whole-GPU flavor asks it.
	claim := uuid.NewString()
	var cand tplacement.NovaCandidate
	cand.Allocations = map[string]struct {
		Resources map[string]int `json:"resources"`
	}{provA: {Resources: map[string]int{"CUSTOM_VGPUD_PASSTHROUGH": 1}}}
	if ok, err := f.nova.Claim(ctx, claim, cand, "1.36"); err != nil || !ok {
		t.Fatalf("the scheduler's claim on %s: %v, %v", provA, ok, err)
	}
	f.proxy.Restore()
	restored := time.Now()
	// Let a pass meet the refused write (the retry never waits longer than
	// an interval).
	time.Sleep(novaInterval)

	// The host's other work, while the whole GPU's allocation is refused.
	id, h := f.place(t, 0, b)
	if h != b {
		t.Logf("the fleet create went to %s, not %s", h.name, b.name)
	}
	local := uuid.NewString()
	if err := b.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: gpuB, UUID: local}); err != nil {
		t.Fatalf("local create beside the stalled claim: %v", err)
	}
	if !allocatedOnHost(t, f.pc, b, local) {
		t.Errorf("local create %s returned before its claim was written (Placement answers)", local)
	}
	if err := b.Destroy(ctx, doomed); err != nil {
		t.Fatal(err)
	}
	if allocatedOnHost(t, f.pc, b, doomed) {
		t.Errorf("destroy of %s returned with its allocation still in Placement", doomed)
	}
	// Within one interval: all but the contested GPU.
	contested := func(line string) bool {
		return strings.Contains(line, provA) || strings.Contains(line, b.name+"_pci_0000_41_00_0") ||
			strings.Contains(line, whole) || strings.Contains(line, claim)
	}
	f.convergedExcept(t, fmt.Sprintf("stall: the rest of the fleet (fleet create %s on %s, local %s)", id, h.name, local), contested)
	// The scheduler's claim goes after grace (counted from when the host
	// first saw it), and the whole GPU's allocation is written then.
	awaitFleet(t, f.pc, f.hosts, novaGrace+novaInterval+novaMargin)
	t.Logf("stall: the contested GPU converged %s after Placement answered again (grace %s)", time.Since(restored).Round(time.Millisecond), novaGrace)
	for _, x := range []string{whole, local} {
		if err := b.Destroy(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	f.converged(t, "after the stall's instances were destroyed")
}

// novaStale: two schedulers claim two vGPU types on fleet-a's empty
// time-sliced H100 at once; Placement takes both (their framebuffer fits),
// but the GPU locks to the first type carved (homogeneous mode). The
// second create is refused as a stale claim, by name (StaleClaim, so that
// Nova can tell "reschedule" from other refusals without reading prose),
// with a message naming the GPU and what holds it; Nova deletes its
// allocation and the same UUID is created on fleet-c.
func novaStale(t *testing.T, f *novaFleet) {
	a, ctx := f.host("fleet-a"), ctxFleet(t)
	gpu := "0000:61:00.0"
	prov := fleet.GPUProviderUUID(a.root, gpu)
	claim := func(profile, class string) (string, tplacement.NovaQuery) {
		q, err := f.nova.Query(ctx, tplacement.Flavor{ExtraSpecs: specs("resources1:"+class, "1")})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range q.Candidates {
			if _, ok := c.Allocations[prov]; ok {
				id := uuid.NewString()
				if ok, err := f.nova.Claim(ctx, id, c, q.Version); err != nil || !ok {
					t.Fatalf("claim %s on %s: %v, %v", profile, gpu, ok, err)
				}
				return id, q
			}
		}
		t.Fatalf("no candidate for %s on %s %s: %v", profile, a.name, gpu, q.Candidates)
		return "", q
	}
	first, _ := claim("H100XM-8C", "CUSTOM_VGPUD_H100XM_8C")
	second, q := claim("H100XM-4C", "CUSTOM_VGPUD_H100XM_4C")
	if err := a.CreateOn(ctx, first, "H100XM-8C", prov); err != nil {
		t.Fatal(err)
	}
	err := a.CreateOn(ctx, second, "H100XM-4C", prov)
	var de *dbusapi.Error
	if !errors.As(err, &de) || de.Name != nameStaleClaim {
		t.Errorf("a claim the host can no longer honour: %v; want the error %s", err, nameStaleClaim)
	} else if !strings.Contains(de.Message, gpu) || !strings.Contains(de.Message, first) {
		t.Errorf("the stale refusal names neither the GPU %s nor what holds it (%s): %s", gpu, first, de.Message)
	}
	// As Nova: the allocation deleted, the same UUID on the next host.
	if _, err := f.nova.Delete(ctx, second); err != nil {
		t.Fatal(err)
	}
	placed := false
	for _, c := range q.Candidates {
		if _, ok := c.Allocations[prov]; ok {
			continue
		}
		h, p := (&tplacement.NovaScheduler{Hosts: f.sched.Hosts}).HostOf(c)
		if h == nil {
			continue
		}
		if ok, err := f.nova.Claim(ctx, second, c, q.Version); err != nil || !ok {
			continue
		}
		if err := h.CreateOn(ctx, second, "H100XM-4C", p); err != nil {
			t.Fatalf("rescheduled on %s: %v", h.Name(), err)
		}
		placed = true
		break
	}
	if !placed {
		t.Fatal("no other host took the rescheduled instance")
	}
	f.converged(t, "a stale claim rescheduled")
}

// filterLines drops the lines drop matches.
func filterLines(msg string, drop func(string) bool) string {
	var keep []string
	for _, l := range strings.Split(msg, "\n") {
		if l != "" && !drop(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// allocatedOnHost reports whether Placement holds an allocation of
// consumer on one of d's GPU providers.
func allocatedOnHost(t *testing.T, pc *placementapi.Client, d *fleetDaemon, consumer string) bool {
	t.Helper()
	c, err := pc.Consumer(ctxFleet(t), consumer)
	if errors.Is(err, placementapi.ErrNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	for p := range c.Allocations {
		if d.providers[p] {
			return true
		}
	}
	return false
}

// novaCrashCreate: a fleet create on fleet-a is cut off by kill -9 at each
// step of the create; Nova, told the host died, deletes its allocation and
// reschedules the same instance UUID on another host. Started again, the
// host must not keep (or finish) the instance whose allocation is gone,
// and the fleet converges within one interval.
func novaCrashCreate(t *testing.T, f *novaFleet) {
	a := f.host("fleet-a")
	// A MIG-backed vGPU (H100XM-2-20C) goes through the GPU instance, the
	// VF's vGPU type and the record; a compute instance is a MIG
	// profile's (1g.10gb).
	for _, c := range []struct {
		point  string
		flavor int
	}{
		{manager.CrashCreateIntent, 4}, {manager.CrashCreateGI, 4}, {manager.CrashCreateCI, 0},
		{manager.CrashCreateVGPU, 4}, {manager.CrashCreateCommit, 4},
	} {
		point, flavor := c.point, c.flavor
		t.Run(point, func(t *testing.T) {
			f.reset(t)
			ctx := ctxFleet(t)
			logFrom := fileSize(t, a.logPath)
			a.stop(t)
			a.restart(t, point)
			s := &tplacement.NovaScheduler{Nova: f.nova, Hosts: f.sched.Hosts, Reschedule: novaReschedules, First: a}
			id := uuid.NewString()
			h, _, err := s.Place(ctx, novaLoadFlavors[flavor].flavor, novaLoadFlavors[flavor].profile, id, nil)
			if err != nil {
				t.Fatalf("nova: %v", err)
			}
			select {
			case <-a.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: no crash at %s within 30s (the create went to %s):\n%s", a.name, point, h.Name(), tailText(a.log()[logFrom:], 3000))
			}
			if !strings.Contains(a.log()[logFrom:], "crash point "+point+" reached") {
				t.Fatalf("%s died, but not at %s:\n%s", a.name, point, tailText(a.log()[logFrom:], 3000))
			}
			if h == tplacement.NovaHost(a) || s.Rescheduled.Load() == 0 {
				t.Fatalf("the create was not rescheduled away from %s (on %s, %d rescheduled)", a.name, h.Name(), s.Rescheduled.Load())
			}
			a.restart(t, "")
			f.converged(t, fmt.Sprintf("crash at %s, rescheduled on %s, restarted", point, h.Name()))
			insts, err := a.client.Instances(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range insts {
				if in.UUID == id {
					t.Errorf("%s kept %s, whose allocation the scheduler deleted and rescheduled on %s", a.name, id, h.Name())
				}
			}
			if err := h.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			f.converged(t, "after the rescheduled instance's destroy")
		})
	}
}

// novaRestartWindow: fleet-b restarts while its Placement requests are
// held, so its first pass waits; destroys sent as soon as its D-Bus name
// is up land between readiness and that pass. Their allocations must go
// within one interval, not after grace.
func novaRestartWindow(t *testing.T, f *novaFleet) {
	b, ctx := f.host("fleet-b"), ctxFleet(t)
	var ids []string
	// Up to 8 tries for 3 creates on fleet-b: a try Nova rescheduled
	// elsewhere (fleet-b's build failed) is destroyed there.
	for try := 0; try < 8 && len(ids) < 3; try++ {
		id, h := f.place(t, 0, b)
		if h != b {
			if err := h.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ids = append(ids, id)
	}
	if len(ids) < 2 {
		t.Fatalf("only %d fleet creates landed on %s", len(ids), b.name)
	}
	f.converged(t, "before the restart")
	b.stop(t)
	f.proxy.Hold()
	released := time.AfterFunc(2*time.Second, f.proxy.Release)
	defer released.Stop()
	b.restart(t, "")
	var wg sync.WaitGroup
	errs := make([]error, len(ids)-1)
	for i, id := range ids[:len(ids)-1] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.Destroy(ctx, id)
		}()
	}
	wg.Wait()
	f.proxy.Release()
	for i, err := range errs {
		if err != nil {
			t.Errorf("destroy of %s in the restart window: %v", ids[i], err)
		}
	}
	f.converged(t, fmt.Sprintf("%d destroys in the restart window", len(ids)-1))
	if err := b.Destroy(ctx, ids[len(ids)-1]); err != nil {
		t.Fatal(err)
	}
}

// novaPlacementDown: Placement stopped for 20 s while Nova schedulers and
// local workers create and destroy on every host. Local operations all
// succeed while it is down; once it answers the fleet converges within
// one interval.
func novaPlacementDown(t *testing.T, f *novaFleet) {
	load := &fleetLoad{}
	f.scheduleNova(load, 4)
	for _, h := range f.hosts {
		load.localOps(h, roomyProfiles[h.name])
	}
	time.Sleep(2 * time.Second)
	f.srv.Stop()
	load.down.Store(true)
	time.Sleep(20 * time.Second)
	load.stop()
	for _, x := range load.downFailures {
		t.Errorf("a local operation failed while Placement was down: %s", x)
	}
	if load.downOps.Load() == 0 || load.unreachable.Load() == 0 {
		t.Fatalf("the outage saw %d local operations, %d scheduler attempts: it tested nothing", load.downOps.Load(), load.unreachable.Load())
	}
	if err := f.srv.Run(); err != nil {
		t.Fatal(err)
	}
	// A scheduler whose claim went through just before Placement stopped,
	// and whose create or delete then failed, leaves its claim: an orphan
	// only grace removes (the one grace case here, bounded below).
	unsettled := f.sched.Unsettled()
	what := fmt.Sprintf("Placement down 20s (%d local operations meanwhile, %d scheduler attempts that did not reach it, %d claims left by them)",
		load.downOps.Load(), load.unreachable.Load(), len(unsettled))
	f.convergedExcept(t, what, func(line string) bool {
		for _, c := range unsettled {
			if strings.Contains(line, c) {
				return true
			}
		}
		return false
	})
	if len(unsettled) > 0 {
		start := time.Now()
		awaitFleet(t, f.pc, f.hosts, novaGrace+novaInterval+novaMargin)
		t.Logf("the claims left by schedulers went %s later (grace %s)", time.Since(start).Round(time.Millisecond), novaGrace)
	}
}

// scheduleNova runs workers Nova schedulers until the load stops; each
// keeps at most one instance.
func (f *novaFleet) scheduleNova(l *fleetLoad, workers int) {
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 11))
			var prevID string
			var prev tplacement.NovaHost
			for !l.stopped.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				fl := novaLoadFlavors[rnd.IntN(len(novaLoadFlavors))]
				id := uuid.NewString()
				h, _, err := f.sched.Place(ctx, fl.flavor, fl.profile, id, rnd)
				switch {
				case err == nil:
					if prev != nil {
						_ = l.op(fmt.Sprintf("scheduler: destroy %s on %s", prevID, prev.Name()), func() error { return prev.Destroy(ctx, prevID) })
					}
					prevID, prev = id, h
				case errors.Is(err, tplacement.ErrNoValidHost):
				case l.down.Load():
					l.unreachable.Add(1)
					time.Sleep(200 * time.Millisecond)
				default:
					l.placementErrs.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
				cancel()
			}
		}()
	}
}

// novaPlacementWiped: Placement restarted on an empty database with
// instances (local ones and Nova's) on the hosts: the trees and every
// allocation are back within one interval.
func novaPlacementWiped(t *testing.T, f *novaFleet) {
	// Nova's instances among them.
	for _, i := range []int{0, 2} {
		f.place(t, i, nil)
	}
	for _, d := range f.hosts {
		if err := d.create(ctxFleet(t), dbusapi.CreateRequest{Tenant: "acme", Profile: roomyProfiles[d.name][0]}); err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
	}
	n := instanceCount(t, f.hosts)
	if err := f.srv.Wipe(); err != nil {
		t.Fatal(err)
	}
	f.converged(t, fmt.Sprintf("Placement wiped with %d instances on the hosts", n))
}
