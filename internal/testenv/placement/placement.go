// Package placement gives tests a real OpenStack Placement: the database
// made with placement-manage db sync (sqlite in a temporary directory),
// served by uwsgi with the python3 plugin on a free 127.0.0.1 port, auth
// strategy noauth2 (any token; "admin" is used). A test may stop and start
// it again on the same port, or restart it on an empty database.
//
// Proxy takes Placement away from one client (cut, hold) while others
// reach it; Nova runs nova-scheduler's own code (Debian's python3-nova)
// against it, and NovaScheduler schedules with it as Nova does.
//
// Tests skip, with the reason printed, when Placement, uwsgi or
// python3-nova is not installed; VGPUD_TEST_REQUIRE_SERVICES=1 turns that
// skip into a failure.
//
// Imports: pkg/placementapi, pkg/store.
package placement

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	requireEnv   = "VGPUD_TEST_REQUIRE_SERVICES"
	wsgiFile     = "/usr/bin/placement-api"
	manage       = "/usr/bin/placement-manage"
	readyTimeout = 60 * time.Second
)

// Server is one running (or stopped) Placement.
type Server struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// Start makes a database and serves it until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	for _, bin := range []string{wsgiFile, manage} {
		if _, err := os.Stat(bin); err != nil {
			skip(t, bin+" is not installed (apt-get install placement-api python3-placement)")
		}
	}
	if _, err := exec.LookPath("uwsgi"); err != nil {
		skip(t, "uwsgi is not installed (apt-get install uwsgi uwsgi-plugin-python3)")
	}
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatalf("placement: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Open makes a database in dir and serves it; the caller stops it. It is
// for programs (bench/): tests call Start.
func Open(dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, port: port}
	if err := s.dbSync(); err != nil {
		return nil, err
	}
	return s, s.Run()
}

func skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("%s (%s=1: services are required)", why, requireEnv)
	}
	t.Skip(why)
}

// URL is the endpoint.
func (s *Server) URL() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

func (s *Server) conf() string { return filepath.Join(s.dir, "placement.conf") }

func (s *Server) dbSync() error {
	conf := fmt.Sprintf("[DEFAULT]\ndebug = false\n[api]\nauth_strategy = noauth2\n[placement_database]\nconnection = sqlite:///%s\n",
		filepath.Join(s.dir, "placement.db"))
	if err := os.WriteFile(s.conf(), []byte(conf), 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "/usr/bin/python3", manage, "--config-file", s.conf(), "db", "sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("placement-manage db sync: %v: %s", err, out)
	}
	return nil
}

// Run starts uwsgi and waits until Placement answers. Started again on
// its port (after Stop or Wipe), it may find the port taken for a moment
// by another socket of the machine: it tries again then.
func (s *Server) Run() error {
	var err error
	for range 5 {
		if err = s.run(); err == nil || !strings.Contains(err.Error(), "Address already in use") {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

func (s *Server) run() error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "uwsgi.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// uwsgi's http-socket closes every connection after its answer without
	// saying so: a client that reuses one may write a PUT into a closed
	// socket ("server closed idle connection"), which Go does not replay.
	// Saying "Connection: close" keeps clients from reusing them.
	cmd := exec.Command("uwsgi", "--plugin", "python3", "--http-socket", "127.0.0.1:"+strconv.Itoa(s.port),
		"--wsgi-file", wsgiFile, "--master", "--processes", "1", "--threads", "8", "--lazy-apps", "--die-on-term", "--add-header", "Connection: close",
		"--env", "OS_PLACEMENT_CONFIG_DIR="+s.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start uwsgi: %w", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	done := s.done
	go func() {
		_ = cmd.Wait() // the worker may segfault while stopping: not a result
		logf.Close()
		close(done)
	}()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.URL() + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "uwsgi.log"))
			s.cmd = nil
			return fmt.Errorf("uwsgi exited before answering:\n%s", tail(string(log), 3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	s.Stop()
	return fmt.Errorf("no answer on %s after %s", s.URL(), readyTimeout)
}

// Running reports whether Placement was started and not stopped since.
func (s *Server) Running() bool { return s.cmd != nil }

// Stop ends uwsgi (its whole process group) and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	s.cmd = nil
}

// Wipe stops Placement, starts again on an empty database (same port).
func (s *Server) Wipe() error {
	s.Stop()
	if err := os.Remove(filepath.Join(s.dir, "placement.db")); err != nil {
		return err
	}
	if err := s.dbSync(); err != nil {
		return err
	}
	return s.Run()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
