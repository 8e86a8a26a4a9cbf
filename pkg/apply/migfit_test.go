package apply

import (
	"slices"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
)

// The H100 grid (catalog profiles/h100-sxm5-80gb.yaml) as NVML reports it.
func h100Grid() manager.GPUView {
	p := func(name string, slices int, starts ...int) gpu.GIProfile {
		g := gpu.GIProfile{Name: name, Slices: slices}
		for _, s := range starts {
			g.Placements = append(g.Placements, gpu.Range{Start: s, Size: slices})
		}
		return g
	}
	var v manager.GPUView
	v.MIG.Profiles = []gpu.GIProfile{p("1g.10gb", 1, 0, 1, 2, 3, 4, 5, 6), p("2g.20gb", 2, 0, 2, 4), p("3g.40gb", 4, 0, 4), p("7g.80gb", 8, 0)}
	return v
}

func oneG(start int, attached bool) manager.InstanceView {
	in := manager.InstanceView{Instance: store.Instance{Kind: store.KindMIG, GIStart: start, GISize: 1}}
	if attached {
		in.Attachment = &store.Attachment{Domain: "vm"}
	}
	return in
}

func kept(g []manager.InstanceView, sel []bool) []int {
	var out []int
	for i, k := range sel {
		if k {
			out = append(out, g[i].GIStart)
		}
	}
	return out
}

func TestChooseKeeps(t *testing.T) {
	f := newMIGFit(h100Grid())
	cases := []struct {
		name    string
		fixed   slotMask
		group   []manager.InstanceView
		want    int
		creates []string
		ok      bool
		keep    []int // GI starts kept
	}{
		{"default fits", 0, []manager.InstanceView{oneG(0, false), oneG(1, false), oneG(6, false)}, 2, []string{"3g.40gb"}, true, []int{0, 1}},
		{"oldest block the new ones", 0, []manager.InstanceView{oneG(6, false), oneG(4, false), oneG(1, false), oneG(0, false)}, 2,
			[]string{"3g.40gb", "2g.20gb"}, true, []int{1, 0}},
		{"attached kept", 0, []manager.InstanceView{oneG(6, false), oneG(0, true), oneG(1, false)}, 2, []string{"3g.40gb"}, true, []int{0, 1}},
		{"re-created when nothing else fits", rangeMask(0, 4), []manager.InstanceView{oneG(5, false)}, 1, []string{"2g.20gb"}, true, []int{}},
		{"no way at all", 0, []manager.InstanceView{oneG(0, true)}, 1, []string{"7g.80gb"}, false, nil},
		{"unknown profile", 0, []manager.InstanceView{oneG(0, false)}, 1, []string{"9g.90gb"}, false, nil},
		{"growing a group", 0, []manager.InstanceView{oneG(4, false)}, 3, []string{"3g.40gb"}, true, []int{4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			choice, ok := f.chooseKeeps(c.fixed, [][]manager.InstanceView{c.group}, []int{c.want}, c.creates, []string{"1g.10gb"})
			if ok != c.ok {
				t.Fatalf("ok %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if got := kept(c.group, choice[0]); !slices.Equal(got, c.keep) && !(len(got) == 0 && len(c.keep) == 0) {
				t.Fatalf("kept starts %v, want %v", got, c.keep)
			}
		})
	}
}

func TestFeasible(t *testing.T) {
	f := newMIGFit(h100Grid())
	cases := []struct {
		occupied slotMask
		needs    []string
		want     bool
	}{
		{0, []string{"7g.80gb"}, true},
		{rangeMask(3, 1), []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}, false},
		{rangeMask(6, 1), []string{"3g.40gb", "2g.20gb"}, true},
		{rangeMask(6, 1), []string{"3g.40gb", "2g.20gb", "1g.10gb"}, false},
		{0, []string{"1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"}, false},
		{rangeMask(0, 1) | rangeMask(5, 1), []string{"2g.20gb", "2g.20gb"}, false},
	}
	for i, c := range cases {
		if got := f.feasible(c.occupied, c.needs); got != c.want {
			t.Errorf("case %d: feasible(%b, %v) = %v, want %v", i, c.occupied, c.needs, got, c.want)
		}
	}
}
