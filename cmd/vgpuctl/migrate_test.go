package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/dbusapi"
)

// migrate's subcommands make one call each on the host --connect names:
// source prints the metadata as the daemon wrote them (whatever -o), which
// prepare reads back from a file; the others name their operation; a
// refusal keeps its exit code.
func TestMigrateCommands(t *testing.T) {
	f := &fake{}
	out, errOut, code := runFake(f, "-o", "json", "migrate", "source", migID)
	if code != 0 || out != `{"version":1,"instance":"`+migID+`"}`+"\n" {
		t.Fatalf("migrate source: exit %d, %q %s", code, out, errOut)
	}
	file := filepath.Join(t.TempDir(), "md.json")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runFake(f, "migrate", "prepare", file, "--vm", "web1", "--tenant", "acme")
	if code != 0 || !strings.Contains(out, "the VM names 0000:81:00.4 here; the driver moves it cold,hibernate,sleep,live") {
		t.Fatalf("migrate prepare: exit %d, %q %s", code, out, errOut)
	}
	if want := `PrepareIncoming {"version":1,"instance":"` + migID + `"} vm="web1" tenant="acme"`; f.lastCall() != want {
		t.Fatalf("prepare called %s, want %s", f.lastCall(), want)
	}
	for sub, call := range map[string]string{"commit": "CommitIncoming", "abort": "AbortIncoming", "complete": "CompleteOutgoing", "cancel": "CancelOutgoing"} {
		out, errOut, code := runFake(f, "migrate", sub, migID)
		if code != 0 || f.lastCall() != call+" "+migID || !strings.Contains(out, migID) {
			t.Errorf("migrate %s: exit %d, %q %s; called %s", sub, code, out, errOut, f.lastCall())
		}
	}
	f.fail = &dbusapi.Error{Name: dbusapi.NameConflict, Message: "no GPU of type L4-24GB on this host in service"}
	if _, errOut, code := runFake(f, "migrate", "prepare", file); code != exitConflict || !strings.Contains(errOut, "Conflict: no GPU of type") {
		t.Fatalf("refused prepare: exit %d, %s", code, errOut)
	}
	if _, _, code := runFake(&fake{}, "migrate", "prepare", filepath.Join(t.TempDir(), "none.json")); code != exitUsage {
		t.Fatalf("prepare from a missing file: exit %d, want usage", code)
	}
}

