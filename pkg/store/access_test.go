package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// chmod sets mode exactly, whatever the umask.
func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestOpenRefusesUnsafeAccess(t *testing.T) {
	tests := []struct {
		name    string
		dir     os.FileMode // the state directory's mode
		file    os.FileMode // state.db's mode; 0: no file
		wantFix []string    // commands the message must give, DIR and FILE replaced
	}{
		{"world-writable directory", 0o777, 0o600, []string{"chmod 0750 DIR"}},
		{"world-writable sticky directory", 0o1777, 0o600, []string{"chmod 0750 DIR"}},
		{"group-writable directory", 0o770, 0o600, []string{"chmod 0750 DIR"}},
		{"others-writable directory", 0o703, 0o600, []string{"chmod 0750 DIR"}},
		{"unsafe directory, no file yet", 0o777, 0, []string{"chmod 0750 DIR"}},
		{"world-writable file", 0o750, 0o666, []string{"chmod 0600 FILE"}},
		{"group-writable file", 0o700, 0o620, []string{"chmod 0600 FILE"}},
		{"both", 0o777, 0o666, []string{"chmod 0750 DIR", "chmod 0600 FILE"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "state.db")
			var before []byte
			if tc.file != 0 {
				before = populated(t, path, 1)
				chmod(t, path, tc.file)
			}
			chmod(t, dir, tc.dir)
			names := dirNames(t, dir)

			db, err := Open(path, Options{})
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded, want ErrUnsafe")
			}
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("Open = %v, want ErrUnsafe", err)
			}
			t.Logf("refused: %v", err)
			for _, fix := range tc.wantFix {
				fix = strings.NewReplacer("DIR", dir, "FILE", path).Replace(fix)
				if !strings.Contains(err.Error(), fix) {
					t.Errorf("message %q should say %q", err, fix)
				}
			}
			if got := dirNames(t, dir); !slices.Equal(got, names) {
				t.Errorf("directory holds %v after refusal, want %v (no file created, no copy)", got, names)
			}
			if tc.file != 0 && !bytes.Equal(readFile(t, path), before) {
				t.Error("refused file was modified")
			}

			// The fixes the message gives are enough.
			chmod(t, dir, tc.dir&0o750)
			if tc.file != 0 {
				chmod(t, path, 0o600)
			}
			db, err = Open(path, Options{})
			if err != nil {
				t.Fatalf("Open after the fix: %v", err)
			}
			db.Close()
		})
	}
}

// The modes vgpud creates, ships (StateDirectoryMode=0750) and a
// hand-made 0755 directory or 0644 file are accepted: read access is not
// refused.
func TestOpenAcceptsSafeAccess(t *testing.T) {
	for _, mode := range [][2]os.FileMode{{0o700, 0o600}, {0o750, 0o640}, {0o755, 0o644}, {0o500, 0o400}} {
		t.Run(fmt.Sprintf("%04o/%04o", mode[0], mode[1]), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "state.db")
			populated(t, path, 1)
			chmod(t, path, mode[1])
			chmod(t, dir, mode[0])
			t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
			if mode[1]&0o200 == 0 && os.Geteuid() != 0 {
				t.Skip("a read-only file cannot be opened for writing but by root")
			}
			db, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			db.Close()
		})
	}
}

func TestOpenRefusesOtherOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another user needs root")
	}
	const nobody = 65534
	for _, which := range []string{"DIR", "FILE"} {
		t.Run(which, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "state.db")
			before := populated(t, path, 1)
			target := map[string]string{"DIR": dir, "FILE": path}[which]
			if err := os.Chown(target, nobody, -1); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path, Options{})
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("Open = %v, want ErrUnsafe", err)
			}
			t.Logf("refused: %v", err)
			want := fmt.Sprintf("owned by uid %d, not by uid 0 that vgpud runs as: run chown 0 %s", nobody, target)
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message %q should say %q", err, want)
			}
			if !bytes.Equal(readFile(t, path), before) {
				t.Error("refused file was modified")
			}
			if names := dirNames(t, dir); !slices.Equal(names, []string{"state.db"}) {
				t.Errorf("directory holds %v after refusal, want only state.db", names)
			}
		})
	}
}

// state.db may not be a symbolic link, dangling or not: its target's
// directory is not checked, and a dangling link must not make vgpud create
// a file wherever it points.
func TestOpenRefusesSymlink(t *testing.T) {
	for _, tc := range []struct {
		name               string
		dangling, relative bool
	}{{"to a database", false, false}, {"relative", false, true}, {"dangling", true, false}} {
		dangling := tc.dangling
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir, elsewhere := filepath.Join(base, "state"), filepath.Join(base, "elsewhere")
			for _, d := range []string{dir, elsewhere} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(elsewhere, "state.db")
			var before []byte
			if !dangling {
				before = populated(t, target, 1)
			}
			path := filepath.Join(dir, "state.db")
			link := target
			if tc.relative {
				link = "../elsewhere/state.db"
			}
			if err := os.Symlink(link, path); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path, Options{})
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("Open = %v, want ErrUnsafe", err)
			}
			t.Logf("refused: %v", err)
			if want := "mv " + target + " " + path; !strings.Contains(err.Error(), want) {
				t.Errorf("message %q should say %q", err, want)
			}
			if dangling {
				if _, err := os.Lstat(target); err == nil {
					t.Error("a file was created at the link's target")
				}
			} else if !bytes.Equal(readFile(t, target), before) {
				t.Error("link target was modified")
			}
			if names := dirNames(t, dir); !slices.Equal(names, []string{"state.db"}) {
				t.Errorf("directory holds %v after refusal, want only the link", names)
			}
		})
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/vgpud":      "/var/lib/vgpud",
		"/srv/my state/x.db":  "'/srv/my state/x.db'",
		"/srv/it's":           `'/srv/it'\''s'`,
		"":                    "''",
		"/a/$(rm -rf x)/b.db": "'/a/$(rm -rf x)/b.db'",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}
