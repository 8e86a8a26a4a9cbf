package container

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDBusActivation: with the unit stopped, a vgpuctl call on the
// container's system bus starts it: dbus-daemon asks systemd for the
// activation file's SystemdService=, dbus-dev.vgpud1.service, the alias
// the enabled unit has.
func TestDBusActivation(t *testing.T) {
	must(t, "systemctl stop vgpud.service")
	if s := prop(t, "ActiveState"); s != "inactive" {
		t.Fatalf("vgpud is %s after stop", s)
	}
	if out := mustCtl(t, "gpus"); !strings.Contains(out, "GPU") {
		t.Fatalf("vgpuctl gpus through activation:\n%s", out)
	}
	if s := prop(t, "ActiveState"); s != "active" {
		t.Fatalf("vgpuctl answered but vgpud is %s", s)
	}
	if j := must(t, "journalctl -u dbus.service --no-pager -q -o cat"); !strings.Contains(j, "unit='dbus-dev.vgpud1.service'") {
		t.Errorf("the bus did not activate vgpud through dbus-dev.vgpud1.service:\n%s", j)
	}
}

// TestDBusActivationFollowsEnable: Alias=dbus-dev.vgpud1.service exists
// only while vgpud is enabled, so a disabled vgpud is not started by a
// client; enabling it again brings activation back.
func TestDBusActivationFollowsEnable(t *testing.T) {
	t.Cleanup(func() { must(t, "systemctl enable vgpud.service && systemctl start vgpud.service") })
	if l := must(t, "readlink /etc/systemd/system/dbus-dev.vgpud1.service"); !strings.HasSuffix(strings.TrimSpace(l), "/vgpud.service") {
		t.Fatalf("the enabled unit's alias points at %q", l)
	}
	must(t, "systemctl disable --now vgpud.service")
	r := ctl("", "gpus")
	if r.err == nil {
		t.Fatalf("vgpuctl gpus answered with vgpud disabled:\n%s", r.out)
	}
	if !strings.Contains(r.out, "Unavailable") || !strings.Contains(r.out, "systemctl enable") {
		t.Errorf("with vgpud disabled vgpuctl should say it is unavailable and how to enable it:\n%s", r.out)
	}
	if s := prop(t, "ActiveState"); s != "inactive" {
		t.Fatalf("a disabled vgpud was activated: %s", s)
	}
	t.Logf("with vgpud disabled: %s", strings.TrimSpace(r.out))
	must(t, "systemctl enable vgpud.service")
	mustCtl(t, "gpus")
	if s := prop(t, "ActiveState"); s != "active" {
		t.Fatalf("re-enabled vgpud was not activated: %s", s)
	}
}

// TestPolkit: the real polkitd with the shipped action file and the docs'
// example rule: root changes state; a member of group vgpud reads; a
// member of group vgpud-operators changes state through the rule; a plain
// user is refused with AccessDenied at once (vgpuctl allows interactive
// authorization, but no agent is there: the answer must not wait for one)
// and nothing changes.
func TestPolkit(t *testing.T) {
	startVgpud(t)
	ensureTenant(t, "ct-polkit")
	create(t, "1g.10gb", "ct-polkit") // root

	if r := ctl("ct-reader", "list"); r.err != nil {
		t.Errorf("a member of group vgpud cannot read: %v\n%s", r.err, r.out)
	}
	if r := ctl("ct-reader", "gpus"); r.err != nil {
		t.Errorf("a member of group vgpud cannot list GPUs: %v\n%s", r.err, r.out)
	}

	before := len(instances(t))
	if r := ctl("ct-operator", "create", "1g.10gb", "--tenant", "ct-polkit"); r.err != nil {
		t.Errorf("the rules.d example did not let group %s change state: %v\n%s", operatorGroup, r.err, r.out)
	} else if n := len(instances(t)); n != before+1 {
		t.Errorf("the operator's create answered but instances went %d -> %d", before, n)
	}

	snapshot := func() []string {
		var s []string
		for _, in := range instances(t) {
			s = append(s, in.UUID+" "+in.State)
		}
		slices.Sort(s)
		return s
	}
	was := snapshot()
	for _, args := range [][]string{
		{"create", "1g.10gb", "--tenant", "ct-polkit"},
		{"tenant", "define", "ct-plain", "--vram", "1GiB", "--compute", "1"},
		{"list"},
	} {
		r := ctl("ct-plain", args...)
		if r.err == nil || !strings.Contains(r.out, "AccessDenied") {
			t.Errorf("plain user: vgpuctl %v: want AccessDenied, got %v\n%s", args, r.err, r.out)
		}
		if r.took > 10*time.Second {
			t.Errorf("plain user: vgpuctl %v took %v (waiting for an authentication agent?)", args, r.took)
		}
	}
	if now := snapshot(); !slices.Equal(was, now) {
		t.Errorf("a refused caller changed the instances:\nbefore %v\nafter  %v", was, now)
	}
	for _, tn := range tenants(t) {
		if tn.Name == "ct-plain" {
			t.Error("a refused caller defined a tenant")
		}
	}
	if s := strings.TrimSpace(must(t, "systemctl is-active polkit.service || true")); s != "active" {
		t.Errorf("polkitd is %s: the checks did not go through it", s)
	}
}

// TestPolkitExampleInDocs: the rule the tests install is the one
// docs/operations.md gives.
func TestPolkitExampleInDocs(t *testing.T) {
	rule, err := os.ReadFile(filepath.Join(ct.repo, "systemd/vgpud-operators.rules.example"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(ct.repo, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rule), "\n") {
		if strings.HasPrefix(line, "//") || strings.TrimSpace(line) == "" {
			continue
		}
		if !strings.Contains(string(doc), line+"\n") {
			t.Errorf("docs/operations.md lacks the example rule's line %q", line)
		}
	}
}