// migrate run drives both hosts in order (the fake answers for both); a
// step that fails before the source's definition is undefined gives back
// the destination's part and ends the source's, with the step's exit code.
func TestMigrateRun(t *testing.T) {
	f := &fake{}
	out, errOut, code := runFake(f, "migrate", "run", migID, "--to", "unix:path=/run/dst")
	if code != 0 || !strings.Contains(out, "to unix:path=/run/dst: its vGPU is 0000:81:00.4 there") {
		t.Fatalf("migrate run: exit %d, %q %s", code, out, errOut)
	}
	want := []string{"MigrationSource " + migID, `PrepareIncoming {"version":1,"instance":"` + migID + `"} vm="" tenant=""`,
		"OutgoingDomainXML " + migID + " 0000:81:00.4", "DefineIncomingDomain " + migID + " <domain><name>web1</name></domain>",
		"UndefineOutgoingDomain " + migID, "CommitIncoming " + migID, "CompleteOutgoing " + migID}
	if strings.Join(f.calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
	f = &fake{}
	if _, _, code := runFake(f, "migrate", "run", migID, "--to", "unix:path=/run/dst", "--keep-source"); code != 0 || strings.Contains(strings.Join(f.calls, " "), "UndefineOutgoingDomain") {
		t.Fatalf("--keep-source: exit %d, calls %v", code, f.calls)
	}
	for failing, tail := range map[string][]string{
		"PrepareIncoming":        {"PrepareIncoming", "CancelOutgoing"},
		"DefineIncomingDomain":   {"DefineIncomingDomain", "CancelOutgoing", "UndefineIncomingDomain", "AbortIncoming"},
		"UndefineOutgoingDomain": {"UndefineOutgoingDomain", "CancelOutgoing", "UndefineIncomingDomain", "AbortIncoming"},
	} {
		f := &fake{failCall: failing}
		_, errOut, code := runFake(f, "migrate", "run", migID, "--to", "unix:path=/run/dst")
		var got []string
		for _, c := range f.calls[len(f.calls)-len(tail):] {
			got = append(got, strings.Fields(c)[0])
		}
		if code != exitConflict || strings.Join(got, " ") != strings.Join(tail, " ") || !strings.Contains(errOut, failing+" refused") {
			t.Errorf("%s refused: exit %d, %s; calls end %v, want %v", failing, code, errOut, got, tail)
		}
	}
	// Once the VM left the source, a failed commit on the destination
	// still completes the source (libvirt has the VM there); the error
	// says how the destination's part is finished, with the step's name.
	f = &fake{failCall: "CommitIncoming"}
	if _, errOut, code := runFake(f, "migrate", "run", migID, "--to", "unix:path=/run/dst"); code != exitConflict ||
		f.lastCall() != "CompleteOutgoing "+migID ||
		!strings.Contains(errOut, "Conflict: the VM moved, but the destination did not record it (its next start does, or run `vgpuctl -c DESTINATION migrate commit "+migID+"`)") ||
		!strings.Contains(errOut, "CommitIncoming refused") {
		t.Errorf("CommitIncoming refused: exit %d, %s; last call %s", code, errOut, f.lastCall())
	}
	// Both failing: the error says how to finish each end.
	f = &fake{failCall: "CommitIncoming|CompleteOutgoing"}
	if _, errOut, code := runFake(f, "migrate", "run", migID, "--to", "unix:path=/run/dst"); code == 0 ||
		!strings.Contains(errOut, "run `vgpuctl migrate complete "+migID+"`") {
		t.Errorf("CommitIncoming and CompleteOutgoing refused: exit %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"migrate", "run", migID}, {"migrate", "run", migID, "--to", "unix:path=/run/dst", "--live"},
		{"migrate", "run", migID, "--to", "unix:path=/run/dst", "--dest-uri", "qemu+tls://dst/system"}} {
		f := &fake{}
		if _, _, code := runFake(f, args...); code != exitUsage || len(f.calls) != 0 {
			t.Errorf("%v: exit %d, calls %v; want usage and no call", args, code, f.calls)
		}
	}
}

// migrate run --live checks both ends' versions before anything is carved
// on the destination: a refusal there calls nothing else; otherwise the
// source's vgpud runs libvirt's migration to --dest-uri with the device
// the destination prepared, and a failed migration gives back the
// destination's instance.
func TestMigrateRunLive(t *testing.T) {
	live := []string{"migrate", "run", migID, "--to", "unix:path=/run/dst", "--live", "--dest-uri", "qemu+tls://dst/system", "--migrate-uri", "tcp://10.0.0.2:49152"}
	f := &fake{}
	if out, errOut, code := runFake(f, live...); code != 0 || !strings.Contains(out, "moved VM") {
		t.Fatalf("migrate run --live: exit %d, %q %s", code, out, errOut)
	}
	want := []string{"MigrationTarget ", "PrecheckOutgoingLive " + migID + " dst qemu 7.2.22", "MigrationSource " + migID,
		`PrepareIncoming {"version":1,"instance":"` + migID + `"} vm="" tenant=""`,
		"MigrateOutgoingLive " + migID + ` 0000:81:00.4 qemu+tls://dst/system "tcp://10.0.0.2:49152" dst keep=false`,
		"CommitIncoming " + migID, "CompleteOutgoing " + migID}
	if strings.Join(f.calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(f.calls, "\n"), strings.Join(want, "\n"))
	}
	f = &fake{failCall: "PrecheckOutgoingLive"}
	if _, errOut, code := runFake(f, live...); code != exitConflict || len(f.calls) != 2 || !strings.Contains(errOut, "PrecheckOutgoingLive refused") {
		t.Fatalf("refused precheck: exit %d, %s; calls %v (nothing after the precheck)", code, errOut, f.calls)
	}
	f = &fake{failCall: "MigrateOutgoingLive"}
	if _, _, code := runFake(f, live...); code != exitConflict || strings.Join(f.calls[len(f.calls)-2:], " ") != "AbortIncoming "+migID+" CancelOutgoing "+migID {
		t.Fatalf("failed migration: exit %d; calls %v", code, f.calls)
	}
}

// migrate run takes the VM's name for the instance attached to it.
func TestMigrateRunByVM(t *testing.T) {
	f := &fake{}
	if _, errOut, code := runFake(f, "migrate", "run", "a-virtual-machine-named-at-length", "--to", "unix:path=/run/dst"); code != 0 {
		t.Fatalf("migrate run VM: exit %d, %s", code, errOut)
	}
	if len(f.calls) < 2 || f.calls[1] != "MigrationSource 7d2e9f10-4b5a-4c6d-9e8f-0a1b2c3d4e5f" {
		t.Fatalf("calls %v: want the VM's instance moved", f.calls)
	}
	if _, _, code := runFake(&fake{}, "migrate", "run", "no-such-vm", "--to", "unix:path=/run/dst"); code != exitNotFound {
		t.Fatalf("migrate run of an unknown VM: exit %d, want NotFound", code)
	}
}
