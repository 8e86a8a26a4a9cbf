package apply_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

// defaultConfigFile is mig-parted's own default config file, unmodified
// (testdata/nvidia/upstream/README.md).
const defaultConfigFile = "nvidia/upstream/config-default.yaml"

// defaultHostConfigs are the configs of defaultConfigFile with an entry
// for the default simulated host's GPUs: its two H100-SXM5-80GB (the L4
// and the A10 have no MIG). Every other config names only profiles or
// device filters of other models.
var defaultHostConfigs = []string{
	"all-1g.10gb", "all-1g.10gb.me", "all-1g.20gb", "all-2g.20gb", "all-3g.40gb",
	"all-4g.40gb", "all-7g.80gb", "all-balanced", "all-disabled", "all-enabled",
}

// defaultHostWithSessions is the default simulated host with the NVML
// sessions modelled: vgpud's own holds every GPU, so a MIG mode change on
// the H100 with SR-IOV VFs goes through the manager's reset path.
func defaultHostWithSessions() *sim.Spec {
	s := sim.DefaultSpec()
	s.Options.NVMLSessions = true
	return s
}

// applyDefaultConfig applies config name in one Diff and one Execute and
// checks that a second Diff is empty.
func applyDefaultConfig(t *testing.T, e *env, name string) {
	t.Helper()
	ctx := context.Background()
	d := mustParse(t, defaultConfigFile, name)
	cs, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatalf("%s: diff: %v", name, err)
	}
	res, err := apply.Execute(ctx, e.m, cs)
	if err != nil {
		t.Fatalf("%s: execute: %v (done %d of %d)\n%s", name, err, len(res.Done), len(cs.Changes), cs)
	}
	again, err := apply.Diff(ctx, e.m, d)
	if err != nil {
		t.Fatalf("%s: second diff: %v", name, err)
	}
	if len(again.Changes) != 0 {
		t.Fatalf("%s: second diff lists %d changes:\n%s", name, len(again.Changes), again)
	}
}

// populate gives the default host instances of every kind: a MIG instance
// and a MIG-backed vGPU on the MIG H100, a time-sliced vGPU with a pinned
// scheduler on the other, vGPUs on the L4 and the A10.
func populate(t *testing.T, e *env) {
	t.Helper()
	e.tenant("acme")
	e.create("acme", "3g.40gb", sim.DefaultH100MIG)
	e.create("acme", "H100XM-1-10C", sim.DefaultH100MIG)
	e.create("acme", "H100XM-20C", sim.DefaultH100TS)
	e.create("acme", "L4-4Q", sim.DefaultL4)
	e.create("acme", "A10-8Q", sim.DefaultA10)
	if _, err := e.m.SetGPUScheduler(context.Background(), sim.DefaultH100TS, manager.SchedulerRequest{Policy: "equal_share"}); err != nil {
		t.Fatal(err)
	}
}

// TestMigPartedDefaultConfig: every config of mig-parted's default file
// that has an entry for the default host's GPUs applies in one apply, with
// no manual step, from the default layout, from a layout with instances of
// every kind, and chained (each after the one before, then back in the
// other order); applying it again changes nothing. Every other config is
// refused whole as applying to nothing.
func TestMigPartedDefaultConfig(t *testing.T) {
	all := configNames(t, defaultConfigFile, "mig-configs")
	for _, name := range defaultHostConfigs {
		if !slices.Contains(all, name) {
			t.Fatalf("%s has no config %s", defaultConfigFile, name)
		}
	}
	t.Run("others apply to nothing", func(t *testing.T) {
		e := newEnvSpec(t, defaultHostWithSessions())
		for _, name := range all {
			if slices.Contains(defaultHostConfigs, name) {
				continue
			}
			_, err := apply.Diff(context.Background(), e.m, mustParse(t, defaultConfigFile, name))
			if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(err.Error(), "nothing in it applies") {
				t.Errorf("%s: %v, want it refused as applying to nothing", name, err)
			}
		}
	})
	for _, name := range defaultHostConfigs {
		t.Run("from default/"+name, func(t *testing.T) {
			applyDefaultConfig(t, newEnvSpec(t, defaultHostWithSessions()), name)
		})
		t.Run("from populated/"+name, func(t *testing.T) {
			e := newEnvSpec(t, defaultHostWithSessions())
			populate(t, e)
			applyDefaultConfig(t, e, name)
			// The time-sliced vGPU and the vGPUs of the L4 and the A10 are
			// outside mig-parted's scope; a MIG mode change on the second
			// H100 destroys its vGPU, as the layout documents.
			for _, l := range e.layout() {
				if strings.HasPrefix(l, sim.DefaultL4) || strings.HasPrefix(l, sim.DefaultA10) {
					continue
				}
				if strings.Contains(l, " acme ") && !strings.HasPrefix(l, sim.DefaultH100TS+" acme H100XM-20C") {
					t.Errorf("%s left %s", name, l)
				}
			}
		})
	}
	t.Run("chained", func(t *testing.T) {
		e := newEnvSpec(t, defaultHostWithSessions())
		populate(t, e)
		for _, name := range defaultHostConfigs {
			applyDefaultConfig(t, e, name)
		}
		for _, name := range slices.Backward(defaultHostConfigs) {
			applyDefaultConfig(t, e, name)
		}
	})
}
