package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"

	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/virt"
	"github.com/vgpud/vgpud/profiles"
)

// The systemd integration: the unit as installed (verify, security score,
// and a check that its hardening leaves the daemon the paths and sockets
// it uses), the notify protocol of the built daemon, and make install.

// maxExposure is the highest `systemd-analyze security` score the unit may
// have (make verify-units enforces the same).
const maxExposure = 2.5

// unitFile is a parsed systemd unit: every assignment per key, in order.
type unitFile map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		u[k] = append(u[k], v)
	}
	return u
}

// last is the effective value of a single-valued key.
func (u unitFile) last(k string) string {
	if v := u[k]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// words are the space-separated values of a list key; an empty
// assignment resets the list, as systemd does.
func (u unitFile) words(k string) []string {
	var out []string
	for _, v := range u[k] {
		if v == "" {
			out = nil
			continue
		}
		out = append(out, strings.Fields(v)...)
	}
	return out
}

func yes(v string) bool { return v == "yes" || v == "true" || v == "on" || v == "1" }

func unitPath(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "systemd", "vgpud.service")
}

// mountModel is what the unit's sandboxing directives make of the file
// system, as systemd sets up the service's mount namespace: rules by
// path, the deepest one deciding. It models ProtectSystem=, ProtectHome=,
// ProtectKernelTunables=, ProtectControlGroups=, PrivateTmp=,
// ReadWritePaths=, ReadOnlyPaths=, InaccessiblePaths= and the
// StateDirectory=/RuntimeDirectory= families (systemd.exec(5)).
type mountModel map[string]string // path → rw, ro, none

func modelOf(t *testing.T, u unitFile) mountModel {
	t.Helper()
	m := mountModel{"/": "rw"}
	switch ps := u.last("ProtectSystem"); ps {
	case "strict":
		m["/"] = "ro"
		// The API file systems stay as they are; other directives guard them.
		m["/dev"], m["/proc"], m["/sys"] = "rw", "rw", "rw"
	case "full":
		m["/usr"], m["/boot"], m["/efi"], m["/etc"] = "ro", "ro", "ro", "ro"
	case "yes", "true":
		m["/usr"], m["/boot"], m["/efi"] = "ro", "ro", "ro"
	case "", "no", "false":
	default:
		t.Fatalf("ProtectSystem=%s not modelled", ps)
	}
	switch ph := u.last("ProtectHome"); ph {
	case "yes", "true":
		m["/home"], m["/root"], m["/run/user"] = "none", "none", "none"
	case "read-only":
		m["/home"], m["/root"], m["/run/user"] = "ro", "ro", "ro"
	case "tmpfs":
		m["/home"], m["/root"], m["/run/user"] = "rw", "rw", "rw" // empty
	}
	if yes(u.last("ProtectKernelTunables")) {
		for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs", "/sys"} {
			m[p] = "ro"
		}
	}
	if yes(u.last("ProtectControlGroups")) {
		m["/sys/fs/cgroup"] = "ro"
	}
	if yes(u.last("PrivateTmp")) {
		m["/tmp"], m["/var/tmp"] = "rw", "rw"
	}
	for key, base := range map[string]string{"StateDirectory": "/var/lib", "RuntimeDirectory": "/run", "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log"} {
		for _, d := range u.words(key) {
			m[filepath.Join(base, d)] = "rw"
		}
	}
	set := func(key, mode string) {
		for _, p := range u.words(key) {
			m[filepath.Clean(strings.TrimLeft(p, "-+"))] = mode
		}
	}
	set("ReadOnlyPaths", "ro")
	set("ReadWritePaths", "rw")
	set("InaccessiblePaths", "none")
	return m
}

// access is what the service may do at path.
func (m mountModel) access(path string) string {
	best, mode := "", "rw"
	for p, md := range m {
		if (path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") || p == "/") && len(p) > len(best) {
			best, mode = p, md
		}
	}
	return mode
}

// recordingFS remembers every sysfs write the backend makes, with the
// path it resolves to in the simulated tree (the mirror on disk has the
// real kernel's symlinks: bus/pci/devices/X -> ../../../devices/...).
type recordingFS struct {
	sysfs.FS
	root string

	mu     sync.Mutex
	writes map[string]string // written name -> resolved name
}

