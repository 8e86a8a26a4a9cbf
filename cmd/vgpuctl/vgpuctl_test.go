package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/version"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const (
	migID = "0b4f5c1e-9a3d-4e2b-8c7f-1a2b3c4d5e6f"
	vfID  = "7d2e9f10-4b5a-4c6d-9e8f-0a1b2c3d4e5f"
)

// verbs are the command lines the golden and width tests run, by name.
var verbs = []struct {
	name string
	args []string
}{
	{"gpus", []string{"gpus"}},
	{"gpu-show", []string{"gpu", "show", "0000:41:00.0"}},
	{"gpu-mig", []string{"gpu", "mig", "0000:41:00.0", "off"}},
	{"gpu-scheduler", []string{"gpu", "scheduler", "0000:81:00.0", "--policy", "fixed_share", "--timeslice", "2ms"}},
	{"profiles", []string{"profiles"}},
	{"capacity", []string{"capacity"}},
	{"list", []string{"list"}},
	{"list-tenant", []string{"list", "--tenant", "acme"}},
	{"show", []string{"show", "0b4f5c1e"}},
	{"dumpxml", []string{"dumpxml", vfID}},
	{"create", []string{"create", "3g.40gb", "--tenant", "acme"}},
	{"destroy", []string{"destroy", migID}},
	{"attach", []string{"attach", "vm1", "7d2e9f10"}},
	{"attach-profile", []string{"attach", "vm1", "--profile", "L4-4Q", "--tenant", "acme"}},
	{"detach", []string{"detach", "a-virtual-machine-named-at-length", vfID}},
	{"tenant-define", []string{"tenant", "define", "acme", "--vram", "80GiB", "--compute", "2500m", "--max-instances", "4", "--class", "guaranteed"}},
	{"tenant-list", []string{"tenant", "list"}},
	{"tenant-show", []string{"tenant", "show", "acme"}},
	{"tenant-set-quota", []string{"tenant", "set-quota", "acme", "--compute", "3"}},
	{"tenant-undefine", []string{"tenant", "undefine", "acme"}},
	{"plan", []string{"plan", "3g.40gb", "--tenant", "acme"}},
	{"plan-file", []string{"plan", "-f", "testdata/layout.yaml"}},
	{"apply-dry-run", []string{"apply", "-f", "testdata/layout.yaml", "--dry-run"}},
	{"reconcile", []string{"reconcile"}},
	{"defrag", []string{"defrag", "7g.80gb", "--tenant", "acme"}},
	{"top", []string{"top", "-n", "1"}},
	{"events", []string{"events", "--count", "2"}},
	{"version", []string{"version"}},
	{"fleet-status", []string{"fleet", "status"}},
}

