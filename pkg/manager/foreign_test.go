package manager_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sysfs"
	"github.com/vgpud/vgpud/pkg/manager"
)

// An mdev mdevctl defines is reported as foreign with mdevctl as its
// origin, a transient one without; vgpud removes neither, and both count
// against the GPU's capacity.
func TestForeignMdevFromMdevctl(t *testing.T) {
	e := newEnv(t, nil)
	g, err := e.m.GPU(sim.DefaultA10)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.VGPU.MdevParents) < 2 {
		t.Fatalf("A10 mdev parents: %+v", g.VGPU.MdevParents)
	}
	md, _ := e.cat.Model("A10-24GB")
	vt, ok := md.VGPUTypeByName("A10-12Q")
	if !ok {
		t.Fatal("no A10-12Q in the catalog")
	}
	typ := vt.ID
	fs := sysfs.New(e.sim.FS())
	const defined, transient = "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a01", "6f1d3b8c-0a52-4d6e-9b1a-3c2f5e7d9a02"
	for i, u := range []string{defined, transient} {
		if err := fs.CreateMdev(g.VGPU.MdevParents[i].PCI, typ, u); err != nil {
			t.Fatalf("create mdev %s: %v", u, err)
		}
	}
	if err := e.sim.MdevctlDefine(g.VGPU.MdevParents[0].PCI, defined, "nvidia-"+strconv.Itoa(typ), "auto"); err != nil {
		t.Fatal(err)
	}
	rep, err := e.m.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	origins := map[string]manager.Foreign{}
	for _, f := range rep.Foreign {
		origins[f.ID] = f
	}
	if f := origins[defined]; f.Kind != manager.ForeignMdev || f.Origin != manager.OriginMdevctl || !strings.Contains(f.Detail, "defined by mdevctl (start auto)") {
		t.Errorf("mdevctl's mdev reported as %+v", f)
	}
	if f := origins[transient]; f.Kind != manager.ForeignMdev || f.Origin != "" || strings.Contains(f.Detail, "mdevctl") {
		t.Errorf("transient mdev reported as %+v", f)
	}
	for _, u := range []string{defined, transient} {
		if _, err := fs.Mdev(u); err != nil {
			t.Errorf("mdev %s after reconcile: %v", u, err)
		}
	}
	// The A10 holds two A10-12Q at most: the two foreign ones fill it.
	e.tenant("acme", unlimited())
	if _, err := e.create("acme", "A10-12Q", sim.DefaultA10); err == nil {
		t.Error("created an A10-12Q beside two foreign ones")
	}
}
