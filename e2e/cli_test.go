package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// decodeSchema decodes vgpuctl's JSON into T, one of the schema types
// below, refusing fields the schema does not have and requiring every
// field it has without omitempty (the documentation's "always present").
func decodeSchema[T any](t testing.TB, r ctlResult) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(r.out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("JSON does not match the schema of docs/vgpuctl.md (%v):\n%s", err, r.out)
	}
	var raw any
	if err := json.Unmarshal([]byte(r.out), &raw); err != nil {
		t.Fatal(err)
	}
	if missing := requireKeys(reflect.TypeOf(v), raw, "$"); len(missing) > 0 {
		t.Fatalf("JSON lacks fields docs/vgpuctl.md says are always present: %v\n%s", missing, r.out)
	}
	return v
}

// requireKeys lists the fields of the schema type t that the decoded JSON
// v lacks: those whose tag has no omitempty. A null is present.
func requireKeys(t reflect.Type, v any, path string) []string {
	if t.Kind() == reflect.Pointer {
		if v == nil {
			return nil
		}
		t = t.Elem()
	}
	var out []string
	switch {
	case t == reflect.TypeOf(time.Time{}):
	case t.Kind() == reflect.Slice:
		items, _ := v.([]any)
		for i, item := range items {
			out = append(out, requireKeys(t.Elem(), item, fmt.Sprintf("%s[%d]", path, i))...)
		}
	case t.Kind() == reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return []string{path + " (not an object)"}
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			val, ok := obj[name]
			if !ok {
				if opts != "omitempty" {
					out = append(out, path+"."+name)
				}
				continue
			}
			out = append(out, requireKeys(f.Type, val, path+"."+name)...)
		}
	}
	return out
}

