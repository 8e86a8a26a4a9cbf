package gpu

import "testing"

func TestSlotMap(t *testing.T) {
	g := GPU{MIG: MIG{Enabled: true,
		Profiles:  []GIProfile{{Name: "7g.80gb", Placements: []Range{{0, 8}}}, {Name: "1g.10gb", Placements: []Range{{0, 1}, {6, 1}}}},
		Instances: []GPUInstance{{ID: 1, Profile: "3g.40gb", Placement: Range{4, 4}}, {ID: 7, Profile: "1g.10gb", Placement: Range{0, 1}}}}}
	got := g.SlotMap(6)
	want := "[1g.] ····· ····· ····· [3g.40gb #1           ]"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if (&GPU{}).SlotMap(6) != "" {
		t.Fatal("a GPU without MIG has no map")
	}
}