func (r *recordingFS) WriteFile(name string, data []byte) error {
	resolved, err := filepath.EvalSymlinks(filepath.Join(r.root, name))
	if err == nil {
		resolved, err = filepath.Rel(r.root, resolved)
	}
	if err != nil {
		resolved = "unresolved: " + err.Error()
	}
	r.mu.Lock()
	r.writes[name] = resolved
	r.mu.Unlock()
	return r.FS.WriteFile(name, data)
}

// TestSystemdHardeningCoversDaemonWrites checks, without systemd, that
// the unit's sandbox leaves the daemon every path it writes and every
// socket it uses. The sysfs paths come from running the real backend on
// the simulated host (its on-disk tree has the kernel's symlink layout)
// through every kind of create and destroy, each resolved as the kernel
// resolves it, then judged by a model of the unit's mount directives.
// The kernel facts the model relies on are checked by
// TestSystemdHardeningKernelSemantics.
func TestSystemdHardeningCoversDaemonWrites(t *testing.T) {
	u := parseUnit(t, unitPath(t))
	model := modelOf(t, u)

	var rec *recordingFS
	m := simhost.Start(t, simhost.Options{
		Sim: sim.OpenOptions{Mirror: true},
		FS: func(h *sim.Host) sysfs.FS {
			rec = &recordingFS{FS: h.FS(), root: h.SysRoot(), writes: map[string]string{}}
			return rec
		},
		Manager: manager.Config{BusyRetry: 1},
	}).Manager
	ctx := context.Background()
	if _, err := m.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: tenant.UnlimitedQuota()}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"H100XM-1-10C", "L4-4Q", "A10-4Q", "1g.10gb"} {
		r, err := m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: p})
		if err != nil {
			t.Fatalf("create %s: %v", p, err)
		}
		if err := m.Destroy(ctx, r.UUID, manager.DestroyOptions{}); err != nil {
			t.Fatalf("destroy %s: %v", p, err)
		}
	}
	kinds := map[string]bool{}
	var names []string
	for name := range rec.writes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		resolved := rec.writes[name]
		if strings.HasPrefix(resolved, "unresolved") {
			t.Fatalf("write %s: %s", name, resolved)
		}
		written, real := "/sys/"+name, "/sys/"+resolved
		if got := model.access(real); got != "rw" {
			t.Errorf("the daemon writes %s, which is %s under the unit (resolves to %s)", written, got, real)
		}
		t.Logf("write %s -> %s: %s", written, real, model.access(real))
		switch {
		case strings.HasSuffix(name, "/nvidia/current_vgpu_type"):
			kinds["current_vgpu_type"] = true
		case strings.HasSuffix(name, "/create"):
			kinds["mdev create"] = true
		case strings.HasSuffix(name, "/remove"):
			kinds["mdev remove"] = true
		}
		// The path as written is a symlink path under a read-only part of
		// /sys: the check would pass by accident if it were writable.
		if model.access(written) == "rw" && written != real {
			t.Errorf("%s is writable as named; the model does not make /sys read-only", written)
		}
	}
	for _, k := range []string{"current_vgpu_type", "mdev create", "mdev remove"} {
		if !kinds[k] {
			t.Errorf("no %s write seen; writes: %v", k, names)
		}
	}

	// The real kernel's layout: PCI devices of this machine resolve into
	// /sys/devices as the simulated ones do.
	if ents, err := os.ReadDir("/sys/bus/pci/devices"); err == nil && len(ents) > 0 {
		real, err := filepath.EvalSymlinks(filepath.Join("/sys/bus/pci/devices", ents[0].Name()))
		if err != nil {
			t.Fatal(err)
		}
		if model.access(real) != "rw" || !strings.HasPrefix(real, "/sys/devices/") {
			t.Errorf("this machine's %s resolves to %s (%s)", ents[0].Name(), real, model.access(real))
		}
	}
	for _, p := range []string{"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/module/nvidia/parameters/x", "/sys/power/state", "/proc/sys/vm/drop_caches"} {
		if model.access(p) != "ro" {
			t.Errorf("%s is %s under the unit, want read-only", p, model.access(p))
		}
	}

	// State directory: the default stateDir is the unit's StateDirectory=.
	if sd := u.words("StateDirectory"); len(sd) != 1 || "/var/lib/"+sd[0] != "/var/lib/vgpud" || model.access("/var/lib/vgpud/state.db") != "rw" {
		t.Errorf("StateDirectory=%v does not give /var/lib/vgpud (the default stateDir) write access", sd)
	}
	// The metrics endpoint's documented Unix socket is made there.
	if model.access("/run/vgpud/metrics.sock") != "rw" {
		t.Errorf("/run/vgpud is %s under the unit: metricsListen unix:/run/vgpud/metrics.sock cannot be made", model.access("/run/vgpud/metrics.sock"))
	}
	// Sockets: connect(2) needs the path to be reachable, not writable.
	for _, s := range []string{"/run/libvirt/libvirt-sock", "/run/dbus/system_bus_socket", "/run/nvidia-persistenced/socket"} {
		if model.access(s) == "none" {
			t.Errorf("socket %s is inaccessible under the unit", s)
		}
	}
	families := map[string]bool{}
	for _, f := range u.words("RestrictAddressFamilies") {
		families[f] = true
	}
	for f, why := range map[string]string{"AF_UNIX": "libvirtd, the system bus, the notify socket", "AF_NETLINK": "kernel uevents",
		"AF_INET": "the metrics endpoint", "AF_INET6": "the metrics endpoint on ::1"} {
		if !families[f] {
			t.Errorf("RestrictAddressFamilies= lacks %s (%s)", f, why)
		}
	}
	if allow := u.words("IPAddressAllow"); len(u.words("IPAddressDeny")) > 0 && !contains(allow, "localhost") {
		t.Errorf("IPAddressDeny= without localhost in IPAddressAllow= blocks the default metrics endpoint 127.0.0.1:9835")
	}
	if yes(u.last("PrivateDevices")) || !contains(u.words("DeviceAllow"), "char-nvidia*") {
		t.Errorf("NVML needs /dev/nvidia*: PrivateDevices=%s, DeviceAllow=%v", u.last("PrivateDevices"), u.words("DeviceAllow"))
	}
	if u.last("ProcSubset") == "pid" {
		t.Error("ProcSubset=pid hides /proc/driver/nvidia from NVML")
	}
	if caps := u.words("CapabilityBoundingSet"); !contains(caps, "CAP_SYS_ADMIN") {
		t.Errorf("CapabilityBoundingSet=%v: NVML's MIG and scheduler calls need CAP_SYS_ADMIN", caps)
	}
	checkSyscalls(t, u)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkSyscalls resolves the unit's SystemCallFilter= with
