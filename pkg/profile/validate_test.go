package profile_test

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/profile"
)

const testFile = "testdata-dir/test-gpu.yaml"

func intp(v int) *int { return &v }

// validModel returns a small model that passes every rule: a 4-slice MIG grid
// with a media and a graphics profile, and vGPU types of each kind.
func validModel() *profile.Model {
	return &profile.Model{
		Version:         profile.SchemaVersion,
		Name:            "TEST-GPU-24GB",
		Product:         "NVIDIA Test",
		Architecture:    "ampere",
		PCIDeviceIDs:    []string{"0x1234"},
		MemoryMiB:       24576,
		UsableMemoryMiB: 24000,
		SMs:             56,
		MIG: &profile.MIG{
			MemorySlices:  4,
			ComputeSlices: 4,
			GPUInstanceProfiles: []profile.GPUInstanceProfile{
				{ID: 14, Index: 0, Name: "1g.6gb", ComputeSlices: 1, Size: 1, Placements: []int{0, 1, 2, 3}, MaxInstances: 4, MemoryMiB: 5952, SMs: 14, CopyEngines: 1},
				{ID: 21, Index: 7, Name: "1g.6gb+me", ComputeSlices: 1, Size: 1, Placements: []int{0, 1, 2, 3}, MaxInstances: 1, MemoryMiB: 5952, SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Media: true},
				{ID: 47, Index: 10, Name: "1g.6gb+gfx", ComputeSlices: 1, Size: 1, Placements: []int{0, 1, 2, 3}, MaxInstances: 4, MemoryMiB: 5952, SMs: 14, CopyEngines: 1, Graphics: true},
				{ID: 5, Index: 1, Name: "2g.12gb", ComputeSlices: 2, Size: 2, Placements: []int{0, 2}, MaxInstances: 2, MemoryMiB: 11968, SMs: 28, CopyEngines: 2},
				{ID: 0, Index: 3, Name: "4g.24gb", ComputeSlices: 4, Size: 4, Placements: []int{0}, MaxInstances: 1, MemoryMiB: 24064, SMs: 56, CopyEngines: 4},
			},
			ComputeInstanceProfiles: []profile.ComputeInstanceSet{
				{GISlices: 1, Profiles: []profile.ComputeInstanceProfile{{ID: 0, Slices: 1, MaxInstances: 1}}},
				{GISlices: 2, Profiles: []profile.ComputeInstanceProfile{{ID: 0, Slices: 1, MaxInstances: 2}, {ID: 1, Slices: 2, MaxInstances: 1}}},
				{GISlices: 4, Profiles: []profile.ComputeInstanceProfile{{ID: 0, Slices: 1, MaxInstances: 4}, {ID: 1, Slices: 2, MaxInstances: 2}, {ID: 3, Slices: 4, MaxInstances: 1}}},
			},
		},
		VGPU: &profile.VGPU{
			Flows:      []string{profile.FlowMdev, profile.FlowVFIO},
			SRIOVVFs:   16,
			TypePrefix: "TEST",
			Types: []profile.VGPUType{
				{ID: 9001, Name: "TEST-24C", Series: "C", FramebufferMiB: 24576, MaxInstances: 1},
				{ID: 9002, Name: "TEST-4C", Series: "C", FramebufferMiB: 4096, MaxInstances: 6, MaxInstancesMixed: 4},
				{ID: 9003, Name: "TEST-1-6C", Series: "C", FramebufferMiB: 6144, MaxInstances: 4, GPUInstanceProfile: intp(14), MaxPerGPUInstance: 1},
				{ID: 9004, Name: "TEST-1-6Q", Series: "Q", FramebufferMiB: 6144, MaxInstances: 4, GPUInstanceProfile: intp(47), MaxPerGPUInstance: 1},
			},
		},
	}
}

func marshal(t *testing.T, m *profile.Model) []byte {
	t.Helper()
	data, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// checkInvalid asserts that err wraps ErrInvalid and that its message names
// each of want (the file, the model and the field, at least).
func checkInvalid(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one naming %q", want)
	}
	if !errors.Is(err, profile.ErrInvalid) {
		t.Errorf("error does not wrap ErrInvalid: %v", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not name %q:\n%v", w, err)
		}
	}
}