// The JSON schema of docs/vgpuctl.md, written out here rather than taken
// from pkg/dbusapi's types, so that decodeSchema holds vgpuctl's output to
// the documentation and not to the structs that produced it.
type (
	docList[T any] struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Items      []T    `json:"items"`
	}
	docInstance struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Instance   schemaInstance `json:"instance"`
	}
	docGPU struct {
		APIVersion string    `json:"apiVersion"`
		Kind       string    `json:"kind"`
		GPU        schemaGPU `json:"gpu"`
	}
	docTenant struct {
		APIVersion string       `json:"apiVersion"`
		Kind       string       `json:"kind"`
		Tenant     schemaTenant `json:"tenant"`
	}
	docDefragment struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Defragment struct {
			Moves   []schemaMove `json:"moves"`
			GPU     string       `json:"gpu"`
			Start   int          `json:"start"`
			Applied bool         `json:"applied"`
		} `json:"defragment"`
	}

	schemaGPU struct {
		PCI          string `json:"pci"`
		UUID         string `json:"uuid"`
		Index        int    `json:"index"`
		Model        string `json:"model"`
		Product      string `json:"product"`
		MemoryBytes  uint64 `json:"memoryBytes"`
		NUMANode     int    `json:"numaNode"`
		KernelDriver string `json:"kernelDriver"`
		State        string `json:"state"`
		Reason       string `json:"reason,omitempty"`
		MIG          struct {
			Capable   bool `json:"capable"`
			Enabled   bool `json:"enabled"`
			Pending   bool `json:"pending"`
			Instances []struct {
				ID               int    `json:"id"`
				ProfileID        int    `json:"profileID"`
				Profile          string `json:"profile"`
				Start            int    `json:"start"`
				Size             int    `json:"size"`
				ComputeInstances int    `json:"computeInstances"`
			} `json:"instances"`
		} `json:"mig"`
		VGPU struct {
			Flavour       string `json:"flavour"`
			Heterogeneous bool   `json:"heterogeneous"`
			TotalVFs      int    `json:"totalVFs"`
			NumVFs        int    `json:"numVFs"`
		} `json:"vgpu"`
		Instances []string `json:"instances"`
		Errors    []string `json:"errors,omitempty"`
		Scheduler *struct {
			Mode        string `json:"mode"`
			Policy      string `json:"policy,omitempty"`
			TimesliceNs int64  `json:"timesliceNs,omitempty"`
			Pending     bool   `json:"pending,omitempty"`
		} `json:"scheduler,omitempty"`
		GPUInstanceSchedulers []struct {
			GPUInstance     int    `json:"gpuInstance"`
			LastGPUInstance int    `json:"lastGPUInstance"`
			Profile         string `json:"profile,omitempty"`
			Start           int    `json:"start"`
			Size            int    `json:"size"`
			Mode            string `json:"mode"`
			Policy          string `json:"policy,omitempty"`
			TimesliceNs     int64  `json:"timesliceNs,omitempty"`
			Pending         bool   `json:"pending,omitempty"`
		} `json:"gpuInstanceSchedulers,omitempty"`
	}

	schemaInstance struct {
		UUID    string `json:"uuid"`
		Tenant  string `json:"tenant"`
		Kind    string `json:"kind"`
		Profile string `json:"profile"`
		Model   string `json:"model"`
		GPU     string `json:"gpu"`
		GPUUUID string `json:"gpuUUID"`
		MIG     *struct {
			GPUInstanceProfileID int `json:"gpuInstanceProfileID"`
			Start                int `json:"start"`
			Size                 int `json:"size"`
			GPUInstanceID        int `json:"gpuInstanceID"`
			ComputeInstanceID    int `json:"computeInstanceID"`
			// The compute instance inside its GPU instance.
			ComputeInstanceProfileID int `json:"computeInstanceProfileID"`
			ComputeInstanceStart     int `json:"computeInstanceStart"`
			ComputeInstanceSlices    int `json:"computeInstanceSlices"`
		} `json:"mig,omitempty"`
		VGPU *struct {
			TypeID     int    `json:"typeID"`
			Type       string `json:"type"`
			Flow       string `json:"flow"`
			VF         string `json:"vf,omitempty"`
			MdevUUID   string `json:"mdevUUID,omitempty"`
			MdevParent string `json:"mdevParent,omitempty"`
		} `json:"vgpu,omitempty"`
		VRAMBytes    uint64    `json:"vramBytes"`
		ComputeMilli uint64    `json:"computeMilli"`
		State        string    `json:"state"`
		Reason       string    `json:"reason,omitempty"`
		Created      time.Time `json:"created"`
		Updated      time.Time `json:"updated"`
		Attachment   *struct {
			VM     string    `json:"vm"`
			VMUUID string    `json:"vmUUID"`
			URI    string    `json:"uri"`
			Live   bool      `json:"live"`
			Since  time.Time `json:"since"`
		} `json:"attachment"`
	}

	schemaTenant struct {
		Name  string `json:"name"`
		Class string `json:"class"`
		// A null quota is unlimited, as dbusapi.Limit reads it.
		Quota struct {
			VRAMBytes    dbusapi.Limit `json:"vramBytes"`
			ComputeMilli dbusapi.Limit `json:"computeMilli"`
			MaxInstances dbusapi.Limit `json:"maxInstances"`
		} `json:"quota"`
		Usage struct {
			VRAMBytes    uint64 `json:"vramBytes"`
			ComputeMilli uint64 `json:"computeMilli"`
			Instances    uint64 `json:"instances"`
		} `json:"usage"`
		AllowedModels   []string  `json:"allowedModels"`
		AllowedProfiles []string  `json:"allowedProfiles"`
		Instances       []string  `json:"instances"`
		Created         time.Time `json:"created"`
	}

	schemaCapacity struct {
		Model   string `json:"model"`
		Profile string `json:"profile"`
		Kind    string `json:"kind"`
		Count   int    `json:"count"`
		GPUs    int    `json:"gpus"`
	}

	schemaMove struct {
		Instance  string `json:"instance"`
		Profile   string `json:"profile"`
		FromGPU   string `json:"fromGPU"`
		FromStart int    `json:"fromStart"`
		ToGPU     string `json:"toGPU"`
		ToStart   int    `json:"toStart"`
	}
)

func fits100(t testing.TB, what, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("%s: line of %d columns: %q", what, n, l)
		}
	}
}

// goldenE2E compares deterministic output of the simulated host with
// cmd/vgpuctl/testdata/e2e; VGPUD_UPDATE_GOLDEN=1 rewrites it.
func goldenE2E(t *testing.T, name, got string) {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "cmd", "vgpuctl", "testdata", "e2e", name)
	if os.Getenv("VGPUD_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (VGPUD_UPDATE_GOLDEN=1 writes it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from %s (the JSON schema is a stable API):\n--- want\n%s\n--- got\n%s", name, path, want, got)
	}
}