// systemd-analyze and checks the calls the daemon makes are allowed.
func checkSyscalls(t *testing.T, u unitFile) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not found: SystemCallFilter= not resolved")
		return
	}
	var expand func(groups []string) map[string]bool
	expand = func(groups []string) map[string]bool {
		out := map[string]bool{}
		for _, g := range groups {
			if !strings.HasPrefix(g, "@") {
				out[g] = true
				continue
			}
			b, err := exec.Command("systemd-analyze", "syscall-filter", "--no-pager", g).Output()
			if err != nil {
				t.Fatalf("systemd-analyze syscall-filter %s: %v", g, err)
			}
			for _, l := range strings.Split(string(b), "\n") {
				l = strings.TrimSpace(l)
				if l == "" || l[0] == '#' || l == g {
					continue
				}
				if strings.HasPrefix(l, "@") {
					for k := range expand([]string{l}) {
						out[k] = true
					}
					continue
				}
				out[l] = true
			}
		}
		return out
	}
	var allow, deny []string
	for _, v := range u["SystemCallFilter"] {
		if strings.HasPrefix(v, "~") {
			deny = append(deny, strings.Fields(v[1:])...)
		} else {
			allow = append(allow, strings.Fields(v)...)
		}
	}
	allowed, denied := expand(allow), expand(deny)
	// What the daemon does: Go's runtime, bbolt (mmap, flock, fdatasync),
	// sockets of every allowed family, sysfs and NVML (ioctl) I/O.
	for _, sc := range []string{"socket", "bind", "connect", "listen", "accept4", "sendmsg", "recvmsg", "sendto", "recvfrom",
		"getsockopt", "setsockopt", "getsockname", "openat", "read", "write", "pwrite64", "close", "ioctl", "mmap", "munmap",
		"madvise", "flock", "fdatasync", "fsync", "rename", "renameat", "epoll_pwait", "epoll_ctl", "futex", "clone",
		"rt_sigaction", "rt_sigprocmask", "sigaltstack", "nanosleep", "clock_gettime", "getpid", "tgkill", "readlinkat",
		"newfstatat", "getdents64", "sched_getaffinity", "prctl"} {
		if !allowed[sc] || denied[sc] {
			t.Errorf("SystemCallFilter= refuses %s (allowed %v, denied %v)", sc, allowed[sc], denied[sc])
		}
	}
}

