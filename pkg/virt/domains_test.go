package virt_test

import (
	"context"
	"testing"
)

// TestDomainsState: Domains lists every domain with whether it runs.
func TestDomainsState(t *testing.T) {
	env, c := setup(t)
	env.DefineDomain(t, "vm-off")
	on := env.DefineDomain(t, "vm-on")
	env.StartDomain(t, "vm-on")
	ds, err := c.Domains(context.Background())
	if err != nil {
		t.Fatalf("Domains: %v", err)
	}
	got := map[string]bool{}
	for _, d := range ds {
		got[d.Name] = d.Running
		if d.Name == "vm-on" && d.UUID != on.UUID {
			t.Errorf("vm-on's UUID %s, libvirt's %s", d.UUID, on.UUID)
		}
	}
	if running, ok := got["vm-on"]; !ok || !running {
		t.Errorf("vm-on: listed %v, running %v", ok, running)
	}
	if running, ok := got["vm-off"]; !ok || running {
		t.Errorf("vm-off: listed %v, running %v", ok, running)
	}
}
