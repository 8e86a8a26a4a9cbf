package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// crashRun is one vgpud process of the crash test.
type crashRun struct {
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

func startCrashDaemon(t *testing.T, state, bus, lvSocket, crashAt string) *crashRun {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(state, "vgpud.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, "\n=== start (crash at %q)\n", crashAt)
	cmd := exec.Command(vgpudBin, "--sim", "--state-dir", state, "--bus-address", bus, "--metrics-listen", "",
		"--libvirt-socket", lvSocket, "--log-level", "warn", "--config", "/dev/null")
	cmd.Env = append(os.Environ(), "VGPUD_CRASH_AT="+crashAt)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &crashRun{cmd: cmd, done: make(chan error, 1), log: logf}
	go func() { r.done <- cmd.Wait() }()
	return r
}

// ready waits until the daemon answers on the bus.
func (r *crashRun) ready(t *testing.T, c *dbusapi.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.Status(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-r.done:
			t.Fatalf("vgpud exited before it was ready: %v (log in %s)", err, r.log.Name())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("vgpud not ready after 30s: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *crashRun) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	r.log.Close()
}

// stop ends the daemon cleanly (SIGTERM) and waits.
func (r *crashRun) stop(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		r.kill()
		t.Fatal("vgpud did not stop on SIGTERM within 60s")
	}
	r.log.Close()
}

var crashProfiles = []string{"1g.10gb", "2g.20gb", "3g.40gb", "H100XM-1-10C", "H100XM-10C", "L4-2Q", "A10-2Q"}

// TestCrashRecovery runs vgpud on a simulated host whose state persists on
// disk, drives a random mix of create, destroy, attach and detach, kills
// the daemon with SIGKILL at a named crash point or at a random moment,
// restarts it and checks: every record is on the host and every device has
// a record (a second reconcile finds nothing to do), no acknowledged
// instance is lost and nothing unacknowledged appears, per-tenant usage is
// the sum of its instances, no intent is left.
func TestCrashRecovery(t *testing.T) {
	iterations := 200
	if v := os.Getenv("VGPUD_CRASH_ITERATIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("VGPUD_CRASH_ITERATIONS=%q", v)
		}
		iterations = n
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("VGPUD_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d (VGPUD_CRASH_SEED to replay)", seed)
	rng := rand.New(rand.NewSource(seed))
	bus := dbus.Start(t)
	lv := libvirtd.Start(t)
	vms := []string{"vgpud-crash-vm1", "vgpud-crash-vm2"}
	for _, vm := range vms {
		lv.DefineDomain(t, vm)
	}
	state := t.TempDir()
	ctx := context.Background()
	c, err := dbusapi.Dial(ctx, bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// acked: instances the daemon acknowledged (created and not destroyed).
	acked := map[string]bool{}
	first := startCrashDaemon(t, state, bus.Address(), lv.Socket(), "")
	first.ready(t, c)
	for _, name := range []string{"alpha", "beta"} {
		q := dbusapi.Quota{VRAMBytes: dbusapi.Limit(300 << 30), ComputeMilli: dbusapi.Unlimited, MaxInstances: dbusapi.Limit(12)}
		if _, err := c.DefineTenant(ctx, dbusapi.TenantSpec{Name: name, Quota: q}); err != nil {
			t.Fatal(err)
		}
	}
	first.stop(t)

	leaks, lost, crashes := 0, 0, 0
	points := []string{}
	for _, p := range manager.CrashPoints {
		if p != manager.CrashReconcile {
			points = append(points, p)
		}
	}
	for it := 0; it < iterations; it++ {
		crashAt := ""
		if rng.Intn(2) == 0 {
			crashAt = fmt.Sprintf("%s:%d", points[rng.Intn(len(points))], 1+rng.Intn(2))
		}
		t0 := time.Now()
		d := startCrashDaemon(t, state, bus.Address(), lv.Socket(), crashAt)
		d.ready(t, c)
		t1 := time.Now()
		uncertain := map[string]bool{}
		var journal []string
		killAfter := time.Duration(20+rng.Intn(400)) * time.Millisecond
		begin := time.Now()
		died := false
		for op := 0; op < 25 && !died; op++ {
			if crashAt == "" && time.Since(begin) > killAfter {
				break
			}
			died = crashOp(ctx, t, rng, c, acked, uncertain, vms, &journal)
			select {
			case <-d.done:
				died = true
			default:
			}
		}
		if died {
			crashes++
			d.log.Close()
		} else {
			d.kill()
		}
		// Restart and check.
		t2 := time.Now()
		r := startCrashDaemon(t, state, bus.Address(), lv.Socket(), "")
		r.ready(t, c)
		t3 := time.Now()
		l, x := checkCrashInvariants(ctx, t, c, acked, uncertain)
		leaks, lost = leaks+l, lost+x
		t4 := time.Now()
		// Every tenth checker stops cleanly and the store is read directly;
		// the others are killed while idle, one more crash to recover from.
		if it%10 == 9 {
			r.stop(t)
			if n := intentsLeft(t, state); n != 0 {
				t.Errorf("iteration %d: %d intents left after a clean stop", it, n)
				leaks++
			}
		} else {
			r.kill()
		}
		if os.Getenv("VGPUD_CRASH_TIMING") != "" {
			t.Logf("iteration %d: start %v, ops %v, restart %v, check %v, stop %v", it, t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3), time.Since(t4))
		}
		if t.Failed() {
			t.Logf("iteration %d (crash at %q) failed; operations: %s", it, crashAt, strings.Join(journal, "; "))
			if b, err := os.ReadFile(filepath.Join(state, "vgpud.log")); err == nil {
				t.Logf("daemon log:\n%s", b[max(0, len(b)-20000):])
			}
			break
		}
	}
	t.Logf("crash iterations: %d, leaks: %d, lost: %d (%d died at a crash point, the rest were killed at a random moment)", iterations, leaks, lost, crashes)
	fmt.Printf("crash iterations: %d, leaks: %d, lost: %d\n", iterations, leaks, lost)
	if leaks != 0 || lost != 0 {
		t.Fatalf("leaks %d, lost %d", leaks, lost)
	}
}

// crashOp runs one random operation; it reports whether the daemon went
// away during it. Acknowledged results update acked; an operation cut off
// by the crash makes its instance uncertain.
func crashOp(ctx context.Context, t *testing.T, rng *rand.Rand, c *dbusapi.Client, acked, uncertain map[string]bool, vms []string, journal *[]string) bool {
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ids := make([]string, 0, len(acked))
	for id := range acked {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	pick := func() string {
		if len(ids) == 0 {
			return ""
		}
		return ids[rng.Intn(len(ids))]
	}
	var err error
	var subject, kind string
	switch k := rng.Intn(10); {
	case k < 5 || len(ids) == 0:
		subject, kind = uuid.NewString(), "create"
		tn := []string{"alpha", "beta"}[rng.Intn(2)]
		_, err = c.Create(octx, dbusapi.CreateRequest{Tenant: tn, Profile: crashProfiles[rng.Intn(len(crashProfiles))], UUID: subject})
		if err == nil {
			acked[subject] = true
		}
	case k < 7:
		subject, kind = pick(), "destroy"
		err = c.Destroy(octx, subject, true)
		if err == nil || dbusapi.ErrorName(err) == dbusapi.NameNotFound {
			delete(acked, subject)
			err = nil
		}
	case k < 9:
		subject, kind = pick(), "attach"
		_, err = c.Attach(octx, subject, vms[rng.Intn(len(vms))], dbusapi.AttachOptions{})
	default:
		subject, kind = pick(), "detach"
		err = c.Detach(octx, subject)
	}
	*journal = append(*journal, fmt.Sprintf("%s %s -> %q", kind, subject, dbusapi.ErrorName(err)))
	if err == nil {
		return false
	}
	if isGone(err) {
		uncertain[subject] = true
		return true
	}
	// A refusal (quota, capacity, conflict, a MIG instance that cannot be
	// attached, not attached): nothing changed.
	return false
}

// isGone reports a call cut off because the daemon died.
func isGone(err error) bool {
	name := dbusapi.ErrorName(err)
	for _, n := range dbusapi.ErrorNames {
		if name == n {
			return false
		}
	}
	return true
}

func checkCrashInvariants(ctx context.Context, t *testing.T, c *dbusapi.Client, acked, uncertain map[string]bool) (leaks, lost int) {
	t.Helper()
	rep, err := c.Reconcile(ctx)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if len(rep.Finished)+len(rep.Undone)+len(rep.Recreated)+len(rep.Failed)+len(rep.Foreign)+len(rep.Attachments) != 0 {
		t.Errorf("second reconcile had work to do (the start-up one missed it): %+v", rep)
		leaks += len(rep.Foreign) + len(rep.Recreated)
	}
	insts, err := c.Instances(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]dbusapi.Instance{}
	for _, in := range insts {
		have[in.UUID] = in
		if in.State != string(store.StateReady) {
			t.Errorf("instance %s is %s after restart: %s", in.UUID, in.State, in.Reason)
		}
		if !acked[in.UUID] && !uncertain[in.UUID] {
			t.Errorf("ghost: instance %s exists but was never acknowledged", in.UUID)
			leaks++
		}
	}
	for id := range acked {
		if _, ok := have[id]; !ok && !uncertain[id] {
			t.Errorf("lost: acknowledged instance %s is gone", id)
			lost++
		}
	}
	// What is there now is the truth for the next iteration.
	for id := range uncertain {
		if _, ok := have[id]; ok {
			acked[id] = true
		} else {
			delete(acked, id)
		}
	}
	tenants, err := c.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(tenants) != 2 {
		t.Errorf("tenants: %d, want 2", len(tenants))
		lost++
	}
	for _, tn := range tenants {
		var vram, compute, n uint64
		for _, in := range insts {
			if in.Tenant == tn.Name {
				vram, compute, n = vram+in.VRAMBytes, compute+in.ComputeMilli, n+1
			}
		}
		if tn.Usage.VRAMBytes != vram || tn.Usage.ComputeMilli != compute || tn.Usage.Instances != n {
			t.Errorf("tenant %s usage %+v, instances sum to %d/%d/%d", tn.Name, tn.Usage, vram, compute, n)
		}
	}
	return leaks, lost
}

func intentsLeft(t *testing.T, state string) int {
	t.Helper()
	db, err := store.Open(filepath.Join(state, "state.db"), store.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open state after stop: %v", err)
	}
	defer db.Close()
	n := 0
	if err := db.View(func(tx *store.Tx) error {
		its, err := tx.Intents()
		n = len(its)
		if n > 0 {
			var ops []string
			for _, it := range its {
				ops = append(ops, string(it.Op)+" "+it.Instance+" "+strings.Join(it.Steps, ","))
			}
			t.Logf("intents left: %s", strings.Join(ops, "; "))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
