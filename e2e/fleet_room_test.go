package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/store"
)

// vgpuctlJSON runs `vgpuctl ARGS -o json` against the daemon and decodes
// its document into doc.
func (d *fleetDaemon) vgpuctlJSON(t *testing.T, doc any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, vgpuctlBin, append(append([]string{"--connect", d.bus.Address()}, args...), "-o", "json")...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("vgpuctl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	if err := json.Unmarshal(out, doc); err != nil {
		t.Fatalf("vgpuctl %s -o json: %v: %s", strings.Join(args, " "), err, out)
	}
}

// TestCapacityAgreesWithFleetStatus: on the built-in host publishing to a
// real Placement, after a mixed set of creates (MIG instances, a
// MIG-backed vGPU, time-sliced vGPUs on VFs and an mdev vGPU), what
// `vgpuctl capacity` says still fits and the room `vgpuctl fleet status`
// shows published for every GPU (a class's total less its reservation less
// what Placement holds there) agree for every profile: one room
// calculation behind both. With exact inventories: carvable ones
// (the default) publish only the part of that room every mix can have
// together (docs/fleet.md).
func TestCapacityAgreesWithFleetStatus(t *testing.T) {
	srv := tplacement.Start(t)
	d := startFleetDaemonWith(t, "room-host", "", srv.URL(), "2s", "3s", "  inventories: exact\n")
	d.learnProviders(t)

	ctx := ctxFleet(t)
	for _, p := range []string{"3g.40gb", "1g.10gb", "H100XM-1-10C", "H100XM-4C", "H100XM-4C", "L4-4Q", "A10-4Q"} {
		if err := d.Create(ctx, "", p); err != nil {
			t.Fatalf("create %s: %v", p, err)
		}
	}

	var gpus struct {
		Items []dbusapi.GPU `json:"items"`
	}
	d.vgpuctlJSON(t, &gpus, "gpus")
	model := map[string]string{} // PCI address → model
	for _, g := range gpus.Items {
		model[g.PCI] = g.Model
	}
	if len(model) != 4 {
		t.Fatalf("the built-in host has 4 GPUs; vgpuctl gpus lists %d", len(model))
	}

	// The status is read once Placement holds exactly the host's
	// allocations, so that what it holds of a class is what the host's
	// instances use.
	var st dbusapi.FleetStatus
	deadline := time.Now().Add(20 * time.Second)
	for {
		var doc struct {
			Kind  string              `json:"kind"`
			Fleet dbusapi.FleetStatus `json:"fleet"`
		}
		d.vgpuctlJSON(t, &doc, "fleet", "status")
		st = doc.Fleet
		if st.LastSync != nil && len(st.Differences) == 0 && len(st.Providers) == len(model) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Placement did not equal the host within 20s: %+v", st)
		}
		time.Sleep(250 * time.Millisecond)
	}

	var caps struct {
		Items []dbusapi.Capacity `json:"items"`
	}
	d.vgpuctlJSON(t, &caps, "capacity")
	if len(caps.Items) == 0 {
		t.Fatal("vgpuctl capacity lists nothing")
	}

	// Profiles whose names normalise to one class share one inventory:
	// Placement cannot count them apart, so they are left out.
	type key struct{ model, class string }
	profiles := map[key][]string{}
	for _, c := range caps.Items {
		k := key{c.Model, fleet.ClassName(store.InstanceKind(c.Kind), c.Profile)}
		profiles[k] = append(profiles[k], c.Profile)
	}

	published := map[key]int{}
	for _, p := range st.Providers {
		m, ok := model[p.GPU]
		if !ok {
			t.Fatalf("provider %s stands for GPU %s, which vgpuctl gpus does not list", p.Name, p.GPU)
		}
		for _, c := range p.Classes {
			if c.Class == fleet.SliceClass || c.Class == fleet.FramebufferClass || c.Class == fleet.GPUClass {
				continue // units every profile shares, not a profile's room
			}
			k := key{m, c.Class}
			if len(profiles[k]) == 0 {
				t.Errorf("%s (GPU %s) publishes %s, which vgpuctl capacity does not list for %s", p.Name, p.GPU, c.Class, m)
				continue
			}
			room := c.HostTotal - c.HostReserved - c.PlacementUsed
			t.Logf("GPU %s (%s): %s room %d", p.GPU, m, c.Class, room)
			published[k] += room
		}
	}

	compared := 0
	for _, c := range caps.Items {
		k := key{c.Model, fleet.ClassName(store.InstanceKind(c.Kind), c.Profile)}
		if len(profiles[k]) > 1 {
			t.Logf("%s: %v share class %s", c.Model, profiles[k], k.class)
			continue
		}
		if n := published[k]; n != c.Count {
			t.Errorf("%s on %s: vgpuctl capacity says %d more fit; vgpuctl fleet status publishes room for %d", c.Profile, c.Model, c.Count, n)
		}
		compared++
	}
	if compared == 0 {
		t.Fatal("no profile compared")
	}
	t.Logf("%d of the %d profiles vgpuctl capacity lists compared on %d GPUs", compared, len(caps.Items), len(st.Providers))
}
