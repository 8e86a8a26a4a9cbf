package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// The three hosts' GPU mixes: MIG and time-sliced H100s, vfio and mdev L4s.
var fleetHosts = []struct{ name, spec string }{
	{"fleet-a", `version: v1
gpus:
  - {model: H100-SXM5-80GB, pci: "0000:41:00.0", flavour: vfio, mig: true}
  - {model: H100-SXM5-80GB, pci: "0000:61:00.0", flavour: vfio}
  - {model: L4-24GB, pci: "0000:81:00.0", flavour: mdev, numaNode: 1}
`},
	{"fleet-b", `version: v1
gpus:
  - {model: H100-SXM5-80GB, pci: "0000:41:00.0", flavour: vfio, mig: true}
  - {model: H100-SXM5-80GB, pci: "0000:42:00.0", flavour: vfio, mig: true}
`},
	{"fleet-c", `version: v1
gpus:
  - {model: H100-SXM5-80GB, pci: "0000:41:00.0", flavour: vfio, mig: true}
  - {model: L4-24GB, pci: "0000:81:00.0", flavour: vfio}
  - {model: H100-SXM5-80GB, pci: "0000:61:00.0", flavour: vfio}
`},
}

// fleetRequests are what the test's schedulers ask Placement for: each
// MIG profile and MIG-backed type with its slices, as docs/fleet.md tells
// a flavor to, time-sliced types and a whole GPU by their class alone.
var fleetRequests = tplacement.Requests(fleet.ClassName, tplacement.ClassAlone, tplacement.ChurnProfiles...)

// fleetDaemon is one vgpud process publishing to Placement: its bus,
// state directory and simulated host are its own.
type fleetDaemon struct {
	*busDaemon
	name   string
	args   []string
	client *dbusapi.Client
	// root is its root provider (or the parent it publishes under),
	// providers its GPU providers, gpus their GPUs' PCI addresses.
	root      string
	providers map[string]bool
	gpus      map[string]string

	// owner is the test that started the daemon: a client dialled again
	// in a subtest (after a restart) must outlive that subtest.
	owner *testing.T

	mu sync.Mutex
	// acked are the instances it acknowledged (created, not destroyed);
	// uncertain those whose create or destroy a dying daemon cut off
	// (checkHost takes the store's word for them).
	acked, uncertain map[string]bool
}

// startFleetDaemon starts a daemon whose periodic pass runs every interval
// (a duration of vgpud.yaml, e.g. "2s").
func startFleetDaemon(t *testing.T, name, spec, endpoint, interval string) *fleetDaemon {
	t.Helper()
	return startFleetDaemonWith(t, name, spec, endpoint, interval, "3s", "")
}

