package e2e

import (
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/internal/testenv"
	tplacement "github.com/vgpud/vgpud/internal/testenv/placement"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/fleet"
	"github.com/vgpud/vgpud/pkg/placementapi"
)

// novaHost has every GPU kind a documented flavor asks for, several of
// them of one kind: two MIG H100s, a time-sliced H100, an L4 (mdev) and an
// RTX PRO 6000 in MIG mode (its vGPUs share GPU instances).
const novaHostSpec = `version: v1
gpus:
  - {model: H100-SXM5-80GB, pci: "0000:41:00.0", flavour: vfio, mig: true}
  - {model: H100-SXM5-80GB, pci: "0000:42:00.0", flavour: vfio, mig: true}
  - {model: H100-SXM5-80GB, pci: "0000:61:00.0", flavour: vfio}
  - {model: L4-24GB, pci: "0000:81:00.0", flavour: mdev}
  - {model: RTX-PRO-6000-BSE-96GB, pci: "0000:c1:00.0", flavour: vfio, mig: true}
`

// novaComputeSpec is the host whose GPU providers hang under a compute
// node's provider (parentUUID), as beside nova-compute.
const novaComputeSpec = `version: v1
gpus:
  - {model: H100-SXM5-80GB, pci: "0000:41:00.0", flavour: vfio, mig: true}
  - {model: L4-24GB, pci: "0000:81:00.0", flavour: mdev}
`

// flavorForm is one way docs/fleet.md tells an operator to write a flavor.
type flavorForm struct {
	name    string
	flavor  tplacement.Flavor
	profile string
	// query is what nova-scheduler must send (to_querystring, decoded).
	query string
	// split: the form puts its classes in the unnumbered group, which
	// Placement may satisfy from two GPUs of one tree; such a candidate is
	// refused by the host, so the form does not work on a host with
	// several GPUs that publish those classes.
	split bool
	// onlySplit: every candidate splits; none can be created.
	onlySplit bool
	// underCompute: the flavor is a real one (VCPU, MEMORY_MB, DISK_GB),
	// whose candidates exist only where the GPU providers hang under a
	// provider that has them.
	underCompute bool
}

