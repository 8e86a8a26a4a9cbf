package profile_test

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// These tests pin the embedded catalog to the host-interfaces reference
// (sections 3 and 4): a change to a number there must be deliberate.

func embedded(t *testing.T) *profile.Catalog {
	t.Helper()
	c, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func model(t *testing.T, c *profile.Catalog, name string) *profile.Model {
	t.Helper()
	m, ok := c.Model(name)
	if !ok {
		t.Fatalf("model %s missing", name)
	}
	return m
}

func TestCatalogModels(t *testing.T) {
	c := embedded(t)
	tests := []struct {
		name, file, product, arch, pci string
		memoryMiB                      uint64
		migProfiles, vgpuTypes         int
		flows                          []string
		vfs                            int
		prefix                         string
		heterogeneous                  bool
	}{
		{"A10-24GB", "a10-24gb.yaml", "NVIDIA A10", "ampere", "0x2236", 24576, 0, 23, []string{"mdev", "vfio"}, 16, "A10", false},
		{"A100-SXM4-40GB", "a100-sxm4-40gb.yaml", "NVIDIA A100-SXM4-40GB", "ampere", "0x20B0", 40960, 7, 13, []string{"mdev", "vfio"}, 32, "A100X", false},
		{"A100-SXM4-80GB", "a100-sxm4-80gb.yaml", "NVIDIA A100-SXM4-80GB", "ampere", "0x20B2", 81920, 7, 14, []string{"mdev", "vfio"}, 32, "A100DX", false},
		{"A30-24GB", "a30-24gb.yaml", "NVIDIA A30", "ampere", "0x20B7", 24576, 5, 10, []string{"mdev", "vfio"}, 16, "A30", false},
		{"B200-SXM-180GB", "b200-sxm-180gb.yaml", "NVIDIA B200", "blackwell", "0x2901", 184320, 7, 16, []string{"vfio"}, 32, "B200X", true},
		{"H100-SXM5-80GB", "h100-sxm5-80gb.yaml", "NVIDIA H100 80GB HBM3", "hopper", "0x2330", 81920, 7, 15, []string{"vfio"}, 32, "H100XM", true},
		{"H200-SXM5-141GB", "h200-sxm5-141gb.yaml", "NVIDIA H200", "hopper", "0x2335", 144384, 7, 16, []string{"vfio"}, 32, "H200X", true},
		{"L4-24GB", "l4-24gb.yaml", "NVIDIA L4", "ada", "0x27B8", 24576, 0, 23, []string{"mdev", "vfio"}, 16, "L4", true},
		{"L40S-48GB", "l40s-48gb.yaml", "NVIDIA L40S", "ada", "0x26B9", 49152, 0, 30, []string{"mdev", "vfio"}, 32, "L40S", true},
		{"RTX-PRO-6000-BSE-96GB", "rtx-pro-6000-bse-96gb.yaml", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell", "0x2BB5", 98304, 11, 64, []string{"vfio"}, 32, "RTX Pro 6000 Blackwell DC", true},
		{"T4-16GB", "t4-16gb.yaml", "Tesla T4", "turing", "0x1EB8", 16384, 0, 15, []string{"mdev"}, 0, "T4", false},
	}
	var want []string
	for _, tt := range tests {
		want = append(want, tt.name)
	}
	var got []string
	for _, m := range c.Models() {
		got = append(got, m.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("models = %v, want %v", got, want)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := model(t, c, tt.name)
			if m.Source() != "profiles/"+tt.file {
				t.Errorf("source %s, want profiles/%s", m.Source(), tt.file)
			}
			if m.Product != tt.product || m.Architecture != tt.arch || !slices.Equal(m.PCIDeviceIDs, []string{tt.pci}) || m.MemoryMiB != tt.memoryMiB {
				t.Errorf("identity = %q %s %v %d MiB, want %q %s [%s] %d MiB", m.Product, m.Architecture, m.PCIDeviceIDs, m.MemoryMiB, tt.product, tt.arch, tt.pci, tt.memoryMiB)
			}
			if m.UsableMemoryMiB >= m.MemoryMiB || m.UsableMemoryMiB < m.MemoryMiB*9/10 {
				t.Errorf("usableMemoryMiB %d is not slightly below %d", m.UsableMemoryMiB, m.MemoryMiB)
			}
			n := 0
			if m.MIG != nil {
				n = len(m.MIG.GPUInstanceProfiles)
			}
			if n != tt.migProfiles {
				t.Errorf("%d GI profiles, want %d", n, tt.migProfiles)
			}
			v := m.VGPU
			if v == nil {
				t.Fatal("no vgpu section")
			}
			if len(v.Types) != tt.vgpuTypes || !slices.Equal(v.Flows, tt.flows) || v.SRIOVVFs != tt.vfs || v.TypePrefix != tt.prefix || v.Heterogeneous != tt.heterogeneous {
				t.Errorf("vgpu = %d types, flows %v, %d VFs, prefix %q, heterogeneous %v; want %d, %v, %d, %q, %v",
					len(v.Types), v.Flows, v.SRIOVVFs, v.TypePrefix, v.Heterogeneous, tt.vgpuTypes, tt.flows, tt.vfs, tt.prefix, tt.heterogeneous)
			}
			for _, ty := range v.Types {
				if !strings.HasPrefix(ty.Name, v.TypePrefix+"-") {
					t.Errorf("type %s does not start with %q", ty.Name, v.TypePrefix+"-")
				}
			}
		})
	}
}

func TestIdentifyEmbedded(t *testing.T) {
	c := embedded(t)
	for _, m := range c.Models() {
		id, err := strconv.ParseUint(m.PCIDeviceIDs[0][2:], 16, 16)
		if err != nil {
			t.Fatal(err)
		}
		for _, product := range []string{"", m.Product, "NVIDIA Unknown"} {
			got, ok := c.Identify(uint16(id), product)
			if !ok || got.Name != m.Name {
				t.Errorf("Identify(%#04x, %q) = %v, want %s", id, product, got, m.Name)
			}
		}
	}
	if m, ok := c.Identify(0x2330, "NVIDIA H100 80GB HBM3"); !ok || m.Name != "H100-SXM5-80GB" {
		t.Errorf("Identify(0x2330) = %v, want H100-SXM5-80GB", m)
	}
	if m, ok := c.Identify(0x0001, ""); ok {
		t.Errorf("Identify(0x0001) = %s, want none", m.Name)
	}
}

func TestMIGGrids(t *testing.T) {
	c := embedded(t)
	tests := []struct {
		model                string
		memSlices, cmpSlices int
		ciSets               []int
	}{
		{"A100-SXM4-40GB", 8, 7, []int{1, 2, 3, 4, 7}},
		{"A100-SXM4-80GB", 8, 7, []int{1, 2, 3, 4, 7}},
		{"A30-24GB", 4, 4, []int{1, 2, 4}},
		{"H100-SXM5-80GB", 8, 7, []int{1, 2, 3, 4, 7}},
		{"H200-SXM5-141GB", 8, 7, []int{1, 2, 3, 4, 7}},
		{"B200-SXM-180GB", 8, 7, []int{1, 2, 3, 4, 7}},
		{"RTX-PRO-6000-BSE-96GB", 12, 4, []int{1, 2, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			g := model(t, c, tt.model).MIG
			if g.MemorySlices != tt.memSlices || g.ComputeSlices != tt.cmpSlices {
				t.Errorf("grid %d memory / %d compute slices, want %d / %d", g.MemorySlices, g.ComputeSlices, tt.memSlices, tt.cmpSlices)
			}
			var sets []int
			for _, s := range g.ComputeInstanceProfiles {
				sets = append(sets, s.GISlices)
			}
			if !slices.Equal(sets, tt.ciSets) {
				t.Errorf("CI sets for %v compute slices, want %v", sets, tt.ciSets)
			}
		})
	}
}

// TestGPUInstanceProfiles pins every GI profile of reference 3.2, with the
// index constant of table 3.1.
func TestGPUInstanceProfiles(t *testing.T) {
	c := embedded(t)
	type gip struct {
		name              string
		id, index, slices int
		size              int
		placements        []int
		max               int
		memoryMiB         uint64
		sms               int
	}
	seven := []int{0, 1, 2, 3, 4, 5, 6}
	quarter := []int{0, 2, 4, 6}
	hopperLike := func(g1, g1x2, g3, g7 string, m1, m2, m3, m7 uint64, s1, s1x2, s2, s3, s4, s7 int) []gip {
		return []gip{
			{g1, 19, 0, 1, 1, seven, 7, m1, s1},
			{g1 + "+me", 20, 7, 1, 1, seven, 1, m1, s1},
			{g1x2, 15, 9, 1, 2, quarter, 4, m2, s1x2},
			{strings.Replace(g1x2, "1g", "2g", 1), 14, 1, 2, 2, []int{0, 2, 4}, 3, m2, s2},
			{g3, 9, 2, 3, 4, []int{0, 4}, 2, m3, s3},
			{strings.Replace(g3, "3g", "4g", 1), 5, 3, 4, 4, []int{0}, 1, m3, s4},
			{g7, 0, 4, 7, 8, []int{0}, 1, m7, s7},
		}
	}
	a100 := func(m1, m2, m3, m7 uint64, g1, g1x2, g3, g7 string) []gip {
		return hopperLike(g1, g1x2, g3, g7, m1, m2, m3, m7, 14, 14, 28, 42, 56, 98)
	}
	tests := []struct {
		model    string
		profiles []gip
	}{
		{"A100-SXM4-40GB", a100(4864, 9856, 19968, 40192, "1g.5gb", "1g.10gb", "3g.20gb", "7g.40gb")},
		{"A100-SXM4-80GB", a100(9728, 19968, 40192, 80384, "1g.10gb", "1g.20gb", "3g.40gb", "7g.80gb")},
		{"H100-SXM5-80GB", hopperLike("1g.10gb", "1g.20gb", "3g.40gb", "7g.80gb", 9984, 20096, 40448, 81152, 16, 26, 32, 60, 64, 132)},
		{"H200-SXM5-141GB", hopperLike("1g.18gb", "1g.35gb", "3g.71gb", "7g.141gb", 16384, 35840, 72192, 144384, 16, 26, 32, 60, 64, 132)},
		{"B200-SXM-180GB", hopperLike("1g.23gb", "1g.45gb", "3g.90gb", "7g.180gb", 23552, 46080, 92160, 184320, 18, 18, 36, 54, 72, 126)},
		{"A30-24GB", []gip{
			{"1g.6gb", 14, 0, 1, 1, []int{0, 1, 2, 3}, 4, 5952, 14},
			{"1g.6gb+me", 21, 7, 1, 1, []int{0, 1, 2, 3}, 1, 5952, 14},
			{"2g.12gb", 5, 1, 2, 2, []int{0, 2}, 2, 11968, 28},
			{"2g.12gb+me", 6, 8, 2, 2, []int{0, 2}, 1, 11968, 28},
			{"4g.24gb", 0, 3, 4, 4, []int{0}, 1, 24064, 56},
		}},
		{"RTX-PRO-6000-BSE-96GB", []gip{
			{"1g.24gb", 14, 0, 1, 3, []int{0, 3, 6, 9}, 4, 24192, 46},
			{"1g.24gb+me", 21, 7, 1, 3, []int{0, 3, 6, 9}, 1, 24192, 46},
			{"1g.24gb+gfx", 47, 10, 1, 3, []int{0, 3, 6, 9}, 4, 24192, 46},
			{"1g.24gb+me.all", 65, 15, 1, 3, []int{0, 3, 6, 9}, 1, 24192, 46},
			{"1g.24gb-me", 67, 13, 1, 3, []int{0, 3, 6, 9}, 4, 24192, 46},
			{"2g.48gb", 5, 1, 2, 6, []int{0, 6}, 2, 48512, 94},
			{"2g.48gb+gfx", 35, 11, 2, 6, []int{0, 6}, 2, 48512, 94},
			{"2g.48gb+me.all", 64, 16, 2, 6, []int{0, 6}, 1, 48512, 94},
			{"2g.48gb-me", 66, 14, 2, 6, []int{0, 6}, 2, 48512, 94},
			{"4g.96gb", 0, 3, 4, 12, []int{0}, 1, 97280, 188},
			{"4g.96gb+gfx", 32, 12, 4, 12, []int{0}, 1, 97280, 188},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			m := model(t, c, tt.model)
			if len(m.MIG.GPUInstanceProfiles) != len(tt.profiles) {
				t.Errorf("%d GI profiles, want %d", len(m.MIG.GPUInstanceProfiles), len(tt.profiles))
			}
			for _, w := range tt.profiles {
				p, ok := m.GPUInstanceProfileByName("MIG " + w.name)
				if !ok {
					t.Errorf("%s missing", w.name)
					continue
				}
				got := gip{p.Name, p.ID, p.Index, p.ComputeSlices, p.Size, p.Placements, p.MaxInstances, p.MemoryMiB, p.SMs}
				if !reflect.DeepEqual(got, w) {
					t.Errorf("%s = %+v\nwant %+v", w.name, got, w)
				}
				if byID, _ := m.GPUInstanceProfileByID(w.id); byID != p {
					t.Errorf("%s: GPUInstanceProfileByID(%d) is another profile", w.name, w.id)
				}
				if byIdx, _ := m.GPUInstanceProfileByIndex(w.index); byIdx != p {
					t.Errorf("%s: GPUInstanceProfileByIndex(%d) is another profile", w.name, w.index)
				}
				media := strings.HasSuffix(w.name, "+me") || strings.HasSuffix(w.name, "+me.all")
				if p.Media != media || p.Graphics != strings.HasSuffix(w.name, "+gfx") {
					t.Errorf("%s: media %v graphics %v", w.name, p.Media, p.Graphics)
				}
			}
		})
	}
}

func TestGPUInstanceEngines(t *testing.T) {
	c := embedded(t)
	tests := []struct {
		model, gi            string
		ce, dec, enc, jpg, o int
	}{
		{"A100-SXM4-40GB", "1g.5gb", 1, 0, 0, 0, 0},
		{"A100-SXM4-40GB", "1g.5gb+me", 1, 1, 0, 1, 1},
		{"A100-SXM4-40GB", "7g.40gb", 7, 5, 0, 1, 1},
		{"A100-SXM4-80GB", "3g.40gb", 3, 2, 0, 0, 0},
		{"A30-24GB", "4g.24gb", 4, 4, 0, 1, 1},
		{"A30-24GB", "2g.12gb+me", 2, 2, 0, 1, 1},
		{"H100-SXM5-80GB", "1g.10gb", 1, 1, 0, 1, 0},
		{"H100-SXM5-80GB", "7g.80gb", 8, 7, 0, 7, 1},
		{"B200-SXM-180GB", "7g.180gb", 7, 7, 0, 4, 4},
		{"B200-SXM-180GB", "2g.45gb", 2, 2, 0, 1, 1},
		{"RTX-PRO-6000-BSE-96GB", "1g.24gb", 1, 1, 1, 1, 0},
		{"RTX-PRO-6000-BSE-96GB", "1g.24gb+me.all", 1, 4, 4, 4, 1},
		{"RTX-PRO-6000-BSE-96GB", "2g.48gb-me", 2, 0, 0, 0, 0},
		{"RTX-PRO-6000-BSE-96GB", "4g.96gb+gfx", 4, 4, 4, 4, 1},
	}
	for _, tt := range tests {
		t.Run(tt.model+"/"+tt.gi, func(t *testing.T) {
			p, ok := model(t, c, tt.model).GPUInstanceProfileByName(tt.gi)
			if !ok {
				t.Fatal("missing")
			}
			got := [5]int{p.CopyEngines, p.Decoders, p.Encoders, p.JPEGs, p.OFAs}
			if want := [5]int{tt.ce, tt.dec, tt.enc, tt.jpg, tt.o}; got != want {
				t.Errorf("CE/DEC/ENC/JPG/OFA = %v, want %v", got, want)
			}
		})
	}
}

func TestVGPUTypes(t *testing.T) {
	c := embedded(t)
	tests := []struct {
		model, name    string
		id             int
		fbMiB          uint64
		max, mixed     int
		gi, perGI      int // gi -1: time-sliced
		unconfirmedIDs bool
	}{
		{"L40S-48GB", "L40S-1B", 1145, 1024, 32, 32, -1, 0, false},
		{"L40S-48GB", "L40S-2B", 1146, 2048, 24, 24, -1, 0, false},
		{"L40S-48GB", "L40S-3B", 2164, 3072, 16, 16, -1, 0, false},
		{"L40S-48GB", "L40S-1Q", 1147, 1024, 32, 32, -1, 0, false},
		{"L40S-48GB", "L40S-48Q", 1156, 49152, 1, 1, -1, 0, false},
		{"L40S-48GB", "L40S-1A", 1157, 1024, 32, 32, -1, 0, false},
		{"L40S-48GB", "L40S-48A", 1166, 49152, 1, 1, -1, 0, false},
		{"L40S-48GB", "L40S-16C", 1172, 16384, 3, 2, -1, 0, true},
		{"L40S-48GB", "L40S-4C", 1176, 4096, 12, 8, -1, 0, true},
		{"L4-24GB", "L4-8C", 820, 8192, 3, 2, -1, 0, true},
		{"L4-24GB", "L4-4C", 822, 4096, 6, 4, -1, 0, true},
		{"A10-24GB", "A10-6Q", 594, 6144, 4, 4, -1, 0, false},
		{"T4-16GB", "T4-16Q", 754, 16384, 1, 1, -1, 0, true},
		{"A100-SXM4-40GB", "A100X-8C", 1203, 8192, 5, 4, -1, 0, true},
		{"A100-SXM4-40GB", "A100X-3-20C", 1212, 20480, 2, 2, 9, 1, true},
		{"A100-SXM4-40GB", "A100X-1-5CME", 1216, 5120, 1, 1, 20, 1, true},
		{"A100-SXM4-80GB", "A100DX-4C", 1236, 4096, 20, 16, -1, 0, true},
		{"A100-SXM4-80GB", "A100DX-1-20C", 1244, 20480, 4, 4, 15, 1, true},
		{"A30-24GB", "A30-2-12CME", 1272, 12288, 1, 1, 6, 1, true},
		{"A30-24GB", "A30-1-6C", 1273, 6144, 4, 4, 14, 1, true},
		{"H100-SXM5-80GB", "H100XM-16C", 1303, 16384, 5, 4, -1, 0, true},
		{"H100-SXM5-80GB", "H100XM-3-40C", 1312, 40960, 2, 2, 9, 1, true},
		{"H200-SXM5-141GB", "H200X-1-18C", 1414, 18432, 7, 7, 19, 1, false},
		{"H200-SXM5-141GB", "H200X-141C", 1428, 144384, 1, 1, -1, 0, false},
		{"H200-SXM5-141GB", "H200X-4C", 1447, 4096, 32, 32, -1, 0, true},
		{"H200-SXM5-141GB", "H200X-3-71C", 1450, 72704, 2, 2, 9, 1, true},
		{"B200-SXM-180GB", "B200X-1-23C", 1474, 23552, 7, 7, 19, 1, true},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-1-24Q", 1561, 24576, 4, 4, 47, 1, false},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-3Q", 1519, 3072, 32, 32, -1, 0, true},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-96Q", 1600, 98304, 1, 1, -1, 0, true},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-4-24Q", 1634, 24576, 4, 4, 32, 4, true},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-2-12Q", 1638, 12288, 8, 8, 35, 4, true},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-1-2Q", 1644, 2048, 32, 32, 47, 12, true},
		{"RTX-PRO-6000-BSE-96GB", "RTX Pro 6000 Blackwell DC-1-3B", 1660, 3072, 32, 32, 47, 8, true},
	}
	for _, tt := range tests {
		t.Run(tt.model+"/"+tt.name, func(t *testing.T) {
			m := model(t, c, tt.model)
			ty, ok := m.VGPUTypeByName("NVIDIA " + tt.name)
			if !ok {
				t.Fatal("missing")
			}
			if byID, _ := m.VGPUTypeByID(tt.id); byID != ty {
				t.Errorf("VGPUTypeByID(%d) is not %s (id %d)", tt.id, tt.name, ty.ID)
			}
			gi := -1
			if ty.MIGBacked() {
				gi = *ty.GPUInstanceProfile
			}
			if ty.FramebufferMiB != tt.fbMiB || ty.MaxInstances != tt.max || ty.MixedMax() != tt.mixed || gi != tt.gi || ty.MaxPerGPUInstance != tt.perGI {
				t.Errorf("fb %d max %d/%d gi %d per-GI %d, want %d %d/%d %d %d",
					ty.FramebufferMiB, ty.MaxInstances, ty.MixedMax(), gi, ty.MaxPerGPUInstance, tt.fbMiB, tt.max, tt.mixed, tt.gi, tt.perGI)
			}
			if got := slices.Contains(ty.Unconfirmed, "id"); got != tt.unconfirmedIDs {
				t.Errorf("id unconfirmed = %v, want %v", got, tt.unconfirmedIDs)
			}
		})
	}
}

