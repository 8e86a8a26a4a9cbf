package fleet

import (
	"testing"

	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/profiles"
)

// TestClassNamesApart: on every model of the catalog, every profile that
// can be published (MIG profiles, vGPU types) has a resource class of its
// own, so Placement counts each apart: 1g.24gb+me and 1g.24gb-me, say.
func TestClassNamesApart(t *testing.T) {
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cat.Models() {
		seen := map[string]string{}
		add := func(kind store.InstanceKind, name string) {
			c := ClassName(kind, name)
			if other, ok := seen[c]; ok {
				t.Errorf("%s: %s and %s are both %s", m.Name, other, name, c)
			}
			seen[c] = name
		}
		if m.MIG != nil {
			for _, p := range m.MIG.GPUInstanceProfiles {
				add(store.KindMIG, p.Name)
			}
		}
		if m.VGPU != nil {
			for _, v := range m.VGPU.Types {
				add(store.KindVGPU, v.Name)
			}
		}
	}
	for _, c := range []struct{ profile, want string }{
		{"1g.10gb", "CUSTOM_VGPUD_MIG_1G_10GB"},
		{"1g.24gb+me", "CUSTOM_VGPUD_MIG_1G_24GB_ME"},
		{"1g.24gb-me", "CUSTOM_VGPUD_MIG_1G_24GB_NO_ME"},
	} {
		if got := ClassName(store.KindMIG, c.profile); got != c.want {
			t.Errorf("ClassName(mig, %s) = %s, want %s", c.profile, got, c.want)
		}
	}
}
