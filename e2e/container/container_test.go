package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
)

// container is a booted Debian root: the systemd-nspawn process, the
// container's init (whose namespaces nsenter joins), and the overlay the
// root is mounted through.
type container struct {
	repo   string
	tmp    string   // work dir: overlay upper and work dirs, the .deb, logs
	root   string   // the merged root (what the container sees as /)
	lock   *os.File // /tmp/vgpud-e2e.lock, held while the container runs
	nspawn *exec.Cmd
	exited chan struct{}
	init   int // pid of the container's systemd, in the host's pid namespace
}

// Inside the container: where the package's files are, and the test's users.
const (
	debPath  = "/root/vgpud.deb"
	dropIn   = "/etc/systemd/system/vgpud.service.d/50-test.conf"
	rulesDst = "/etc/polkit-1/rules.d/50-vgpud-operators.rules"
	// The shipped example rule lets group vgpud-operators change state.
	operatorGroup = "vgpud-operators"
)

// testDropIn is what the tests change in the shipped unit, and why: --sim
// puts the simulated host under the StateDirectory (/var/lib/vgpud/sim);
// a shorter WatchdogSec lets the watchdog test take seconds, not a minute.
const testDropIn = `[Service]
ExecStart=
ExecStart=/usr/sbin/vgpud --sim
WatchdogSec=6s
`

// boot builds (or reuses) the cached Debian root, the package, mounts the
// overlay, boots the container and installs the package in it. A non-nil
// container is returned even with an error, for close to clean up.
func boot(ctx context.Context) (*container, error) {
	repo, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	base, err := run(ctx, repo, "scripts/container-root.sh")
	if err != nil {
		return nil, fmt.Errorf("Debian root: %w", err)
	}
	base = strings.TrimSpace(lastLine(base))
	tmp, err := os.MkdirTemp("", "vgpud-container-")
	if err != nil {
		return nil, err
	}
	c := &container{repo: repo, tmp: tmp, root: filepath.Join(tmp, "root"), exited: make(chan struct{})}
	step := time.Now()
	deb, err := c.buildPackage(ctx)
	if err != nil {
		return c, err
	}
	fmt.Printf("container tests: package built in %s\n", time.Since(step).Round(time.Second))
	step = time.Now()
	if c.lock, err = lockE2E(ctx); err != nil {
		return c, err
	}
	fmt.Printf("container tests: waited %s for /tmp/vgpud-e2e.lock\n", time.Since(step).Round(time.Second))
	if err := c.mount(base); err != nil {
		return c, err
	}
	if err := copyFile(deb, filepath.Join(c.root, debPath), 0o644); err != nil {
		return c, err
	}
	step = time.Now()
	if err := c.start(ctx); err != nil {
		return c, err
	}
	fmt.Printf("container tests: systemd in the container running after %s\n", time.Since(step).Round(time.Second))
	step = time.Now()
	if err := c.install(ctx); err != nil {
		return c, err
	}
	fmt.Printf("container tests: package installed in %s\n", time.Since(step).Round(time.Second))
	return c, nil
}

// buildPackage builds the binaries (or takes $VGPUD_E2E_BIN's) and the
// .deb from them, as a release would.
func (c *container) buildPackage(ctx context.Context) (string, error) {
	bin := os.Getenv("VGPUD_E2E_BIN")
	if bin == "" {
		bin = filepath.Join(c.tmp, "bin")
		if _, err := run(ctx, c.repo, "go", "build", "-trimpath", "-o", bin+"/", "./cmd/vgpud", "./cmd/vgpuctl"); err != nil {
			return "", fmt.Errorf("build: %w", err)
		}
	}
	out, err := runEnv(ctx, c.repo, []string{"BUILDDIR=" + bin, "VERSION=0~test", "DEB_COMPRESS=gzip"}, "scripts/package-deb.sh", filepath.Join(c.tmp, "deb"))
	if err != nil {
		return "", fmt.Errorf("package: %w", err)
	}
	return strings.TrimSpace(lastLine(out)), nil
}

