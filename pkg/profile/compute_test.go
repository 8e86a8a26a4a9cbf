package profile_test

import (
	"slices"
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
)

func TestComputeInstanceByName(t *testing.T) {
	h100 := model(t, embedded(t), "H100-SXM5-80GB")
	cases := []struct {
		name      string
		gi        string
		slices    int
		id        int
		ok        bool
		canonical string
	}{
		{"1c.3g.40gb", "3g.40gb", 1, 0, true, "1c.3g.40gb"},
		{"MIG 2c.3g.40gb", "3g.40gb", 2, 1, true, "2c.3g.40gb"},
		{"3c.3g.40gb", "3g.40gb", 3, 2, true, "3g.40gb"},
		{"4c.7g.80gb", "7g.80gb", 4, 3, true, "4c.7g.80gb"},
		{"1c.1g.10gb+me", "1g.10gb+me", 1, 0, true, "1g.10gb+me"},
		{"4c.3g.40gb", "", 0, 0, false, ""},
		{"5c.7g.80gb", "", 0, 0, false, ""},
		{"1c.3g.41gb", "", 0, 0, false, ""},
		{"3g.40gb", "", 0, 0, false, ""},
		{"c.3g.40gb", "", 0, 0, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gi, ci, ok := h100.ComputeInstanceByName(c.name)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if gi.Name != c.gi || ci.Slices != c.slices || ci.ID != c.id {
				t.Fatalf("got GI %s, CI %+v; want %s, %d slices, id %d", gi.Name, ci, c.gi, c.slices, c.id)
			}
			if got := profile.ComputeInstanceName(ci.Slices, gi); got != c.canonical {
				t.Fatalf("name %q, want %q", got, c.canonical)
			}
		})
	}
	if !profile.IsProfileName("1c.3g.40gb") || profile.IsProfileName("1c.3g") {
		t.Fatal("IsProfileName and compute-instance names disagree")
	}
}

func TestComputeInstanceStarts(t *testing.T) {
	for _, c := range []struct {
		gi, size int
		want     []int
	}{
		{3, 1, []int{0, 1, 2}},
		{3, 2, []int{0}},
		{4, 2, []int{0, 2}},
		{7, 3, []int{0, 3}},
		{7, 7, []int{0}},
		{2, 3, nil},
		{3, 0, nil},
	} {
		if got := profile.ComputeInstanceStarts(c.gi, c.size); !slices.Equal(got, c.want) {
			t.Errorf("starts of %d in %d: %v, want %v", c.size, c.gi, got, c.want)
		}
	}
}
