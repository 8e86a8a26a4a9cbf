package container

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/invariant"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/discover"
	nvmlb "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/profiles"
)

// must runs script as root in the container and fails the test when it
// fails.
func must(t *testing.T, script string) string {
	t.Helper()
	out, err := ct.sh(context.Background(), script)
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return out
}

// prop is one property of vgpud.service as systemctl show gives it.
func prop(t *testing.T, name string) string {
	t.Helper()
	return strings.TrimSpace(must(t, "systemctl show -p "+name+" --value vgpud.service"))
}

// ctlResult is a vgpuctl run inside the container.
type ctlResult struct {
	out  string
	err  error
	took time.Duration
}

// ctl runs vgpuctl as user ("" is root) over the container's system bus.
func ctl(user string, args ...string) ctlResult {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + a + "'"
	}
	start := time.Now()
	out, err := ct.shAs(context.Background(), user, "exec vgpuctl "+strings.Join(q, " "))
	return ctlResult{out: out, err: err, took: time.Since(start)}
}

// mustCtl runs vgpuctl as root and fails the test when it fails.
func mustCtl(t *testing.T, args ...string) string {
	t.Helper()
	r := ctl("", args...)
	if r.err != nil {
		t.Fatalf("vgpuctl %s: %v\n%s", strings.Join(args, " "), r.err, r.out)
	}
	return r.out
}

// listDoc is vgpuctl's -o json list document.
type listDoc[T any] struct {
	Items []T `json:"items"`
}

func instances(t *testing.T) []dbusapi.Instance {
	t.Helper()
	var d listDoc[dbusapi.Instance]
	if err := json.Unmarshal([]byte(mustCtl(t, "-o", "json", "list")), &d); err != nil {
		t.Fatalf("vgpuctl -o json list: %v", err)
	}
	return d.Items
}

func tenants(t *testing.T) []dbusapi.Tenant {
	t.Helper()
	var d listDoc[dbusapi.Tenant]
	if err := json.Unmarshal([]byte(mustCtl(t, "-o", "json", "tenant", "list")), &d); err != nil {
		t.Fatalf("vgpuctl -o json tenant list: %v", err)
	}
	return d.Items
}

// create creates an instance as root and returns its UUID.
func create(t *testing.T, profileName, tenant string) string {
	t.Helper()
	var d struct {
		Instance dbusapi.Instance `json:"instance"`
	}
	out := mustCtl(t, "-o", "json", "create", profileName, "--tenant", tenant)
	if err := json.Unmarshal([]byte(out), &d); err != nil || d.Instance.UUID == "" {
		t.Fatalf("vgpuctl create %s: %v\n%s", profileName, err, out)
	}
	return d.Instance.UUID
}

// ensureTenant defines tenant (unlimited) unless it exists.
func ensureTenant(t *testing.T, name string) {
	t.Helper()
	for _, tn := range tenants(t) {
		if tn.Name == name {
			return
		}
	}
	mustCtl(t, "tenant", "define", name, "--vram", "unlimited", "--compute", "unlimited")
}

// startVgpud starts the unit (a no-op when it runs) and waits for the job.
func startVgpud(t *testing.T) {
	t.Helper()
	must(t, "systemctl start vgpud.service")
}

// storeState is the daemon's state database, read with the daemon stopped.
type storeState struct {
	instances []store.Instance
	intents   []store.Intent
}

// checkConsistent stops vgpud, and checks its state database against the
// simulated host and the catalog, the way the crash test does: no intent
// left, every record ready, no device without a record and no record
// without its device, and each tenant's usage as vgpud reported it just
// before equal to the sum of its instances' costs. vgpud is started again.
// It returns the records.
func checkConsistent(t *testing.T) []store.Instance {
	t.Helper()
	reported := tenants(t)
	must(t, "systemctl stop vgpud.service")
	defer startVgpud(t)
	state := filepath.Join(ct.root, "var/lib/vgpud")
	s := readStore(t, filepath.Join(state, "state.db"))
	for _, in := range s.intents {
		t.Errorf("intent %s (%s %s, steps %v) left", in.ID, in.Op, in.Instance, in.Steps)
	}
	for _, in := range s.instances {
		if in.State != store.StateReady {
			t.Errorf("instance %s is %s: %s", in.UUID, in.State, in.Reason)
		}
	}
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range reported {
		var want dbusapi.Usage
		for _, in := range s.instances {
			if in.Tenant != tn.Name {
				continue
			}
			vram, compute, err := invariant.Cost(cat, in)
			if err != nil {
				t.Error(err)
			}
			want.VRAMBytes += vram
			want.ComputeMilli += compute
			want.Instances++
		}
		if tn.Usage != want {
			t.Errorf("tenant %s reports usage %+v; its instances cost %+v by the catalog", tn.Name, tn.Usage, want)
		}
	}
	extra, missing := hostDiff(t, cat, filepath.Join(state, "sim"), s.instances)
	for _, d := range extra {
		t.Errorf("leak: %s", d)
	}
	for _, d := range missing {
		t.Errorf("lost: %s", d)
	}
	return s.instances
}

func readStore(t *testing.T, path string) storeState {
	t.Helper()
	db, err := store.Open(path, store.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open %s with vgpud stopped: %v", path, err)
	}
	defer db.Close()
	var s storeState
	err = db.View(func(tx *store.Tx) (err error) {
		if s.instances, err = tx.Instances(); err != nil {
			return err
		}
		s.intents, err = tx.Intents()
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return s
}

// hostDiff discovers the simulated host the daemon ran on and compares it
// with the records.
func hostDiff(t *testing.T, cat *profile.Catalog, dir string, recs []store.Instance) (extra, missing []string) {
	t.Helper()
	h, err := sim.Open(dir, nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatalf("open the simulated host %s: %v", dir, err)
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := nvmlb.New(h.NVML(), cat, nvmlb.Options{})
	if err := b.Init(ctx); err != nil {
		t.Fatal(err)
	}
	inv, err := discover.Host{NVML: b, Sysfs: sysfs.New(h.FS())}.Inventory(ctx)
	if err != nil {
		t.Fatalf("discover the simulated host: %v", err)
	}
	return invariant.HostDiff(inv, recs)
}

// journalCursor marks where vgpud's journal ends now: its line count (the
// journal of a test run only grows).
func journalCursor(t *testing.T) int {
	t.Helper()
	return strings.Count(journal(t), "\n")
}

// journalAfter is vgpud's journal (messages only, systemd's about the unit
// included) after cursor.
func journalAfter(t *testing.T, cursor int) string {
	t.Helper()
	lines := strings.SplitAfter(journal(t), "\n")
	if cursor > len(lines) {
		return ""
	}
	return strings.Join(lines[cursor:], "")
}

func journal(t *testing.T) string {
	t.Helper()
	return must(t, "journalctl -u vgpud.service --no-pager -q -o cat")
}

// waitFor polls cond every 200 ms until it holds or timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