// mount puts an overlay over the cached root: the container writes only
// to the upper dir, which close removes.
func (c *container) mount(base string) error {
	up, work := filepath.Join(c.tmp, "upper"), filepath.Join(c.tmp, "work")
	for _, d := range []string{up, work, c.root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	opts := "lowerdir=" + base + ",upperdir=" + up + ",workdir=" + work
	if err := syscall.Mount("overlay", c.root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the overlay over %s: %w", base, err)
	}
	return nil
}

// start boots the container and waits for its systemd to be running.
// --register=no and --keep-unit: the host has no machined and no systemd
// as PID 1; --private-network: the container's loopback is its own, so
// vgpud's metrics port does not meet the host's.
func (c *container) start(ctx context.Context) error {
	logf, err := os.Create(filepath.Join(c.tmp, "console.log"))
	if err != nil {
		return err
	}
	c.nspawn = exec.Command("systemd-nspawn", "--register=no", "--keep-unit", "--private-network",
		"--quiet", "-D", c.root, "-b", "--console=pipe")
	// nspawn mounts /sys read-only in the container, where a host's is
	// writable; ReadWritePaths=/sys/devices can only keep what is writable
	// above it, so the sandbox test could not see the unit's own effect.
	// Nothing in the tests writes to sysfs (the simulated host is files
	// under the state directory).
	c.nspawn.Env = append(os.Environ(), "SYSTEMD_NSPAWN_API_VFS_WRITABLE=1")
	c.nspawn.Stdout, c.nspawn.Stderr = logf, logf
	c.nspawn.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := c.nspawn.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("systemd-nspawn: %w", err)
	}
	go func() {
		_ = c.nspawn.Wait()
		logf.Close()
		close(c.exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-c.exited:
			return fmt.Errorf("systemd-nspawn exited\n%s", c.console())
		default:
		}
		if pid, ok := initPid(c.nspawn.Process.Pid); ok {
			c.init = pid
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no container init after 60 s\n%s", c.console())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Until systemd has its private bus, systemctl cannot ask it.
	for {
		out, err := c.sh(ctx, "systemctl is-system-running --wait")
		s := strings.TrimSpace(out)
		if s == "running" || s == "degraded" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container's systemd is %q (%v)\n%s", s, err, c.console())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// initPid finds the container's init: the child of systemd-nspawn that
// runs systemd.
func initPid(nspawn int) (int, bool) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", nspawn))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(s)
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			if strings.HasSuffix(exe, "/systemd") {
				return pid, true
			}
		}
	}
	return 0, false
}

// install installs the package as an operator does (dpkg -i; its postinst
// creates group vgpud, the directories, enables the unit and reloads the
// bus), the test's drop-in, and the users the polkit tests act as.
func (c *container) install(ctx context.Context) error {
	steps := []string{
		"mkdir -p " + filepath.Dir(dropIn) + " && cat >" + dropIn + " <<'EOF'\n" + testDropIn + "EOF",
		"dpkg -i " + debPath,
		"systemctl daemon-reload",
		"groupadd -r " + operatorGroup,
		"useradd -M -s /bin/sh -G vgpud ct-reader",
		"useradd -M -s /bin/sh -G " + operatorGroup + " ct-operator",
		"useradd -M -s /bin/sh ct-plain",
		"install -m 0644 /usr/share/doc/vgpud/vgpud-operators.rules.example " + rulesDst,
	}
	for _, s := range steps {
		if out, err := c.sh(ctx, s); err != nil {
			return fmt.Errorf("%s: %w\n%s", s, err, out)
		}
	}
	return nil
}

// close stops the container (SIGTERM to systemd-nspawn halts it; SIGKILL
// after 30 s), unmounts the overlay and removes the work dir.
func (c *container) close() {
	if c.nspawn != nil && c.nspawn.Process != nil {
		_ = c.nspawn.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(30 * time.Second):
			fmt.Fprintln(os.Stderr, "container tests: systemd-nspawn did not stop in 30 s; killing it")
			_ = c.nspawn.Process.Kill()
			<-c.exited
		}
	}
	if err := syscall.Unmount(c.root, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		// Still busy: detach it, so the directory can go.
		_ = syscall.Unmount(c.root, syscall.MNT_DETACH)
	}
	if c.lock != nil {
		c.lock.Close()
	}
	if os.Getenv("VGPUD_CONTAINER_KEEP") == "" {
		_ = os.RemoveAll(c.tmp)
	} else {
		fmt.Fprintln(os.Stderr, "container tests: kept", c.tmp)
	}
}

// sh runs a shell script inside the container, as root, with a deadline.
func (c *container) sh(ctx context.Context, script string) (string, error) {
	return c.shAs(ctx, "", script)
}

// shAs runs script as user (by name; "" is root), with the user's
// supplementary groups.
func (c *container) shAs(ctx context.Context, user, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	args := []string{"-t", strconv.Itoa(c.init), "-a"}
	if user != "" {
		args = append(args, "setpriv", "--reuid="+user, "--regid="+user, "--init-groups", "--")
	}
	args = append(args, "/bin/sh", "-c", script)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "HOME=/"}
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return out.String(), err
}

// console is the tail of the container's console output.
func (c *container) console() string {
	b, _ := os.ReadFile(filepath.Join(c.tmp, "console.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// dumpJournal prints vgpud's journal, for a failed run.
func (c *container) dumpJournal() {
	out, _ := c.sh(context.Background(), "journalctl -u vgpud --no-pager -n 200 -o short-monotonic")
	fmt.Fprintf(os.Stderr, "--- vgpud's journal in the container (last 200 lines):\n%s\n", out)
}

func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	return runEnv(ctx, dir, nil, name, args...)
}

func runEnv(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %w\n%s", name, err, errb.String())
	}
	return out.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}
