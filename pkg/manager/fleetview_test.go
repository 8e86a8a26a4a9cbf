package manager_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// fleetGPU is the fleet view of the GPU at pci.
func (e *env) fleetGPU(pci string) manager.FleetGPU {
	e.t.Helper()
	view, err := e.m.FleetView()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, g := range view {
		if g.PCI == pci {
			return g
		}
	}
	e.t.Fatalf("no GPU %s in the fleet view", pci)
	return manager.FleetGPU{}
}

func classOf(g manager.FleetGPU, profile string) (manager.FleetClass, bool) {
	for _, c := range g.Classes {
		if c.Profile == profile {
			return c, true
		}
	}
	return manager.FleetClass{}, false
}

// roomIsAdmission checks that the room the fleet view publishes for each
// class of the GPU at pci is exactly what the admission takes there now:
// Room creates pinned to the GPU succeed, one more is refused. What it
// created is destroyed again.
func (e *env) roomIsAdmission(pci string) {
	e.t.Helper()
	for _, c := range e.fleetGPU(pci).Classes {
		var made []string
		for i := 0; i < c.Room; i++ {
			r, err := e.create("acme", c.Profile, pci)
			if err != nil {
				e.t.Fatalf("%s: the fleet publishes room %d for %s, the admission refused number %d: %v", pci, c.Room, c.Profile, i+1, err)
			}
			made = append(made, r.UUID)
		}
		if _, err := e.create("acme", c.Profile, pci); !errors.Is(err, manager.ErrNoCapacity) {
			e.t.Fatalf("%s: the fleet publishes room %d for %s, the admission took one more (%v)", pci, c.Room, c.Profile, err)
		}
		for _, id := range made {
			if err := e.m.Destroy(context.Background(), id, manager.DestroyOptions{}); err != nil {
				e.t.Fatal(err)
			}
		}
	}
}

// TestFleetViewOfMIGBackedAndPassthrough: MIG-backed vGPU types and the
// whole GPU are published as classes with the admission's room (what
// Placement counts them in is pkg/fleet's: TestFleetUnitsOfMIGBackedAndPassthrough).
func TestFleetViewOfMIGBackedAndPassthrough(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())

	g := e.fleetGPU(sim.DefaultH100MIG)
	want := map[string]manager.FleetClass{
		"H100XM-3-40C":             {Profile: "H100XM-3-40C", Kind: store.KindMIGVGPU, Room: 2},
		"H100XM-1-10C":             {Profile: "H100XM-1-10C", Kind: store.KindMIGVGPU, Room: 7},
		manager.ProfilePassthrough: {Profile: manager.ProfilePassthrough, Kind: store.KindPassthrough, Room: 1},
	}
	for name, w := range want {
		if c, ok := classOf(g, name); !ok || c != w {
			t.Fatalf("class %s = %+v (published %v), want %+v", name, c, ok, w)
		}
	}
	e.roomIsAdmission(sim.DefaultH100MIG)

	v := e.mustCreate("acme", "H100XM-3-40C", sim.DefaultH100MIG)
	g = e.fleetGPU(sim.DefaultH100MIG)
	if len(g.Records) != 1 || g.Records[0].Record.UUID != v.UUID || g.Records[0].Profile != "H100XM-3-40C" {
		t.Fatalf("records %+v, want the MIG-backed vGPU", g.Records)
	}
	if c, _ := classOf(g, manager.ProfilePassthrough); c.Room != 0 {
		t.Fatalf("a GPU with a vGPU offers room %d for a whole GPU", c.Room)
	}
	e.roomIsAdmission(sim.DefaultH100MIG)

	// A whole GPU: nothing else has room there, and the class stays
	// published for its allocation.
	if err := e.m.Destroy(context.Background(), v.UUID, manager.DestroyOptions{}); err != nil {
		t.Fatal(err)
	}
	w := e.mustCreate("acme", manager.ProfilePassthrough, sim.DefaultH100MIG)
	g = e.fleetGPU(sim.DefaultH100MIG)
	if g.State != gpu.StatePassthrough || len(g.Records) != 1 || g.Records[0].Record.UUID != w.UUID {
		t.Fatalf("whole GPU: state %s, records %+v", g.State, g.Records)
	}
	for _, c := range g.Classes {
		if c.Room != 0 {
			t.Fatalf("a GPU passed through offers room %d for %s", c.Room, c.Profile)
		}
	}
}

// TestFleetViewOfSharedGPUInstances: the room of a type whose vGPUs share
// a GPU instance counts the free seats of the shared instance (its units:
// pkg/fleet's TestFleetUnitsOfSharedGPUInstances).
func TestFleetViewOfSharedGPUInstances(t *testing.T) {
	const pci = "0000:41:00.0"
	e := newEnv(t, &sim.Spec{Version: "v1", GPUs: []sim.GPUSpec{{Model: "RTX-PRO-6000-BSE-96GB", PCI: pci, Flavour: gpu.FlavourVFIO, MIG: true}}})
	e.tenant("acme", unlimited())
	const typ = "RTX Pro 6000 Blackwell DC-1-6Q" // four per 1g.24gb+gfx (3 slots)
	before, ok := classOf(e.fleetGPU(pci), typ)
	if !ok || before.Kind != store.KindMIGVGPU || before.Room == 0 {
		t.Fatalf("class %s = %+v (published %v)", typ, before, ok)
	}
	e.roomIsAdmission(pci)
	e.mustCreate("acme", typ, pci)
	g := e.fleetGPU(pci)
	if c, _ := classOf(g, typ); c.Room != before.Room-1 {
		t.Fatalf("room for %s after one: %d, want %d (three seats left in the shared instance)", typ, c.Room, before.Room-1)
	}
	e.roomIsAdmission(pci)
}

// TestFleetGPUByUUIDIsTheViewsGPU: one GPU read alone is that GPU of the
// whole view; a GPU the host does not have is ErrNotFound.
func TestFleetGPUByUUIDIsTheViewsGPU(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	e.mustCreate("acme", "3g.40gb", sim.DefaultH100MIG)
	e.mustCreate("acme", "L4-4Q", sim.DefaultL4)
	view, err := e.m.FleetView()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range view {
		one, err := e.m.FleetGPUByUUID(g.UUID)
		if err != nil || !reflect.DeepEqual(one, g) {
			t.Fatalf("GPU %s read alone: %+v, %v; in the view: %+v", g.PCI, one, err, g)
		}
	}
	if _, err := e.m.FleetGPUByUUID("GPU-00000000-0000-0000-0000-000000000000"); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("an unknown GPU read alone: %v, want ErrNotFound", err)
	}
}
