package main

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// maxMainLines bounds package main: flags, configuration, wiring and the
// subcommands' plumbing fit in it; anything that needs more is a subject
// of its own and belongs in the package that owns it (docs/architecture.md).
const maxMainLines = 1600

// TestMainStaysWiring counts the non-blank lines of cmd/vgpud's non-test
// Go files and fails above maxMainLines, naming the largest files.
func TestMainStaysWiring(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	type count struct {
		file  string
		lines int
	}
	var counts []count
	total := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(data), "\n") {
			if strings.TrimSpace(l) != "" {
				n++
			}
		}
		counts = append(counts, count{f, n})
		total += n
	}
	if len(counts) == 0 {
		t.Fatal("no Go files found; is the test running in cmd/vgpud?")
	}
	if total <= maxMainLines {
		return
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i].lines > counts[j].lines })
	var top []string
	for _, c := range counts[:min(5, len(counts))] {
		top = append(top, c.file+" "+strconv.Itoa(c.lines))
	}
	t.Fatalf("cmd/vgpud has %d non-blank non-test lines, more than %d: package main is for flags, configuration, wiring and subcommand plumbing; move what has a subject of its own to its package (largest: %s)",
		total, maxMainLines, strings.Join(top, ", "))
}
