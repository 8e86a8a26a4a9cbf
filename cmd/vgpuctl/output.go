package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// header starts every JSON and YAML document: which schema, which kind.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

func hdr(kind string) header { return header{APIVersion: dbusapi.APIVersion, Kind: kind} }

// list is a list document: {"apiVersion", "kind": "<Kind>List", "items": [...]}.
type list[T any] struct {
	header
	Items []T `json:"items"`
}

func newList[T any](kind string, items []T) list[T] {
	if items == nil {
		items = []T{}
	}
	return list[T]{header: hdr(kind + "List"), Items: items}
}

// Single-object documents: the object under a key named after its kind,
// beside apiVersion and kind (flattening would clash with the objects' own
// "kind" fields).
type (
	gpuDoc struct {
		header
		GPU dbusapi.GPU `json:"gpu"`
	}
	instanceDoc struct {
		header
		Instance dbusapi.Instance `json:"instance"`
	}
	tenantDoc struct {
		header
		Tenant dbusapi.Tenant `json:"tenant"`
	}
	planDoc struct {
		header
		Plan dbusapi.Plan `json:"plan"`
	}
	applyDoc struct {
		header
		Apply dbusapi.ApplyResult `json:"apply"`
	}
	reconcileDoc struct {
		header
		Report dbusapi.ReconcileReport `json:"report"`
	}
	defragDoc struct {
		header
		Defragment dbusapi.DefragResult `json:"defragment"`
	}
	hostdevDoc struct {
		header
		Instance string `json:"instance"`
		XML      string `json:"xml"`
	}
	versionDoc struct {
		header
		Client string `json:"client"`
		// Daemon is empty when vgpud could not be asked; Error says why.
		Daemon string `json:"daemon,omitempty"`
		Error  string `json:"error,omitempty"`
	}
	resultDoc struct {
		header
		// Operation is what was done (destroy, detach, set-quota, ...) to ID.
		Operation string `json:"operation"`
		ID        string `json:"id"`
	}
	eventDoc struct {
		header
		Event dbusapi.Event `json:"event"`
	}
	topDoc struct {
		header
		Items []topRow `json:"items"`
	}
)

// emit writes v as JSON or YAML, or calls table for the table format.
func (a *app) emit(v any, table func(w io.Writer) error) error {
	switch a.output {
	case "json":
		enc := json.NewEncoder(a.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
		_, err = a.out.Write(b)
		return err
	}
	return table(a.out)
}

// col is a table column: a title and the widest a cell may be (0: no
// limit). The limits keep every table within 100 columns.
type col struct {
	title string
	max   int
}

// table writes rows under cols, cells cut to their column's width.
func table(w io.Writer, cols []col, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	titles := make([]string, len(cols))
	for i, c := range cols {
		titles[i] = c.title
	}
	fmt.Fprintln(tw, strings.Join(titles, "\t"))
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, cell := range r {
			if i < len(cols) {
				cell = clip(cell, cols[i].max)
			}
			cells[i] = cell
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// trunc is cols as they are when cut is set, else without width limits
// (--no-trunc).
func trunc(cols []col, cut bool) []col {
	if cut {
		return cols
	}
	out := make([]col, len(cols))
	for i, c := range cols {
		out[i] = col{title: c.title}
	}
	return out
}

// clip shortens s to n characters, marking the cut with "~".
func clip(s string, n int) string {
	if n <= 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "~"
}

// short is the first 8 characters of a UUID, which commands accept.
func short(id string, full bool) string {
	if full || len(id) < 8 {
		return id
	}
	return id[:8]
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func bytesOf(v uint64) string { return tenant.FormatBytes(v) }

// bytesColumn renders sizes for one table column in one unit: GiB (with
// up to 3 decimals, 9.75GiB) when every size is that exact, else MiB, else
// each as bytesOf does.
func bytesColumn(vs []uint64) []string {
	out := make([]string, len(vs))
	for _, u := range []struct {
		name string
		size float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}} {
		ok := true
		for i, v := range vs {
			s := strconv.FormatFloat(float64(v)/u.size, 'f', -1, 64)
			if dot := strings.IndexByte(s, '.'); dot >= 0 && len(s)-dot-1 > 3 {
				ok = false
				break
			}
			out[i] = s + u.name
		}
		if ok {
			return out
		}
	}
	for i, v := range vs {
		out[i] = bytesOf(v)
	}
	return out
}
func computeOf(v uint64) string { return tenant.FormatCompute(v) }

func limitBytes(l dbusapi.Limit) string   { return tenant.FormatBytes(uint64(l)) }
func limitCompute(l dbusapi.Limit) string { return tenant.FormatCompute(uint64(l)) }

func limitCount(l dbusapi.Limit) string {
	if l == dbusapi.Unlimited {
		return "unlimited"
	}
	return fmt.Sprint(uint64(l))
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
