package gpu

import (
	"fmt"
	"sort"
	"strings"
)

// Slices is the size of the GPU's MIG slot grid: the widest placement of
// any profile NVML reports (8 on A100/H100, 12 on RTX PRO 6000).
func (g *GPU) Slices() int {
	n := 0
	for _, p := range g.MIG.Profiles {
		for _, pl := range p.Placements {
			n = max(n, pl.End())
		}
	}
	return n
}

// SlotMap draws the GPU's MIG slot grid on one line, cell slots wide per
// slice: each GPU instance as [profile #id], free slices as dots. An empty
// string when the GPU has no MIG grid.
func (g *GPU) SlotMap(cell int) string {
	n := g.Slices()
	if n == 0 || !g.MIG.Enabled {
		return ""
	}
	cell = max(cell, 4)
	line := []rune(strings.Repeat(" ", n*cell))
	for s := 0; s < n; s++ {
		copy(line[s*cell:], []rune(strings.Repeat("·", cell-1)))
	}
	gis := append([]GPUInstance(nil), g.MIG.Instances...)
	sort.Slice(gis, func(i, j int) bool { return gis[i].Placement.Start < gis[j].Placement.Start })
	for _, gi := range gis {
		from, width := gi.Placement.Start*cell, gi.Placement.Size*cell-1
		if from+width > len(line) || width < 2 {
			continue
		}
		name := gi.Profile
		if name == "" {
			name = fmt.Sprintf("p%d", gi.ProfileID)
		}
		label := fmt.Sprintf("%s #%d", name, gi.ID)
		inner := width - 2
		if len([]rune(label)) > inner {
			label = string([]rune(label)[:inner])
		}
		seg := "[" + label + strings.Repeat(" ", inner-len([]rune(label))) + "]"
		copy(line[from:], []rune(seg))
	}
	return strings.TrimRight(string(line), " ")
}
