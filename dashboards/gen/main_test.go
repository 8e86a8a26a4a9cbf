package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/dashboards"
)

// The committed JSON is what the generator writes (stale files fail), in
// Grafana's export form, with typed panels on the grid.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	for _, d := range dashboards.All() {
		want, err := render(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("..", d.File))
		if err != nil {
			t.Fatalf("%v (run go generate ./dashboards)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./dashboards", d.File)
		}
		var doc struct {
			UID           string `json:"uid"`
			SchemaVersion int    `json:"schemaVersion"`
			Inputs        []struct {
				Name, Type, PluginID string
			} `json:"__inputs"`
			Requires []struct{ Type, ID string } `json:"__requires"`
			Panels   []struct {
				ID      int    `json:"id"`
				Type    string `json:"type"`
				GridPos struct{ X, W int }
				Targets []struct {
					Expr       string `json:"expr"`
					Datasource struct{ UID string }
				} `json:"targets"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Name, Type, Regex string
					Current           struct{ Value string }
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(got, &doc); err != nil {
			t.Fatalf("%s: %v", d.File, err)
		}
		if doc.SchemaVersion < 41 {
			t.Errorf("%s: schemaVersion %d, want the SDK's current one", d.File, doc.SchemaVersion)
		}
		if len(doc.Inputs) != 1 || doc.Inputs[0].Name != dsInput || doc.Inputs[0].Type != "datasource" {
			t.Errorf("%s: __inputs %+v, want the Prometheus data source", d.File, doc.Inputs)
		}
		required := map[string]bool{}
		for _, r := range doc.Requires {
			required[r.Type+"/"+r.ID] = true
		}
		for _, r := range []string{"grafana/grafana", "datasource/prometheus"} {
			if !required[r] {
				t.Errorf("%s: __requires lacks %s", d.File, r)
			}
		}
		if len(doc.Templating.List) == 0 || doc.Templating.List[0].Type != "datasource" || doc.Templating.List[0].Current.Value != "${"+dsInput+"}" {
			t.Errorf("%s: the first variable is not the data source bound to the import input", d.File)
		}
		ids := map[int]bool{}
		for _, p := range doc.Panels {
			if ids[p.ID] || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("%s: panel %d duplicated or wider than the grid", d.File, p.ID)
			}
			ids[p.ID] = true
			if !required["panel/"+p.Type] {
				t.Errorf("%s: panel %d's type %q is not in __requires", d.File, p.ID, p.Type)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" || tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s: panel %d: a query without an expression or the data source variable", d.File, p.ID)
				}
			}
		}
	}
}

// The GPU variable shows each GPU's index, PCI bus id and model, and
// selects by UUID.
func TestGPUVariableShowsPCIAndModel(t *testing.T) {
	for _, d := range dashboards.All() {
		for _, v := range d.Vars {
			if v.Name != "gpu" {
				continue
			}
			for _, want := range []string{"pci_bus_id", "model", "vgpud_gpu_info"} {
				if !strings.Contains(v.Query, want) {
					t.Errorf("%s: $gpu's query %q does not show %s", d.File, v.Query, want)
				}
			}
			if !strings.Contains(v.Regex, "(?<value>") || !strings.Contains(v.Regex, "(?<text>") {
				t.Errorf("%s: $gpu's regex %q does not pick a value and a text", d.File, v.Regex)
			}
		}
	}
}

// Only the generator imports the SDK: the daemon and the CLI do not.
func TestDaemonDoesNotImportTheSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../../cmd/vgpud", "../../cmd/vgpuctl").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	if bytes.Contains(out, []byte("grafana-foundation-sdk")) {
		t.Error("cmd/vgpud or cmd/vgpuctl depends on the Grafana Foundation SDK")
	}
}
