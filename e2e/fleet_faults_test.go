package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/internal/invariant"
	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/discover"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/placementapi"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// faultInterval is the daemons' sync interval in TestFleetDaemonFaults:
// after an outage, Placement must equal the hosts within one interval of
// answering again (the retry while it is down never waits longer).
const faultInterval = 5 * time.Second

// roomyProfiles are, per host, a profile its local worker can always
// create while the outage lasts: the schedulers hold at most four
// instances and the worker three, which a time-sliced H100 (ten 8C) or
// two MIG H100s hold whatever the schedulers took.
var roomyProfiles = map[string][]string{
	"fleet-a": {"H100XM-8C"},
	"fleet-b": {"1g.10gb"},
	"fleet-c": {"H100XM-8C"},
}

// fleetLoad is work on the fleet while a fault happens: schedulers
// placing and destroying through Placement (each keeps at most one
// instance), and local workers creating and destroying over D-Bus (each
// keeps at most two).
type fleetLoad struct {
	stopped atomic.Bool
	// down is set while Placement is down: the local operations started
	// then must all succeed.
	down atomic.Bool
	wg   sync.WaitGroup
	// unreachable counts the scheduler attempts that failed to reach
	// Placement, placementErrs those Placement refused otherwise (e.g. a
	// 500 while it stops).
	unreachable, placementErrs atomic.Int64
	mu                         sync.Mutex
	// failures are the local operations that failed, by name; downFailures
	// those of them started while Placement was down.
	failures, downFailures []string
	// downOps counts the local operations started while Placement was down.
	downOps atomic.Int64
}

// op runs one local operation and notes how it ended.
func (l *fleetLoad) op(what string, do func() error) error {
	down := l.down.Load()
	if down {
		l.downOps.Add(1)
	}
	err := do()
	if err != nil {
		msg := fmt.Sprintf("%s: %v", what, err)
		l.mu.Lock()
		l.failures = append(l.failures, msg)
		if down {
			l.downFailures = append(l.downFailures, msg)
		}
		l.mu.Unlock()
	}
	return err
}

// localOps creates (profiles in turn) and destroys on d until the load
// stops.
func (l *fleetLoad) localOps(d *fleetDaemon, profiles []string) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		var live []string
		for i := 0; !l.stopped.Load(); i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			id, prof := uuid.NewString(), profiles[i%len(profiles)]
			err := l.op(fmt.Sprintf("%s: local create of %s %s", d.name, prof, id), func() error {
				return d.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: prof, UUID: id})
			})
			if err != nil {
				time.Sleep(50 * time.Millisecond)
			} else {
				live = append(live, id)
			}
			if len(live) > 2 {
				_ = l.op(fmt.Sprintf("%s: local destroy of %s", d.name, live[0]), func() error { return d.Destroy(ctx, live[0]) })
				live = live[1:]
			}
			cancel()
		}
	}()
}

// schedule runs workers schedulers until the load stops.
func (l *fleetLoad) schedule(s *tplacement.Scheduler, workers int) {
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			var prevID string
			var prev tplacement.Host
			for !l.stopped.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				id, h, err := s.Place(ctx, fleetRequests[rnd.IntN(len(fleetRequests))], rnd)
				switch {
				case errors.Is(err, tplacement.ErrFull):
				case errors.Is(err, placementapi.ErrUnreachable):
					l.unreachable.Add(1)
				case err != nil:
					// Place's errors are Placement's (a refused create is
					// counted as stale): no local operation failed.
					l.placementErrs.Add(1)
					time.Sleep(50 * time.Millisecond)
				default:
					if prev != nil {
						_ = l.op(fmt.Sprintf("scheduler: destroy %s on %s", prevID, prev.Name()), func() error { return prev.Destroy(ctx, prevID) })
					}
					prevID, prev = id, h
				}
				cancel()
			}
		}()
	}
}

// stop ends the load, every operation in flight finished.
func (l *fleetLoad) stop() {
	l.stopped.Store(true)
	l.wg.Wait()
}

// instanceCount is how many instances the hosts hold.
func instanceCount(t *testing.T, hosts []*fleetDaemon) int {
	t.Helper()
	n := 0
	for _, h := range hosts {
		insts, err := h.client.Instances(ctxFleet(t), "")
		if err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
		n += len(insts)
	}
	return n
}

