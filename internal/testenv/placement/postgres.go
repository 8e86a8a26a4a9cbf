package placement

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// pgBinGlob finds PostgreSQL's server programs (Debian keeps them per
// major version, off PATH).
const pgBinGlob = "/usr/lib/postgresql/*/bin"

// errNoPostgres: the PostgreSQL server is not installed.
var errNoPostgres = errors.New("postgresql is not installed (apt-get install postgresql)")

// pgCluster is a private PostgreSQL cluster, as production runs
// Placement's database on: initdb into its own directory, its own port on
// 127.0.0.1 and its own unix socket directory, never the machine's
// cluster. PostgreSQL refuses to run as root: under root the cluster
// belongs to the postgres system user (nobody when there is none).
type pgCluster struct {
	bin  string
	root string // data/, sock/, postgres.log
	port int
	cred *syscall.Credential
	cmd  *exec.Cmd
	done chan struct{}
}

// pgBin is the newest installed server's bin directory.
func pgBin() (string, error) {
	dirs, _ := filepath.Glob(pgBinGlob)
	best, bestV := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil && v > bestV {
			best, bestV = d, v
		}
	}
	if best == "" {
		return "", errNoPostgres
	}
	return best, nil
}

// startPostgres makes a cluster in a new directory and starts it. The
// directory is not the caller's: a root-owned test directory (0700) is one
// the postgres user cannot enter.
func startPostgres() (*pgCluster, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", "vgpud-placement-pg-")
	if err != nil {
		return nil, err
	}
	p := &pgCluster{bin: bin, root: root}
	if os.Geteuid() == 0 {
		if p.cred, err = unprivileged(); err != nil {
			os.RemoveAll(root)
			return nil, err
		}
		if err := os.Chown(root, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("postgresql directory: %w", err)
		}
	}
	if err := p.init(); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if p.port, err = freePort(); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if err := p.start(); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// unprivileged is the user a root-started cluster runs as.
func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
		}
	}
	return nil, errors.New("postgresql refuses root and neither the postgres nor the nobody user exists")
}

// command runs one of the cluster's programs as the cluster's user.
func (p *pgCluster) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, prog), args...)
	cmd.Dir = p.root
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	return cmd
}

func (p *pgCluster) init() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// trust: the cluster listens on 127.0.0.1 and a socket in its own
	// directory only, for the test's lifetime.
	out, err := p.command(ctx, "initdb", "-D", filepath.Join(p.root, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb: %w: %s", err, tail(string(out), 2000))
	}
	if err := os.Mkdir(filepath.Join(p.root, "sock"), 0o700); err != nil {
		return err
	}
	if p.cred != nil {
		return os.Chown(filepath.Join(p.root, "sock"), int(p.cred.Uid), int(p.cred.Gid))
	}
	return nil
}

// start runs the server and waits until it takes connections.
func (p *pgCluster) start() error {
	logf, err := os.OpenFile(filepath.Join(p.root, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := p.command(context.Background(), "postgres", "-D", filepath.Join(p.root, "data"), "-p", strconv.Itoa(p.port),
		"-k", filepath.Join(p.root, "sock"), "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Pdeathsig, cmd.SysProcAttr.Setpgid = syscall.SIGTERM, true
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	done := p.done
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := p.command(ctx, "pg_isready", "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(p.port)).Run()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(p.root, "postgres.log"))
			p.cmd = nil
			return fmt.Errorf("postgres exited before taking connections:\n%s", tail(string(log), 3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("postgres on port %d not ready after %s", p.port, readyTimeout)
}

// recreate drops Placement's database (if any) and makes it empty.
func (p *pgCluster) recreate() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres"}
	if out, err := p.command(ctx, "dropdb", append(conn, "--if-exists", "--force", "placement")...).CombinedOutput(); err != nil {
		return fmt.Errorf("dropdb: %w: %s", err, out)
	}
	if out, err := p.command(ctx, "createdb", append(conn, "placement")...).CombinedOutput(); err != nil {
		return fmt.Errorf("createdb: %w: %s", err, out)
	}
	return nil
}

// url is Placement's [placement_database] connection.
func (p *pgCluster) url() string {
	return fmt.Sprintf("postgresql+psycopg2://postgres@127.0.0.1:%d/placement", p.port)
}

// stop ends the server (a fast shutdown) and removes its directory.
func (p *pgCluster) stop() {
	if p.cmd != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		p.cmd = nil
	}
	os.RemoveAll(p.root)
}
