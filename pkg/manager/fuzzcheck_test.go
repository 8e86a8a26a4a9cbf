package manager_test

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/vgpud/vgpud/internal/invariant"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// fuzzErrorProblems: a refusal names what was wrong with one of the manager's
// sentinels; on the simulated host no backend fails.
func fuzzErrorProblems(err error) []string {
	if err == nil {
		return nil
	}
	for _, s := range []error{manager.ErrNotFound, manager.ErrInvalidArgument, manager.ErrQuotaExceeded, manager.ErrNoCapacity,
		manager.ErrAccessDenied, manager.ErrBusy, manager.ErrConflict, manager.ErrGPULost} {
		if errors.Is(err, s) {
			return nil
		}
	}
	if errors.Is(err, manager.ErrBackendFailure) {
		return []string{fmt.Sprintf("a backend failure on the simulated host: %v", err)}
	}
	return []string{fmt.Sprintf("error with no sentinel: %v", err)}
}

// invariants are the crash test's checks, on the state after a step.
func (r *fuzzRun) invariants(s fuzzState) []string {
	var out []string
	for _, in := range s.intents {
		out = append(out, fmt.Sprintf("intent %s (%s %s, steps %v) left", in.ID, in.Op, in.Instance, in.Steps))
	}
	for _, in := range s.insts {
		if in.State != store.StateReady {
			out = append(out, fmt.Sprintf("instance %s is %s: %s", in.UUID, in.State, in.Reason))
		}
		if _, ok := s.tenants[in.Tenant]; !ok {
			out = append(out, fmt.Sprintf("instance %s belongs to tenant %q, which is not defined", in.UUID, in.Tenant))
		}
	}
	for id, a := range s.atts {
		if _, ok := s.insts[id]; !ok {
			out = append(out, fmt.Sprintf("attachment of instance %s to %s has no instance record", id, a.Domain))
		}
	}

	// Records against the host, both ways.
	var recs []store.Instance
	for _, in := range s.insts {
		recs = append(recs, in)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].UUID < recs[j].UUID })
	gen, err := r.e.sim.Generation()
	if err != nil {
		r.t.Fatal(err)
	}
	if key := fmt.Sprint(recs); gen != r.checkedGen || key != r.checkedRecs {
		extra, missing := invariant.HostDiff(r.inventory(), recs)
		for _, d := range extra {
			if !slices.Contains(r.foreign, d) {
				out = append(out, "on the host without a record: "+d)
			}
		}
		out = append(out, missing...)
		r.checkedGen, r.checkedRecs = gen, key
	}

	// Attachment records against the VMs' configs, both ways.
	out = append(out, r.lv.diff(s)...)

	// Usage as the manager reports it against the catalog.
	views, err := r.e.m.Tenants()
	if err != nil {
		return append(out, fmt.Sprintf("list tenants: %v", err))
	}
	if len(views) != len(s.tenants) {
		out = append(out, fmt.Sprintf("the manager lists %d tenants, the store holds %d", len(views), len(s.tenants)))
	}
	for _, v := range views {
		var want tenant.Usage
		for _, in := range s.insts {
			if in.Tenant != v.Name {
				continue
			}
			vram, compute, err := invariant.Cost(r.e.cat, in)
			if err != nil {
				out = append(out, err.Error())
			}
			want.VRAMBytes += vram
			want.ComputeMilli += compute
			want.Instances++
		}
		if v.Usage != want {
			out = append(out, fmt.Sprintf("tenant %s reports usage %+v; its instances cost %+v by the catalog", v.Name, v.Usage, want))
		}
	}
	return out
}

// fuzzEffectProblems checks that a step changed only what its operation may.
func fuzzEffectProblems(before, after fuzzState, eff fuzzEffect, err error) []string {
	ok := err == nil
	out, gone, made := fuzzInstanceProblems(before, after, eff, ok)
	out = append(out, fuzzAttachmentProblems(before, after, eff, ok, gone, made)...)
	return append(out, fuzzTenantProblems(before, after, eff, ok)...)
}

