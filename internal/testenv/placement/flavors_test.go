package placement_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/fleet"
)

// TestFlavorsMatchFleetDoc: every request docs/fleet.md shows asks for a
// profile of the flavor table, with the table's slices and framebuffer,
// and the shared classes are pkg/fleet's.
func TestFlavorsMatchFleetDoc(t *testing.T) {
	if tplacement.SliceClass != fleet.SliceClass || tplacement.FramebufferClass != fleet.FramebufferClass ||
		tplacement.GPUClass != fleet.GPUClass || tplacement.GPUUnits != fleet.GPUUnits {
		t.Fatalf("shared classes %s, %s, %s (%d); pkg/fleet names them %s, %s, %s (%d)",
			tplacement.SliceClass, tplacement.FramebufferClass, tplacement.GPUClass, tplacement.GPUUnits,
			fleet.SliceClass, fleet.FramebufferClass, fleet.GPUClass, fleet.GPUUnits)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "fleet.md"))
	if err != nil {
		t.Fatal(err)
	}
	problems, n := checkFlavorDoc(string(doc), tplacement.ProfileFlavors, fleet.ClassName)
	if n < 5 {
		t.Fatalf("found %d requests in docs/fleet.md; is the parse right?", n)
	}
	for _, p := range problems {
		t.Error(p)
	}
	for _, p := range tplacement.ChurnProfiles {
		_ = tplacement.FlavorOf(p) // panics on a profile the table lacks
	}
}

// TestFlavorDocCheckCatches: the check finds a class the table lacks and
// amounts that differ from it.
func TestFlavorDocCheckCatches(t *testing.T) {
	doc := "Ask `resources1=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:3`\n" +
		"```\nopenstack flavor set x \\\n  --property resources1:CUSTOM_VGPUD_L4_4Q=1 \\\n  --property resources1:CUSTOM_VGPUD_VGPU_FB_MIB=2048\n```\n" +
		"or `resources1:CUSTOM_VGPUD_NOPE=1`, and `resources1:CUSTOM_VGPUD_PASSTHROUGH=1` is right.\n"
	problems, n := checkFlavorDoc(doc, tplacement.ProfileFlavors, fleet.ClassName)
	got := strings.Join(problems, "\n")
	for _, want := range []string{
		"3g.40gb with 3 of CUSTOM_VGPUD_MIG_SLICE; the flavor table says 4",
		"L4-4Q with 2048 of CUSTOM_VGPUD_VGPU_FB_MIB; the flavor table says 4096",
		"CUSTOM_VGPUD_NOPE, which no profile of the flavor table has",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("check missed %q; it said:\n%s", want, got)
		}
	}
	if n != 4 || strings.Contains(got, "PASSTHROUGH") {
		t.Errorf("check read %d requests (want 4) or blamed the right one:\n%s", n, got)
	}
}

var (
	fenced = regexp.MustCompile("(?ms)^[ \t]*```[^\n]*\n(.*?)^[ \t]*```")
	inline = regexp.MustCompile("`([^`\n]+)`")
	// query: resources1=A:1,B:4; property: resources1:A=1.
	query    = regexp.MustCompile(`\bresources\d*=((?:[A-Z0-9_]+:\d+,?)+)`)
	property = regexp.MustCompile(`\bresources\d*:([A-Z0-9_]+)=(\d+)`)
)

// checkFlavorDoc reads each code block and code span of doc as one request
// and compares the vgpud classes it asks for with the table.
func checkFlavorDoc(doc string, table []tplacement.ProfileFlavor, class tplacement.ClassNamer) (problems []string, requests int) {
	var chunks []string
	for _, m := range fenced.FindAllStringSubmatch(doc, -1) {
		chunks = append(chunks, m[1])
	}
	for _, m := range inline.FindAllStringSubmatch(fenced.ReplaceAllString(doc, ""), -1) {
		chunks = append(chunks, m[1])
	}
	byClass := map[string]tplacement.ProfileFlavor{}
	for _, f := range table {
		byClass[class(f.Kind, f.Profile)] = f
	}
	for _, c := range chunks {
		asked := map[string]int{}
		for _, m := range query.FindAllStringSubmatch(c, -1) {
			for _, kv := range strings.Split(strings.TrimSuffix(m[1], ","), ",") {
				k, v, _ := strings.Cut(kv, ":")
				asked[k], _ = strconv.Atoi(v)
			}
		}
		for _, m := range property.FindAllStringSubmatch(c, -1) {
			asked[m[1]], _ = strconv.Atoi(m[2])
		}
		var profiles []tplacement.ProfileFlavor
		for k := range asked {
			if !strings.HasPrefix(k, "CUSTOM_VGPUD_") || k == tplacement.SliceClass || k == tplacement.FramebufferClass || k == tplacement.GPUClass {
				continue
			}
			f, ok := byClass[k]
			if !ok {
				problems = append(problems, "docs/fleet.md asks for "+k+", which no profile of the flavor table has: add the profile to ProfileFlavors (internal/testenv/placement/flavors.go)")
				continue
			}
			profiles = append(profiles, f)
		}
		if len(asked) > 0 {
			requests++
		}
		if len(profiles) != 1 {
			continue // several profiles in one span: their amounts are not one request's
		}
		f := profiles[0]
		for _, shared := range []struct {
			class string
			want  int
		}{{tplacement.SliceClass, f.Slices}, {tplacement.FramebufferClass, f.FramebufferMiB}, {tplacement.GPUClass, f.GPU}} {
			if got, ok := asked[shared.class]; ok && got != shared.want {
				problems = append(problems, "docs/fleet.md asks for "+f.Profile+" with "+strconv.Itoa(got)+" of "+shared.class+
					"; the flavor table says "+strconv.Itoa(shared.want)+": correct one of them")
			}
		}
	}
	return problems, requests
}
