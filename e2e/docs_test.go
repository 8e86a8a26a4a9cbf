package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
)

// The documentation's commands, run as a newcomer would (the rule is in
// docs/operations.md, "Commands in the documentation").

// docCommandWords are the first words that make a code block's line a
// command.
var docCommandWords = map[string]bool{
	"vgpuctl": true, "vgpud": true, "bin/vgpuctl": true, "bin/vgpud": true, "make": true, "export": true,
	"mkdir": true, "dbus-daemon": true, "busctl": true, "until": true, "systemctl": true,
}

var skipMarker = regexp.MustCompile(`^<!-- docs-test: skip: (.+) -->$`)

// docBlock is one code block's commands.
type docBlock struct {
	line     int
	commands []string
	skip     string
}

// docCommands extracts the code blocks of a Markdown file with their
// commands: fenced blocks and indented ones (4 spaces after a blank line).
func docCommands(t *testing.T, path string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []docBlock
	var cur *docBlock
	fenced, prevBlank, pendingSkip := false, true, ""
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```"):
			if fenced {
				flush()
			} else {
				cur, pendingSkip = &docBlock{line: n, skip: pendingSkip}, ""
			}
			fenced = !fenced
			continue
		case fenced:
			cur.add(line)
			continue
		case strings.HasPrefix(line, "    ") && (cur != nil || prevBlank):
			if cur == nil {
				cur, pendingSkip = &docBlock{line: n, skip: pendingSkip}, ""
			}
			cur.add(strings.TrimPrefix(line, "    "))
		case strings.TrimSpace(line) == "":
		default:
			flush()
			if m := skipMarker.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				pendingSkip = strings.TrimSpace(m[1])
			} else if strings.HasPrefix(strings.TrimSpace(line), "<!--") && strings.Contains(line, "docs-test:") {
				t.Fatalf("%s:%d: malformed marker %q: want <!-- docs-test: skip: REASON -->", path, n, line)
			}
		}
		prevBlank = strings.TrimSpace(line) == ""
	}
	flush()
	return out
}

func (b *docBlock) add(line string) {
	l := strings.TrimSpace(line)
	for _, p := range []string{"$ ", "# "} {
		l = strings.TrimPrefix(l, p)
	}
	word, _, _ := strings.Cut(l, " ")
	if docCommandWords[word] || strings.HasPrefix(word, "systemd-") {
		b.commands = append(b.commands, l)
	}
}

// runDocScript runs commands with bash (stopping at the first failure) in
// dir with env, and fails the test with the output when one fails.
func runDocScript(t *testing.T, what, dir string, env []string, commands []string) {
	t.Helper()
	script := "set -euo pipefail\n"
	for _, c := range commands {
		script += fmt.Sprintf("echo %s\n%s\n", strconv.Quote("+ "+c), c)
	}
	// A file, not a pipe: what the commands leave in the background (the
	// daemon) keeps its output open after bash is done.
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("timeout", "120", "bash", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) // what the commands left in the background
	}
	if err != nil {
		text, _ := os.ReadFile(out.Name())
		t.Fatalf("%s: a documented command failed (%v):\n%s", what, err, text)
	}
}

// killUnder ends the processes whose command line names dir (what a
// documented command daemonized: dbus-daemon --fork), by pid.
func killUnder(dir string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(dir)) {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
}

func TestDocsCommandsRun(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("dbus-daemon"); err != nil {
		skipMissing(t, "dbus-daemon is not installed")
	}
	binDir := filepath.Dir(vgpudBin)
	basePath := binDir + string(os.PathListSeparator) + os.Getenv("PATH")
	for _, file := range []string{"README.md", "docs/vgpuctl.md", "docs/operations.md"} {
		var run []string
		for _, b := range docCommands(t, filepath.Join(root, file)) {
			if b.skip != "" || len(b.commands) == 0 {
				continue
			}
			run = append(run, b.commands...)
		}
		t.Run(strings.ReplaceAll(file, "/", "_"), func(t *testing.T) {
			if len(run) == 0 {
				t.Skipf("%s: every command block is marked (docs-test: skip)", file)
			}
			if file == "README.md" {
				runReadme(t, binDir, basePath, run)
				return
			}
			bus := testbus.Start(t)
			d := startBusDaemon(t, bus, busDaemonOpts{})
			env := append(os.Environ(), "PATH="+basePath, "VGPUCTL_CONNECT="+bus.Address(), "VGPUD_STATE_DIR="+d.stateDir)
			runDocScript(t, file, t.TempDir(), env, run)
		})
	}
}

// runReadme runs README.md's commands in a directory whose bin/ holds the
// built binaries (`make build` is that), /tmp/vgpud being a directory of
// the test's own.
func runReadme(t *testing.T, binDir, path string, commands []string) {
	work := t.TempDir()
	if err := os.Symlink(binDir, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "vgpud")
	t.Cleanup(func() {
		killUnder(state)
		time.Sleep(200 * time.Millisecond)
	})
	var run []string
	for _, c := range commands {
		if c == "make build" {
			continue // the binaries are built
		}
		run = append(run, strings.ReplaceAll(c, "/tmp/vgpud", state))
	}
	env := []string{"PATH=" + path, "HOME=" + work}
	runDocScript(t, "README.md", work, env, run)
}