// TestFleetDaemonFaults: the faults of the fleet's Placement integration,
// on three vgpud processes and one real Placement. Two schedulers race
// for the last 3g slot of a GPU: one wins on the host. Placement is
// stopped for 30 s while schedulers and local creates and destroys run:
// every local operation succeeds, and once Placement answers again it
// equals the hosts within one sync interval, or two for a scheduler's
// claim left in the outage (grace), and a 5 s margin. Placement restarted on an
// empty database gets the tree and every allocation back. Then a daemon
// dies by itself (VGPUD_CRASH_AT) at each crash point of the sync pass,
// under load; started again, the fleet converges, and its host has
// neither leaked a device nor lost a record.
func TestFleetDaemonFaults(t *testing.T) {
	srv, pc, hosts, sched := startFleet(t, faultInterval.String())
	raceForLastSlot(t, pc, hosts)

	// Placement stopped for 30 s under load.
	load := &fleetLoad{}
	load.schedule(&tplacement.Scheduler{C: pc, Hosts: sched}, 4)
	for _, h := range hosts {
		load.localOps(h, roomyProfiles[h.name])
	}
	time.Sleep(2 * time.Second)
	srv.Stop()
	load.down.Store(true)
	time.Sleep(30 * time.Second)
	load.stop()
	// Before the stop, Placement may refuse a claim the schedulers got
	// first (NoCapacity, or StaleClaim for a scheduler's claim): that is the fleet at work, not a failure.
	for _, f := range load.downFailures {
		t.Errorf("a local operation failed while Placement was down: %s", f)
	}
	during := load.downOps.Load()
	if during == 0 || load.unreachable.Load() == 0 {
		t.Fatalf("the outage saw %d local operations, %d scheduler attempts: it tested nothing", during, load.unreachable.Load())
	}
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	// One interval for the first pass after Placement answers; a claim a
	// scheduler left when Placement went away between its claim and its
	// delete (the outage's one grace case) is first seen by that pass and
	// removed by the pass after grace (3 s): one more interval. The margin
	// is for a loaded machine.
	took := awaitFleet(t, pc, hosts, 2*faultInterval+5*time.Second)
	t.Logf("Placement down 30s: %d local operations started while it was down, %d failed; %d scheduler attempts did not reach it (%d other Placement errors; %d local operations refused before it stopped); "+
		"converged %s after it answered (sync interval %s)", during, len(load.downFailures), load.unreachable.Load(), load.placementErrs.Load(),
		len(load.failures)-len(load.downFailures), took, faultInterval)

	// Placement restarted on an empty database.
	n := instanceCount(t, hosts)
	if n == 0 {
		t.Fatal("no instance before the wipe: it would test nothing")
	}
	if err := srv.Wipe(); err != nil {
		t.Fatal(err)
	}
	// The first pass after the wipe publishes every provider, resource
	// class and allocation of three hosts again into one sqlite Placement
	// (about seventy classes a host): seconds on an idle machine, three
	// times that on two cores the whole e2e suite loads.
	t.Logf("Placement wiped with %d instances on the hosts: tree and allocations back %s after it answered",
		n, awaitFleet(t, pc, hosts, faultInterval+25*time.Second))

	crashInSync(t, pc, hosts, sched)
}

// raceForLastSlot: a GPU with one 3g slot left; two schedulers claim it
// and create through the daemon at once. Exactly one wins on the host,
// and after the sync Placement holds only what the host honours.
func raceForLastSlot(t *testing.T, pc *placementapi.Client, hosts []*fleetDaemon) {
	b, ctx := hosts[1], ctxFleet(t)
	gpuPCI := "0000:41:00.0"
	if err := b.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: gpuPCI}); err != nil {
		t.Fatal(err)
	}
	awaitFleet(t, pc, hosts, 20*time.Second)
	prov := fleet.GPUProviderUUID(b.root, gpuPCI)
	inv, _, err := pc.Inventories(ctx, prov)
	if err != nil || inv["CUSTOM_VGPUD_MIG_3G_40GB"].Total != 2 {
		t.Fatalf("3g inventory with one 3g carved = %v, %v; want a total of 2 (one slot left)", inv, err)
	}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uuid.NewString()
			errs[i] = pc.PutConsumer(ctx, id, placementapi.Consumer{ProjectID: "fleet", UserID: "scheduler", ConsumerType: "INSTANCE",
				Allocations: map[string]placementapi.Allocation{prov: {Resources: map[string]int{"CUSTOM_VGPUD_MIG_3G_40GB": 1, fleet.SliceClass: 4}}}})
			if errs[i] == nil {
				if errs[i] = b.Create(ctx, id, "3g.40gb"); errs[i] != nil {
					_ = pc.PutConsumer(ctx, id, placementapi.Consumer{}) // the loser's claim, as a scheduler drops it
				}
			}
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, placementapi.ErrCapacity), errors.Is(err, placementapi.ErrConflict), dbusapi.ErrorName(err) == dbusapi.NameNoCapacity, dbusapi.ErrorName(err) == dbusapi.NameStaleClaim:
		default:
			t.Fatalf("unexpected refusal in the race for the last 3g slot: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d schedulers won the last 3g slot (%v), want 1", won, errs)
	}
	t.Logf("race for the last 3g slot: one won (%v); converged in %s", errs, awaitFleet(t, pc, hosts, 20*time.Second))
	// The GPU's room back for the load that follows.
	insts, err := b.client.Instances(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if err := b.Destroy(ctx, in.UUID); err != nil {
			t.Fatal(err)
		}
	}
}

