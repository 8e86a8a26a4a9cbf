package tenant_test

import (
	"testing"

	"github.com/vgpud/vgpud/pkg/tenant"
)

func TestComputeInstanceVRAMBytes(t *testing.T) {
	const gi3g40 = uint64(40192) << 20 // H100 3g.40gb
	cases := []struct {
		name             string
		mem              uint64
		ciSlices, slices int
		want             uint64
	}{
		{"1c of a 3g", gi3g40, 1, 3, gi3g40 / 3},
		{"2c of a 3g", gi3g40, 2, 3, gi3g40 * 2 / 3},
		{"whole GI", gi3g40, 3, 3, gi3g40},
		{"no slices", gi3g40, 0, 3, 0},
		{"more slices than the GI", gi3g40, 4, 3, 0},
		{"GI of no slices", gi3g40, 1, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := tenant.ComputeInstanceVRAMBytes(c.mem, c.ciSlices, c.slices); got != c.want {
				t.Fatalf("got %d, want %d", got, c.want)
			}
		})
	}
	// Three 1c fill a 3g and never cost more than it.
	if sum := 3 * tenant.ComputeInstanceVRAMBytes(gi3g40, 1, 3); sum > gi3g40 || gi3g40-sum >= 3 {
		t.Fatalf("three 1c cost %d, the 3g %d", sum, gi3g40)
	}
}
