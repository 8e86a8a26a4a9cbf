package manager_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// An unpinned create whose only GPUs offering the profile are failed,
// lost or passed through names those GPUs and why, never "none of 0
// GPUs offering it".
func TestRefusalNamesUnavailableGPUs(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(t *testing.T, e *env)
		profile string
		want    []string
	}{
		{"failed", func(t *testing.T, e *env) {
			l4 := e.gpuUUID(sim.DefaultL4)
			e.m.MarkGPUFailed(l4, "XID 48 (double-bit ECC)")
		}, "L4-4Q", []string{"1 GPU offers it and it is out of service", sim.DefaultL4 + ": failed: XID 48 (double-bit ECC)"}},
		{"passed through", func(t *testing.T, e *env) {
			e.mustCreate("acme", "L4-24GB/passthrough", sim.DefaultL4)
		}, "L4-4Q", []string{"1 GPU offers it and it is out of service", sim.DefaultL4 + ": passed through whole"}},
		{"lost", func(t *testing.T, e *env) {
			if err := e.sim.LoseGPU(sim.DefaultL4); err != nil {
				t.Fatal(err)
			}
			if err := e.m.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
		}, "L4-4Q", []string{sim.DefaultL4 + ": lost"}},
		{"MIG GPU failed", func(t *testing.T, e *env) {
			e.m.MarkGPUFailed(e.gpuUUID(sim.DefaultH100MIG), "XID 79 (fallen off the bus)")
		}, "3g.40gb", []string{sim.DefaultH100MIG + ": failed: XID 79 (fallen off the bus)"}},
		{"MIG GPU passed through", func(t *testing.T, e *env) {
			e.mustCreate("acme", "H100-SXM5-80GB/passthrough", sim.DefaultH100MIG)
		}, "1g.10gb", []string{sim.DefaultH100MIG + ": passed through whole"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			c.setup(t, e)
			before := e.summary()
			_, err := e.create("acme", c.profile, "")
			if !errors.Is(err, manager.ErrNoCapacity) {
				t.Fatalf("create %s: %v, want NoCapacity", c.profile, err)
			}
			msg := manager.Message(err)
			t.Logf("refusal: %s", msg)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, "of 0 GPUs") || strings.Contains(err.Error(), "of 0 ") {
				t.Errorf("refusal counts no GPU: %q", err)
			}
			if after := e.summary(); after != before {
				t.Errorf("refusal changed the host:\n%s\nwas\n%s", after, before)
			}
		})
	}
}

// gpuUUID is the UUID of the GPU at a PCI address.
func (e *env) gpuUUID(pci string) string {
	e.t.Helper()
	for _, g := range e.m.Inventory().GPUs {
		if g.PCI == pci {
			return g.UUID
		}
	}
	e.t.Fatalf("no GPU at %s", pci)
	return ""
}