func TestGoldenJSON(t *testing.T) {
	for _, v := range verbs {
		t.Run(v.name, func(t *testing.T) {
			out, errOut, code := runFake(&fake{}, append(v.args, "-o", "json")...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			checkJSON(t, v.name, out)
			golden(t, v.name+".json", out)
		})
	}
}

// checkJSON insists every document is valid JSON with the schema header.
func checkJSON(t *testing.T, name, out string) {
	t.Helper()
	for _, doc := range jsonDocs(t, out) {
		var h header
		if err := json.Unmarshal(doc, &h); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if h.APIVersion != dbusapi.APIVersion || h.Kind == "" {
			t.Fatalf("%s: header %+v", name, h)
		}
	}
}

// jsonDocs splits the output into its JSON documents (one, or one per
// line for events and top).
func jsonDocs(t *testing.T, out string) []json.RawMessage {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	var docs []json.RawMessage
	for dec.More() {
		var d json.RawMessage
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		docs = append(docs, d)
	}
	if len(docs) == 0 {
		t.Fatal("no JSON document")
	}
	return docs
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/vgpuctl -update)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (JSON is a stable API: add fields, never change them; then -update):\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// TestYAMLMatchesJSON holds -o yaml to "the same document as YAML": read
// back, it is the -o json document, value for value.
func TestYAMLMatchesJSON(t *testing.T) {
	for _, v := range verbs {
		if v.name == "events" || v.name == "top" {
			continue // JSON Lines; their YAML is a document stream
		}
		t.Run(v.name, func(t *testing.T) {
			js, errOut, code := runFake(&fake{}, append(v.args, "-o", "json")...)
			if code != 0 {
				t.Fatalf("-o json: exit %d: %s", code, errOut)
			}
			ym, errOut, code := runFake(&fake{}, append(v.args, "-o", "yaml")...)
			if code != 0 {
				t.Fatalf("-o yaml: exit %d: %s", code, errOut)
			}
			fromYAML, err := yaml.YAMLToJSON([]byte(ym))
			if err != nil {
				t.Fatalf("-o yaml is not YAML (%v):\n%s", err, ym)
			}
			var a, b any
			if err := json.Unmarshal([]byte(js), &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(fromYAML, &b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("-o yaml differs from -o json:\n--- json\n%s\n--- yaml\n%s", js, ym)
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	f := &fake{}
	out, errOut, code := runFake(f, "--version")
	if code != 0 || out != "vgpuctl "+version.Version+"\n" {
		t.Fatalf("--version: exit %d, %q (%s); want %q", code, out, errOut, "vgpuctl "+version.Version+"\n")
	}
	// The same line as the client part of `vgpuctl version`.
	full, _, _ := runFake(&fake{}, "version")
	if first, _, _ := strings.Cut(full, "\n"); first+"\n" != out {
		t.Errorf("--version %q, version's first line %q", out, first)
	}
	if f.lastCall() != "" {
		t.Errorf("--version asked vgpud: %s", f.lastCall())
	}
}

// TestGPUShowManyInstances: gpu show lists a GPU's instances one per
// line, so a full GPU stays within 100 columns.
func TestGPUShowManyInstances(t *testing.T) {
	g := fakeGPUs()[0]
	g.Instances = []string{migID, vfID, "3c1d2e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"}
	var b strings.Builder
	if err := gpuDetail(&b, g); err != nil {
		t.Fatal(err)
	}
	for _, id := range g.Instances {
		if !strings.Contains(b.String(), id) {
			t.Errorf("gpu show lacks instance %s:\n%s", id, b.String())
		}
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if n := utf8.RuneCountInString(line); n > 100 {
			t.Errorf("%d columns: %q", n, line)
		}
	}
}

// TestDestroyPartialFailure: when one of several destroys fails, -o json
// still lists the instances destroyed before it, and the exit code is the
// failure's.
func TestDestroyPartialFailure(t *testing.T) {
	for _, format := range []string{"json", "yaml"} {
		out, errOut, code := runFake(&fake{failDestroy: vfID}, "destroy", migID, vfID, "-o", format)
		if code != exitBusy || !strings.Contains(errOut, "Busy") {
			t.Fatalf("-o %s: exit %d %q, want %d and Busy", format, code, errOut, exitBusy)
		}
		if format == "yaml" {
			b, err := yaml.YAMLToJSON([]byte(out))
			if err != nil {
				t.Fatalf("-o yaml: %v\n%s", err, out)
			}
			out = string(b)
		}
		var doc list[resultDoc]
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, out)
		}
		if doc.Kind != "ResultList" || len(doc.Items) != 1 || doc.Items[0].ID != migID {
			t.Fatalf("-o %s: %+v, want the one destroyed instance %s", format, doc, migID)
		}
	}
}

// TestSetQuotaAllFlagsReadsNothing: with every quota flag given there is
// nothing to keep, so set-quota does not read the tenant (which a caller
// polkit lets change but not read could not).
func TestSetQuotaAllFlagsReadsNothing(t *testing.T) {
	f := &fake{}
	if _, errOut, code := runFake(f, "tenant", "set-quota", "acme", "--vram", "1TiB", "--compute", "4", "--max-instances", "8"); code != 0 {
		t.Fatal(errOut)
	}
	f.mu.Lock()
	calls := slices.Clone(f.calls)
	f.mu.Unlock()
	if slices.Contains(calls, "Tenant acme") {
		t.Fatalf("set-quota with all flags read the tenant: %v", calls)
	}
	if want := (dbusapi.Quota{VRAMBytes: 1 << 40, ComputeMilli: 4000, MaxInstances: 8}); f.quota != want {
		t.Fatalf("set-quota sent %+v, want %+v", f.quota, want)
	}
}

func TestTablesFit100Columns(t *testing.T) {
	for _, v := range verbs {
		t.Run(v.name, func(t *testing.T) {
			out, errOut, code := runFake(&fake{}, v.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if strings.TrimSpace(out) == "" {
				t.Fatal("no output")
			}
			for _, line := range strings.Split(out, "\n") {
				if n := utf8.RuneCountInString(line); n > 100 {
					t.Errorf("%d columns: %q", n, line)
				}
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		name string
		fail error
		args []string
		code int
		want string
	}{
		{"ok", nil, []string{"list"}, exitOK, ""},
		{"unknown command", nil, []string{"frobnicate"}, exitUsage, "unknown command"},
		{"unknown flag", nil, []string{"list", "--frob"}, exitUsage, "unknown flag"},
		{"missing argument", nil, []string{"destroy"}, exitUsage, "requires at least 1 arg"},
		{"bad output format", nil, []string{"list", "-o", "xml"}, exitUsage, `-o "xml"`},
		{"bad quantity", nil, []string{"tenant", "define", "x", "--vram", "80 parsecs", "--compute", "1"}, exitUsage, "--vram"},
		{"define without quota", nil, []string{"tenant", "define", "x"}, exitUsage, "--vram and --compute are required"},
		{"attach both ways", nil, []string{"attach", "vm", migID, "--profile", "x", "--tenant", "t"}, exitUsage, "not both"},
		{"denied", &dbusapi.Error{Name: dbusapi.NameAccessDenied, Message: "reading needs group vgpud"}, []string{"gpus"}, exitDenied, "vgpuctl: AccessDenied: reading needs group vgpud"},
		{"not found", &dbusapi.Error{Name: dbusapi.NameNotFound, Message: "no tenant x (run `vgpuctl tenant list`)"}, []string{"tenant", "show", "x"}, exitNotFound, "NotFound: no tenant x"},
		{"no capacity", &dbusapi.Error{Name: dbusapi.NameNoCapacity, Message: "no room; run `vgpuctl capacity`"}, []string{"gpus"}, exitNoCapacity, "NoCapacity"},
		{"quota", &dbusapi.Error{Name: dbusapi.NameQuotaExceeded, Message: "VRAM quota 10GiB"}, []string{"gpus"}, exitQuota, "QuotaExceeded"},
		{"busy", &dbusapi.Error{Name: dbusapi.NameBusy, Message: "retry"}, []string{"gpus"}, exitBusy, "Busy"},
		{"conflict", &dbusapi.Error{Name: dbusapi.NameConflict, Message: "other VM"}, []string{"gpus"}, exitConflict, "Conflict"},
		{"gpu lost", &dbusapi.Error{Name: dbusapi.NameGPULost, Message: "fell off"}, []string{"gpus"}, exitGPULost, "GPULost"},
		{"stale claim", &dbusapi.Error{Name: dbusapi.NameStaleClaim, Message: "the fleet's allocation for x is stale"}, []string{"gpus"}, exitStale, "StaleClaim"},
		{"invalid argument", &dbusapi.Error{Name: dbusapi.NameInvalidArgument, Message: "bad profile"}, []string{"gpus"}, exitUsage, "InvalidArgument"},
		{"backend", &dbusapi.Error{Name: dbusapi.NameBackendFailure, Message: "driver"}, []string{"gpus"}, exitFailure, "BackendFailure: driver"},
		{"unavailable", &dbusapi.Error{Name: dbusapi.NameUnavailable, Message: "vgpud is not running"}, []string{"gpus"}, exitUnavailable, "Unavailable"},
		{"timeout", &dbusapi.Error{Name: dbusapi.NameTimeout, Message: "too slow"}, []string{"gpus"}, exitTimeout, "Timeout"},
		{"plain error", errors.New("something odd"), []string{"gpus"}, exitFailure, "BackendFailure: something odd"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, code := runFake(&fake{fail: c.fail}, c.args...)
			if code != c.code {
				t.Fatalf("exit %d, want %d (%s)", code, c.code, errOut)
			}
			if !strings.Contains(errOut, c.want) {
				t.Fatalf("stderr %q lacks %q", errOut, c.want)
			}
			for _, jargon := range []string{"goroutine", "panic", "org.freedesktop", "dbus.Error"} {
				if strings.Contains(errOut, jargon) {
					t.Fatalf("stderr shows %q: %s", jargon, errOut)
				}
			}
		})
	}
}

func TestTenantQuotaFlags(t *testing.T) {
	f := &fake{}
	if _, errOut, code := runFake(f, "tenant", "define", "acme", "--vram", "80GiB", "--compute", "2500m", "--class", "guaranteed", "--allow-model", "H100-SXM5-80GB"); code != 0 {
		t.Fatal(errOut)
	}
	want := dbusapi.Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: dbusapi.Unlimited}
	if f.defined.Quota != want || f.defined.Class != "guaranteed" || len(f.defined.AllowedModels) != 1 {
		t.Fatalf("defined %+v, want quota %+v", f.defined, want)
	}
	// set-quota keeps what is not given: acme has 80GiB, 2500m, 4.
	if _, errOut, code := runFake(f, "tenant", "set-quota", "acme", "--compute", "2.5", "--max-instances", "unlimited"); code != 0 {
		t.Fatal(errOut)
	}
	if want := (dbusapi.Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: dbusapi.Unlimited}); f.quota != want {
		t.Fatalf("set-quota sent %+v, want %+v", f.quota, want)
	}
}

func TestInstancePrefixes(t *testing.T) {
	f := &fake{}
	if _, errOut, code := runFake(f, "destroy", "0b4f"); code != 0 || f.lastCall() != "Destroy "+migID+" false" {
		t.Fatalf("destroy 0b4f: %d %s, last call %q", code, errOut, f.lastCall())
	}
	if _, errOut, code := runFake(f, "destroy", "ffff0000"); code != exitNotFound {
		t.Fatalf("unknown prefix: exit %d %s", code, errOut)
	}
	if _, _, code := runFake(f, "destroy", "0b"); code != exitUsage {
		t.Fatalf("two-character prefix: exit %d", code)
	}
}

func TestDynamicCompletion(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"__complete", "destroy", ""}, migID},
		{[]string{"__complete", "tenant", "show", "ac"}, "acme"},
		{[]string{"__complete", "profiles", "--gpu", ""}, "0000:81:00.0"},
		{[]string{"__complete", "create", "--tenant", "acme", "--profile", "L4"}, "L4-4Q"},
		{[]string{"__complete", "create", "H1"}, "H100XM-2-20C"},
		// detach [VM] INSTANCE: VMs and attached instances first, then
		// the instances of the VM named.
		{[]string{"__complete", "detach", ""}, "a-virtual-machine-named-at-length"},
		{[]string{"__complete", "detach", ""}, vfID},
		{[]string{"__complete", "detach", "a-virtual-machine-named-at-length", ""}, vfID},
	}
	for _, c := range cases {
		out, errOut, code := runFake(&fake{}, c.args...)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, %q lacks %q (%s)", c.args, code, out, c.want, errOut)
		}
	}
	// Nothing where no instance goes: after the instance, and for an
	// instance that is not attached.
	for _, args := range [][]string{
		{"__complete", "detach", vfID, ""},
		{"__complete", "detach", "a-virtual-machine-named-at-length", vfID, ""},
		{"__complete", "detach", "0b4f"},
	} {
		out, errOut, code := runFake(&fake{}, args...)
		if code != 0 || strings.Contains(out, migID) || strings.Contains(out, vfID) {
			t.Errorf("%v: exit %d, completes %q (%s)", args, code, out, errOut)
		}
	}
}

func TestCompletionScriptsAndManPages(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, errOut, code := runFake(&fake{}, "completion", sh)
		if code != 0 || !strings.Contains(out, "vgpuctl") || len(out) < 1000 {
			t.Errorf("completion %s: exit %d, %d bytes (%s)", sh, code, len(out), errOut)
		}
	}
	dir := t.TempDir()
	if _, errOut, code := runFake(&fake{}, "gen-docs", "--man", filepath.Join(dir, "man"), "--completions", filepath.Join(dir, "comp")); code != 0 {
		t.Fatal(errOut)
	}
	for _, p := range []string{"man/vgpuctl.1", "man/vgpuctl-attach.1", "man/vgpuctl-tenant-define.1", "comp/vgpuctl.bash", "comp/_vgpuctl", "comp/vgpuctl.fish"} {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// TestDocsCoverCommands keeps docs/vgpuctl.md complete: every command and
// every exit code is documented.
func TestDocsCoverCommands(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "vgpuctl.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	a := &app{streams: streams{out: io.Discard, err: io.Discard}}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			if sub.Runnable() && !strings.Contains(text, "`"+sub.CommandPath()) {
				t.Errorf("docs/vgpuctl.md does not document %q", sub.CommandPath())
			}
			walk(sub)
		}
	}
	walk(a.rootCmd())
	for _, code := range []int{exitOK, exitFailure, exitUsage, exitDenied, exitNotFound, exitNoCapacity, exitQuota, exitBusy, exitConflict, exitGPULost, exitUnavailable, exitTimeout} {
		if !strings.Contains(text, fmt.Sprintf("\n| %d | ", code)) {
			t.Errorf("exit code %d undocumented", code)
		}
	}
	if !strings.Contains(text, "\n| 130 | ") {
		t.Error("exit code 130 undocumented")
	}
}

// gpu scheduler: the flags checked before any call, the call as made, and
// the pending state said in words.
func TestGPUScheduler(t *testing.T) {
	for _, bad := range [][]string{
		{"gpu", "scheduler", "0000:81:00.0"},
		{"gpu", "scheduler", "0000:81:00.0", "--mode", "sometimes", "--policy", "fixed_share"},
		{"gpu", "scheduler", "0000:81:00.0", "--mode", "adaptive", "--policy", "fixed_share"},
		{"gpu", "scheduler", "0000:81:00.0", "--mode", "pinned"},
		{"gpu", "scheduler", "0000:81:00.0", "--policy", "fixed_share", "--timeslice", "-1ms"},
		// The API carries whole microseconds: 1ns would reach vgpud as 0,
		// the driver's default.
		{"gpu", "scheduler", "0000:81:00.0", "--policy", "fixed_share", "--timeslice", "1ns"},
		{"gpu", "scheduler", "0000:81:00.0", "--policy", "fixed_share", "--timeslice", "1999999ns"},
	} {
		f := &fake{}
		if _, errOut, code := runFake(f, bad...); code != exitUsage || len(f.calls) != 0 {
			t.Errorf("%v: exit %d, calls %v, %s; want a usage error and no call", bad, code, f.calls, errOut)
		}
	}
	f := &fake{}
	out, errOut, code := runFake(f, "gpu", "scheduler", "0000:81:00.0", "--policy", "fixed_share", "--timeslice", "2ms")
	if code != 0 || len(f.calls) == 0 || f.calls[0] != `SetGPUScheduler 0000:81:00.0 "" "fixed_share" 2ms` || !strings.Contains(out, "pinned to fixed_share, time slice 2ms\n  pending: ") {
		t.Fatalf("pin: exit %d, calls %q, out %q, err %q", code, f.calls, out, errOut)
	}
	// What is shown is what vgpud holds (the driver's value, read back),
	// not what was typed.
	f = &fake{held: &dbusapi.GPUSchedulerState{Mode: "pinned", Policy: "equal_share", Timeslice: 2 * time.Millisecond}}
	out, errOut, code = runFake(f, "gpu", "scheduler", "0000:81:00.0", "--policy", "equal_share", "--timeslice", "1999us")
	if code != 0 || !strings.Contains(out, "pinned to equal_share, time slice 2ms\n") {
		t.Fatalf("pin shown as held: exit %d, out %q, err %q", code, out, errOut)
	}
	out, _, code = runFake(f, "gpu", "scheduler", "0000:81:00.0", "--mode", "adaptive")
	if code != 0 || f.lastCall() != `SetGPUScheduler 0000:81:00.0 "adaptive" "" 0s` || !strings.Contains(out, "is adaptive") {
		t.Fatalf("adaptive: exit %d, call %q, out %q", code, f.lastCall(), out)
	}
}

// gpu scheduler --gpu-instance: an id out of 0..2^31-1 (one that would
// wrap on the wire) is a usage error with no
// call; otherwise the GPU instance's call is made (never the GPU's), and
// the answer names the GPU instance.
func TestGPUInstanceSchedulerFlag(t *testing.T) {
	f := &fake{}
	for _, bad := range []string{"-1", "4294967299", "2147483648"} {
		if _, errOut, code := runFake(f, "gpu", "scheduler", "0000:41:00.0", "--gpu-instance", bad, "--policy", "equal_share"); code != exitUsage || len(f.calls) != 0 {
			t.Errorf("--gpu-instance %s: exit %d, calls %v, %s; want a usage error and no call", bad, code, f.calls, errOut)
		}
	}
	if _, _, code := runFake(f, "gpu", "scheduler", "0000:41:00.0", "--gpu-instance", "3"); code != exitUsage || len(f.calls) != 0 {
		t.Errorf("no policy: exit %d, calls %v; want a usage error and no call", code, f.calls)
	}
	out, errOut, code := runFake(f, "gpu", "scheduler", "0000:41:00.0", "--gpu-instance", "3", "--policy", "equal-share", "--timeslice", "5ms")
	if code != 0 || len(f.calls) == 0 || f.calls[0] != `SetGPUInstanceScheduler 0000:41:00.0 3 "" "equal-share" 5ms` || !strings.Contains(out, "GPU 0000:41:00.0 GPU instance 3 pinned to equal_share, time slice 5ms\n") {
		t.Fatalf("pin: exit %d, calls %q, out %q, err %q", code, f.calls, out, errOut)
	}
	out, _, code = runFake(f, "gpu", "scheduler", "0000:41:00.0", "--gpu-instance", "0", "--mode", "adaptive")
	if code != 0 || f.lastCall() != `SetGPUInstanceScheduler 0000:41:00.0 0 "adaptive" "" 0s` || !strings.Contains(out, "GPU instance 0 is not pinned") {
		t.Fatalf("adaptive: exit %d, call %q, out %q", code, f.lastCall(), out)
	}
}

// --no-trunc shows every cell whole: list's profiles, gpus' models and
// states, events' values; without it they are cut with "~".
func TestNoTrunc(t *testing.T) {
	long := "H100-SXM5-80GB/1g.10gb+me"
	insts := []dbusapi.Instance{{UUID: migID, Tenant: "a-tenant-with-a-long-name", Profile: long, Kind: "mig", GPU: "0000:41:00.0", State: "ready"}}
	gpus := []dbusapi.GPU{{PCI: "0000:41:00.0", Model: "H100-SXM5-80GB-with-a-long-name", State: "failed", Reason: "XID 79 (GPU has fallen off the bus)"}}
	ev := dbusapi.Event{Signal: "PropertiesChanged", Kind: "instance", ID: migID, Changed: map[string]any{"Reason": "a reason longer than twenty-four characters"}}
	for _, c := range []struct {
		name string
		out  func(full bool) string
		want string
	}{
		{"list", func(full bool) string { var b strings.Builder; _ = instanceTable(&b, insts, full); return b.String() }, long},
		{"gpus", func(full bool) string { var b strings.Builder; _ = gpuTable(&b, gpus, full); return b.String() }, "failed: XID 79 (GPU has fallen off the bus)"},
		{"events", func(full bool) string { return eventLine(ev, full) }, "a reason longer than twenty-four characters"},
	} {
		if got := c.out(true); !strings.Contains(got, c.want) || strings.Contains(got, "~") {
			t.Errorf("%s --no-trunc cuts %q:\n%s", c.name, c.want, got)
		}
		if got := c.out(false); strings.Contains(got, c.want) || !strings.Contains(got, "~") {
			t.Errorf("%s without --no-trunc shows %q whole:\n%s", c.name, c.want, got)
		}
	}
	if got := eventLine(ev, true); !strings.Contains(got, migID) {
		t.Errorf("events --no-trunc shortens the UUID: %s", got)
	}
}

// profiles prints its VRAM column in one unit.
func TestProfilesOneMemoryUnit(t *testing.T) {
	if got := bytesColumn([]uint64{80 << 30, 9984 << 20, 4 << 30}); strings.Join(got, " ") != "80GiB 9.75GiB 4GiB" {
		t.Errorf("GiB column: %v", got)
	}
	if got := bytesColumn([]uint64{80 << 30, 1000 << 20}); strings.Join(got, " ") != "81920MiB 1000MiB" {
		t.Errorf("MiB column: %v", got)
	}
	out, errOut, code := runFake(&fake{}, "profiles")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	units := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		for _, f := range strings.Fields(line) {
			for _, u := range []string{"GiB", "MiB", "KiB", "TiB"} {
				if strings.HasSuffix(f, u) {
					units[u] = true
				}
			}
		}
	}
	if len(units) != 1 {
		t.Errorf("profiles' VRAM column mixes units %v:\n%s", units, out)
	}
}

// TestFleetStatusTable: the table names each difference and marks a
// provider Placement lacks; without a fleet the daemon's Unavailable is
// exit 10.
func TestFleetStatusTable(t *testing.T) {
	f := &fake{}
	out, _, code := runFake(f, "fleet", "status")
	for _, want := range []string{"gpu-7_pci_0000_41_00_0", "MISSING", "CUSTOM_VGPUD_MIG_SLICE", "8/0/5", "2 differences", "provider-missing", "allocation-stale", "host: no instance"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Fatalf("fleet status (exit %d) lacks %q:\n%s", code, want, out)
		}
	}
	f.fail = &dbusapi.Error{Name: dbusapi.NameUnavailable, Message: "no fleet: configure fleet: in vgpud.yaml (docs/fleet.md)"}
	if _, errOut, code := runFake(f, "fleet", "status"); code != exitUnavailable || !strings.Contains(errOut, "configure fleet:") {
		t.Fatalf("fleet status without a fleet: exit %d, %q", code, errOut)
	}
}

// TestCreatePlacementConsumer: --placement-consumer reaches the request.
func TestCreatePlacementConsumer(t *testing.T) {
	f := &fake{}
	const consumer = "88fce000-e480-4d4a-b58e-cabee588cd84"
	if _, errOut, code := runFake(f, "create", "3g.40gb", "--tenant", "acme", "--placement-consumer", consumer); code != exitOK || f.created.PlacementConsumer != consumer {
		t.Fatalf("create --placement-consumer: exit %d (%s), request %+v", code, errOut, f.created)
	}
}

// TestPlacementBehindIsReported: a create or destroy that succeeded but
// left Placement to the sync says so on standard error and still exits 0
// (the operation is done), with -o json too (the JSON carries it as
// placementBehind); one that kept its promise prints no warning.
func TestPlacementBehindIsReported(t *testing.T) {
	const lag = "allocation not written before carving (placement: unreachable); the sync writes it"
	for _, args := range [][]string{
		{"create", "3g.40gb", "--tenant", "acme"},
		{"create", "3g.40gb", "--tenant", "acme", "-o", "json"},
		{"destroy", migID},
	} {
		out, errOut, code := runFake(&fake{behind: lag}, args...)
		if code != exitOK || !strings.Contains(errOut, "vgpuctl: warning: ") || !strings.Contains(errOut, lag) {
			t.Errorf("%v: exit %d, stderr %q; want 0 and the warning", args, code, errOut)
		}
		if slices.Contains(args, "json") && !strings.Contains(out, `"placementBehind": "`+lag+`"`) {
			t.Errorf("%v: the JSON does not carry placementBehind:\n%s", args, out)
		}
		if _, errOut, code := runFake(&fake{}, args...); code != exitOK || errOut != "" {
			t.Errorf("%v with every promise kept: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// gpu scheduler --gpu-instance N --clear drops the pin (the call is
// adaptive), also of a GPU instance that is gone; gpu show names such a
// pin by the id its GPU instance had and says how to drop it. --clear
// with a setting is a usage error with no call.
func TestGPUInstanceSchedulerClear(t *testing.T) {
	f := &fake{}
	for _, args := range [][]string{{"--policy", "equal_share"}, {"--mode", "pinned"}, {"--timeslice", "5ms"}} {
		if _, errOut, code := runFake(f, append([]string{"gpu", "scheduler", "0000:41:00.0", "--gpu-instance", "5", "--clear"}, args...)...); code != exitUsage || len(f.calls) != 0 {
			t.Errorf("--clear %v: exit %d, calls %v, %s; want a usage error and no call", args, code, f.calls, errOut)
		}
	}
	out, errOut, code := runFake(f, "gpu", "scheduler", "0000:41:00.0", "--gpu-instance", "5", "--clear")
	if code != 0 || f.lastCall() != `SetGPUInstanceScheduler 0000:41:00.0 5 "adaptive" "" 0s` || !strings.Contains(out, "GPU instance 5 is not pinned") {
		t.Fatalf("--clear: exit %d, call %q, out %q, err %q", code, f.lastCall(), out, errOut)
	}
	f = &fake{giScheds: []dbusapi.GPUInstanceScheduler{
		{GPUInstance: 3, Profile: "1g.24gb+gfx", Start: 0, Size: 3, LastGPUInstance: 3, GPUSchedulerState: dbusapi.GPUSchedulerState{Mode: "adaptive"}},
		{GPUInstance: -1, Profile: "1g.24gb+gfx", Start: 3, Size: 3, LastGPUInstance: 5, GPUSchedulerState: dbusapi.GPUSchedulerState{Mode: "pinned", Policy: "equal_share", Pending: true}},
	}}
	out, _, code = runFake(f, "gpu", "show", "0000:41:00.0")
	if want := "GPU instance 5, 1g.24gb+gfx at 3 (gone; --gpu-instance 5 --clear drops its pin) scheduler: pinned: equal_share (the driver's time slice), pending"; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("gpu show: exit %d, out %q; want %q", code, out, want)
	}
}