func TestCLIVerbs(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})

	ver := d.ctl(t, "version").must(t, "version")
	if !strings.Contains(ver.out, "vgpuctl ") || !strings.Contains(ver.out, "vgpud ") {
		t.Fatalf("version: %q", ver.out)
	}
	// --version is the client's line of `version`, without asking vgpud.
	if r := d.ctl(t, "--version").must(t, "--version"); !strings.HasPrefix(ver.out, r.out) || strings.Count(r.out, "\n") != 1 {
		t.Fatalf("--version %q; version printed %q", r.out, ver.out)
	}
	// Fresh host: the JSON of gpus, profiles and capacity is deterministic.
	gpus := d.ctl(t, "gpus", "-o", "json").must(t, "gpus")
	goldenE2E(t, "gpus.json", gpus.out)
	gl := decodeSchema[docList[schemaGPU]](t, gpus)
	if gl.Kind != "GPUList" || len(gl.Items) != 4 || gl.Items[0].PCI != sim.DefaultH100MIG {
		t.Fatalf("gpus: %+v", gl)
	}
	goldenE2E(t, "profiles-l4.json", d.ctl(t, "profiles", "--gpu", sim.DefaultL4, "-o", "json").must(t, "profiles").out)
	caps := d.ctl(t, "capacity", "-o", "json").must(t, "capacity")
	goldenE2E(t, "capacity.json", caps.out)
	free := func(model, profile string) int {
		for _, c := range decodeSchema[docList[schemaCapacity]](t, d.ctl(t, "capacity", "-o", "json").must(t, "capacity")).Items {
			if c.Model == model && c.Profile == profile {
				return c.Count
			}
		}
		return -1
	}
	if n := free("H100-SXM5-80GB", "3g.40gb"); n != 2 {
		t.Fatalf("capacity of 3g.40gb on a free H100 = %d, want 2", n)
	}
	for _, args := range [][]string{{"gpus"}, {"gpu", "show", sim.DefaultH100MIG}, {"profiles"}, {"capacity", "--all"}} {
		r := d.ctl(t, args...).must(t, strings.Join(args, " "))
		fits100(t, strings.Join(args, " "), r.out)
	}

	// Tenants.
	td := decodeSchema[docTenant](t, d.ctl(t, "tenant", "define", "acme", "--vram", "80GiB", "--compute", "2500m", "--max-instances", "4", "--class", "guaranteed", "-o", "json").must(t, "tenant define"))
	if td.Tenant.Quota.VRAMBytes != 80<<30 || td.Tenant.Quota.ComputeMilli != 2500 || td.Tenant.Quota.MaxInstances != 4 || td.Tenant.Class != "guaranteed" {
		t.Fatalf("tenant define: %+v", td.Tenant)
	}
	d.ctl(t, "tenant", "define", "beta", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define beta")
	if r := d.ctl(t, "tenant", "define", "acme", "--vram", "1GiB", "--compute", "1"); r.code != 8 || !strings.Contains(r.err, "Conflict") {
		t.Fatalf("redefine with other quota: exit %d %q", r.code, r.err)
	}
	tl := decodeSchema[docList[schemaTenant]](t, d.ctl(t, "tenant", "list", "-o", "json").must(t, "tenant list"))
	if len(tl.Items) != 2 || tl.Items[1].Quota.MaxInstances != dbusapi.Unlimited {
		t.Fatalf("tenant list: %+v", tl.Items)
	}

	// Plan, create, list.
	if r := d.ctl(t, "plan", "3g.40gb", "--tenant", "acme").must(t, "plan"); !strings.Contains(r.out, "fits on "+sim.DefaultH100MIG) {
		t.Fatalf("plan: %s", r.out)
	}
	mig := decodeSchema[docInstance](t, d.ctl(t, "create", "3g.40gb", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	if mig.Kind != "mig" || mig.GPU != sim.DefaultH100MIG || mig.State != "ready" || mig.Attachment != nil {
		t.Fatalf("create 3g.40gb: %+v", mig)
	}
	vf := decodeSchema[docInstance](t, d.ctl(t, "create", "--profile", "L4-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	md := decodeSchema[docInstance](t, d.ctl(t, "create", "A10-4Q", "--tenant", "beta", "-o", "json").must(t, "create")).Instance
	if free("H100-SXM5-80GB", "3g.40gb") != 1 {
		t.Fatal("capacity did not drop after a create")
	}
	il := decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "--tenant", "acme", "-o", "json").must(t, "list"))
	if len(il.Items) != 2 {
		t.Fatalf("list --tenant acme: %+v", il.Items)
	}
	r := d.ctl(t, "list").must(t, "list")
	fits100(t, "list", r.out)
	if !strings.Contains(r.out, mig.UUID[:8]) || !strings.Contains(r.out, "beta") {
		t.Fatalf("list table:\n%s", r.out)
	}
	if r := d.ctl(t, "show", vf.UUID[:8], "-o", "json").must(t, "show"); decodeSchema[docInstance](t, r).Instance.VGPU.Flow != "vfio" {
		t.Fatalf("show: %s", r.out)
	}
	if r := d.ctl(t, "tenant", "show", "acme").must(t, "tenant show"); !strings.Contains(r.out, "Instances:") || !strings.Contains(r.out, "2 of 4") {
		t.Fatalf("tenant show:\n%s", r.out)
	}
	fits100(t, "tenant list", d.ctl(t, "tenant", "list").must(t, "tenant list").out)
	// -o yaml is the -o json document as YAML.
	for _, args := range [][]string{{"tenant", "show", "acme"}, {"gpus"}, {"list"}} {
		js := d.ctl(t, append(args, "-o", "json")...).must(t, strings.Join(args, " ")+" -o json").out
		ym := d.ctl(t, append(args, "-o", "yaml")...).must(t, strings.Join(args, " ")+" -o yaml").out
		fromYAML, err := yaml.YAMLToJSON([]byte(ym))
		if err != nil {
			t.Fatalf("%v -o yaml is not YAML (%v):\n%s", args, err, ym)
		}
		var a, b any
		if json.Unmarshal([]byte(js), &a) != nil || json.Unmarshal(fromYAML, &b) != nil || !reflect.DeepEqual(a, b) {
			t.Errorf("%v: -o yaml is not the -o json document:\n--- json\n%s\n--- yaml\n%s", args, js, ym)
		}
	}

	// dumpxml: the hostdev of a VF and of an mdev; a plain MIG instance has none.
	if r := d.ctl(t, "dumpxml", vf.UUID).must(t, "dumpxml"); !strings.Contains(r.out, `<hostdev`) || !strings.Contains(r.out, `managed="no"`) {
		t.Fatalf("dumpxml VF:\n%s", r.out)
	}
	if r := d.ctl(t, "dumpxml", md.UUID).must(t, "dumpxml"); !strings.Contains(r.out, md.VGPU.MdevUUID) || !strings.Contains(r.out, `type="mdev"`) {
		t.Fatalf("dumpxml mdev:\n%s", r.out)
	}
	if r := d.ctl(t, "dumpxml", mig.UUID); r.code != 2 || !strings.Contains(r.err, "InvalidArgument") {
		t.Fatalf("dumpxml of a MIG instance: exit %d %q", r.code, r.err)
	}

	// Quota, capacity and the other named errors, with their exit codes.
	d.ctl(t, "tenant", "set-quota", "acme", "--max-instances", "3").must(t, "set-quota")
	d.ctl(t, "create", "1g.10gb", "--tenant", "acme").must(t, "third instance")
	errCases := []struct {
		args []string
		code int
		name string
	}{
		{[]string{"create", "1g.10gb", "--tenant", "acme"}, 6, "QuotaExceeded"},
		{[]string{"create", "7g.80gb", "--tenant", "beta", "--gpu", sim.DefaultH100MIG}, 5, "NoCapacity"},
		{[]string{"destroy", "9b2a6a3c-3a49-4c51-9d47-5d2a4b1f0c11"}, 4, "NotFound"},
		{[]string{"tenant", "show", "nope"}, 4, "NotFound"},
		{[]string{"create", "H100-9g.900gb", "--tenant", "beta"}, 2, "InvalidArgument"},
		{[]string{"tenant", "undefine", "acme"}, 7, "Busy"},
		{[]string{"attach", "vm1", vf.UUID}, 1, "BackendFailure"},
		{[]string{"create", "--tenant", "acme"}, 2, "give a profile"},
		{[]string{"list", "--frobnicate"}, 2, "unknown flag"},
	}
	for _, c := range errCases {
		r := d.ctl(t, c.args...)
		if r.code != c.code || !strings.Contains(r.err, c.name) {
			t.Errorf("vgpuctl %v: exit %d %q; want %d and %s", c.args, r.code, r.err, c.code, c.name)
		}
		if strings.Contains(r.err, "goroutine") || strings.Contains(r.err, "org.freedesktop") {
			t.Errorf("vgpuctl %v shows internals: %s", c.args, r.err)
		}
	}
	// MIG mode on a GPU whose change needs a reset (its VFs are enabled):
	// vgpud carries it through; and off again.
	d.ctl(t, "gpu", "mig", sim.DefaultH100TS, "on").must(t, "gpu mig on")
	d.ctl(t, "gpu", "mig", sim.DefaultH100TS, "off").must(t, "gpu mig off")
	// Heterogeneous vGPU mode of the time-sliced H100 (no vGPUs on it),
	// on and off again, as gpus shows it.
	heterogeneous := func() bool {
		for _, g := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
			if g.PCI == sim.DefaultH100TS {
				return g.VGPU.Heterogeneous
			}
		}
		t.Fatalf("gpus lacks %s", sim.DefaultH100TS)
		return false
	}
	for _, on := range []bool{true, false} {
		r := d.ctl(t, "gpu", "heterogeneous", sim.DefaultH100TS, onOffArg(on), "-o", "json").must(t, "gpu heterogeneous")
		if !strings.Contains(r.out, `"kind": "Result"`) || heterogeneous() != on {
			t.Fatalf("gpu heterogeneous %s: %s; gpus shows heterogeneous=%v", onOffArg(on), r.out, !on)
		}
	}

	// top shows entitled compute. The instance runs no workload: until the
	// share loop closes a window that covers it, achieved is unknown (null,
	// "-"); after, it is 0. Which one depends on when the window closes.
	r = d.ctl(t, "top", "-n", "1").must(t, "top")
	fits100(t, "top", r.out)
	if !strings.Contains(r.out, mig.UUID[:8]) || !strings.Contains(r.out, "0.428") {
		t.Fatalf("top:\n%s", r.out)
	}
	tj := d.ctl(t, "top", "-n", "1", "-o", "json").must(t, "top -o json")
	if !regexp.MustCompile(`"achievedMilli":(null|0)[,}]`).MatchString(tj.out) || !strings.Contains(tj.out, `"entitledMilli":428`) {
		t.Fatalf("top -o json: %s", tj.out)
	}

	// events follows signals.
	followEvents(t, d, func() { d.ctl(t, "destroy", md.UUID).must(t, "destroy") }, "InterfacesRemoved", "OperationFinished")

	// reconcile, defrag, declarative plan and apply.
	rep := d.ctl(t, "reconcile", "-o", "json").must(t, "reconcile")
	if !strings.Contains(rep.out, `"kind": "ReconcileReport"`) {
		t.Fatalf("reconcile: %s", rep.out)
	}
	layout := filepath.Join(t.TempDir(), "layout.yaml")
	os.WriteFile(layout, []byte("version: v1\ntenants:\n  - name: gamma\n    vram: 24GiB\n    compute: \"1\"\nlayout:\n  - gpu: \""+sim.DefaultA10+"\"\n    instances:\n      - {profile: A10-8Q, tenant: gamma, count: 1}\n"), 0o644)
	for _, args := range [][]string{{"plan", "-f", layout}, {"apply", "-f", layout, "--dry-run"}} {
		r := d.ctl(t, args...).must(t, strings.Join(args, " "))
		if !strings.Contains(r.out, "would change") || !strings.Contains(r.out, "A10-8Q") {
			t.Fatalf("%v:\n%s", args, r.out)
		}
	}
	if l := decodeSchema[docList[schemaTenant]](t, d.ctl(t, "tenant", "list", "-o", "json")); len(l.Items) != 2 {
		t.Fatal("a dry run changed the host")
	}
	r = d.ctl(t, "apply", "-f", layout).must(t, "apply")
	if !strings.Contains(r.out, "changed:") {
		t.Fatalf("apply:\n%s", r.out)
	}
	if g := decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "--tenant", "gamma", "-o", "json").must(t, "list gamma")); len(g.Items) != 1 || !strings.HasSuffix(g.Items[0].Profile, "A10-8Q") {
		t.Fatalf("after apply: %+v", g.Items)
	}
	if r := d.ctl(t, "apply", "-f", layout, "--dry-run").must(t, "apply again"); !strings.Contains(r.out, "no changes") {
		t.Fatalf("apply of a layout the host matches:\n%s", r.out)
	}

	// Shell completion scripts and names from the daemon.
	for _, sh := range []string{"bash", "zsh", "fish"} {
		if r := d.ctl(t, "completion", sh).must(t, "completion "+sh); len(r.out) < 1000 {
			t.Errorf("completion %s: %d bytes", sh, len(r.out))
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"__complete", "destroy", ""}, mig.UUID},
		{[]string{"__complete", "tenant", "show", ""}, "acme"},
		{[]string{"__complete", "profiles", "--gpu", "0000:8"}, sim.DefaultL4},
		{[]string{"__complete", "create", "--tenant", "acme", "--profile", "L4-"}, "L4-4Q"},
	} {
		if r := d.ctl(t, c.args...).must(t, "completion"); !strings.Contains(r.out, c.want) {
			t.Errorf("%v: %q lacks %q", c.args, r.out, c.want)
		}
	}

	// Tear down.
	d.ctl(t, "destroy", mig.UUID, vf.UUID[:8]).must(t, "destroy")
	d.ctl(t, "tenant", "undefine", "acme", "--force").must(t, "undefine --force")
	if l := decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "--tenant", "beta", "-o", "json").must(t, "list")); len(l.Items) != 0 {
		t.Fatalf("beta still holds %+v", l.Items)
	}

	// defrag: 1g.10gb instances left at slots 3 and 6 of the empty MIG H100
	// keep 3g.40gb (slots 0-3 or 4-7) out though 6 slices are free;
	// moving one of them makes room.
	for i := 0; i < 7; i++ {
		d.ctl(t, "create", "1g.10gb", "--tenant", "beta", "--gpu", sim.DefaultH100MIG).must(t, "create 1g.10gb")
	}
	for _, in := range decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "--tenant", "beta", "-o", "json").must(t, "list")).Items {
		if in.MIG != nil && in.MIG.Start != 3 && in.MIG.Start != 6 {
			d.ctl(t, "destroy", in.UUID).must(t, "destroy")
		}
	}
	if r := d.ctl(t, "create", "3g.40gb", "--tenant", "beta", "--gpu", sim.DefaultH100MIG); r.code != 5 {
		t.Fatalf("3g.40gb on a fragmented GPU: exit %d %s; want NoCapacity", r.code, r.err)
	}
	df := decodeSchema[docDefragment](t, d.ctl(t, "defrag", "3g.40gb", "--tenant", "beta", "--gpu", sim.DefaultH100MIG, "-o", "json").must(t, "defrag")).Defragment
	if df.Applied || len(df.Moves) == 0 || df.GPU != sim.DefaultH100MIG || df.Moves[0].FromGPU != sim.DefaultH100MIG {
		t.Fatalf("defrag: %+v", df)
	}
	r = d.ctl(t, "defrag", "3g.40gb", "--tenant", "beta", "--gpu", sim.DefaultH100MIG, "--apply").must(t, "defrag --apply")
	fits100(t, "defrag", r.out)
	if !strings.Contains(r.out, "moved ") || !strings.Contains(r.out, "3g.40gb then fits on "+sim.DefaultH100MIG) {
		t.Fatalf("defrag --apply:\n%s", r.out)
	}
	d.ctl(t, "create", "3g.40gb", "--tenant", "beta", "--gpu", sim.DefaultH100MIG).must(t, "create 3g.40gb after defrag --apply")
}