// TestConfirmedTypeIDs: exactly the ids of reference 4.2 are not marked
// unconfirmed; 1519 (DC-3Q) is marked because its sources disagree.
func TestConfirmedTypeIDs(t *testing.T) {
	confirmed := map[int]string{594: "A10-6Q", 2164: "L40S-3B", 1414: "H200X-1-18C", 1428: "H200X-141C",
		1561: "RTX Pro 6000 Blackwell DC-1-24Q", 1145: "L40S-1B", 1146: "L40S-2B"}
	for i, gb := range []int{1, 2, 3, 4, 6, 8, 12, 16, 24, 48} {
		confirmed[1147+i] = fmt.Sprintf("L40S-%dQ", gb)
		confirmed[1157+i] = fmt.Sprintf("L40S-%dA", gb)
	}
	seen := 0
	for _, m := range embedded(t).Models() {
		for _, ty := range m.VGPU.Types {
			name, ok := confirmed[ty.ID]
			if ok {
				seen++
				if name != ty.Name {
					t.Errorf("%s: id %d is %s, the reference says %s", m.Name, ty.ID, ty.Name, name)
				}
			}
			if unc := slices.Contains(ty.Unconfirmed, "id"); unc == ok {
				t.Errorf("%s: %s id %d: unconfirmed %v", m.Name, ty.Name, ty.ID, unc)
			}
		}
	}
	if seen != len(confirmed) {
		t.Errorf("found %d of the %d confirmed ids", seen, len(confirmed))
	}
}

