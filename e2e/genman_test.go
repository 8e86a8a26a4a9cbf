package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vgpud/vgpud/internal/testenv"
)

// scripts/gen-man.sh writes vgpud's section-8 pages (the unit's
// Documentation= names vgpud(8)) beside vgpuctl's, also when only vgpuctl
// is given and no vgpud lies beside it: the script then builds one.
func TestGenManWritesBothSections(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	lone := filepath.Join(t.TempDir(), "vgpuctl") // no vgpud beside it
	data, err := os.ReadFile(vgpuctlBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lone, data, 0o755); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "gen-man.sh"), out)
	cmd.Env = append(os.Environ(), "VGPUCTL="+lone, "VGPUD=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen-man.sh: %v\n%s", err, b)
	}
	for _, page := range []string{"vgpud.8", "vgpuctl.1", "vgpuctl-create.1"} {
		if fi, err := os.Stat(filepath.Join(out, "man", page)); err != nil || fi.Size() == 0 {
			t.Errorf("no man page %s: %v", page, err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "completions")); err != nil {
		t.Errorf("no completions: %v", err)
	}
}