// startFleetDaemonWith starts a daemon with its own grace period, whose
// fleet section also has extra (lines of YAML indented under fleet:, e.g.
// "  parentUUID: ...\n"). An empty spec is the built-in host
// (sim.DefaultSpec).
func startFleetDaemonWith(t *testing.T, name, spec, endpoint, interval, grace, extra string) *fleetDaemon {
	t.Helper()
	dir := t.TempDir()
	specPath, cfgPath := filepath.Join(dir, "host.yaml"), filepath.Join(dir, "vgpud.yaml")
	// A short sync interval and grace keep the test short; convergence is
	// still event-driven for every create and destroy.
	cfg := fmt.Sprintf("version: v1\nfleet:\n  endpoint: %s\n  host: %s\n  syncInterval: %s\n  grace: %s\n  timeout: 5s\n%s", endpoint, name, interval, grace, extra)
	files := map[string]string{cfgPath: cfg}
	if spec != "" {
		files[specPath] = spec
	}
	for p, s := range files {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bus := testbus.Start(t)
	d := &fleetDaemon{name: name, busDaemon: &busDaemon{bus: bus, stateDir: filepath.Join(dir, "state")},
		acked: map[string]bool{}, uncertain: map[string]bool{}, owner: t}
	if err := os.Mkdir(d.stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d.logPath = filepath.Join(dir, "vgpud.log")
	d.args = []string{"--sim", "--config", cfgPath, "--state-dir", d.stateDir, "--metrics-listen", "",
		"--bus-address", bus.Address(), "--libvirt-socket", "", "--log-level", "info"}
	if spec != "" {
		d.args = append(d.args, "--sim-host", specPath)
	}
	d.start(t)
	t.Cleanup(func() { d.stop(t) })
	d.dial(t)
	if _, err := d.client.DefineTenant(ctxFleet(t), dbusapi.TenantSpec{Name: "acme", Class: "guaranteed",
		Quota: dbusapi.Quota{VRAMBytes: dbusapi.Unlimited, ComputeMilli: dbusapi.Unlimited, MaxInstances: dbusapi.Unlimited}}); err != nil {
		t.Fatal(err)
	}
	return d
}

// dial connects the test's client to the daemon's bus.
func (d *fleetDaemon) dial(t *testing.T) {
	t.Helper()
	c, err := dbusapi.Dial(context.Background(), d.bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	owner := d.owner
	if owner == nil {
		owner = t
	}
	owner.Cleanup(func() { c.Close() })
	d.client = c
}

// restart starts the daemon again on its state (after it died or was
// stopped), with $VGPUD_CRASH_AT=crashAt unless that is "", and connects
// a new client.
func (d *fleetDaemon) restart(t *testing.T, crashAt string) {
	t.Helper()
	if d.client != nil {
		d.client.Close()
	}
	d.env = nil
	if crashAt != "" {
		d.env = []string{"VGPUD_CRASH_AT=" + crashAt}
	}
	d.start(t)
	d.dial(t)
}

// start runs the process (again, after a kill) and waits for its bus name.
func (d *fleetDaemon) start(t *testing.T) {
	t.Helper()
	d.done = make(chan struct{})
	watch := busNameWatcher(t, d.bus)
	cmd, logf := d.spawn(t, d.args...)
	d.cmd = cmd
	done := d.done
	go func() {
		d.err = cmd.Wait()
		logf.Close()
		close(done)
	}()
	select {
	case <-watch:
	case <-done:
		t.Fatalf("%s exited during start-up (%v):\n%s", d.name, d.err, tailText(d.log(), 4000))
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not take %s within 60s:\n%s", d.name, dbusapi.BusName, tailText(d.log(), 4000))
	}
}

func ctxFleet(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// The scheduler's view of a daemon (tplacement.Host): creates and destroys
// go over D-Bus, a create carrying the scheduler's consumer.
func (d *fleetDaemon) Name() string              { return d.name }
func (d *fleetDaemon) Owns(provider string) bool { return d.providers[provider] }

func (d *fleetDaemon) Create(ctx context.Context, consumer, profile string) error {
	return d.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: profile, PlacementConsumer: consumer})
}

// CreateOn is the create as nova-compute would ask it: the consumer and
// the GPU of the provider the scheduler chose (tplacement.NovaHost).
func (d *fleetDaemon) CreateOn(ctx context.Context, consumer, profile, provider string) error {
	return d.create(ctx, dbusapi.CreateRequest{Tenant: "acme", Profile: profile, PlacementConsumer: consumer, GPU: d.gpus[provider]})
}

func (d *fleetDaemon) Destroy(ctx context.Context, id string) error {
	_, err := d.DestroyBehind(ctx, id)
	return err
}

// DestroyBehind is Destroy that also returns what the destroy left to the
// sync (its PlacementBehind signal; "" when Placement was brought up to
// date before the reply).
func (d *fleetDaemon) DestroyBehind(ctx context.Context, id string) (string, error) {
	behind, err := d.client.DestroyBehind(ctx, id, false)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err == nil || dbusapi.ErrorName(err) == dbusapi.NameNotFound:
		delete(d.acked, id)
	case isGone(err):
		d.uncertain[id] = true
	}
	return behind, err
}

// create creates over D-Bus (a local create when req names no consumer)
// and notes what the daemon acknowledged.
func (d *fleetDaemon) create(ctx context.Context, req dbusapi.CreateRequest) error {
	id := req.PlacementConsumer
	if id == "" {
		if req.UUID == "" {
			req.UUID = uuid.NewString()
		}
		id = req.UUID
	}
	_, err := d.client.Create(ctx, req)
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case err == nil:
		d.acked[id] = true
	case isGone(err):
		d.uncertain[id] = true // refusals change nothing
	}
	return err
}