func specs(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// flavorForms are the flavors docs/fleet.md shows (TestFleetNovaFlavors
// checks that each extra spec there is one of these), and a real flavor in
// both set-ups.
var flavorForms = []flavorForm{
	{name: "MIG profile, numbered, model trait", profile: "3g.40gb",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_MIG_3G_40GB", "1", "resources1:CUSTOM_VGPUD_MIG_SLICE", "4",
			"trait1:CUSTOM_VGPUD_MODEL_H100_SXM5_80GB", "required")},
		query: "limit=1000&required1=CUSTOM_VGPUD_MODEL_H100_SXM5_80GB&resources1=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"},
	{name: "MIG profile, unnumbered", profile: "3g.40gb", split: true,
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources:CUSTOM_VGPUD_MIG_3G_40GB", "1", "resources:CUSTOM_VGPUD_MIG_SLICE", "4")},
		query:  "limit=1000&resources=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"},
	{name: "time-sliced vGPU with its framebuffer, numbered", profile: "L4-4Q",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_L4_4Q", "1", "resources1:CUSTOM_VGPUD_VGPU_FB_MIB", "4096")},
		query:  "limit=1000&resources1=CUSTOM_VGPUD_L4_4Q:1,CUSTOM_VGPUD_VGPU_FB_MIB:4096"},
	{name: "time-sliced vGPU with its framebuffer, unnumbered", profile: "L4-4Q", split: true,
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources:CUSTOM_VGPUD_L4_4Q", "1", "resources:CUSTOM_VGPUD_VGPU_FB_MIB", "4096")},
		query:  "limit=1000&resources=CUSTOM_VGPUD_L4_4Q:1,CUSTOM_VGPUD_VGPU_FB_MIB:4096"},
	{name: "time-sliced vGPU, class alone", profile: "L4-4Q",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_L4_4Q", "1")},
		query:  "limit=1000&resources1=CUSTOM_VGPUD_L4_4Q:1"},
	{name: "MIG-backed vGPU with its slices", profile: "H100XM-3-40C",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_H100XM_3_40C", "1", "resources1:CUSTOM_VGPUD_MIG_SLICE", "4")},
		query:  "limit=1000&resources1=CUSTOM_VGPUD_H100XM_3_40C:1,CUSTOM_VGPUD_MIG_SLICE:4"},
	{name: "MIG-backed vGPU sharing its GPU instance, class alone", profile: "RTX Pro 6000 Blackwell DC-1-6Q",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_RTX_PRO_6000_BLACKWELL_DC_1_6Q", "1")},
		query:  "limit=1000&resources1=CUSTOM_VGPUD_RTX_PRO_6000_BLACKWELL_DC_1_6Q:1"},
	{name: "whole GPU, class alone", profile: "passthrough",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_PASSTHROUGH", "1")},
		query:  "limit=1000&resources1=CUSTOM_VGPUD_PASSTHROUGH:1"},
	{name: "whole GPU, model trait", profile: "passthrough",
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_PASSTHROUGH", "1", "trait1:CUSTOM_VGPUD_MODEL_L4_24GB", "required")},
		query:  "limit=1000&required1=CUSTOM_VGPUD_MODEL_L4_24GB&resources1=CUSTOM_VGPUD_PASSTHROUGH:1"},
	// Two numbered groups, one GPU each: one consumer on two GPUs, which
	// a vgpud instance (one GPU) cannot be; every candidate splits.
	{name: "two GPUs, isolate", profile: "3g.40gb", split: true, onlySplit: true,
		flavor: tplacement.Flavor{ExtraSpecs: specs("resources1:CUSTOM_VGPUD_MIG_3G_40GB", "1", "resources1:CUSTOM_VGPUD_MIG_SLICE", "4",
			"resources2:CUSTOM_VGPUD_MIG_3G_40GB", "1", "resources2:CUSTOM_VGPUD_MIG_SLICE", "4", "group_policy", "isolate")},
		query: "group_policy=isolate&limit=1000&resources1=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4&resources2=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"},
	// A real flavor: its VCPU, MEMORY_MB and DISK_GB go to the unnumbered
	// group, which only a compute node's provider satisfies.
	{name: "real flavor under nova-compute", profile: "3g.40gb", underCompute: true,
		flavor: tplacement.Flavor{VCPUs: 8, MemoryMB: 65536, RootGB: 40, ExtraSpecs: specs("resources1:CUSTOM_VGPUD_MIG_3G_40GB", "1",
			"resources1:CUSTOM_VGPUD_MIG_SLICE", "4", "group_policy", "none")},
		query: "group_policy=none&limit=1000&resources=DISK_GB:40,MEMORY_MB:65536,VCPU:8&resources1=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"},
	// The same flavor with its own resources zeroed, as a flavor for GPU
	// providers under their own root must be.
	{name: "real flavor, own root, zeroed", profile: "3g.40gb",
		flavor: tplacement.Flavor{VCPUs: 8, MemoryMB: 65536, RootGB: 40, ExtraSpecs: specs("resources1:CUSTOM_VGPUD_MIG_3G_40GB", "1",
			"resources1:CUSTOM_VGPUD_MIG_SLICE", "4", "resources:VCPU", "0", "resources:MEMORY_MB", "0", "resources:DISK_GB", "0")},
		query: "limit=1000&resources1=CUSTOM_VGPUD_MIG_3G_40GB:1,CUSTOM_VGPUD_MIG_SLICE:4"},
}

// tableForms are the flavor table's flavors (internal/testenv/placement,
// flavors.go: the GPU class beside each profile's class, slices and
// framebuffer) as Nova flavors, for the profiles docs/fleet.md lists.
func tableForms() []flavorForm {
	var out []flavorForm
	for _, p := range []string{"3g.40gb", "H100XM-3-40C", "RTX Pro 6000 Blackwell DC-1-6Q", "L4-4Q", "passthrough"} {
		specs := tplacement.FlavorOf(p).ExtraSpecs(fleet.ClassName, tplacement.WithFramebuffer)
		var asked []string
		for k, v := range specs {
			asked = append(asked, strings.TrimPrefix(k, "resources1:")+":"+v)
		}
		sort.Strings(asked)
		out = append(out, flavorForm{name: p + ", the flavor table's", profile: p, flavor: tplacement.Flavor{ExtraSpecs: specs},
			query: "limit=1000&resources1=" + strings.Join(asked, ",")})
	}
	return out
}