func onOffArg(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// TestCLIApplyNVIDIAFormats applies the NVIDIA sample files through
// vgpuctl and D-Bus: the format is found from the content, --select takes
// NAME@TENANT and NAME (the default tenant), the host reaches the layout,
// and applying again changes nothing.
func TestCLIApplyNVIDIAFormats(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	testdata := filepath.Join(root, "pkg", "apply", "testdata")
	// layout is the instances as "GPU tenant profile xN", sorted; profiles
	// without their model prefix (apply names them MODEL/PROFILE).
	layout := func() []string {
		count := map[string]int{}
		for _, in := range decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "-o", "json").must(t, "list")).Items {
			count[in.GPU+" "+in.Tenant+" "+in.Profile[strings.LastIndex(in.Profile, "/")+1:]]++
		}
		var out []string
		for k, n := range count {
			out = append(out, fmt.Sprintf("%s x%d", k, n))
		}
		sort.Strings(out)
		return out
	}
	// perGPU is what gpus reports: each GPU's instance count and MIG GPU
	// instances by profile.
	perGPU := func() map[string]string {
		out := map[string]string{}
		for _, g := range decodeSchema[docList[schemaGPU]](t, d.ctl(t, "gpus", "-o", "json").must(t, "gpus")).Items {
			var gis []string
			for _, gi := range g.MIG.Instances {
				gis = append(gis, gi.Profile)
			}
			sort.Strings(gis)
			out[g.PCI] = fmt.Sprintf("%d %v", len(g.Instances), gis)
		}
		return out
	}
	migLayout := []string{sim.DefaultH100MIG + " acme 1g.10gb x2", sim.DefaultH100MIG + " acme 2g.20gb x1", sim.DefaultH100MIG + " acme 3g.40gb x1"}
	steps := []struct {
		file, sel string
		layout    []string
		gpus      map[string]string
	}{
		{"mig-parted.yaml", "gpu0-balanced@acme", migLayout,
			map[string]string{sim.DefaultH100MIG: "4 [1g.10gb 1g.10gb 2g.20gb 3g.40gb]", sim.DefaultH100TS: "0 []", sim.DefaultL4: "0 []", sim.DefaultA10: "0 []"}},
		// MIG instances are outside vgpu-device-manager's scope: they stay.
		{"vgpu-device-manager.yaml", "mixed", append(slices.Clone(migLayout),
			sim.DefaultH100TS+" default H100XM-20C x4", sim.DefaultL4+" default L4-4Q x2", sim.DefaultA10+" default A10-8Q x3"),
			map[string]string{sim.DefaultH100MIG: "4 [1g.10gb 1g.10gb 2g.20gb 3g.40gb]", sim.DefaultH100TS: "4 []", sim.DefaultL4: "2 []", sim.DefaultA10: "3 []"}},
	}
	for _, s := range steps {
		args := []string{"apply", "-f", filepath.Join(testdata, s.file), "--select", s.sel}
		if r := d.ctl(t, args...).must(t, "apply "+s.file); !strings.Contains(r.out, "changed:") {
			t.Fatalf("apply %s --select %s:\n%s", s.file, s.sel, r.out)
		}
		if got := layout(); !slices.Equal(got, s.layout) {
			t.Fatalf("after %s --select %s: list shows %v, want %v", s.file, s.sel, got, s.layout)
		}
		if got := perGPU(); !maps.Equal(got, s.gpus) {
			t.Fatalf("after %s --select %s: gpus shows %v, want %v", s.file, s.sel, got, s.gpus)
		}
		// The host matches now: a dry run and a second apply change nothing.
		if r := d.ctl(t, append(args, "--dry-run")...).must(t, "apply --dry-run again"); !strings.Contains(r.out, "no changes: the host already matches "+s.file) {
			t.Fatalf("dry run of %s --select %s on a host that matches:\n%s", s.file, s.sel, r.out)
		}
		if r := d.ctl(t, args...).must(t, "apply again"); r.out != "no changes: the host already matches "+s.file+"\n" {
			t.Fatalf("apply of %s --select %s again:\n%s", s.file, s.sel, r.out)
		}
		if got := layout(); !slices.Equal(got, s.layout) {
			t.Fatalf("the second apply of %s changed the host: %v", s.file, got)
		}
	}
}

