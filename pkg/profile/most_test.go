package profile_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// TestLoadRefusesMoreInstancesThanTheGPUClass: an operator's catalog
// (the profiles directory, read at start and at every reload) whose model
// lets one GPU hold more than MaxInstancesPerGPU instances is refused with
// ErrTooManyInstances, naming the model and how many, and nothing of it is
// loaded; at exactly the bound it loads.
func TestLoadRefusesMoreInstancesThanTheGPUClass(t *testing.T) {
	dir := t.TempDir()
	m := validModel()
	m.Name, m.Product = "TEST-DENSE-24GB", "NVIDIA Dense"
	m.VGPU.SRIOVVFs = 96
	m.VGPU.Types = append(m.VGPU.Types, profile.VGPUType{ID: 9101, Name: "TEST-025C", Series: "C", FramebufferMiB: 256, MaxInstances: profile.MaxInstancesPerGPU + 1})
	writeFile(t, dir, "dense.yaml", marshal(t, m))
	cat, err := profile.Load(profiles.FS, dir)
	if !errors.Is(err, profile.ErrTooManyInstances) || !errors.Is(err, profile.ErrInvalid) || cat != nil {
		t.Fatalf("Load = %v, %v; want ErrTooManyInstances (and ErrInvalid), no catalog", cat, err)
	}
	for _, w := range []string{"TEST-DENSE-24GB", "65 instances", "more than 64"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not name %q: %v", w, err)
		}
	}
	m.VGPU.Types[len(m.VGPU.Types)-1].MaxInstances = profile.MaxInstancesPerGPU
	writeFile(t, dir, "dense.yaml", marshal(t, m))
	if _, err := profile.Load(profiles.FS, dir); err != nil {
		t.Fatalf("a model holding exactly %d: %v", profile.MaxInstancesPerGPU, err)
	}
}

// TestMostInstancesBoundsMIGMixes: on a MIG GPU the bound adds the
// compute instances to the GPU instances' vGPUs, as one GPU can hold both
// kinds at once in different GPU instances.
func TestMostInstancesBoundsMIGMixes(t *testing.T) {
	m := validModel()
	m.VGPU.Types[3].MaxPerGPUInstance = 3 // TEST-1-6Q: up to 3 per 1g.6gb+gfx, 4 of those
	if got, want := m.MostInstances(), 4+4*3; got != want {
		t.Fatalf("MostInstances = %d, want %d (4 compute slices + 4 GPU instances x 3 vGPUs)", got, want)
	}
}
