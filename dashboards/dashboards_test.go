package dashboards_test

import (
	"os"
	"os/exec"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/dashboards"
	"github.com/vgpud/vgpud/pkg/metrics"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record string `json:"record"`
			Alert  string `json:"alert"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

func rules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

// TestQueriesUseExportedMetrics: every panel query and every rule uses
// only metrics vgpud exports or the rules record.
func TestQueriesUseExportedMetrics(t *testing.T) {
	known := map[string]bool{}
	for _, n := range metrics.FamilyNames() {
		known[n] = true
	}
	rf := rules(t)
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	used := map[string]bool{}
	check := func(where, expr string) {
		refs := dashboards.Metrics(expr)
		if len(refs) == 0 {
			t.Errorf("%s: %q uses no vgpud metric", where, expr)
		}
		for _, m := range refs {
			used[m] = true
			if !known[m] {
				t.Errorf("%s: %q uses %s, which vgpud does not export", where, expr, m)
			}
		}
	}
	for _, d := range dashboards.All() {
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				check(d.File+": "+p.Title, tg.Expr)
			}
		}
		for _, v := range d.Vars {
			check(d.File+": variable "+v.Name, v.Query)
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			check("rules.yml: "+r.Record+r.Alert, r.Expr)
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" && !used[r.Record] {
				t.Logf("recording rule %s is not on a dashboard", r.Record)
			}
		}
	}
}

func TestPromtool(t *testing.T) {
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Skip("skipping: promtool is not installed (Debian package prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		out, err := exec.Command("promtool", args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
