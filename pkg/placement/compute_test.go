package placement_test

import (
	"errors"
	"testing"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
)

// H100 compute-instance profiles of a 3-slice and a 7-slice GPU instance.
var (
	ci1of3 = profile.ComputeInstanceProfile{ID: 0, Slices: 1, MaxInstances: 3}
	ci2of3 = profile.ComputeInstanceProfile{ID: 1, Slices: 2, MaxInstances: 1}
	ci2of7 = profile.ComputeInstanceProfile{ID: 1, Slices: 2, MaxInstances: 3}
	ci3of7 = profile.ComputeInstanceProfile{ID: 2, Slices: 3, MaxInstances: 2}
)

func TestComputeStart(t *testing.T) {
	one := func(s int) placement.ComputeSlot { return placement.ComputeSlot{Start: s, Size: 1, ProfileID: 0} }
	cases := []struct {
		name    string
		gi      placement.ComputeGI
		p       profile.ComputeInstanceProfile
		want    int
		wantErr error
	}{
		{"first 1c in an empty 3g", placement.ComputeGI{Slices: 3}, ci1of3, 0, nil},
		{"third 1c after 0 and 2", placement.ComputeGI{Slices: 3, Used: []placement.ComputeSlot{one(0), one(2)}}, ci1of3, 1, nil},
		{"fourth 1c", placement.ComputeGI{Slices: 3, Used: []placement.ComputeSlot{one(0), one(1), one(2)}}, ci1of3, 0, placement.ErrNoCapacity},
		{"2c beside a 1c at 0 (2c only starts at 0)", placement.ComputeGI{Slices: 3, Used: []placement.ComputeSlot{one(0)}}, ci2of3, 0, placement.ErrNoCapacity},
		{"2c beside a 1c at 2", placement.ComputeGI{Slices: 3, Used: []placement.ComputeSlot{one(2)}}, ci2of3, 0, nil},
		{"3c in a 7g after a 3c at 0", placement.ComputeGI{Slices: 7, Used: []placement.ComputeSlot{{Start: 0, Size: 3, ProfileID: 2}}}, ci3of7, 3, nil},
		{"2c in a 7g with 1c at 0 and 2", placement.ComputeGI{Slices: 7, Used: []placement.ComputeSlot{one(0), one(2)}}, ci2of7, 4, nil},
		{"profile larger than the GI", placement.ComputeGI{Slices: 1}, ci2of3, 0, placement.ErrUnknownProfile},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := placement.ComputeStart(c.gi, c.p)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("err = %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %d, %v; want %d", got, err, c.want)
			}
		})
	}
}

func TestPlaceComputeBestFit(t *testing.T) {
	one := func(s int) placement.ComputeSlot { return placement.ComputeSlot{Start: s, Size: 1} }
	gis := []placement.ComputeGI{
		{ID: "empty", Slices: 3},
		{ID: "one-left", Slices: 3, Used: []placement.ComputeSlot{one(0), one(1)}},
		{ID: "two-left", Slices: 3, Used: []placement.ComputeSlot{one(0)}},
	}
	d, err := placement.PlaceCompute(gis, ci1of3)
	if err != nil || d.GI != "one-left" || d.Start != 2 || d.Free != 0 {
		t.Fatalf("got %+v, %v; want the fullest GI at 2", d, err)
	}
	if _, err := placement.PlaceCompute(gis[1:2], ci2of3); !errors.Is(err, placement.ErrNoCapacity) {
		t.Fatalf("2c in a GI with one slice left: %v", err)
	}
	if _, err := placement.PlaceCompute(nil, ci1of3); !errors.Is(err, placement.ErrNoCapacity) {
		t.Fatalf("no GI: %v", err)
	}
}