// vgpuctlStatus runs `vgpuctl fleet status -o json` against the daemon.
func (d *fleetDaemon) vgpuctlStatus(t *testing.T) (dbusapi.FleetStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, vgpuctlBin, "--connect", d.bus.Address(), "fleet", "status", "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return dbusapi.FleetStatus{}, fmt.Errorf("vgpuctl fleet status: %v: %s", err, stderr.String())
	}
	var doc struct {
		Kind  string              `json:"kind"`
		Fleet dbusapi.FleetStatus `json:"fleet"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || doc.Kind != "FleetStatus" {
		return dbusapi.FleetStatus{}, fmt.Errorf("vgpuctl fleet status -o json: %v: %s", err, out)
	}
	return doc.Fleet, nil
}

// learnProviders reads the daemon's providers from its fleet status, once
// its first pass has published them.
func (d *fleetDaemon) learnProviders(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := d.client.FleetStatus(ctxFleet(t))
		if err == nil && st.LastSync != nil && len(st.Providers) > 0 {
			d.root, d.providers, d.gpus = st.Root, map[string]bool{}, map[string]string{}
			for _, p := range st.Providers {
				d.providers[p.UUID] = true
				d.gpus[p.UUID] = p.GPU
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no successful sync within 30s: %+v, %v\n%s", d.name, st, err, tailText(d.log(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// placementHolds reads every provider and allocation in Placement:
// provider UUID → consumer → resources.
func placementHolds(ctx context.Context, c *placementapi.Client) (map[string]map[string]map[string]int, error) {
	var list struct {
		Providers []placementapi.Provider `json:"resource_providers"`
	}
	if err := c.Do(ctx, "GET", "/resource_providers", nil, &list); err != nil {
		return nil, err
	}
	out := map[string]map[string]map[string]int{}
	for _, p := range list.Providers {
		a, err := c.ProviderAllocations(ctx, p.UUID)
		if err != nil {
			return nil, err
		}
		out[p.UUID] = a
	}
	return out, nil
}

// fleetDiffers returns what keeps Placement from equalling the union of
// the hosts' truth ("" when it does): Placement has exactly the hosts'
// roots and GPU providers; every consumer in Placement is an instance of
// the host whose provider holds it, and every instance has one
// allocation; no consumer is allocated on, and no instance lives on, two
// hosts; and each host's own comparison (vgpuctl fleet status, which
// also compares inventories and traits) names no difference.
func fleetDiffers(t *testing.T, c *placementapi.Client, hosts []*fleetDaemon) string {
	t.Helper()
	ctx := ctxFleet(t)
	holds, err := placementHolds(ctx, c)
	if err != nil {
		return "read Placement: " + err.Error()
	}
	var msg []string
	want := map[string]bool{}
	// Where each consumer is allocated and each instance lives: never on
	// two hosts.
	allocatedOn, livesOn := map[string][]string{}, map[string][]string{}
	for _, h := range hosts {
		want[h.root] = true
		for p := range h.providers {
			want[p] = true
		}
		insts, err := h.client.Instances(ctx, "")
		if err != nil {
			return h.name + ": " + err.Error()
		}
		host := map[string]bool{}
		for _, i := range insts {
			host[i.UUID] = true
		}
		placed := map[string]int{}
		for p := range h.providers {
			for consumer := range holds[p] {
				placed[consumer]++
			}
		}
		for id := range placed {
			allocatedOn[id] = append(allocatedOn[id], h.name)
		}
		for id := range host {
			livesOn[id] = append(livesOn[id], h.name)
			if placed[id] != 1 {
				msg = append(msg, fmt.Sprintf("%s: instance %s has %d allocations in Placement", h.name, id, placed[id]))
			}
		}
		for id := range placed {
			if !host[id] {
				msg = append(msg, fmt.Sprintf("%s: Placement holds %s, which is no instance", h.name, id))
			}
		}
		st, err := h.vgpuctlStatus(t)
		if err != nil {
			return h.name + ": " + err.Error()
		}
		for _, d := range st.Differences {
			msg = append(msg, fmt.Sprintf("%s: vgpuctl fleet status: %s %s %s (host %s, placement %s)", h.name, d.Kind, d.Provider, d.Subject, d.Host, d.Placement))
		}
	}
	for id, on := range allocatedOn {
		if len(on) > 1 {
			msg = append(msg, fmt.Sprintf("consumer %s is allocated on %d hosts: %v", id, len(on), on))
		}
	}
	for id, on := range livesOn {
		if len(on) > 1 {
			msg = append(msg, fmt.Sprintf("instance %s lives on %d hosts: %v", id, len(on), on))
		}
	}
	for p := range holds {
		if !want[p] {
			msg = append(msg, "Placement has provider "+p+", of no host")
		}
	}
	for p := range want {
		if _, ok := holds[p]; !ok {
			msg = append(msg, "Placement lacks provider "+p)
		}
	}
	sort.Strings(msg)
	return strings.Join(msg, "\n")
}

// consumersOn counts the allocations Placement holds on h's providers.
func consumersOn(t *testing.T, c *placementapi.Client, h *fleetDaemon) int {
	t.Helper()
	n := 0
	for p := range h.providers {
		a, err := c.ProviderAllocations(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		n += len(a)
	}
	return n
}

// awaitFleet waits until Placement equals the hosts' truth.
func awaitFleet(t *testing.T, c *placementapi.Client, hosts []*fleetDaemon, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		msg := fleetDiffers(t, c, hosts)
		if msg == "" {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("Placement still differs from the hosts after %s:\n%s", within, msg)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// startFleet starts Placement and the three daemons of fleetHosts (their
// periodic pass every interval), and waits until Placement equals their
// truth. It returns Placement, a client, the daemons, and the daemons as
// the schedulers see them.
func startFleet(t *testing.T, interval string) (*tplacement.Server, *placementapi.Client, []*fleetDaemon, []tplacement.Host) {
	t.Helper()
	srv := tplacement.Start(t)
	pc, err := placementapi.New(placementapi.Config{Endpoint: srv.URL(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var hosts []*fleetDaemon
	var sched []tplacement.Host
	for _, h := range fleetHosts {
		d := startFleetDaemon(t, h.name, h.spec, srv.URL(), interval)
		hosts = append(hosts, d)
		sched = append(sched, d)
	}
	for _, d := range hosts {
		d.learnProviders(t)
	}
	t.Logf("three daemons published in Placement; converged in %s", awaitFleet(t, pc, hosts, 20*time.Second))
	return srv, pc, hosts, sched
}

// TestFleetDaemons: three vgpud processes, each with its own simulated
// host, bus and state, publish to one real Placement. Fleet schedulers
// written here (allocation candidates → allocation → D-Bus create with the
// consumer → on refusal the allocation deleted, the next candidate tried)
// churn with 1, 4 and 16 at once; after each phase Placement equals the
// union of the hosts' truth and vgpuctl fleet status names no difference.
// Then one daemon is killed with SIGKILL in the middle of a burst of
// creates (each claims in Placement, and its pass follows) and started
// again: the fleet converges.
func TestFleetDaemons(t *testing.T) {
	_, pc, hosts, sched := startFleet(t, "2s")

	placed := int64(0)
	for i, phase := range []struct{ workers, ops int }{{1, 10}, {4, 16}, {16, 32}} {
		// Each phase has its own minute: under load one minute did not
		// hold the three phases and the emptying below.
		s := &tplacement.Scheduler{C: pc, Hosts: sched}
		if err := s.Churn(ctxFleet(t), phase.workers, phase.ops, fleetRequests, uint64(i+1)); err != nil {
			t.Fatalf("%d schedulers: %v", phase.workers, err)
		}
		took := awaitFleet(t, pc, hosts, 20*time.Second)
		t.Logf("%d schedulers: placed %d, refused as stale %d, lost in Placement %d, no candidate %d, destroyed %d; converged in %s",
			phase.workers, s.Placed.Load(), s.Stale.Load(), s.ClaimLost.Load(), s.NoCandidate.Load(), s.Destroyed.Load(), took)
		placed += s.Placed.Load()
	}
	if placed == 0 {
		t.Fatal("no scheduler placed anything: the churn tested nothing")
	}

	// SIGKILL during a sync: a burst of local creates (each claims first in
	// Placement, and its events start a pass), killed as soon as Placement
	// shows the first new claim, while the rest are on their way.
	b := hosts[1]
	// The churn may have filled b (whole GPUs among it): empty it, so
	// that the burst's creates have room and claim.
	ctx := ctxFleet(t)
	all, err := b.client.Instances(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range all {
		if err := b.client.Destroy(ctx, in.UUID, true); err != nil {
			t.Fatalf("%s: destroy %s: %v", b.name, in.UUID, err)
		}
	}
	before := consumersOn(t, pc, b)
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Refusals and the lost connection are the point here.
			_, err := b.client.Create(cctx, dbusapi.CreateRequest{Tenant: "acme", Profile: "1g.10gb"})
			mu.Lock()
			outcomes[dbusapi.ErrorName(err)]++
			mu.Unlock()
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for consumersOn(t, pc, b) <= before {
		if time.Now().After(deadline) {
			t.Fatal("no create of the burst claimed in Placement within 10s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-b.done
	wg.Wait()
	t.Logf("burst cut by SIGKILL: outcomes by error name (\"\": created) %v", outcomes)
	b.restart(t, "")
	// Claims of creates the kill cut short go after the grace period (3 s).
	t.Logf("after SIGKILL and restart: converged in %s", awaitFleet(t, pc, hosts, 30*time.Second))

	// Without a fleet the status is a named error.
	plain := startBusDaemon(t, testbus.Start(t), busDaemonOpts{})
	pcl, err := dbusapi.Dial(context.Background(), plain.bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	_, err = pcl.FleetStatus(ctxFleet(t))
	var de *dbusapi.Error
	if !errors.As(err, &de) || de.Name != dbusapi.NameUnavailable || !strings.Contains(de.Message, "configure fleet:") {
		t.Fatalf("fleet status without a fleet = %v", err)
	}
}
