package virt_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/vgpud/vgpud/pkg/virt"
)

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]virt.Version{
		"6.1.0-18-amd64":   {6, 1, 0},
		"5.18.19":          {5, 18, 19},
		"5.18":             {5, 18, 0},
		"6.9-rc2":          {6, 9, 0},
		"6.18.44-fc-v1272": {6, 18, 44},
	} {
		got, err := virt.ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "6", "x.1", "6.x"} {
		if v, err := virt.ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) = %v, want an error", bad, v)
		}
	}
}

func TestCheckLiveMigration(t *testing.T) {
	ok := virt.HostVersions{Host: "a", Libvirt: virt.Version{10, 0, 0}, QEMU: virt.Version{8, 2, 2}, Kernel: virt.Version{6, 8, 0}}
	// The minimums themselves are enough.
	atMin := virt.HostVersions{Host: "b", Libvirt: virt.Version{8, 6, 0}, QEMU: virt.Version{8, 1, 0}, Kernel: virt.Version{5, 18, 0}}
	with := func(f func(*virt.HostVersions)) virt.HostVersions {
		v := ok
		v.Host = "b"
		f(&v)
		return v
	}
	debian12 := with(func(v *virt.HostVersions) { v.QEMU = virt.Version{7, 2, 22}; v.Libvirt = virt.Version{9, 0, 0} })
	cases := []struct {
		name     string
		src, dst virt.HostVersions
		vgpuLive bool
		want     []virt.Refusal
	}{
		{"new enough", ok, ok, true, nil},
		{"at the minimums", atMin, atMin, true, nil},
		{"QEMU 7.2 on the destination", ok, debian12, true, []virt.Refusal{
			{Reason: virt.ReasonQEMUTooOld, End: "destination", Host: "b", Have: virt.Version{7, 2, 22}, Need: virt.Version{8, 1, 0}}}},
		{"QEMU 8.0.9 on the source", with(func(v *virt.HostVersions) { v.QEMU = virt.Version{8, 0, 9} }), ok, true, []virt.Refusal{
			{Reason: virt.ReasonQEMUTooOld, End: "source", Host: "b", Have: virt.Version{8, 0, 9}, Need: virt.Version{8, 1, 0}}}},
		{"libvirt 8.5", ok, with(func(v *virt.HostVersions) { v.Libvirt = virt.Version{8, 5, 0} }), true, []virt.Refusal{
			{Reason: virt.ReasonLibvirtTooOld, End: "destination", Host: "b", Have: virt.Version{8, 5, 0}, Need: virt.Version{8, 6, 0}}}},
		{"kernel 5.17", with(func(v *virt.HostVersions) { v.Kernel = virt.Version{5, 17, 15} }), ok, true, []virt.Refusal{
			{Reason: virt.ReasonKernelTooOld, End: "source", Host: "b", Have: virt.Version{5, 17, 15}, Need: virt.Version{5, 18, 0}}}},
		{"everything old, both ends", with(func(v *virt.HostVersions) {
			*v = virt.HostVersions{Host: "s", Libvirt: virt.Version{7, 0, 0}, QEMU: virt.Version{6, 2, 0}, Kernel: virt.Version{5, 10, 0}}
		}), debian12, true, []virt.Refusal{
			{Reason: virt.ReasonQEMUTooOld, End: "source", Host: "s", Have: virt.Version{6, 2, 0}, Need: virt.Version{8, 1, 0}},
			{Reason: virt.ReasonLibvirtTooOld, End: "source", Host: "s", Have: virt.Version{7, 0, 0}, Need: virt.Version{8, 6, 0}},
			{Reason: virt.ReasonKernelTooOld, End: "source", Host: "s", Have: virt.Version{5, 10, 0}, Need: virt.Version{5, 18, 0}},
			{Reason: virt.ReasonQEMUTooOld, End: "destination", Host: "b", Have: virt.Version{7, 2, 22}, Need: virt.Version{8, 1, 0}},
		}},
		{"vGPU in the config only: old versions do not matter", debian12, debian12, false, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := virt.CheckLiveMigration(c.src, c.dst, c.vgpuLive)
			if c.want == nil {
				if err != nil {
					t.Fatalf("CheckLiveMigration: %v, want nil", err)
				}
				return
			}
			var pe *virt.PrecheckError
			if !errors.Is(err, virt.ErrLiveMigrationRefused) || !errors.As(err, &pe) {
				t.Fatalf("CheckLiveMigration: %v, want a *PrecheckError wrapping ErrLiveMigrationRefused", err)
			}
			if !reflect.DeepEqual(pe.Refusals, c.want) {
				t.Fatalf("refusals = %+v\nwant %+v", pe.Refusals, c.want)
			}
		})
	}
	err := virt.CheckLiveMigration(ok, debian12, true)
	const want = "live migration refused: qemu_too_old: QEMU 7.2.22 on the destination (b) is older than 8.1.0, which live migration of a VFIO device needs"
	if err == nil || err.Error() != want {
		t.Fatalf("message = %v\nwant %s", err, want)
	}
}