// crashInSync makes one daemon die by itself at each crash point of the
// sync pass while local creates and destroys run on it and schedulers on
// the fleet; started again without the crash point, the fleet converges
// and the host keeps its invariants (checkHost, with the daemon stopped).
func crashInSync(t *testing.T, pc *placementapi.Client, hosts []*fleetDaemon, sched []tplacement.Host) {
	// Each round has its own minute (ctx is set at the top of each): how
	// many rounds fit in one depends on the machine's load.
	d, ctx := hosts[0], ctxFleet(t)
	nprov := len(d.providers)
	d.stopAndCheck(t)
	// emptyHost destroys d's instances: the earlier rounds' load may have
	// filled its MIG GPUs (how many operations a round runs depends on the
	// machine's speed), and a round that carves needs room. A destroy
	// removes its own allocation, so no pass reaches a removal crash point
	// through it; a pass may reach the round's crash point meanwhile (work
	// an earlier round left): then it says false, the crash come early.
	emptyHost := func() bool {
		died := func() bool {
			select {
			case <-d.done:
				return true
			case <-time.After(10 * time.Second):
				return false
			}
		}
		insts, err := d.client.Instances(ctx, "")
		if err != nil {
			if died() {
				return false
			}
			t.Fatal(err)
		}
		for _, in := range insts {
			if err := d.Destroy(ctx, in.UUID); err != nil && dbusapi.ErrorName(err) != dbusapi.NameNotFound {
				if died() {
					return false
				}
				t.Fatal(err)
			}
		}
		return true
	}
	for _, c := range []struct {
		point string
		// nth is the hit that kills: the start-up pass syncs every
		// provider once (nothing cached), so nprov+2 falls in a pass that
		// a local create started.
		nth int
		// arm makes the point reachable once the daemon runs.
		arm func()
	}{
		{fleet.CrashProvider, nprov + 2, nil},
		{fleet.CrashInventory, nprov + 2, nil},
		// An allocation Placement lost (an operator's mistake): the next
		// pass writes it again.
		{fleet.CrashAlloc, 1, func() {
			if !emptyHost() {
				return
			}
			id := uuid.NewString()
			if err := d.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: "1g.10gb", UUID: id}); err != nil {
				select {
				case <-d.done: // a pass the destroys started reached the point
					return
				case <-time.After(10 * time.Second):
				}
				t.Fatal(err)
			}
			// Its allocation is the claim, or, for a create served before
			// the syncer started, written by a pass (which dies there).
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
				if cons, err := pc.Consumer(ctx, id); err == nil && len(cons.Allocations) > 0 {
					if err := pc.PutConsumer(ctx, id, placementapi.Consumer{}); err != nil && !errors.Is(err, placementapi.ErrNotFound) {
						t.Fatal(err)
					}
					return
				}
				select {
				case <-d.done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			t.Fatalf("%s: no allocation for %s within 20s", d.name, id)
		}},
		// A scheduler's claim whose create never came: the pass removes
		// it once its grace is over. (A destroy removes its allocation
		// itself, so passes remove only what no operation did.)
		{fleet.CrashUnalloc, 1, func() {
			if !emptyHost() {
				return
			}
			q := url.Values{"resources1": {"CUSTOM_VGPUD_MIG_1G_10GB:1,CUSTOM_VGPUD_MIG_SLICE:1"}, "limit": {"100"}}
			id := uuid.NewString()
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				cands, err := pc.AllocationCandidates(ctx, q.Encode())
				if placementapi.Kind(err) == "unreachable" {
					continue // a loaded Placement: ask again, as a scheduler would
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, cand := range cands {
					for p := range cand.Allocations {
						if !d.Owns(p) {
							continue
						}
						err := tplacement.Claim(ctx, pc, id, cand.Allocations)
						if k := placementapi.Kind(err); k == "unreachable" || k == "conflict" {
							break // not made: ask again
						}
						if err != nil {
							t.Fatal(err)
						}
						return
					}
				}
			}
			t.Fatalf("%s: no candidate for a 1g.10gb claim within 20s of emptying the host", d.name)
		}},
	} {
		ctx = ctxFleet(t)
		logFrom := fileSize(t, d.logPath)
		start := time.Now()
		d.restart(t, fmt.Sprintf("%s:%d", c.point, c.nth))
		if c.arm != nil {
			c.arm()
		}
		load := &fleetLoad{}
		load.localOps(d, []string{"1g.10gb", "L4-4Q", "H100XM-8C"})
		load.schedule(&tplacement.Scheduler{C: pc, Hosts: sched}, 2)
		select {
		case <-d.done:
		case <-time.After(60 * time.Second):
			load.stop()
			t.Fatalf("%s: no crash at %s within 60s:\n%s", d.name, c.point, tailText(d.log()[logFrom:], 4000))
		}
		died := time.Since(start)
		load.stop()
		cut := len(load.failures)
		logged := strings.Contains(d.log()[logFrom:], "crash point "+c.point+" reached")
		var ee *exec.ExitError
		if !errors.As(d.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL || !logged {
			t.Fatalf("%s: exit %v, crash point logged: %v; want SIGKILL at %s:\n%s", d.name, d.err, logged, c.point, tailText(d.log()[logFrom:], 4000))
		}
		d.restart(t, "")
		took := awaitFleet(t, pc, hosts, 30*time.Second)
		t.Logf("crash at %s:%d: died %s after its start (%d operations failed with it); restarted, converged in %s",
			c.point, c.nth, died.Round(time.Millisecond), cut, took)
		d.stopAndCheck(t)
	}
	d.restart(t, "")
	awaitFleet(t, pc, hosts, 30*time.Second)
	for _, h := range hosts {
		h.stopAndCheck(t)
	}
}