// TestSystemdHardeningKernelSemantics checks, in a private mount
// namespace (as root), the two kernel behaviours the unit's comments and
// the model above rely on:
//   - a Unix socket whose directory is mounted read-only can still be
//     connected to (libvirtd's and the system bus's sockets under
//     ProtectSystem=strict), while creating a file there fails;
//   - under a read-only tree with its devices/ subtree bound read-write
//     again (ProtectKernelTunables=yes plus ReadWritePaths=/sys/devices),
//     a write through bus/.../X/attr, a symlink into devices/, succeeds,
//     and a write to a file that really lives under bus/ fails.
func TestSystemdHardeningKernelSemantics(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts in a private mount namespace")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		skipMissing(t, "unshare (util-linux) not found")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "libvirt", "libvirt-sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
			accepted <- struct{}{}
		}
	}()
	sys := filepath.Join(dir, "sys")
	dev := filepath.Join(sys, "devices", "pci0000:60", "0000:61:00.4", "nvidia")
	for _, d := range []string{dev, filepath.Join(sys, "bus", "pci", "devices"), filepath.Join(sys, "kernel")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(dev, "current_vgpu_type"), filepath.Join(sys, "kernel", "tunable")} {
		if err := os.WriteFile(f, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../../devices/pci0000:60/0000:61:00.4", filepath.Join(sys, "bus", "pci", "devices", "0000:61:00.4")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0], "-test.run=^TestSystemdHelperMountProbe$", "-test.v")
	cmd.Env = append(os.Environ(), "VGPUD_MOUNT_PROBE="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("PROBE OK")) {
		t.Fatalf("mount probe: %v\n%s", err, out)
	}
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the probe's connection was not accepted")
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "probe:") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestSystemdHelperMountProbe runs inside the private mount namespace
// TestSystemdHardeningKernelSemantics creates; it does nothing otherwise.
func TestSystemdHelperMountProbe(t *testing.T) {
	dir := os.Getenv("VGPUD_MOUNT_PROBE")
	if dir == "" {
		t.Skip("helper of TestSystemdHardeningKernelSemantics")
	}
	// The order is systemd's (namespace.c): every entry is bind-mounted
	// first, then the read-only ones are remounted read-only, leaving the
	// read-write entries below them as they are.
	bind := func(p string) {
		t.Helper()
		if err := syscall.Mount(p, p, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			t.Fatalf("bind %s: %v", p, err)
		}
	}
	readOnly := func(p string) {
		t.Helper()
		if err := syscall.Mount("", p, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount %s read-only: %v", p, err)
		}
	}
	// /run under ProtectSystem=strict.
	bind(filepath.Join(dir, "run"))
	readOnly(filepath.Join(dir, "run"))
	sock := filepath.Join(dir, "run", "libvirt", "libvirt-sock")
	if err := os.WriteFile(filepath.Join(dir, "run", "libvirt", "new"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("creating a file under the read-only /run: %v, want EROFS", err)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("connect to a socket on a read-only mount: %v", err)
	}
	c.Close()
	t.Log("probe: connected to a Unix socket on a read-only mount; file creation there: EROFS")

	// /sys under ProtectKernelTunables=yes with ReadWritePaths=/sys/devices.
	sys := filepath.Join(dir, "sys")
	bind(sys)
	bind(filepath.Join(sys, "devices"))
	readOnly(sys)
	through := filepath.Join(sys, "bus", "pci", "devices", "0000:61:00.4", "nvidia", "current_vgpu_type")
	f, err := os.OpenFile(through, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open %s for writing: %v", through, err)
	}
	if _, err := f.Write([]byte("893\n")); err != nil {
		t.Fatalf("write through the symlink: %v", err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(sys, "kernel", "tunable"), []byte("1\n"), 0); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a tunable outside devices/: %v, want EROFS", err)
	}
	t.Log("probe: write through bus/pci/devices/<VF> into the read-write devices/ succeeded; kernel/ tunable: EROFS")
	fmt.Println("PROBE OK")
}

// exposure runs systemd-analyze security --offline=true on a unit file.
func exposure(t *testing.T, unit string) (float64, string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		skipMissing(t, "systemd-analyze not found (apt-get install systemd)")
	}
	out, _ := exec.Command("systemd-analyze", "security", "--offline=true", "--no-pager", unit).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for vgpud.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure score:\n%s", out)
	}
	score, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return score, string(out)
}

