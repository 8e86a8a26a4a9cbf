package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// startMigrateFleetHosts is startMigrateHosts with a fleet: section on
// both hosts, publishing to one Placement at endpoint (a long grace: no
// allocation may go by waiting it out).
func startMigrateFleetHosts(t *testing.T, endpoint string) *migrateHosts {
	t.Helper()
	srcLV, dstLV := libvirtd.StartPair(t)
	config := func(name string) []string {
		p := filepath.Join(t.TempDir(), "vgpud.yaml")
		cfg := fmt.Sprintf("version: v1\nfleet:\n  endpoint: %s\n  host: %s\n  syncInterval: 2s\n  grace: 1h\n  timeout: 5s\n", endpoint, name)
		if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{"--config", p}
	}
	h := &migrateHosts{srcLV: srcLV, dstLV: dstLV,
		src: startBusDaemon(t, testbus.Start(t), busDaemonOpts{libvirtSocket: srcLV.Socket(), args: config("move-src")}),
		dst: startBusDaemon(t, testbus.Start(t), busDaemonOpts{libvirtSocket: dstLV.Socket(), args: config("move-dst")})}
	for _, d := range []*busDaemon{h.src, h.dst} {
		d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
		// Published before anything is created: a create's claim needs
		// the GPU's provider.
		awaitPublished(t, d)
	}
	return h
}

// awaitPublished waits for d's first successful sync pass.
func awaitPublished(t *testing.T, d *busDaemon) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st, err := (&fleetDaemon{busDaemon: d}).vgpuctlStatus(t)
		if err == nil && st.LastSync != nil && len(st.Providers) > 0 && len(st.Differences) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no clean sync within a minute: %+v %v", st, err)
		}
	}
}

// fleetState is, for each host, its fleet status and the consumers
// Placement holds on its providers; "" when every status is clean and
// instance is held on want's providers alone, else what differs.
func fleetState(t *testing.T, pc *placementapi.Client, instance string, want *busDaemon, hosts map[string]*busDaemon) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holds, err := placementHolds(ctx, pc)
	if err != nil {
		return err.Error()
	}
	var msg []string
	on := map[string][]string{} // consumer → hosts holding it
	for name, d := range hosts {
		st, err := (&fleetDaemon{busDaemon: d}).vgpuctlStatus(t)
		if err != nil {
			msg = append(msg, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		if len(st.Differences) != 0 || st.LastSync == nil {
			msg = append(msg, fmt.Sprintf("%s: fleet status: last sync %v, differences %+v", name, st.LastSync, st.Differences))
		}
		for _, p := range st.Providers {
			for consumer := range holds[p.UUID] {
				on[consumer] = append(on[consumer], name)
			}
		}
	}
	for consumer, names := range on {
		sort.Strings(names)
		switch {
		case consumer != instance:
			msg = append(msg, fmt.Sprintf("consumer %s (not the instance) held on %v", consumer, names))
		case len(names) != 1 || hosts[names[0]] != want:
			msg = append(msg, fmt.Sprintf("instance %s held on %v", consumer, names))
		}
	}
	if len(on[instance]) == 0 {
		msg = append(msg, fmt.Sprintf("instance %s held nowhere", instance))
	}
	sort.Strings(msg)
	return strings.Join(msg, "\n")
}

// consumersOnHost lists the consumers Placement holds on d's providers.
func consumersOnHost(t *testing.T, pc *placementapi.Client, d *busDaemon) []string {
	t.Helper()
	st, err := (&fleetDaemon{busDaemon: d}).vgpuctlStatus(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holds, err := placementHolds(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range st.Providers {
		for consumer := range holds[p.UUID] {
			out = append(out, consumer)
		}
	}
	sort.Strings(out)
	return out
}

// awaitFleetState waits (up to a minute: a few sync intervals) for
// fleetState to be clean.
func awaitFleetState(t *testing.T, pc *placementapi.Client, instance string, want *busDaemon, hosts map[string]*busDaemon) {
	t.Helper()
	var msg string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if msg = fleetState(t, pc, instance, want, hosts); msg == "" {
			return
		}
	}
	t.Fatalf("Placement does not match the hosts:\n%s", msg)
}

// TestMigrateRunFleet: `vgpuctl migrate run` between two hosts that both
// publish to one Placement moves the instance's allocation with the VM:
// afterwards Placement holds the instance on the destination's provider
// alone, no migration consumer is left, and `vgpuctl fleet status` is
// clean on both hosts. Moving it back does the same the other way. Before,
// a move begun and cancelled by hand holds the source's allocation under
// the migration consumer meanwhile and gives it back to the instance.
func TestMigrateRunFleet(t *testing.T) {
	srv := tplacement.Start(t)
	pc, err := placementapi.New(placementapi.Config{Endpoint: srv.URL(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	h := startMigrateFleetHosts(t, srv.URL())
	hosts := map[string]*busDaemon{"source": h.src, "destination": h.dst}
	vm := h.srcLV.DefineDomain(t, "vgpud-e2e-fleet")
	h.dstLV.RemoveAtCleanup(t, vm)
	in := decodeSchema[docInstance](t, h.src.ctl(t, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	h.src.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach")
	awaitFleetState(t, pc, in.UUID, h.src, hosts)

	// While the VM is moving away, the source's allocation is its
	// migration consumer's, and the source's passes (every 2 s) do not
	// write the instance's back; a cancel moves it back.
	h.src.ctl(t, "migrate", "source", in.UUID).must(t, "migrate source")
	time.Sleep(5 * time.Second)
	held := consumersOnHost(t, pc, h.src)
	if len(held) != 1 || held[0] == in.UUID {
		t.Fatalf("while moving, the source's providers hold %v; want the migration consumer alone", held)
	}
	h.src.ctl(t, "migrate", "cancel", in.UUID).must(t, "migrate cancel")
	awaitFleetState(t, pc, in.UUID, h.src, hosts)

	r := h.src.ctl(t, "migrate", "run", in.UUID, "--to", h.dst.bus.Address()).must(t, "migrate run")
	if !strings.Contains(r.out, "moved VM "+vm.Name) {
		t.Fatalf("migrate run printed %q", r.out)
	}
	if moved := instances(t, h.dst); len(moved) != 1 || moved[0].UUID != in.UUID {
		t.Fatalf("destination's instances: %+v", moved)
	}
	awaitFleetState(t, pc, in.UUID, h.dst, hosts)

	h.dst.ctl(t, "migrate", "run", in.UUID, "--to", h.src.bus.Address()).must(t, "migrate run back")
	if back := instances(t, h.src); len(back) != 1 || back[0].UUID != in.UUID {
		t.Fatalf("source's instances after the move back: %+v", back)
	}
	awaitFleetState(t, pc, in.UUID, h.src, hosts)
	checkUsage(t, "source", h.src)
	checkUsage(t, "destination", h.dst)
}