func TestValidModelIsValid(t *testing.T) {
	m, err := profile.Parse(testFile, marshal(t, validModel()))
	if err != nil {
		t.Fatal(err)
	}
	if m.Source() != testFile {
		t.Errorf("Source() = %q, want %q", m.Source(), testFile)
	}
}

// TestValidateRules has one case per rule of Model.Validate. Each mutates the
// valid model, round-trips it through YAML and Parse, and checks that the
// error wraps ErrInvalid and names the file, the model and the field.
func TestValidateRules(t *testing.T) {
	gi := func(m *profile.Model, name string) *profile.GPUInstanceProfile {
		p, ok := m.GPUInstanceProfileByName(name)
		if !ok {
			panic("no GI profile " + name)
		}
		return p
	}
	vt := func(m *profile.Model, name string) *profile.VGPUType {
		x, ok := m.VGPUTypeByName(name)
		if !ok {
			panic("no vGPU type " + name)
		}
		return x
	}
	tests := []struct {
		name   string
		mutate func(m *profile.Model)
		field  string // the field path the message must name
		detail string // more of the message, optional
	}{
		// Model.
		{"version missing", func(m *profile.Model) { m.Version = "" }, "version", "missing"},
		{"version newer than this build", func(m *profile.Model) { m.Version = "v2" }, "version", `"v2" is not supported`},
		{"name with a space", func(m *profile.Model) { m.Name = "TEST GPU" }, "name", "letters, digits"},
		{"name too short", func(m *profile.Model) { m.Name = "T" }, "name", "2-63"},
		{"product missing", func(m *profile.Model) { m.Product = "" }, "product", "missing"},
		{"architecture unknown", func(m *profile.Model) { m.Architecture = "Hopper" }, "architecture", `"Hopper"`},
		{"no pci device id", func(m *profile.Model) { m.PCIDeviceIDs = nil }, "pciDeviceIDs", "at least one"},
		{"pci device id without 0x", func(m *profile.Model) { m.PCIDeviceIDs = []string{"0x1234", "2330"} }, "pciDeviceIDs[1]", "0x-prefixed"},
		{"pci device id too long", func(m *profile.Model) { m.PCIDeviceIDs = []string{"0x12345"} }, "pciDeviceIDs[0]", "4 hex digits"},
		{"pci device id not hex", func(m *profile.Model) { m.PCIDeviceIDs = []string{"0x12G4"} }, "pciDeviceIDs[0]", "4 hex digits"},
		{"memory zero", func(m *profile.Model) { m.MemoryMiB = 0 }, "memoryMiB", "must be positive"},
		{"usable memory above nominal", func(m *profile.Model) { m.UsableMemoryMiB = 30000 }, "usableMemoryMiB", "at most memoryMiB"},
		{"usable memory zero", func(m *profile.Model) { m.UsableMemoryMiB = 0 }, "usableMemoryMiB", "must be positive"},
		{"sms zero", func(m *profile.Model) { m.SMs = 0 }, "sms", "must be positive"},
		{"neither MIG nor vGPU", func(m *profile.Model) { m.MIG, m.VGPU = nil, nil }, "mig/vgpu", "needs MIG profiles"},

		// MIG grid and GPU-instance profiles.
		{"memory slices zero", func(m *profile.Model) { m.MIG.MemorySlices = 0 }, "mig.memorySlices", "1..32"},
		{"memory slices above 32", func(m *profile.Model) { m.MIG.MemorySlices = 33 }, "mig.memorySlices", "1..32"},
		{"compute slices above memory slices", func(m *profile.Model) { m.MIG.ComputeSlices = 5 }, "mig.computeSlices", "1..memorySlices"},
		{"no GI profiles", func(m *profile.Model) { m.MIG.GPUInstanceProfiles = nil; m.VGPU.Types = m.VGPU.Types[:2] }, "mig.gpuInstanceProfiles", "empty"},
		{"GI id used twice", func(m *profile.Model) { gi(m, "1g.6gb+me").ID = 14 }, "mig.gpuInstanceProfiles[1] (1g.6gb+me).id", "14 used by two profiles"},
		{"GI index out of range", func(m *profile.Model) { gi(m, "2g.12gb").Index = 18 }, "mig.gpuInstanceProfiles[3] (2g.12gb).index", "0..17"},
		{"GI index negative", func(m *profile.Model) { gi(m, "2g.12gb").Index = -1 }, "mig.gpuInstanceProfiles[3] (2g.12gb).index", "0..17"},
		{"GI index used twice", func(m *profile.Model) { gi(m, "4g.24gb").Index = 1 }, "mig.gpuInstanceProfiles[4] (4g.24gb).index", "1 used by two profiles"},
		{"GI name malformed", func(m *profile.Model) { gi(m, "2g.12gb").Name = "2g12gb" }, "mig.gpuInstanceProfiles[3] (2g12gb).name", "not of the form"},
		{"GI name unknown suffix", func(m *profile.Model) { gi(m, "2g.12gb").Name = "2g.12gb+foo" }, "mig.gpuInstanceProfiles[3] (2g.12gb+foo).name", "not of the form"},
		{"GI name used twice", func(m *profile.Model) { gi(m, "1g.6gb+gfx").Name = "1g.6gb" }, "mig.gpuInstanceProfiles[2] (1g.6gb).name", "used by two profiles"},
		{"GI compute slices above the grid", func(m *profile.Model) { p := gi(m, "4g.24gb"); p.ComputeSlices, p.Name = 5, "5g.24gb" }, "mig.gpuInstanceProfiles[4] (5g.24gb).computeSlices", "1..4"},
		{"GI compute slices disagree with name", func(m *profile.Model) { gi(m, "2g.12gb").ComputeSlices = 1 }, "mig.gpuInstanceProfiles[3] (2g.12gb).computeSlices", "disagrees with the name"},
		{"GI size zero", func(m *profile.Model) { gi(m, "2g.12gb").Size = 0 }, "mig.gpuInstanceProfiles[3] (2g.12gb).size", "1..4 memory slices"},
		{"GI size above the grid", func(m *profile.Model) { gi(m, "4g.24gb").Size = 5 }, "mig.gpuInstanceProfiles[4] (4g.24gb).size", "1..4 memory slices"},
		{"GI placements empty", func(m *profile.Model) { gi(m, "4g.24gb").Placements = nil }, "mig.gpuInstanceProfiles[4] (4g.24gb).placements", "empty"},
		{"GI placement outside the grid", func(m *profile.Model) { gi(m, "2g.12gb").Placements = []int{0, 3} }, "mig.gpuInstanceProfiles[3] (2g.12gb).placements", "start 3 + size 2 is outside the 4 memory slices"},
		{"GI placement negative", func(m *profile.Model) { gi(m, "2g.12gb").Placements = []int{-2, 0} }, "mig.gpuInstanceProfiles[3] (2g.12gb).placements", "outside"},
		{"GI placements not increasing", func(m *profile.Model) { gi(m, "2g.12gb").Placements = []int{2, 0} }, "mig.gpuInstanceProfiles[3] (2g.12gb).placements", "strictly increasing"},
		{"GI max instances above disjoint placements", func(m *profile.Model) { gi(m, "2g.12gb").MaxInstances = 3 }, "mig.gpuInstanceProfiles[3] (2g.12gb).maxInstances", "1..2 (disjoint placements)"},
		{"GI overlapping placements limit instances", func(m *profile.Model) { gi(m, "2g.12gb").Placements = []int{0, 1} }, "mig.gpuInstanceProfiles[3] (2g.12gb).maxInstances", "2 must be 1..1"},
		{"GI max instances zero", func(m *profile.Model) { gi(m, "4g.24gb").MaxInstances = 0 }, "mig.gpuInstanceProfiles[4] (4g.24gb).maxInstances", "1..1"},
		{"GI memory zero", func(m *profile.Model) { gi(m, "4g.24gb").MemoryMiB = 0 }, "mig.gpuInstanceProfiles[4] (4g.24gb).memoryMiB", "must be 1..24576"},
		{"GI memory above the GPU's", func(m *profile.Model) { gi(m, "4g.24gb").MemoryMiB = 24577 }, "mig.gpuInstanceProfiles[4] (4g.24gb).memoryMiB", "must be 1..24576"},
		{"GI memory times instances above the GPU's", func(m *profile.Model) { gi(m, "1g.6gb").MemoryMiB = 7000 }, "mig.gpuInstanceProfiles[0] (1g.6gb).memoryMiB", "7000 x maxInstances 4 exceeds"},
		{"GI sms above the GPU's", func(m *profile.Model) { gi(m, "4g.24gb").SMs = 57 }, "mig.gpuInstanceProfiles[4] (4g.24gb).sms", "1..56"},
		{"media profile with two instances", func(m *profile.Model) { gi(m, "1g.6gb+me").MaxInstances = 2 }, "mig.gpuInstanceProfiles[1] (1g.6gb+me).maxInstances", "limited to 1 instance"},

		// Compute-instance sets.
		{"CI set for a GI larger than the GPU", func(m *profile.Model) {
			m.MIG.ComputeInstanceProfiles = append(m.MIG.ComputeInstanceProfiles, profile.ComputeInstanceSet{GISlices: 8, Profiles: []profile.ComputeInstanceProfile{{ID: 5, Slices: 8, MaxInstances: 1}}})
		}, "mig.computeInstanceProfiles[3] (giSlices 8).giSlices", "1..4"},
		{"CI set listed twice", func(m *profile.Model) {
			m.MIG.ComputeInstanceProfiles = append(m.MIG.ComputeInstanceProfiles, m.MIG.ComputeInstanceProfiles[0])
		}, "mig.computeInstanceProfiles[3] (giSlices 1).giSlices", "listed twice"},
		{"CI id used twice", func(m *profile.Model) { m.MIG.ComputeInstanceProfiles[1].Profiles[1].ID = 0 }, "mig.computeInstanceProfiles[1] (giSlices 2).profiles[1].id", "0 used twice"},
		{"CI slices above the GI's", func(m *profile.Model) { m.MIG.ComputeInstanceProfiles[1].Profiles[0].Slices = 3 }, "mig.computeInstanceProfiles[1] (giSlices 2).profiles[0].slices", "1..2"},
		{"CI instances do not fit", func(m *profile.Model) { m.MIG.ComputeInstanceProfiles[2].Profiles[1].MaxInstances = 3 }, "mig.computeInstanceProfiles[2] (giSlices 4).profiles[1].maxInstances", "3 x 2 slices does not fit 4"},
		{"CI instances so many they would wrap", func(m *profile.Model) { m.MIG.ComputeInstanceProfiles[2].Profiles[1].MaxInstances = 1 << 62 }, "mig.computeInstanceProfiles[2] (giSlices 4).profiles[1].maxInstances", "does not fit 4"},
		{"CI set without a whole-GI profile", func(m *profile.Model) {
			m.MIG.ComputeInstanceProfiles[1].Profiles = m.MIG.ComputeInstanceProfiles[1].Profiles[:1]
		}, "mig.computeInstanceProfiles[1] (giSlices 2)", "no compute-instance profile covers the whole GPU instance"},
		{"CI set missing for a GI size", func(m *profile.Model) {
			m.MIG.ComputeInstanceProfiles = append(m.MIG.ComputeInstanceProfiles[:1], m.MIG.ComputeInstanceProfiles[2])
		}, "mig.gpuInstanceProfiles[3] (2g.12gb)", "no computeInstanceProfiles entry for giSlices 2"},

		// vGPU.
		{"no flows", func(m *profile.Model) { m.VGPU.Flows = nil }, "vgpu.flows", "at least one"},
		{"unknown flow", func(m *profile.Model) { m.VGPU.Flows = []string{"vfio", "sriov"} }, "vgpu.flows[1]", `"sriov" is not mdev or vfio`},
		{"vfio without VFs", func(m *profile.Model) { m.VGPU.SRIOVVFs = 0 }, "vgpu.sriovVFs", "needs SR-IOV"},
		{"negative VFs", func(m *profile.Model) { m.VGPU.Flows, m.VGPU.SRIOVVFs = []string{"mdev"}, -1 }, "vgpu.sriovVFs", "must not be negative"},
		{"type prefix missing", func(m *profile.Model) { m.VGPU.TypePrefix = "" }, "vgpu.typePrefix", "missing"},
		{"no types", func(m *profile.Model) { m.VGPU.Types = nil }, "vgpu.types", "empty"},
		{"type id zero", func(m *profile.Model) { vt(m, "TEST-4C").ID = 0 }, "vgpu.types[1] (TEST-4C).id", "must be positive"},
		{"type id used twice", func(m *profile.Model) { vt(m, "TEST-4C").ID = 9001 }, "vgpu.types[1] (TEST-4C).id", "9001 used by two types"},
		{"type name malformed", func(m *profile.Model) { vt(m, "TEST-4C").Name = "TEST-4" }, "vgpu.types[1] (TEST-4).name", "not a vGPU type name"},
		{"type name with the NVIDIA prefix", func(m *profile.Model) { vt(m, "TEST-4C").Name = "NVIDIA_TEST-4C" }, "vgpu.types[1] (NVIDIA_TEST-4C).name", "not a vGPU type name"},
		{"type name used twice", func(m *profile.Model) { vt(m, "TEST-4C").Name = "TEST-24C" }, "vgpu.types[1] (TEST-24C).name", "used by two types"},
		{"series unknown", func(m *profile.Model) { vt(m, "TEST-4C").Series = "X" }, "vgpu.types[1] (TEST-4C).series", `"X" is not Q, B, A or C`},
		{"series not in the name", func(m *profile.Model) { vt(m, "TEST-4C").Series = "Q" }, "vgpu.types[1] (TEST-4C).series", `"Q" does not appear in the name`},
		{"framebuffer zero", func(m *profile.Model) { vt(m, "TEST-4C").FramebufferMiB = 0 }, "vgpu.types[1] (TEST-4C).framebufferMiB", "must be 1..24576"},
		{"framebuffer above the GPU's", func(m *profile.Model) { vt(m, "TEST-24C").FramebufferMiB = 24577 }, "vgpu.types[0] (TEST-24C).framebufferMiB", "must be 1..24576"},
		{"type max instances zero", func(m *profile.Model) { vt(m, "TEST-24C").MaxInstances = 0 }, "vgpu.types[0] (TEST-24C).maxInstances", "must be positive"},
		{"mixed max above homogeneous max", func(m *profile.Model) { vt(m, "TEST-4C").MaxInstancesMixed = 7 }, "vgpu.types[1] (TEST-4C).maxInstancesMixed", "0..maxInstances (6)"},
		{"max instances above the VFs", func(m *profile.Model) { m.VGPU.SRIOVVFs = 4 }, "vgpu.types[1] (TEST-4C).maxInstances", "6 exceeds the 4 SR-IOV VFs"},
		{"max instances above the VFs on mdev", func(m *profile.Model) { m.VGPU.Flows, m.VGPU.SRIOVVFs = []string{"mdev"}, 4 }, "vgpu.types[1] (TEST-4C).maxInstances", "6 exceeds the 4 SR-IOV VFs"},
		{"type flow unknown", func(m *profile.Model) { vt(m, "TEST-4C").Flows = []string{"pci"} }, "vgpu.types[1] (TEST-4C).flows[0]", `"pci" is not mdev or vfio`},
		{"type flow the model lacks", func(m *profile.Model) { m.VGPU.Flows = []string{"mdev"}; vt(m, "TEST-4C").Flows = []string{"vfio"} }, "vgpu.types[1] (TEST-4C).flows[0]", `"vfio" is not one of the model's flows`},
		{"max resolution malformed", func(m *profile.Model) { vt(m, "TEST-4C").MaxResolution = "4K" }, "vgpu.types[1] (TEST-4C).maxResolution", `"4K" is not WxH`},
		{"per-GI max on a time-sliced type", func(m *profile.Model) { vt(m, "TEST-4C").MaxPerGPUInstance = 1 }, "vgpu.types[1] (TEST-4C).maxPerGPUInstance", "only for MIG-backed types"},
		{"framebuffer times max above memory", func(m *profile.Model) { vt(m, "TEST-4C").MaxInstances = 7 }, "vgpu.types[1] (TEST-4C).maxInstances", "7 x 4096 MiB exceeds the GPU's 24576 MiB"},
		{"framebuffer times max wraps around", func(m *profile.Model) {
			m.VGPU.Flows, m.VGPU.SRIOVVFs = []string{"mdev"}, 0
			x := vt(m, "TEST-4C")
			x.MaxInstances, x.MaxInstancesMixed = 1<<62, 0
		}, "vgpu.types[1] (TEST-4C).maxInstances", "exceeds the GPU's 24576 MiB"},
		{"MIG-backed type with unknown GI profile", func(m *profile.Model) { vt(m, "TEST-1-6C").GPUInstanceProfile = intp(99) }, "vgpu.types[2] (TEST-1-6C).gpuInstanceProfile", "99 is not a GPU-instance profile id of this model"},
		{"MIG-backed type on a model without MIG", func(m *profile.Model) { m.MIG = nil }, "vgpu.types[2] (TEST-1-6C).gpuInstanceProfile", "14 is not a GPU-instance profile id"},
		{"MIG-backed type without per-GI max", func(m *profile.Model) { vt(m, "TEST-1-6C").MaxPerGPUInstance = 0 }, "vgpu.types[2] (TEST-1-6C).maxPerGPUInstance", "a MIG-backed type needs it"},
		{"MIG-backed max above per-GI max times GIs", func(m *profile.Model) { vt(m, "TEST-1-6C").MaxInstances = 5 }, "vgpu.types[2] (TEST-1-6C).maxInstances", "5 exceeds maxPerGPUInstance 1 x 4 instances of 1g.6gb"},
		{"graphics type on a non-gfx GI", func(m *profile.Model) { vt(m, "TEST-1-6Q").GPUInstanceProfile = intp(14) }, "vgpu.types[3] (TEST-1-6Q).gpuInstanceProfile", "needs a +gfx GPU-instance profile, 1g.6gb is not"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := validModel()
			tt.mutate(m)
			got, err := profile.Parse(testFile, marshal(t, m))
			if got != nil {
				t.Errorf("Parse returned a model with the error")
			}
			checkInvalid(t, err, testFile, "model "+m.Name, tt.field+":", tt.detail)
		})
	}
}