func TestSystemdUnitSecurityScore(t *testing.T) {
	score, out := exposure(t, unitPath(t))
	var open []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "✗") {
			open = append(open, strings.Join(strings.Fields(l)[:2], " "))
		}
	}
	t.Logf("exposure %.1f (maximum %.1f); open: %s", score, maxExposure, strings.Join(open, "; "))
	if score > maxExposure {
		t.Fatalf("exposure %.1f above %.1f:\n%s", score, maxExposure, out)
	}
	// Every remaining exposure is explained in the unit's comments: each
	// failed check's subject (User, CAP_SYS_ADMIN, AF_NETLINK, ...)
	// appears in a comment line.
	unit, err := os.ReadFile(unitPath(t))
	if err != nil {
		t.Fatal(err)
	}
	var comments strings.Builder
	for _, l := range strings.Split(string(unit), "\n") {
		if strings.HasPrefix(l, "#") {
			comments.WriteString(l + "\n")
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "✗") {
			continue
		}
		key := subject(strings.Fields(l)[1])
		if !strings.Contains(comments.String(), key) {
			t.Errorf("remaining exposure %s (%s) is not explained in the unit's comments", strings.Fields(l)[1], key)
		}
	}
}

// subject is what a security check is about: "CapabilityBoundingSet=~CAP_SYS_ADMIN"
// is about CAP_SYS_ADMIN, "RestrictAddressFamilies=~AF_(INET|INET6)" about
// AF_INET, "User=/DynamicUser=" about User.
func subject(check string) string {
	if _, after, ok := strings.Cut(check, "~"); ok {
		after = strings.ReplaceAll(after, "(", "")
		if i := strings.IndexAny(after, "|)*"); i >= 0 {
			after = after[:i]
		}
		return after
	}
	name, _, _ := strings.Cut(check, "=")
	return name
}

// installTree runs scripts/install.sh into a fresh DESTDIR.
func installTree(t *testing.T, prefix string) (string, []string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "install.sh"), "install")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "DESTDIR="+dest, "PREFIX="+prefix, "BUILDDIR="+filepath.Dir(vgpudBin))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh install: %v\n%s", err, out)
	}
	return dest, listTree(t, dest)
}

