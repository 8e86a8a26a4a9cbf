// Package placement gives tests a real OpenStack Placement: the database
// made with placement-manage db sync (sqlite in a temporary directory, or
// with Options.Postgres a private PostgreSQL cluster as production runs
// it), served by uwsgi with the python3 plugin on a free 127.0.0.1 port,
// auth strategy noauth2 (any token; "admin" is used). A test may stop and
// start it again on the same port, or restart it on an empty database.
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
	"regexp"
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

// Options say how to run Placement; the zero value is sqlite, one uwsgi
// process.
type Options struct {
	// Postgres keeps the database in a private PostgreSQL cluster (its
	// own directory, port and socket; see postgres.go) instead of sqlite.
	Postgres bool
	// Processes is how many uwsgi worker processes serve (default 1),
	// each with 8 threads.
	Processes int
}

// Server is one running (or stopped) Placement.
type Server struct {
	dir  string
	port int
	opts Options
	pg   *pgCluster
	cmd  *exec.Cmd
	done chan struct{}
}

// Start makes a database and serves it until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with opts.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Postgres {
		if _, err := pgBin(); err != nil {
			skip(t, err.Error())
		}
	}
	for _, bin := range []string{wsgiFile, manage} {
		if _, err := os.Stat(bin); err != nil {
			skip(t, bin+" is not installed (apt-get install placement-api python3-placement)")
		}
	}
	if _, err := exec.LookPath("uwsgi"); err != nil {
		skip(t, "uwsgi is not installed (apt-get install uwsgi uwsgi-plugin-python3)")
	}
	s, err := OpenWith(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("placement: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Open makes a database in dir and serves it; the caller closes it. It is
// for programs (bench/): tests call Start.
func Open(dir string) (*Server, error) { return OpenWith(dir, Options{}) }

// OpenWith is Open with opts.
func OpenWith(dir string, opts Options) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	if opts.Processes <= 0 {
		opts.Processes = 1
	}
	s := &Server{dir: dir, port: port, opts: opts}
	if opts.Postgres {
		if s.pg, err = startPostgres(); err != nil {
			return nil, err
		}
		if err := s.pg.recreate(); err != nil {
			s.Close()
			return nil, err
		}
	}
	if err := s.dbSync(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.Run(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
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

// Database is "sqlite" or "postgresql": where Placement keeps its data.
func (s *Server) Database() string {
	if s.pg != nil {
		return "postgresql"
	}
	return "sqlite"
}

func (s *Server) dbSync() error {
	conn := "sqlite:///" + filepath.Join(s.dir, "placement.db")
	if s.pg != nil {
		conn = s.pg.url()
	}
	conf := fmt.Sprintf("[DEFAULT]\ndebug = false\n[api]\nauth_strategy = noauth2\n[placement_database]\nconnection = %s\n", conn)
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
		"--wsgi-file", wsgiFile, "--master", "--processes", strconv.Itoa(s.opts.Processes), "--threads", "8", "--lazy-apps", "--die-on-term", "--add-header", "Connection: close",
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

// Close stops Placement and, with Postgres, its cluster: for good.
func (s *Server) Close() {
	s.Stop()
	if s.pg != nil {
		s.pg.stop()
		s.pg = nil
	}
}

// Wipe stops Placement, starts again on an empty database (same port).
func (s *Server) Wipe() error {
	s.Stop()
	if s.pg != nil {
		if err := s.pg.recreate(); err != nil {
			return err
		}
	} else if err := os.Remove(filepath.Join(s.dir, "placement.db")); err != nil {
		return err
	}
	if err := s.dbSync(); err != nil {
		return err
	}
	return s.Run()
}

// statusRe is the answer's status in uwsgi's request log line
// ("... => generated 95 bytes in 3 msecs (HTTP/1.1 200) ...").
var statusRe = regexp.MustCompile(`=> generated \d+ bytes in \d+ msecs \(HTTP/[0-9.]+ (\d{3})\)`)

// Statuses counts the answers Placement gave since it was first started,
// by HTTP status, from uwsgi's request log.
func (s *Server) Statuses() (map[int]int, error) {
	data, err := os.ReadFile(filepath.Join(s.dir, "uwsgi.log"))
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, m := range statusRe.FindAllSubmatch(data, -1) {
		code, _ := strconv.Atoi(string(m[1]))
		out[code]++
	}
	return out, nil
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