// events runs `vgpuctl events`, waits until it follows, does act, and
// expects each of the signals in order.
func followEvents(t *testing.T, d *busDaemon, act func(), want ...string) {
	t.Helper()
	cmd := exec.Command(vgpuctlBin, "--connect", d.bus.Address(), "events", "--count", "20")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(20 * time.Second)
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("vgpuctl events ended: %s", errb.String())
			}
			return l
		case <-timeout:
			t.Fatalf("vgpuctl events: still waiting for %v", want)
		}
		return ""
	}
	if l := next(); !strings.HasPrefix(l, "# following") {
		t.Fatalf("vgpuctl events started with %q", l)
	}
	act()
	for _, w := range want {
		for {
			l := next()
			fits100(t, "events", l)
			if strings.Contains(l, " "+w+" ") {
				break
			}
		}
	}
}

// TestCLIConcurrentCreates runs 64 vgpuctl clients at once against a
// tenant allowed 10 instances: exactly 10 get one, the others are refused
// with QuotaExceeded (exit 6); admission is atomic across callers.
func TestCLIConcurrentCreates(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited", "--max-instances", "10").must(t, "tenant define")
	var wg sync.WaitGroup
	codes := make([]int, 64)
	errs := make([]string, 64)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := d.ctl(t, "create", "A10-1Q", "--tenant", "acme")
			codes[i], errs[i] = r.code, r.err
		}()
	}
	wg.Wait()
	count := map[int]int{}
	for i, c := range codes {
		count[c]++
		if c != 0 && c != 6 {
			t.Errorf("client %d: exit %d %s", i, c, errs[i])
		}
	}
	if count[0] != 10 || count[6] != 54 {
		t.Fatalf("exit codes %v, want 10 successes and 54 QuotaExceeded", count)
	}
	if l := decodeSchema[docList[schemaInstance]](t, d.ctl(t, "list", "-o", "json").must(t, "list")); len(l.Items) != 10 {
		t.Fatalf("%d instances, want 10", len(l.Items))
	}
}

