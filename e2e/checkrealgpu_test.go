package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const checkRealGPU = "../scripts/check-real-gpu.sh"

// TestCheckRealGPUScript: scripts/check-real-gpu.sh parses (bash -n);
// on a host without an NVIDIA GPU (no nvidia-smi, or one that lists no
// GPU) it says it skipped, exits 0 and writes nothing; and no line of it
// changes a GPU: no write into sysfs, no nvidia-smi or sriov-manage
// command that sets a mode, resets, or makes or destroys instances.
func TestCheckRealGPUScript(t *testing.T) {
	if out, err := exec.Command("bash", "-n", checkRealGPU).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	dir := t.TempDir()
	noGPU := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(noGPU, []byte("#!/bin/sh\necho 'No devices were found'\nexit 6\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, smi := range []string{filepath.Join(dir, "absent"), noGPU} {
		out := filepath.Join(dir, "out")
		cmd := exec.Command("bash", checkRealGPU)
		cmd.Env = append(os.Environ(), "NVIDIA_SMI="+smi, "OUT="+out)
		b, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(b), "skipped") {
			t.Errorf("NVIDIA_SMI=%s: %v\n%s; want it skipped with exit 0", smi, err, b)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("NVIDIA_SMI=%s: %s was written", smi, out)
		}
	}
	src, err := os.ReadFile(checkRealGPU)
	if err != nil {
		t.Fatal(err)
	}
	changes := regexp.MustCompile(`>\s*"?/sys|>\s*"?\$dev|tee\s+"?/sys|sriov-manage|\bsmi"?\s+(-r\b|--gpu-reset|-mig\b|-pm\b|-e\b|-c\b|-ac\b|-pl\b|mig\s+-(cgi|dgi|cci|dci))|vgpu\s+.*--set|setpci|/remove|/rescan`)
	for i, line := range strings.Split(string(src), "\n") {
		code := strings.TrimSpace(line)
		if strings.HasPrefix(code, "#") {
			continue
		}
		if changes.MatchString(code) {
			t.Errorf("%s:%d changes a GPU: %s", checkRealGPU, i+1, code)
		}
	}
}
