package manager_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// A time-sliced vGPU refused because the GPUs offering its type are full
// says how many offer it and why each is full, never "none of 0 GPUs": a
// GPU whose VFs all hold vGPUs offers the type all the same.
func TestVGPURefusalCountsFullGPUs(t *testing.T) {
	cases := []struct {
		name    string
		fill    []string // profiles created first, where placement puts them
		profile string
		gpu     string
		want    []string
	}{
		{"every VF taken", slices.Repeat([]string{"L4-1Q"}, 16), "L4-1Q", "",
			[]string{"1 GPU offers it and it is full", sim.DefaultL4 + ": all 16 of its VFs hold a vGPU", "creatable there now: nothing"}},
		{"every VF taken, pinned", slices.Repeat([]string{"L4-1Q"}, 16), "L4-1Q", sim.DefaultL4,
			[]string{"the GPU asked for offers it and is full", sim.DefaultL4 + ": all 16 of its VFs hold a vGPU"}},
		{"two GPUs offer it", slices.Repeat([]string{"H100XM-20C"}, 4), "H100XM-20C", "",
			[]string{"2 GPUs offer it and all are full", sim.DefaultH100MIG + ": MIG is on", sim.DefaultH100TS + ": holds 4 of the 4 H100XM-20C it takes"}},
		{"type at its maximum", slices.Repeat([]string{"L4-8Q"}, 3), "L4-8Q", "",
			[]string{"1 GPU offers it and it is full", sim.DefaultL4 + ": holds 3 of the 3 L4-8Q it takes"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.tenant("acme", unlimited())
			for _, p := range c.fill {
				e.mustCreate("acme", p, "")
			}
			_, err := e.create("acme", c.profile, c.gpu)
			if !errors.Is(err, manager.ErrNoCapacity) {
				t.Fatalf("error %v, want NoCapacity", err)
			}
			msg := manager.Message(err)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, "of 0 GPUs") || strings.Contains(err.Error(), "of 0 GPUs") {
				t.Errorf("message counts no GPU offering the type: %q", err)
			}
		})
	}
}