// TestCLIAttachVerbs runs attach, detach and attach --profile against a
// real libvirtd and QEMU.
func TestCLIAttachVerbs(t *testing.T) {
	lv := libvirtd.Start(t)
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{libvirtSocket: lv.Socket()})
	vm := lv.DefineDomain(t, "vgpud-e2e-cli")
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	in := decodeSchema[docInstance](t, d.ctl(t, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance

	att := decodeSchema[docInstance](t, d.ctl(t, "attach", vm.Name, in.UUID, "-o", "json").must(t, "attach")).Instance
	if att.Attachment == nil || att.Attachment.VM != vm.Name || att.Attachment.VMUUID != vm.UUID || att.Attachment.Live {
		t.Fatalf("attach: %+v", att.Attachment)
	}
	if x := lv.Virsh(t, "dumpxml", "--inactive", vm.Name); !strings.Contains(x, in.VGPU.MdevUUID) {
		t.Fatalf("the domain's config lacks the mdev:\n%s", x)
	}
	d.ctl(t, "attach", vm.Name, in.UUID).must(t, "attach again (no-op)")
	if r := d.ctl(t, "list").must(t, "list"); !strings.Contains(r.out, vm.Name) {
		t.Fatalf("list does not show the VM:\n%s", r.out)
	}
	if r := d.ctl(t, "detach", "some-other-vm", in.UUID); r.code != 8 {
		t.Fatalf("detach naming the wrong VM: exit %d %s", r.code, r.err)
	}
	d.ctl(t, "detach", vm.Name, in.UUID).must(t, "detach")
	if x := lv.Virsh(t, "dumpxml", "--inactive", vm.Name); strings.Contains(x, in.VGPU.MdevUUID) {
		t.Fatalf("the mdev is still in the config after detach:\n%s", x)
	}
	if r := d.ctl(t, "attach", "no-such-vm", in.UUID); r.code != 4 || !strings.Contains(r.err, "NotFound") {
		t.Fatalf("attach to a missing VM: exit %d %q", r.code, r.err)
	}
	// Create and attach in one step; destroy --detach takes it out again.
	na := decodeSchema[docInstance](t, d.ctl(t, "attach", vm.Name, "--profile", "A10-4Q", "--tenant", "acme", "-o", "json").must(t, "attach --profile")).Instance
	if na.Attachment == nil || na.Attachment.VM != vm.Name {
		t.Fatalf("attach --profile: %+v", na)
	}
	if r := d.ctl(t, "destroy", na.UUID); r.code != 7 {
		t.Fatalf("destroy of an attached instance: exit %d %s", r.code, r.err)
	}
	d.ctl(t, "destroy", "--detach", na.UUID).must(t, "destroy --detach")
	if x := lv.Virsh(t, "dumpxml", "--inactive", vm.Name); strings.Contains(x, "<hostdev") {
		t.Fatalf("hostdevs left in the config:\n%s", x)
	}
}

// BenchmarkCLI64Clients is one batch of 64 concurrent `vgpuctl list`
// processes per iteration.
func BenchmarkCLI64Clients(b *testing.B) {
	bus := testbus.Start(b)
	d := startBusDaemon(b, bus, busDaemonOpts{})
	d.ctl(b, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(b, "tenant define")
	for _, p := range []string{"3g.40gb", "L4-4Q", "A10-4Q", "1g.10gb"} {
		d.ctl(b, "create", p, "--tenant", "acme").must(b, "create")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		var failed sync.Once
		for j := 0; j < 64; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if r := d.ctl(b, "list", "-o", "json"); r.code != 0 {
					failed.Do(func() { b.Errorf("vgpuctl list: exit %d %s", r.code, r.err) })
				}
			}()
		}
		wg.Wait()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/64, "ms/client")
}

