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