func fileSize(t *testing.T, path string) int {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Size())
}

// stopAndCheck stops the daemon (SIGTERM) and compares its store with
// what it acknowledged and with its simulated host as discovery sees it:
// no intent left, no device without a record (a leak), no record without
// its devices and no acknowledged instance without a record (lost), no
// record of an instance never acknowledged. Instances whose operation a
// dying daemon cut off then take the store's word.
func (d *fleetDaemon) stopAndCheck(t *testing.T) {
	t.Helper()
	d.stop(t)
	st := readState(t, d.stateDir)
	for _, in := range st.intents {
		t.Errorf("%s: intent %s (%s %s) left", d.name, in.ID, in.Op, in.Instance)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	recs := map[string]bool{}
	for _, in := range st.instances {
		recs[in.UUID] = true
		if !d.acked[in.UUID] && !d.uncertain[in.UUID] {
			t.Errorf("%s: leak: instance %s (%s) was never acknowledged", d.name, in.UUID, in.Profile)
		}
	}
	for id := range d.acked {
		if !recs[id] && !d.uncertain[id] {
			t.Errorf("%s: lost: acknowledged instance %s has no record", d.name, id)
		}
	}
	extra, missing := invariant.HostDiff(simInventory(t, d.stateDir), st.instances)
	for _, x := range extra {
		t.Errorf("%s: leak: %s", d.name, x)
	}
	for _, x := range missing {
		t.Errorf("%s: lost: %s", d.name, x)
	}
	for id := range d.uncertain {
		if recs[id] {
			d.acked[id] = true
		} else {
			delete(d.acked, id)
		}
		delete(d.uncertain, id)
	}
}

// simInventory discovers the simulated host in a state directory through
// the production backends, with no daemon running.
func simInventory(t *testing.T, stateDir string) gpu.Inventory {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(filepath.Join(stateDir, "sim"), nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	b := nvmlb.New(h.NVML(), cat, nvmlb.Options{})
	if err := b.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Host{NVML: b, Sysfs: sysfs.New(h.FS())}.Inventory(ctxFleet(t))
	if err != nil {
		t.Fatalf("discover the simulated host: %v", err)
	}
	return inv
}
