package e2e

import (
	"slices"
	"testing"
	"time"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// TestInstancesBackWhenVFsReturn: vGPUs on SR-IOV VFs that vanish behind
// vgpud's back (sriov-manage -d) are marked failed by the periodic
// discovery, and come back by themselves, re-created, once the VFs do
// (sriov-manage -e): no reconcile asked for, no restart.
func TestInstancesBackWhenVFsReturn(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--discovery-interval", "1s"}})
	const l4 = sim.DefaultL4
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	var ids []string
	for range 3 {
		ids = append(ids, decodeSchema[docInstance](t, d.ctl(t, "create", "L4-2Q", "--tenant", "acme", "--gpu", l4, "-o", "json").must(t, "create")).Instance.UUID)
	}
	slices.Sort(ids)
	states := func() map[string]string {
		out := map[string]string{}
		for _, in := range decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "--tenant", "acme", "-o", "json").must(t, "list")).Items {
			out[in.UUID] = in.State
		}
		return out
	}
	await := func(what, state string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			s := states()
			all := len(s) == len(ids)
			for _, id := range ids {
				all = all && s[id] == state
			}
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: instances %v, want all %s\n%s", what, s, state, tailText(d.log(), 4000))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	d.sim(t, "vfs", l4, "off")
	await("VFs off", "failed")
	d.sim(t, "vfs", l4, "on")
	await("VFs back", "ready")
}
