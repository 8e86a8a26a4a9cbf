package dbusapi

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the generated reference in docs/dbus-api.md")

const (
	refBegin = "<!-- BEGIN GENERATED REFERENCE (go test ./pkg/dbusapi -update-docs) -->"
	refEnd   = "<!-- END GENERATED REFERENCE -->"
)

// reference renders every interface's methods, properties and signals
// from the declarations the service dispatches with.
func reference(s *Service) string {
	var b strings.Builder
	cell := func(s string) string { return strings.ReplaceAll(s, "|", "\\|") }
	for _, n := range []string{ManagerInterface, GPUInterface, InstanceInterface, TenantInterface} {
		d := s.ifaces[n]
		fmt.Fprintf(&b, "### %s\n\n%s\n\n", n, d.doc)
		fmt.Fprintf(&b, "| Method | Access | What it does |\n|---|---|---|\n")
		for _, m := range d.methods {
			var in, out []string
			for i, a := range m.in {
				in = append(in, m.sigIn(i)+" "+a.name)
			}
			for i, a := range m.out {
				out = append(out, m.sigOut(i)+" "+a.name)
			}
			sig := m.name + "(" + strings.Join(in, ", ") + ")"
			if len(out) > 0 {
				sig += " → (" + strings.Join(out, ", ") + ")"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", sig, m.accessDoc(), cell(m.doc))
		}
		fmt.Fprintf(&b, "\n| Property | Type | Meaning |\n|---|---|---|\n")
		for _, p := range d.props {
			access := ""
			if p.public {
				access = " (readable by anyone)"
			}
			fmt.Fprintf(&b, "| `%s` | `%s` | %s%s |\n", p.name, p.sig, cell(p.doc), access)
		}
		if len(d.signals) > 0 {
			fmt.Fprintf(&b, "\n| Signal | Meaning |\n|---|---|\n")
			for _, sg := range d.signals {
				var a []string
				for _, x := range sg.args {
					a = append(a, x.sig+" "+x.name)
				}
				fmt.Fprintf(&b, "| `%s(%s)` | %s |\n", sg.name, strings.Join(a, ", "), cell(sg.doc))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestDocsUpToDate keeps docs/dbus-api.md's reference in step with the API.
func TestDocsUpToDate(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "dbus-api.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i, j := strings.Index(text, refBegin), strings.Index(text, refEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the generated reference markers", path)
	}
	want := refBegin + "\n\n" + reference(newService(nil, Options{})) + refEnd
	got := text[i : j+len(refEnd)]
	if got == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(text[:i]+want+text[j+len(refEnd):]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s is out of date with the API: run go test ./pkg/dbusapi -run TestDocsUpToDate -update-docs", path)
}