// docsExtraSpec is an extra spec as docs/fleet.md writes one
// (`resources1:CUSTOM_VGPUD_L4_4Q=1`, `resources:VCPU=0`,
// `group_policy=none`).
var docsExtraSpec = regexp.MustCompile(`\b((?:resources|trait)[0-9]*:[A-Z][A-Z0-9_]+|group_policy)=([A-Za-z0-9]+)`)

// TestFleetNovaFlavors: every flavor form docs/fleet.md shows goes through
// Nova's own code (python3-nova): ResourceRequest.from_request_spec must
// send the documented query, and each candidate Placement gives on a host
// with several GPUs of each kind is claimed by SchedulerReportClient
// (microversion 1.36, as nova-scheduler does) and created on that host by
// vgpud with the consumer; then destroyed. Forms whose classes sit in the
// unnumbered group get candidates that split the classes across two GPUs,
// which the host refuses: they do not work on such a host; nor does a
// flavor with two numbered GPU groups (one instance is on one GPU). A real flavor
// (VCPU, MEMORY_MB, DISK_GB) finds candidates only on the host whose GPU
// providers hang under a compute node's provider (parentUUID), and its
// allocation keeps the compute node's part after vgpud adopted it.
func TestFleetNovaFlavors(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "fleet.md"))
	if err != nil {
		t.Fatal(err)
	}
	forms := append(append([]flavorForm{}, flavorForms...), tableForms()...)
	for _, m := range docsExtraSpec.FindAllStringSubmatch(string(doc), -1) {
		found := false
		for _, f := range forms {
			found = found || f.flavor.ExtraSpecs[m[1]] == m[2]
		}
		if !found {
			t.Errorf("docs/fleet.md shows the extra spec %s=%s, which no flavor form of this test exercises", m[1], m[2])
		}
	}

	srv := tplacement.Start(t)
	pc, err := placementapi.New(placementapi.Config{Endpoint: srv.URL(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFleet(t)
	// The compute node nova-compute would publish.
	computeNode := uuid.NewString()
	if err := pc.CreateProvider(ctx, computeNode, "compute-17", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.SetInventories(ctx, computeNode, 0, map[string]placementapi.Inventory{
		"VCPU":      {Total: 64, MaxUnit: 64, MinUnit: 1, StepSize: 1, AllocationRatio: 1},
		"MEMORY_MB": {Total: 262144, MaxUnit: 262144, MinUnit: 1, StepSize: 1, AllocationRatio: 1},
		"DISK_GB":   {Total: 2000, MaxUnit: 2000, MinUnit: 1, StepSize: 1, AllocationRatio: 1},
	}); err != nil {
		t.Fatal(err)
	}
	own := startFleetDaemon(t, "fleet-nova", novaHostSpec, srv.URL(), "5s")
	under := startFleetDaemonWith(t, "compute-17", novaComputeSpec, srv.URL(), "5s", "3s", "  parentUUID: "+computeNode+"\n")
	hosts := []*fleetDaemon{own, under}
	for _, d := range hosts {
		d.learnProviders(t)
	}
	awaitFleet(t, pc, hosts, 20*time.Second)
	nova := tplacement.StartNova(t, srv.URL())

	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			ctx := ctxFleet(t)
			q, err := nova.Query(ctx, f.flavor)
			if err != nil {
				t.Fatalf("%v\n%s", err, tailText(nova.Log.String(), 3000))
			}
			if got, _ := url.QueryUnescape(q.Query); got != f.query {
				t.Errorf("nova-scheduler's query = %s, want %s", got, f.query)
			}
			created, split := 0, 0
			for _, c := range q.Candidates {
				d, gpuProvs := candidateHost(hosts, c)
				if d == nil {
					t.Fatalf("candidate %v names no GPU of the hosts", c.Allocations)
				}
				if f.underCompute && d != under {
					t.Errorf("a real flavor got a candidate on %s, whose GPU providers have their own root: %v", d.name, c.Allocations)
				}
				id := uuid.NewString()
				ok, err := nova.Claim(ctx, id, c, q.Version)
				if err != nil || !ok {
					t.Fatalf("claim %v: %v, %v\n%s", c.Allocations, ok, err, tailText(nova.Log.String(), 3000))
				}
				err = d.CreateOn(ctx, id, f.profile, gpuProvs[0])
				if len(gpuProvs) > 1 {
					split++
					if err == nil {
						t.Errorf("%s created %s from a candidate split across GPUs %v", d.name, id, gpuProvs)
					}
					if _, err := nova.Delete(ctx, id); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: create %s on %s from candidate %v: %v", d.name, f.profile, d.gpus[gpuProvs[0]], c.Allocations, err)
					if _, err := nova.Delete(ctx, id); err != nil {
						t.Fatal(err)
					}
					continue
				}
				created++
				in := findInstance(t, d, id)
				if in.GPU != d.gpus[gpuProvs[0]] || in.Profile != f.profile {
					t.Errorf("%s: created %s %s on %s, want %s on %s", d.name, id, in.Profile, in.GPU, f.profile, d.gpus[gpuProvs[0]])
				}
				cons, err := nova.Allocations(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				for p, a := range c.Allocations {
					for rc, n := range a.Resources {
						if cons.Allocations[p].Resources[rc] != n {
							t.Errorf("%s: after the create the allocation of %s holds %s=%d on %s, the scheduler claimed %d",
								d.name, id, rc, cons.Allocations[p].Resources[rc], p, n)
						}
					}
				}
				behind, err := d.DestroyBehind(ctx, id)
				if err != nil {
					t.Fatalf("%s: destroy %s: %v", d.name, id, err)
				}
				// The destroy removed vgpud's part; the compute node's part is
				// nova's to delete. A destroy whose removal Placement did not
				// take in time says so (PlacementBehind) and leaves it to the
				// sync: then the sync's next passes must remove it.
				onGPU := func() map[string]bool {
					cons, err := nova.Allocations(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					left := map[string]bool{}
					for p := range cons.Allocations {
						if d.providers[p] {
							left[p] = true
						}
					}
					return left
				}
				if behind == "" {
					if left := onGPU(); len(left) > 0 {
						t.Errorf("%s: the allocation of %s on its GPU is still in Placement after its destroy returned and said nothing was left behind: %v", d.name, id, left)
					}
				} else {
					t.Logf("%s: destroy of %s left Placement behind: %s", d.name, id, behind)
					testenv.WaitFor(t, "the sync removes the allocation the destroy left behind", 2*5*time.Second+25*time.Second, func() bool {
						return len(onGPU()) == 0
					})
				}
				if _, err := nova.Delete(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%d candidates: %d created, %d split across GPUs", len(q.Candidates), created, split)
			if f.split && split == 0 {
				t.Errorf("no candidate of an unnumbered form split across GPUs: the test's host lost its point")
			}
			if f.onlySplit {
				if created != 0 || split == 0 {
					t.Errorf("a form whose candidates all name two GPUs: %d created, %d split", created, split)
				}
				return
			}
			if created == 0 {
				t.Errorf("no candidate created: the form does not work on a host with several GPUs")
			}
		})
	}
	awaitFleet(t, pc, hosts, 20*time.Second)
}

// candidateHost is the host whose GPU providers a candidate names, and
// those providers (sorted: a candidate of one GPU names one).
func candidateHost(hosts []*fleetDaemon, c tplacement.NovaCandidate) (*fleetDaemon, []string) {
	for _, d := range hosts {
		var provs []string
		for p := range maps.Keys(c.Allocations) {
			if d.providers[p] {
				provs = append(provs, p)
			}
		}
		if len(provs) > 0 {
			sort.Strings(provs)
			return d, provs
		}
	}
	return nil, nil
}

// findInstance is the host's instance id.
func findInstance(t *testing.T, d *fleetDaemon, id string) dbusapi.Instance {
	t.Helper()
	insts, err := d.client.Instances(ctxFleet(t), "")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(insts, func(in dbusapi.Instance) bool { return in.UUID == id })
	if i < 0 {
		t.Fatalf("%s: no instance %s after its create succeeded", d.name, id)
	}
	return insts[i]
}
