package apply_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// A vgpud layout names compute-instance profiles: three 1c.3g.40gb go into
// one 3g.40gb GPU instance; fewer take one away and keep the GPU instance;
// a whole-GI 3g.40gb beside them is a GPU instance of its own.
func TestApplyComputeInstanceLayout(t *testing.T) {
	e := newEnv(t)
	doc := func(ci, whole int) *apply.Desired {
		t.Helper()
		y := `version: v1
tenants:
  - {name: acme, vram: unlimited, compute: unlimited}
layout:
  - gpu: "0000:41:00.0"
    mig: true
    instances:
      - {profile: 1c.3g.40gb, tenant: acme, count: ` + strconv.Itoa(ci) + `}
      - {profile: H100-SXM5-80GB/3g.40gb, tenant: acme, count: ` + strconv.Itoa(whole) + `}
`
		d, err := apply.Parse("ci.yaml", []byte(y), "")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	e.apply(doc(3, 1))
	want := []string{sim.DefaultH100MIG + " acme 1c.3g.40gb×3", sim.DefaultH100MIG + " acme 3g.40gb×1"}
	if got := e.layout(); !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v", got, want)
	}
	if s := e.summary(); strings.Count(s, "ci=3") != 1 || strings.Count(s, "ci=1") != 1 {
		t.Fatalf("want a GPU instance of three compute instances and one of one:\n%s", s)
	}
	e.apply(doc(2, 0))
	if s := e.summary(); strings.Count(s, "ci=2") != 1 || strings.Count(s, "gi") != 1 {
		t.Fatalf("after the smaller layout want one GPU instance of two:\n%s", s)
	}
}
