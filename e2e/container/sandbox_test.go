package container

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// capSysAdmin is CAP_SYS_ADMIN's bit in /proc/PID/status's Cap* masks.
const capSysAdmin = 1 << 21

// TestSandboxInForce: the unit's hardening as the running process has
// it: NoNewPrivs, seccomp filter mode, CAP_SYS_ADMIN the only effective
// (and bounding) capability, the file system read-only but for the state
// directory and /sys/devices.
func TestSandboxInForce(t *testing.T) {
	startVgpud(t)
	pid := prop(t, "MainPID")
	status := must(t, "cat /proc/"+pid+"/status")
	field := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `:\s*(\S+)`).FindStringSubmatch(status)
		if m == nil {
			t.Fatalf("/proc/%s/status has no %s", pid, name)
		}
		return m[1]
	}
	if v := field("NoNewPrivs"); v != "1" {
		t.Errorf("NoNewPrivs %s, want 1", v)
	}
	if v := field("Seccomp"); v != "2" {
		t.Errorf("Seccomp %s, want 2 (filter)", v)
	}
	for _, c := range []string{"CapEff", "CapPrm", "CapBnd"} {
		v, err := strconv.ParseUint(field(c), 16, 64)
		if err != nil || v != capSysAdmin {
			t.Errorf("%s %s, want only CAP_SYS_ADMIN (%x)", c, field(c), capSysAdmin)
		}
	}
	if v := field("CapAmb"); v != "0000000000000000" {
		t.Errorf("CapAmb %s, want none", v)
	}

	// Writes from inside the daemon's mount namespace (as root with every
	// capability, so only the mounts refuse them).
	write := func(path string) error {
		_, err := ct.sh(context.Background(), "nsenter -t "+pid+" -m sh -c 'echo x > "+path+" && rm -f "+path+"'")
		return err
	}
	for _, p := range []string{"/usr/vgpud-test", "/usr/sbin/vgpud-test", "/etc/vgpud-test", "/etc/vgpud/vgpud-test", "/var/vgpud-test", "/var/lib/vgpud-test", "/var/cache/vgpud-test", "/var/log/vgpud-test"} {
		if err := write(p); err == nil {
			t.Errorf("vgpud's sandbox lets %s be written", p)
		}
	}
	if err := write("/var/lib/vgpud/write-test"); err != nil {
		t.Errorf("vgpud cannot write its StateDirectory: %v", err)
	}
	// /sys/devices must be a writable mount (the vGPU attributes and mdev
	// create/remove live there); writing a real attribute of this machine's
	// devices is not something a test may do, so the mount flags are read.
	mounts := mountOptions(must(t, "cat /proc/"+pid+"/mountinfo"))
	if o := mounts("/sys/devices/pci0000:00"); !strings.HasPrefix(o, "rw") {
		t.Errorf("/sys/devices in vgpud's namespace: %q, want rw", o)
	}
	for _, p := range []string{"/sys/kernel", "/sys/module", "/usr/sbin", "/etc/vgpud"} {
		if o := mounts(p); !strings.HasPrefix(o, "ro") {
			t.Errorf("%s in vgpud's namespace: %q, want ro", p, o)
		}
	}
}

// mountOptions parses a mountinfo and returns a lookup of the options of
// the mount a path is on: the longest mount point above it, the last one
// mounted there winning, as in the kernel.
func mountOptions(mountinfo string) func(path string) string {
	opts := map[string]string{}
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 5 {
			opts[f[4]] = f[5]
		}
	}
	return func(path string) string {
		best := ""
		for mp := range opts {
			under := mp == "/" || path == mp || strings.HasPrefix(path, mp+"/")
			if under && len(mp) > len(best) {
				best = mp
			}
		}
		return opts[best]
	}
}

var exposure = regexp.MustCompile(`Overall exposure level for vgpud.service: ([0-9.]+)`)

// TestSecurityScoreOnline: systemd-analyze security on the running unit
// (its drop-in included) scores what the offline check of the packaged
// unit file scores (scripts/verify-units.sh's check), and at most 2.5.
func TestSecurityScoreOnline(t *testing.T) {
	startVgpud(t)
	out, _ := ct.sh(context.Background(), "systemd-analyze security --no-pager vgpud.service")
	online := exposure.FindStringSubmatch(out)
	if online == nil {
		t.Fatalf("no exposure in the online analysis:\n%s", out)
	}
	unit := filepath.Join(ct.root, "usr/lib/systemd/system/vgpud.service")
	off, _ := run(context.Background(), ct.repo, "systemd-analyze", "security", "--offline=true", "--no-pager", unit)
	offline := exposure.FindStringSubmatch(off)
	if offline == nil {
		t.Fatalf("no exposure in the offline analysis:\n%s", off)
	}
	t.Logf("exposure online %s, offline %s", online[1], offline[1])
	if online[1] != offline[1] {
		t.Errorf("online exposure %s differs from the offline %s:\n%s", online[1], offline[1], out)
	}
	if v, _ := strconv.ParseFloat(online[1], 64); v > 2.5 {
		t.Errorf("exposure %s is above 2.5", online[1])
	}
}

// TestBootOrder: systemd orders vgpud as the unit says: after the NVIDIA
// driver's units, before libvirt's, and pulls it in at boot.
func TestBootOrder(t *testing.T) {
	after := strings.Fields(prop(t, "After"))
	before := strings.Fields(prop(t, "Before"))
	has := func(list []string, u string) bool {
		for _, x := range list {
			if x == u {
				return true
			}
		}
		return false
	}
	for _, u := range []string{"nvidia-persistenced.service", "nvidia-vgpud.service", "nvidia-vgpu-mgr.service", "systemd-modules-load.service"} {
		if !has(after, u) {
			t.Errorf("vgpud is not ordered after %s (After=%v)", u, after)
		}
	}
	for _, u := range []string{"libvirtd.service", "virtqemud.service", "libvirt-guests.service"} {
		if !has(before, u) {
			t.Errorf("vgpud is not ordered before %s (Before=%v)", u, before)
		}
	}
	if wanted := prop(t, "WantedBy"); !strings.Contains(wanted, "multi-user.target") {
		t.Errorf("vgpud is not wanted by multi-user.target (enabled by the package): WantedBy=%s", wanted)
	}
}