// BenchmarkCLIAttachVsVirsh times `vgpuctl attach VM INSTANCE` of an
// existing instance against `virsh attach-device --config` of the same
// hostdev XML on the same libvirtd, alternating, each followed by an
// untimed detach. vgpuctl/virsh is the ratio of their medians (goal <= 1.3).
func BenchmarkCLIAttachVsVirsh(b *testing.B) {
	if _, err := exec.LookPath("virsh"); err != nil {
		b.Skip("skipping: virsh is not installed (libvirt-clients)")
	}
	lv := libvirtd.Start(b)
	bus := testbus.Start(b)
	d := startBusDaemon(b, bus, busDaemonOpts{libvirtSocket: lv.Socket()})
	vm := lv.DefineDomain(b, "vgpud-e2e-bench-cli")
	d.ctl(b, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(b, "tenant define")
	in := decodeSchema[docInstance](b, d.ctl(b, "create", "A10-4Q", "--tenant", "acme", "-o", "json").must(b, "create")).Instance
	xml := d.ctl(b, "dumpxml", in.UUID).must(b, "dumpxml").out
	f := filepath.Join(b.TempDir(), "hostdev.xml")
	if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
		b.Fatal(err)
	}
	var ours, theirs []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		d.ctl(b, "attach", vm.Name, in.UUID).must(b, "attach")
		ours = append(ours, time.Since(start))
		b.StopTimer()
		d.ctl(b, "detach", in.UUID).must(b, "detach")
		b.StartTimer()
		start = time.Now()
		if out, err := lv.VirshErr("attach-device", vm.Name, f, "--config"); err != nil {
			b.Fatalf("virsh attach-device: %v\n%s", err, out)
		}
		theirs = append(theirs, time.Since(start))
		b.StopTimer()
		if out, err := lv.VirshErr("detach-device", vm.Name, f, "--config"); err != nil {
			b.Fatalf("virsh detach-device: %v\n%s", err, out)
		}
		b.StartTimer()
	}
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	mo, mt := med(ours), med(theirs)
	b.ReportMetric(float64(mo.Microseconds())/1000, "ms-vgpuctl")
	b.ReportMetric(float64(mt.Microseconds())/1000, "ms-virsh")
	b.ReportMetric(float64(mo)/float64(mt), "vgpuctl/virsh")
	b.Logf("median attach: vgpuctl %v, virsh %v, ratio %.2f (goal <= 1.3)", mo, mt, float64(mo)/float64(mt))
}
