package sysfs_test

import (
	"errors"
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
)

const (
	u1 = "83c32df7-d52e-4ec1-9668-1f3c7e4df107"
	u2 = "b0a3989f-8138-4d49-b63a-59db28ec8b48"
	u3 = "5cf14a12-a437-4c82-a13f-70e945782d7b"
)

// mdevctl's config directory as its README describes it: a directory per
// parent, a JSON file per mdev named by its UUID.
func TestReadMdevctl(t *testing.T) {
	dir := fstest.MapFS{
		"0000:a1:00.4/" + u1:            {Data: []byte(`{"mdev_type": "nvidia-558", "start": "auto", "attrs": []}`)},
		"0000:a1:00.5/" + u2:            {Data: []byte(`{"mdev_type": "nvidia-559", "start": "manual"}`)},
		"matrix/" + strings.ToUpper(u3): {Data: []byte(`{"mdev_type": "vfio_ap-passthrough", "start": "manual", "attrs": [{"assign_adapter": "5"}]}`)},
		"scripts.d/callouts/x":          {Data: []byte("#!/bin/sh\n")},
		"0000:a1:00.4/README":           {Data: []byte("not a definition")},
	}
	got, err := sysfs.ReadMdevctl(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.MdevctlDefinition{
		{UUID: u1, Parent: "0000:a1:00.4", Type: "nvidia-558", Start: "auto", File: "0000:a1:00.4/" + u1},
		{UUID: u2, Parent: "0000:a1:00.5", Type: "nvidia-559", Start: "manual", File: "0000:a1:00.5/" + u2},
		{UUID: u3, Parent: "matrix", Type: "vfio_ap-passthrough", Start: "manual", File: "matrix/" + strings.ToUpper(u3)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// A definition that does not parse is named in the error; the others are
// still read. A missing directory (no mdevctl) holds none.
func TestReadMdevctlErrors(t *testing.T) {
	dir := fstest.MapFS{
		"0000:a1:00.4/" + u1: {Data: []byte(`{"mdev_type": "nvidia-558", "start": "auto"}`)},
		"0000:a1:00.4/" + u2: {Data: []byte(`{"mdev_type": "nvidia-558", "start": "sometimes"}`)},
		"0000:a1:00.5/" + u3: {Data: []byte(`{"start": "auto"`)},
	}
	got, err := sysfs.ReadMdevctl(dir)
	if len(got) != 1 || got[0].UUID != u1 {
		t.Errorf("read %+v, want the one good definition", got)
	}
	for _, want := range []string{u2 + `: start "sometimes"`, "0000:a1:00.5/" + u3} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	sub, _ := fs.Sub(fstest.MapFS{}, "etc/mdevctl.d")
	if got, err := sysfs.ReadMdevctl(sub); err != nil || got != nil {
		t.Errorf("missing directory: %+v, %v", got, err)
	}
}

// `mdevctl list --defined` as mdevctl's README shows it, with --verbose
// attribute lines.
func TestParseMdevctlList(t *testing.T) {
	out := u1 + " 0000:00:02.0 i915-GVTg_V4_8 auto\n" +
		u2 + " 0000:00:02.0 i915-GVTg_V4_8 auto\n" +
		"783e6dbb-ea0e-411f-94e2-717eaad438bf matrix vfio_ap-passthrough manual\n" +
		"  Attrs:\n" +
		"    @{0}: {\"assign_adapter\":\"5\"}\n"
	got, err := sysfs.ParseMdevctlList(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[2].Parent != "matrix" || got[2].Start != "manual" || got[0].Type != "i915-GVTg_V4_8" {
		t.Fatalf("got %+v", got)
	}
	var lines []string
	for _, d := range got {
		lines = append(lines, sysfs.MdevctlLine(d))
	}
	if back := strings.Join(lines, "\n") + "\n"; !strings.HasPrefix(out, back[:len(back)-len(lines[2])-1]) {
		t.Errorf("MdevctlLine does not write what it reads:\n%s", back)
	}
	for _, bad := range []string{
		u1 + " 0000:00:02.0 i915-GVTg_V4_8\n",
		"not-a-uuid 0000:00:02.0 i915-GVTg_V4_8 auto\n",
		u1 + " 0000:00:02.0 i915-GVTg_V4_8 sometimes\n",
	} {
		if _, err := sysfs.ParseMdevctlList(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%q: %v, want an error naming line 1", bad, err)
		}
	}
	if _, err := sysfs.ParseMdevctlList(strings.NewReader("")); err != nil {
		t.Error(errors.Unwrap(err))
	}
}