func listTree(t *testing.T, dest string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			files = append(files, strings.TrimPrefix(p, dest))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// TestSystemdInstallTree: install puts every part where its consumer
// looks (FHS, per PREFIX), the installed unit verifies with its binary
// in place, and uninstall takes it all away again.
func TestSystemdInstallTree(t *testing.T) {
	tests := []struct {
		prefix string
		want   []string
	}{
		{prefix: "/usr", want: []string{
			"/usr/sbin/vgpud", "/usr/lib/systemd/system/vgpud.service", "/usr/lib/tmpfiles.d/vgpud.conf", "/usr/lib/sysusers.d/vgpud.conf",
			"/usr/share/dbus-1/system.d/dev.vgpud1.conf", "/usr/share/dbus-1/system-services/dev.vgpud1.service",
			"/usr/share/polkit-1/actions/dev.vgpud1.policy", "/etc/vgpud/vgpud.yaml", "/usr/share/vgpud/profiles/h100-sxm5-80gb.yaml",
			"/usr/share/doc/vgpud/vgpud.yaml.example", "/usr/share/bash-completion/completions/vgpud",
			"/usr/share/zsh/vendor-completions/_vgpud", "/usr/share/fish/vendor_completions.d/vgpud.fish",
			"/usr/share/vgpud/dashboards/host-overview.json", "/usr/share/vgpud/prometheus/rules.yml",
			"/usr/bin/vgpuctl", "/usr/share/man/man1/vgpuctl.1", "/usr/share/bash-completion/completions/vgpuctl",
			"/usr/share/cockpit/vgpud/manifest.json", "/usr/share/cockpit/vgpud/index.html", "/usr/share/cockpit/vgpud/vgpud.js"}},
		// dbus-daemon and polkit do not read /usr/local: those go where they look.
		{prefix: "/usr/local", want: []string{
			"/usr/local/sbin/vgpud", "/usr/local/lib/systemd/system/vgpud.service", "/usr/local/lib/tmpfiles.d/vgpud.conf",
			"/etc/dbus-1/system.d/dev.vgpud1.conf", "/usr/local/share/dbus-1/system-services/dev.vgpud1.service",
			"/usr/share/polkit-1/actions/dev.vgpud1.policy", "/etc/vgpud/vgpud.yaml",
			// Cockpit looks in /usr/local/share/cockpit too.
			"/usr/local/share/cockpit/vgpud/manifest.json"}},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.prefix, "/", "_"), func(t *testing.T) {
			dest, files := installTree(t, tt.prefix)
			have := map[string]bool{}
			for _, f := range files {
				have[f] = true
			}
			for _, w := range tt.want {
				if !have[w] {
					t.Errorf("not installed: %s", w)
				}
			}
			t.Logf("PREFIX=%s: %d files:\n  %s", tt.prefix, len(files), strings.Join(files, "\n  "))
			unit, err := os.ReadFile(filepath.Join(dest, tt.prefix, "lib/systemd/system/vgpud.service"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(unit, []byte("ExecStart="+tt.prefix+"/sbin/vgpud\n")) {
				t.Errorf("installed unit does not start %s/sbin/vgpud", tt.prefix)
			}
			if _, err := exec.LookPath("systemd-analyze"); err == nil {
				check := filepath.Join(t.TempDir(), "vgpud.service")
				if err := os.WriteFile(check, bytes.ReplaceAll(unit, []byte(tt.prefix+"/sbin/vgpud"), []byte(dest+tt.prefix+"/sbin/vgpud")), 0o644); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command("systemd-analyze", "verify", "--man=no", check).CombinedOutput(); err != nil {
					t.Errorf("systemd-analyze verify of the installed unit: %v\n%s", err, out)
				}
			}
			root, _ := testenv.RepoRoot()
			cmd := exec.Command(filepath.Join(root, "scripts", "install.sh"), "uninstall")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "DESTDIR="+dest, "PREFIX="+tt.prefix, "BUILDDIR="+filepath.Dir(vgpudBin))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("uninstall: %v\n%s", err, out)
			}
			if left := listTree(t, dest); len(left) != 0 {
				t.Fatalf("uninstall left %v", left)
			}
		})
	}
}

// ---- the built daemon under a simulated service manager ----

// daemonProc is a vgpud process started as systemd would start it.
type daemonProc struct {
	cmd    *exec.Cmd
	logs   *testenv.Buffer
	exited chan struct{}
	err    error
	notify *testenv.NotifySocket
}