// fuzzInstanceProblems checks the instances a step destroyed, created and
// kept (ok: the step succeeded); gone and made are the instances it
// destroyed and created.
func fuzzInstanceProblems(before, after fuzzState, eff fuzzEffect, ok bool) (out, gone []string, made []store.Instance) {
	onGPU := func(in store.Instance) bool {
		return eff.anyTenant && (slices.Contains(eff.gpus, in.GPUPCI) || slices.Contains(eff.gpus, in.GPUUUID))
	}
	mayTouch := func(in store.Instance) bool {
		return onGPU(in) || (!eff.anyTenant && eff.tenant != "" && in.Tenant == eff.tenant)
	}

	if ok && eff.needTarget && eff.target == "" {
		out = append(out, "succeeded, but the reference names no instance")
	}

	// Instances destroyed.
	for id, in := range before.insts {
		if _, still := after.insts[id]; still {
			continue
		}
		gone = append(gone, id)
		switch {
		case eff.destroy == nil || !eff.destroy(in) || !mayTouch(in):
			out = append(out, fmt.Sprintf("instance %s of tenant %s (%s on %s) was destroyed", id, in.Tenant, in.Profile, in.GPUPCI))
		}
	}
	if ok && eff.exact && eff.destroy != nil {
		for id, in := range before.insts {
			if _, still := after.insts[id]; still && eff.destroy(in) {
				out = append(out, fmt.Sprintf("instance %s is still there after its destroy succeeded", id))
			}
		}
	}

	// Instances created.
	for id, in := range after.insts {
		if _, had := before.insts[id]; had {
			continue
		}
		made = append(made, in)
		switch {
		case !ok && !eff.anyTenant:
			out = append(out, fmt.Sprintf("instance %s (%s of tenant %s) was created by a refused operation", id, in.Profile, in.Tenant))
		case !mayTouch(in):
			out = append(out, fmt.Sprintf("instance %s (%s of tenant %s on %s) was created", id, in.Profile, in.Tenant, in.GPUPCI))
		}
	}
	if len(made) > eff.create {
		out = append(out, fmt.Sprintf("%d instances created, at most %d expected", len(made), eff.create))
	}
	if ok && eff.exact && eff.create > 0 && len(made) != eff.create {
		out = append(out, fmt.Sprintf("%d instances created by a create that succeeded", len(made)))
	}

	// Instances kept: same owner and profile; the same placement unless
	// moved by a defragment that succeeded.
	for id, a := range before.insts {
		b, ok2 := after.insts[id]
		if !ok2 {
			continue
		}
		if a.Tenant != b.Tenant || a.Profile != b.Profile || a.Kind != b.Kind {
			out = append(out, fmt.Sprintf("instance %s changed from %s/%s/%s to %s/%s/%s", id, a.Tenant, a.Kind, a.Profile, b.Tenant, b.Kind, b.Profile))
		}
		if fuzzPlacement(a) != fuzzPlacement(b) && !(eff.move && ok) {
			out = append(out, fmt.Sprintf("instance %s moved from %s to %s", id, fuzzPlacement(a), fuzzPlacement(b)))
		}
	}
	return out, gone, made
}

// fuzzAttachmentProblems checks the attachments a step dropped, moved and
// made.
func fuzzAttachmentProblems(before, after fuzzState, eff fuzzEffect, ok bool, gone []string, made []store.Instance) []string {
	var out []string
	// Attachments.
	for id, a := range before.atts {
		b, still := after.atts[id]
		switch {
		case !still && slices.Contains(gone, id):
		case !still && id == eff.attach && (ok || eff.destroy != nil):
			// a detach, or the detach half of a destroy with detach
		case !still:
			out = append(out, fmt.Sprintf("attachment of %s to %s was dropped", id, a.Domain))
		case b.Domain != a.Domain || b.DomainUUID != a.DomainUUID:
			out = append(out, fmt.Sprintf("attachment of %s moved from %s to %s", id, a.Domain, b.Domain))
		}
	}
	for id, b := range after.atts {
		if _, had := before.atts[id]; had {
			continue
		}
		isNew := slices.ContainsFunc(made, func(in store.Instance) bool { return in.UUID == id })
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("a refused operation attached %s to %s", id, b.Domain))
		case (id == eff.attach || isNew) && eff.attachVM != "" && b.Domain == eff.attachVM:
		default:
			out = append(out, fmt.Sprintf("instance %s was attached to %s", id, b.Domain))
		}
	}
	if ok && eff.attachVM != "" {
		attached := eff.attach
		if len(made) == 1 {
			attached = made[0].UUID
		}
		if a, held := after.atts[attached]; !held || a.Domain != eff.attachVM {
			out = append(out, fmt.Sprintf("instance %s is not attached to %s after the call succeeded", attached, eff.attachVM))
		}
	}
	if ok && eff.attach != "" && eff.attachVM == "" && eff.destroy == nil {
		if _, still := after.atts[eff.attach]; still {
			out = append(out, fmt.Sprintf("instance %s is still attached after its detach succeeded", eff.attach))
		}
	}
	return out
}

// fuzzTenantProblems checks the tenants a step defined and undefined.
func fuzzTenantProblems(before, after fuzzState, eff fuzzEffect, ok bool) []string {
	var out []string
	// Tenants.
	if ok && eff.exact {
		for _, name := range eff.addTenants {
			if _, there := after.tenants[name]; !there {
				out = append(out, fmt.Sprintf("tenant %q is not there after its define succeeded", name))
			}
		}
		for _, name := range eff.removeTenants {
			if _, there := after.tenants[name]; there {
				out = append(out, fmt.Sprintf("tenant %q is still there after its undefine succeeded", name))
			}
		}
	}
	for name := range before.tenants {
		if _, still := after.tenants[name]; still {
			continue
		}
		if !(ok && slices.Contains(eff.removeTenants, name)) && !slices.Contains(eff.pruneOthers, name) {
			out = append(out, fmt.Sprintf("tenant %s was undefined", name))
		}
	}
	for name := range after.tenants {
		if _, had := before.tenants[name]; had {
			continue
		}
		if !slices.Contains(eff.addTenants, name) || (!ok && !eff.anyTenant) {
			out = append(out, fmt.Sprintf("tenant %q was defined", name))
		}
	}
	return out
}

func fuzzPlacement(in store.Instance) string {
	return fmt.Sprintf("%s slot %d profile %d vf %q mdev %q", in.GPUPCI, in.GIStart, in.GIProfileID, in.VF, in.MdevUUID)
}
