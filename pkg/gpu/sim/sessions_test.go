package sim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

func sessionsSpec() *sim.Spec {
	s := sim.DefaultSpec()
	s.Options.NVMLSessions = true
	return s
}

// A MIG mode change on a GPU with SR-IOV VFs stays pending, and the reset
// that commits it is refused, with the driver's IN_USE and what holds the
// GPU named, while the VFs are enabled, while a process (this one's NVML
// included) holds an NVML session on it, and while a VM holds a vGPU;
// disabling the VFs is refused with the unbindLock error while a session
// is open. Released, the sequence vgpud runs goes through.
func TestResetRefusals(t *testing.T) {
	e := newEnv(t, sessionsSpec())
	g := sim.DefaultH100TS
	d := e.dev(t, g)
	activation, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if ret != nvml.SUCCESS || activation != nvml.ERROR_IN_USE {
		t.Fatalf("SetMigMode: activation %v, %v; want IN_USE pending", activation, ret)
	}
	if cur, pend, _ := d.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode %d pending %d; want off, on pending", cur, pend)
	}
	refused := func(what string, err error, want ...string) {
		t.Helper()
		if !errors.Is(err, nvml.ERROR_IN_USE) {
			t.Fatalf("%s: %v; want IN_USE", what, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %v; want it to name %q", what, err, w)
			}
		}
	}
	refused("reset with VFs and a session", e.h.ResetGPU(g), "VFs are enabled", "NVML sessions are open by")
	refused("VF disable with a session", e.h.SetVFs(g, false), "unbindLock", "NVML sessions are open by")

	// A VM holding a vGPU is named first, by both.
	vf := vfOf(g, 0)
	writeOK(t, e, vfType(vf), typeID(t, e, "H100-SXM5-80GB", "H100XM-20C"))
	if err := e.h.OpenDevice(vf, "0b7c1b6e-8d5f-4c4e-9a47-6f7d3f0c2a11", "vm1"); err != nil {
		t.Fatal(err)
	}
	refused("reset with a VM", e.h.ResetGPU(g), "VM 0b7c1b6e-8d5f-4c4e-9a47-6f7d3f0c2a11 holds a vGPU")
	refused("VF disable with a VM", e.h.SetVFs(g, false), "unbindLock", "VM 0b7c1b6e")
	if err := e.h.CloseDevice(vf); err != nil {
		t.Fatal(err)
	}
	writeOK(t, e, vfType(vf), 0)

	// Another client holds the GPU too: released by this process, it
	// still blocks, named.
	if err := e.h.OpenSession(g, "dcgm"); err != nil {
		t.Fatal(err)
	}
	rel, ok := e.lib.(interface {
		ReleaseGPU(string) nvml.Return
		ReopenGPU(string) nvml.Return
	})
	if !ok {
		t.Fatal("the simulated NVML cannot release a GPU")
	}
	uuid, _ := d.GetUUID()
	if ret := rel.ReleaseGPU(uuid); ret != nvml.SUCCESS {
		t.Fatalf("ReleaseGPU: %v", ret)
	}
	if hs, _ := e.h.Sessions(g); len(hs) != 1 || hs[0] != "dcgm" {
		t.Fatalf("holders after release: %q; want dcgm alone", hs)
	}
	refused("VF disable with dcgm", e.h.SetVFs(g, false), "unbindLock", "dcgm")
	if err := e.h.CloseSession(g, "dcgm"); err != nil {
		t.Fatal(err)
	}

	// Nothing holds it: VFs off, reset (the mode committed), VFs on.
	if err := e.h.SetVFs(g, false); err != nil {
		t.Fatal(err)
	}
	if err := e.h.ResetGPU(g); err != nil {
		t.Fatal(err)
	}
	if err := e.h.SetVFs(g, true); err != nil {
		t.Fatal(err)
	}
	if ret := rel.ReopenGPU(uuid); ret != nvml.SUCCESS {
		t.Fatalf("ReopenGPU: %v", ret)
	}
	if cur, pend, _ := e.dev(t, g).GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode after the reset %d pending %d; want on", cur, pend)
	}
	if hs, _ := e.h.Sessions(g); len(hs) != 1 {
		t.Fatalf("holders after ReopenGPU: %q; want this process", hs)
	}
	// Shut down, the process holds nothing.
	if ret := e.lib.Shutdown(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if hs, _ := e.h.Sessions(g); len(hs) != 0 {
		t.Fatalf("holders after Shutdown: %q; want none", hs)
	}
}

// Without options.nvmlSessions no session is modelled: a process's NVML
// blocks nothing.
func TestSessionsOffByDefault(t *testing.T) {
	e := newEnv(t, nil)
	if hs, err := e.h.Sessions(sim.DefaultL4); err != nil || len(hs) != 0 {
		t.Fatalf("holders: %q, %v; want none", hs, err)
	}
	if err := e.h.SetVFs(sim.DefaultL4, false); err != nil {
		t.Fatal(err)
	}
	if err := e.h.ResetGPU(sim.DefaultL4); err != nil {
		t.Fatal(err)
	}
}