// startVgpud starts the built daemon on the simulated host in stateDir,
// with $NOTIFY_SOCKET (and extra environment) set.
func startVgpud(t *testing.T, stateDir string, env []string, args ...string) *daemonProc {
	t.Helper()
	p := &daemonProc{logs: &testenv.Buffer{}, exited: make(chan struct{}), notify: testenv.ListenNotify(t)}
	cfg := filepath.Join(t.TempDir(), "vgpud.yaml")
	if err := os.WriteFile(cfg, []byte("version: v1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--config", cfg, "--sim", "--state-dir", stateDir, "--metrics-listen", "", "--libvirt-socket", "",
		"--profiles-dir", "", "--uevent-settle", "50ms", "--recover-probe", "200ms", "--log-level", "debug"}
	p.cmd = exec.Command(vgpudBin, append(base, args...)...)
	// No system bus: on the simulated host the daemon then runs without
	// its D-Bus API, which these tests do not use.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "DBUS_SYSTEM_BUS_ADDRESS=") && !strings.HasPrefix(e, "NOTIFY_SOCKET=") && !strings.HasPrefix(e, "WATCHDOG_") {
			p.cmd.Env = append(p.cmd.Env, e)
		}
	}
	p.cmd.Env = append(append(p.cmd.Env, "NOTIFY_SOCKET="+p.notify.Path()), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(90 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("vgpud log:\n%s", p.logs.String())
		}
	})
	return p
}

func (p *daemonProc) signal(s syscall.Signal) {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(s)
	}
}

// awaitLog waits until the daemon's log holds want, and returns the log.
func (p *daemonProc) awaitLog(t *testing.T, want string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		logs := p.logs.String()
		if strings.Contains(logs, want) || time.Now().After(deadline) {
			return logs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait waits for the process to exit.
func (p *daemonProc) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("vgpud did not exit within %v", timeout)
		return nil
	}
}

// seed runs fn with a manager in this process on stateDir's store and
// simulated host (the daemon must not run meanwhile: bbolt locks the
// store), as a client would have left them.
func seed(t *testing.T, stateDir string, vc *virt.Conn, fn func(m *manager.Manager, h *sim.Host)) {
	t.Helper()
	var mv manager.Virt
	if vc != nil {
		mv = vc
	}
	h := simhost.Start(t, simhost.Options{Dir: stateDir, Manager: manager.Config{Virt: mv, BusyRetry: 1}})
	// The daemon that starts next needs the store's lock.
	defer h.Close()
	m, ctx := h.Manager, context.Background()
	if _, err := m.Tenant("acme"); err != nil {
		if _, err := m.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: tenant.UnlimitedQuota()}); err != nil {
			t.Fatal(err)
		}
	}
	fn(m, h.Sim)
}