// migTypeRE splits a MIG-backed type name: GI compute slices, framebuffer GB, series, suffix.
var migTypeRE = regexp.MustCompile(`-([0-9]+)-([0-9]+)([QBAC])(ME)?$`)

// TestMIGBackedTypes checks every MIG-backed type against its GI profile: the
// name's slice count, the media suffix, graphics only on +gfx profiles where
// the model has them, and max = per-GI max x GIs, capped at the VFs.
func TestMIGBackedTypes(t *testing.T) {
	for _, m := range embedded(t).Models() {
		for _, ty := range m.VGPU.Types {
			if !ty.MIGBacked() {
				continue
			}
			gi, _ := m.GPUInstanceProfileByID(*ty.GPUInstanceProfile)
			parts := migTypeRE.FindStringSubmatch(ty.Name)
			if parts == nil {
				t.Errorf("%s: %s does not look MIG-backed", m.Name, ty.Name)
				continue
			}
			if parts[1] != strconv.Itoa(gi.ComputeSlices) {
				t.Errorf("%s: %s on %s: slice count differs", m.Name, ty.Name, gi.Name)
			}
			if (parts[4] == "ME") != gi.Media {
				t.Errorf("%s: %s on %s: ME suffix and media profile disagree", m.Name, ty.Name, gi.Name)
			}
			if ty.Series != profile.SeriesC && !gi.Graphics {
				t.Errorf("%s: graphics type %s on %s", m.Name, ty.Name, gi.Name)
			}
			want := ty.MaxPerGPUInstance * gi.MaxInstances
			if vfs := m.VGPU.SRIOVVFs; vfs > 0 {
				want = min(want, vfs)
			}
			if ty.MaxInstances != want {
				t.Errorf("%s: %s max %d, want %d x %d GIs capped at %d VFs", m.Name, ty.Name, ty.MaxInstances, ty.MaxPerGPUInstance, gi.MaxInstances, m.VGPU.SRIOVVFs)
			}
		}
	}
}

