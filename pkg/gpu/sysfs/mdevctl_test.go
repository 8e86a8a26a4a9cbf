package sysfs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
)

const (
	u1 = "83c32df7-d52e-4ec1-9668-1f3c7e4df107"
	u2 = "b0a3989f-8138-4d49-b63a-59db28ec8b48"
	u3 = "5cf14a12-a437-4c82-a13f-70e945782d7b"
)

// writeTree writes files (path -> content) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// mdevctl's config directory as its README describes it: a directory per
// parent, a JSON file per mdev named by its UUID.
func TestReadMdevctl(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"0000:a1:00.4/" + u1:            `{"mdev_type": "nvidia-558", "start": "auto", "attrs": []}`,
		"0000:a1:00.5/" + u2:            `{"mdev_type": "nvidia-559", "start": "manual"}`,
		"matrix/" + strings.ToUpper(u3): `{"mdev_type": "vfio_ap-passthrough", "start": "manual", "attrs": [{"assign_adapter": "5"}]}`,
		"scripts.d/callouts/x":          "#!/bin/sh\n",
		"0000:a1:00.4/README":           "not a definition",
	})
	got, err := sysfs.ReadMdevctl(context.Background(), dir)
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
	dir := writeTree(t, map[string]string{
		"0000:a1:00.4/" + u1: `{"mdev_type": "nvidia-558", "start": "auto"}`,
		"0000:a1:00.4/" + u2: `{"mdev_type": "nvidia-558", "start": "sometimes"}`,
		"0000:a1:00.5/" + u3: `{"start": "auto"`,
	})
	got, err := sysfs.ReadMdevctl(context.Background(), dir)
	if len(got) != 1 || got[0].UUID != u1 {
		t.Errorf("read %+v, want the one good definition", got)
	}
	for _, want := range []string{u2 + ` skipped: start "sometimes"`, "0000:a1:00.5/" + u3} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if got, err := sysfs.ReadMdevctl(context.Background(), filepath.Join(t.TempDir(), "etc/mdevctl.d")); err != nil || got != nil {
		t.Errorf("missing directory: %+v, %v", got, err)
	}
}

// TestReadMdevctlHostileEntries: whatever sits in mdevctl's directory
// under a definition's name, the read returns, with every good definition
// and each bad entry named with what it is, and opens nothing that is
// not a regular file: a FIFO (which blocked the read until a writer
// came), a device node and a link to one (/dev/zero never ends: the read
// ran the daemon out of memory), a link to a FIFO or to a good file, a
// directory, a file larger than MaxMdevctlDefinition (read whole before).
func TestReadMdevctlHostileEntries(t *testing.T) {
	const parent = "0000:a1:00.4"
	good := `{"mdev_type": "nvidia-558", "start": "auto"}`
	ids := []string{}
	for i := 0; i < 9; i++ {
		ids = append(ids, fmt.Sprintf("6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9b%02d", i))
	}
	dir := writeTree(t, map[string]string{parent + "/" + u1: good, "elsewhere/" + u2: good})
	p := func(id string) string { return filepath.Join(dir, parent, id) }
	if err := syscall.Mkfifo(p(ids[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", p(ids[1])); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(p(ids[0]), p(ids[2])); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "elsewhere", u2), p(ids[3])); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p(ids[4]), 0o755); err != nil {
		t.Fatal(err)
	}
	// Sparse: its size is what counts, and it is never read.
	huge, err := os.Create(p(ids[5]))
	if err != nil {
		t.Fatal(err)
	}
	if err := huge.Truncate(300 << 20); err != nil {
		t.Fatal(err)
	}
	huge.Close()
	// Just over the bound, with a valid definition at its start.
	if err := os.WriteFile(p(ids[6]), append([]byte(good), make([]byte, sysfs.MaxMdevctlDefinition)...), 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		ids[0]: "a FIFO", ids[1]: "a symbolic link", ids[2]: "a symbolic link", ids[3]: "a symbolic link",
		ids[4]: "a directory", ids[5]: "314572800 bytes", ids[6]: "bytes; a definition is at most 65536",
	}
	// A device node itself (/dev/zero's numbers), where the test may make one.
	if err := syscall.Mknod(p(ids[7]), syscall.S_IFCHR|0o644, 1<<8|5); err == nil {
		want[ids[7]] = "a character device"
	} else {
		t.Logf("no device node (%v): that case is not run", err)
	}
	type result struct {
		defs []gpu.MdevctlDefinition
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defs, err := sysfs.ReadMdevctl(context.Background(), dir)
		done <- result{defs, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("reading mdevctl's directory did not return (a FIFO or an endless file held it)")
	}
	if len(r.defs) != 2 || r.defs[0].UUID != u1 || r.defs[1].UUID != u2 {
		t.Errorf("definitions %+v, want the two good ones", r.defs)
	}
	bad := map[string]string{}
	for _, fe := range sysfs.MdevctlFileErrors(r.err) {
		bad[fe.UUID] = fe.Error()
		if fe.Parent != parent {
			t.Errorf("%s: parent %q", fe.File, fe.Parent)
		}
	}
	for id, what := range want {
		if !strings.Contains(bad[id], what) || !strings.Contains(bad[id], parent+"/"+id+" skipped") {
			t.Errorf("entry %s reported as %q, want it named, skipped, as %q", id, bad[id], what)
		}
	}
	if len(bad) != len(want) {
		t.Errorf("reported %d entries, want %d: %v", len(bad), len(want), r.err)
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
