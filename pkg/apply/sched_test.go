package apply_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/manager"
)

// A layout's scheduler key pins a GPU's vGPU scheduler or hands it to the
// share loop; applied again it changes nothing.
func TestApplyScheduler(t *testing.T) {
	e := newEnv(t)
	pin := "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: fixed_share, timeslice: 2ms}}]\n"
	cs, _ := e.apply(parseText(t, pin))
	if len(cs.Changes) != 1 || cs.Changes[0].Op != apply.OpSetScheduler || !strings.Contains(cs.Changes[0].String(), "fixed_share, time slice 2ms") {
		t.Fatalf("changes:\n%s", cs)
	}
	g, err := e.m.GPU("0000:81:00.0")
	if err != nil || g.Scheduler == nil || g.Scheduler.Mode != manager.SchedPinned || g.Scheduler.Policy != "fixed_share" || g.Scheduler.Timeslice != 2*time.Millisecond {
		t.Fatalf("GPU scheduler %+v, %v", g.Scheduler, err)
	}
	cs, _ = e.apply(parseText(t, "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {mode: adaptive}}]\n"))
	if len(cs.Changes) != 1 {
		t.Fatalf("changes:\n%s", cs)
	}
	if g, _ := e.m.GPU("0000:81:00.0"); g.Scheduler == nil || g.Scheduler.Mode != manager.SchedAdaptive {
		t.Fatalf("GPU scheduler %+v, want adaptive", g.Scheduler)
	}
}

// Bad scheduler keys are refused when the file is read, or by Diff where
// the GPU decides (MIG on), and nothing changes.
func TestApplySchedulerRefused(t *testing.T) {
	const h = "version: v1\nlayout: [{gpu: '0000:81:00.0', "
	for _, bad := range []string{
		h + "scheduler: {policy: round_robin}}]",
		h + "scheduler: {mode: adaptive, policy: fixed_share}}]",
		h + "scheduler: {mode: sometimes}}]",
		h + "scheduler: {policy: fixed_share, timeslice: soon}}]",
		"version: v1\nlayout: [{gpu: '0000:41:00.0', mig: true, scheduler: {policy: fixed_share}}]",
	} {
		_, err := apply.Parse("host.yaml", []byte(bad), "")
		var fe *apply.FileError
		if !errors.As(err, &fe) || !strings.HasSuffix(fe.Field, ".scheduler") {
			t.Errorf("%s: %v, want a FileError at layout[0].scheduler", bad, err)
		}
	}
	e := newEnv(t)
	before := e.summary()
	d := parseText(t, "version: v1\nlayout: [{gpu: '0000:41:00.0', scheduler: {policy: fixed_share}}]")
	_, err := apply.Diff(context.Background(), e.m, d)
	if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(err.Error(), "no time-sliced vGPU scheduler") {
		t.Fatalf("scheduler on a MIG GPU: %v", err)
	}
	if e.summary() != before {
		t.Fatal("a refused diff changed the host")
	}
}

func parseText(t *testing.T, text string) *apply.Desired {
	t.Helper()
	d, err := apply.Parse("host.yaml", []byte(text), "")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Instances apply creates store the profile as `vgpuctl create` does: the
// short name ("1g.10gb"), not a model-qualified one.
func TestApplyStoresShortProfileNames(t *testing.T) {
	e := newEnv(t)
	e.apply(mustParse(t, "vgpud.yaml", ""))
	insts, err := e.m.AllInstances()
	if err != nil || len(insts) == 0 {
		t.Fatalf("instances: %d, %v", len(insts), err)
	}
	for _, in := range insts {
		if strings.Contains(in.Profile, "/") {
			t.Errorf("instance %s stores profile %q, want the short name", in.UUID, in.Profile)
		}
	}
}

// A pinned slice the driver holds rounded (the _v2 call takes whole Hz:
// 6ms is held as 5.988023ms, 30ms as 29.41ms) is the layout's slice: a
// second apply of the same layout changes nothing.
func TestApplySchedulerRoundedSliceIsApplied(t *testing.T) {
	for _, ts := range []string{"6ms", "30ms", "1ms"} {
		e := newEnv(t)
		pin := "version: v1\nlayout: [{gpu: '0000:81:00.0', scheduler: {policy: equal_share, timeslice: " + ts + "}}]\n"
		if cs, _ := e.apply(parseText(t, pin)); len(cs.Changes) != 1 {
			t.Fatalf("%s: first apply:\n%s", ts, cs)
		}
		cs, err := apply.Diff(context.Background(), e.m, parseText(t, pin))
		if err != nil || !cs.Empty() {
			t.Fatalf("%s: applied again: %v\n%s", ts, err, cs)
		}
	}
}