func TestRTXGraphicsProfiles(t *testing.T) {
	m := model(t, embedded(t), "RTX-PRO-6000-BSE-96GB")
	var gfx []int
	for _, p := range m.MIG.GPUInstanceProfiles {
		if p.Graphics {
			gfx = append(gfx, p.ID)
		}
	}
	if !slices.Equal(gfx, []int{47, 35, 32}) {
		t.Errorf("+gfx profiles %v, want [47 35 32]", gfx)
	}
}

// TestUnconfirmedNamesFields: every unconfirmed entry is the YAML name of a
// field of the struct it sits in, so a typo cannot hide an inferred value.
func TestUnconfirmedNamesFields(t *testing.T) {
	check := func(where string, v any, list []string) {
		fields := map[string]bool{}
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			fields[name] = true
		}
		for _, u := range list {
			if !fields[u] || u == "unconfirmed" {
				t.Errorf("%s: unconfirmed entry %q is not a field of %s", where, u, rt.Name())
			}
		}
	}
	for _, m := range embedded(t).Models() {
		check(m.Name, *m, m.Unconfirmed)
		if g := m.MIG; g != nil {
			check(m.Name+" mig", *g, g.Unconfirmed)
			for _, p := range g.GPUInstanceProfiles {
				check(m.Name+" "+p.Name, p, p.Unconfirmed)
			}
			for _, s := range g.ComputeInstanceProfiles {
				for _, p := range s.Profiles {
					check(fmt.Sprintf("%s CI %d in %d", m.Name, p.ID, s.GISlices), p, p.Unconfirmed)
				}
			}
		}
		if v := m.VGPU; v != nil {
			check(m.Name+" vgpu", *v, v.Unconfirmed)
			for _, ty := range v.Types {
				check(m.Name+" "+ty.Name, ty, ty.Unconfirmed)
			}
		}
	}
}