// TestParseDecodeErrors covers what fails before validation: the YAML itself.
func TestParseDecodeErrors(t *testing.T) {
	valid := string(marshal(t, validModel()))
	tests := []struct {
		name string
		data string
		want []string // besides the file
	}{
		{"unknown top-level field", valid + "memoryGiB: 24\n", []string{"model TEST-GPU-24GB", `unknown field "memoryGiB"`}},
		{"unknown nested field", strings.Replace(valid, "memorySlices: 4", "memorySlices: 4\n  slots: 4", 1), []string{"model TEST-GPU-24GB", `unknown field "slots"`}},
		{"duplicate key", valid + "sms: 57\n", []string{"model TEST-GPU-24GB", `key "sms" already set`}},
		{"wrong type", strings.Replace(valid, "\nsms: 56", "\nsms: many", 1), []string{"model TEST-GPU-24GB", "Model.sms", "of type int"}},
		{"negative unsigned", strings.Replace(valid, "memoryMiB: 24576", "memoryMiB: -1", 1), []string{"model TEST-GPU-24GB", "memoryMiB"}},
		{"syntax error", "version: v1\nname: TEST-GPU-24GB\nproduct: [NVIDIA\n", []string{"model TEST-GPU-24GB", "line 3"}},
		{"tab indentation", "version: v1\nname: \"TEST-GPU-24GB\"\nmig:\n\tmemorySlices: 4\n", []string{"model TEST-GPU-24GB", "line 4"}},
		{"not a mapping", "- version: v1\n", []string{"cannot unmarshal array"}},
		{"empty file", "", []string{"version: missing", "name:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := profile.Parse(testFile, []byte(tt.data))
			if m != nil {
				t.Errorf("Parse returned a model with the error")
			}
			checkInvalid(t, err, append([]string{testFile}, tt.want...)...)
		})
	}
}