// records reads the instance records the daemon left (after it exited).
func records(t *testing.T, stateDir string) map[string]store.Instance {
	t.Helper()
	db, err := store.Open(filepath.Join(stateDir, "state.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string]store.Instance{}
	err = db.View(func(tx *store.Tx) error {
		recs, err := tx.Instances()
		for _, r := range recs {
			out[r.UUID] = r
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func openSim(t *testing.T, stateDir string) *sim.Host {
	t.Helper()
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(filepath.Join(stateDir, "sim"), nil, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func gpuLine(h *sim.Host, pci string) string {
	s, _ := h.Summary()
	return simhost.SummaryLine(s, pci)
}

// TestSystemdNotifyProtocol runs the built daemon as systemd runs a
// Type=notify service with WatchdogSec=: READY=1 only once start-up
// reconcile has re-created what a reboot took (slowed down so an early
// READY would show), STATUS= lines, WATCHDOG=1 at half WATCHDOG_USEC,
// RELOADING=1/READY=1 on SIGHUP, STOPPING=1 and exit status 0 on SIGTERM.
func TestSystemdNotifyProtocol(t *testing.T) {
	state := t.TempDir()
	var ids []string
	seed(t, state, nil, func(m *manager.Manager, h *sim.Host) {
		for _, p := range []struct{ profile, gpu string }{{"3g.40gb", sim.DefaultH100MIG}, {"L4-4Q", sim.DefaultL4}, {"A10-4Q", sim.DefaultA10}} {
			r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: p.profile, GPU: p.gpu})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.UUID)
		}
		if err := h.Reboot(); err != nil {
			t.Fatal(err)
		}
		if err := h.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: "700ms", Count: 1}); err != nil {
			t.Fatal(err)
		}
	})
	h := openSim(t, state)
	const watchdog = 500 * time.Millisecond
	start := time.Now()
	var p *daemonProc
	snapshot := func(m testenv.NotifyMsg) string {
		if !m.Has("READY=1") {
			return ""
		}
		return gpuLine(h, sim.DefaultH100MIG) + "\n" + gpuLine(h, sim.DefaultL4) + "\n" + gpuLine(h, sim.DefaultA10)
	}
	p = startVgpud(t, state, []string{fmt.Sprintf("WATCHDOG_USEC=%d", watchdog.Microseconds())})
	p.notify.OnMsg(snapshot)
	ready, ri := p.notify.Await("READY=1", 0, 60*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	t.Logf("READY=1 after %v with STATUS=%q; host then:\n%s", ready.At.Sub(start).Round(time.Millisecond), ready.Fields["STATUS"], ready.Snap)
	lines := strings.Split(ready.Snap, "\n")
	if !strings.Contains(lines[0], "ci=1") || !strings.Contains(lines[1], "=t") || !strings.Contains(lines[2], "mdev") {
		t.Fatalf("READY=1 before start-up reconcile re-created the instances:\n%s", ready.Snap)
	}
	var statuses []string
	for _, m := range p.notify.Between(0, ri) {
		if s, ok := m.Fields["STATUS"]; ok {
			statuses = append(statuses, s)
		}
	}
	if strings.Join(statuses, "|") != "opening state|reconciling" || ready.Fields["STATUS"] != "4 GPUs, 3 instances" {
		t.Fatalf("STATUS lines %q then %q", statuses, ready.Fields["STATUS"])
	}

	// Watchdog: 10 pings, at half the interval.
	n := 0
	_, wi := p.notify.Await("10 WATCHDOG=1", ri, 20*time.Second, func(m testenv.NotifyMsg) bool {
		if m.Has("WATCHDOG=1") {
			n++
		}
		return n == 10
	})
	var pings []time.Time
	for _, m := range p.notify.Between(ri, wi+1) {
		if m.Has("WATCHDOG=1") {
			pings = append(pings, m.At)
		}
	}
	var worst, sum time.Duration
	for i := 1; i < len(pings); i++ {
		g := pings[i].Sub(pings[i-1])
		worst, sum = max(worst, g), sum+g
	}
	mean := sum / time.Duration(len(pings)-1)
	t.Logf("WATCHDOG_USEC=%v: mean ping gap %v, worst %v", watchdog, mean.Round(time.Millisecond), worst.Round(time.Millisecond))
	if mean < watchdog*4/10 || mean > watchdog*6/10 || worst >= watchdog {
		t.Fatalf("watchdog pings: mean gap %v, worst %v; want about %v and never %v", mean, worst, watchdog/2, watchdog)
	}

	// SIGHUP: RELOADING=1, then READY=1 again; the daemon keeps its state.
	mark := p.notify.Count()
	p.signal(syscall.SIGHUP)
	_, rl := p.notify.Await("RELOADING=1", mark, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("RELOADING=1") && m.Fields["MONOTONIC_USEC"] != "" })
	again, _ := p.notify.Await("READY=1 after the reload", rl, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("READY=1") })
	if again.Fields["STATUS"] != "4 GPUs, 3 instances" {
		t.Fatalf("status after reload %q", again.Fields["STATUS"])
	}

	// SIGTERM: STOPPING=1 and a clean exit.
	mark = p.notify.Count()
	sent := time.Now()
	p.signal(syscall.SIGTERM)
	stopping, _ := p.notify.Await("STOPPING=1", mark, 10*time.Second, func(m testenv.NotifyMsg) bool { return m.Has("STOPPING=1") })
	if err := p.wait(t, 90*time.Second); err != nil {
		t.Fatalf("exit: %v, want status 0", err)
	}
	t.Logf("SIGTERM: STOPPING=1 after %v, exit after %v", stopping.At.Sub(sent).Round(time.Millisecond), time.Since(sent).Round(time.Millisecond))
	recs := records(t, state)
	for _, id := range ids {
		if recs[id].State != store.StateReady {
			t.Fatalf("record %s after the run: %+v", id, recs[id])
		}
	}
}