// TestInferredValuesAreMarked pins the unconfirmed lists the reference's
// [I] and [X] marks require.
func TestInferredValuesAreMarked(t *testing.T) {
	c := embedded(t)
	for _, m := range c.Models() {
		for _, f := range []string{"product", "pciDeviceIDs", "usableMemoryMiB", "sms"} {
			if !slices.Contains(m.Unconfirmed, f) {
				t.Errorf("%s: %s not marked unconfirmed", m.Name, f)
			}
		}
		if v := m.VGPU; v.SRIOVVFs > 0 && !slices.Contains(v.Unconfirmed, "sriovVFs") && m.Name != "RTX-PRO-6000-BSE-96GB" {
			t.Errorf("%s: sriovVFs not marked unconfirmed", m.Name)
		}
	}
	tests := []struct {
		model  string
		fields []string // on every GI profile
	}{
		{"H200-SXM5-141GB", []string{"id", "placements"}},
		{"B200-SXM-180GB", []string{"id", "placements", "copyEngines", "sms"}},
	}
	for _, tt := range tests {
		for _, p := range model(t, c, tt.model).MIG.GPUInstanceProfiles {
			for _, f := range tt.fields {
				if !slices.Contains(p.Unconfirmed, f) {
					t.Errorf("%s %s: %s not marked unconfirmed", tt.model, p.Name, f)
				}
			}
		}
	}
	a30, _ := model(t, c, "A30-24GB").GPUInstanceProfileByID(6)
	if !slices.Contains(a30.Unconfirmed, "id") {
		t.Errorf("A30 2g.12gb+me: id 6 not marked unconfirmed")
	}
}
