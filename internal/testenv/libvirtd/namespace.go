package libvirtd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// privatePaths are the directories a privileged libvirtd and virtlogd keep
// their state in whatever their configuration says: each is covered, in
// the Env's mount namespace, by a directory of the Env's own.
var privatePaths = []string{"/etc/libvirt", "/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt", "/var/log/libvirt"}

// privateDir is where, under the Env's directory, the private copy of a
// system path lives ("/run/libvirt" → "root/run/libvirt").
func privateDir(p string) string { return filepath.Join("root", p) }

// namespace is a mount namespace (and, for an Env that stands for a host of
// its own, a UTS namespace with that host's name) held open by a sleeping child process
// (the holder) made with unshare(1); daemons join it with nsenter(1), so a
// libvirtd restarted by a test finds its predecessor's state (and reattaches
// to its guests) as libvirtd restarted on a host does.
type namespace struct {
	dir    string // the Env's directory: private trees under dir/root
	uts    bool   // a UTS namespace of its own: libvirtd's hostname differs
	holder *exec.Cmd
	done   chan struct{}
}

// holderScript sets the hostname when given one (only inside a UTS
// namespace of its own), makes the private directories and bind-mounts them
// over the system paths, then says "ready" and sleeps until killed. unshare's
// --propagation private keeps these mounts from reaching the host and the
// host's later mounts from reaching in.
const holderScript = `set -e
dir=$1; host=$2; shift 2
if [ -n "$host" ]; then hostname "$host"; fi
for p in "$@"; do
	mkdir -p "$dir/root$p" "$p"
	mount --bind "$dir/root$p" "$p"
done
echo ready
exec sleep infinity
`

// holderTimeout bounds the holder's set-up (a few mounts).
const holderTimeout = 10 * time.Second

// newNamespace makes the namespace for an Env whose directory is dir. A
// non-empty hostname gives it a UTS namespace with that name, so libvirtd
// in it reports a hostname of its own (ConnectGetHostname, migration's
// same-host check).
func newNamespace(dir, hostname string) (*namespace, error) {
	args := []string{"--mount", "--propagation", "private"}
	if hostname != "" {
		args = append(args, "--uts")
	}
	args = append(args, "--", "sh", "-c", holderScript, "holder", dir, hostname)
	cmd := exec.Command("unshare", append(args, privatePaths...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	// The holder goes with the test binary if it dies without cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the mount namespace holder (unshare): %w", err)
	}
	ns := &namespace{dir: dir, uts: hostname != "", holder: cmd, done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("holder said %q", line)
		}
		ready <- err
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(ns.done)
	}()
	select {
	case err = <-ready:
	case <-time.After(holderTimeout):
		err = fmt.Errorf("no answer within %v", holderTimeout)
	}
	if err != nil {
		ns.close()
		return nil, fmt.Errorf("private mount namespace: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return ns, nil
}

// command runs name in the namespace. nsenter joins it and then execs name
// (no fork for mount and UTS namespaces), so the process is the daemon
// itself.
// A nil namespace runs name as it is.
func (ns *namespace) command(name string, args ...string) *exec.Cmd {
	if ns == nil {
		return exec.Command(name, args...)
	}
	pid := strconv.Itoa(ns.holder.Process.Pid)
	opts := []string{"--target", pid, "--mount"}
	if ns.uts {
		opts = append(opts, "--uts")
	}
	return exec.Command("nsenter", append(append(opts, "--", name), args...)...)
}

// path is where a path inside the namespace is seen from outside: a path
// under one of privatePaths maps into the Env's directory, any other path
// is the same inside and out.
func (ns *namespace) path(p string) string {
	for _, pp := range privatePaths {
		if p == pp || strings.HasPrefix(p, pp+"/") {
			return filepath.Join(ns.dir, privateDir(p))
		}
	}
	return p
}

// close ends the holder. The namespace goes when its last process does
// (guests a test left running keep it until they are destroyed).
func (ns *namespace) close() {
	if err := ns.holder.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return
	}
	<-ns.done
}
