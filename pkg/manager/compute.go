package manager

import (
	"fmt"
	"sort"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/store"
)

// Compute instances ("1c.3g.40gb") are instances of kind mig, one record
// each. Records of one tenant share a GPU instance: the first record
// creates it (step gi in its intent) and carves its compute instance in
// it; the next ones find it in the snapshot and carve only their compute
// instance (no gi step), at a start inside the GPU instance that
// pkg/placement chooses by the driver's rules. A release takes the
// record's compute instance away, and the GPU instance only when no other
// record names it (giShared), so the last one out destroys it, as the
// driver demands (GpuInstance.Destroy is IN_USE while compute instances
// live on it). Compute instances share their GPU instance's memory and
// engines, so a GPU instance holds one tenant's compute instances only,
// and never a vGPU (the driver puts no vGPU on a GPU instance with
// compute instances, nor a compute instance beside a vGPU).

// ciArgs are the compute-instance profile and start a record's compute
// instance is created with: -1, -1 for one covering the GPU instance.
func ciArgs(r *store.Instance) (profileID, start int) {
	if r.CISlices > 0 {
		return r.CIProfileID, r.CIStart
	}
	return -1, -1
}

// ciSlot is the part of its GPU instance a record's compute instance
// takes; a record without CISlices takes all giSlices.
func ciSlot(r *store.Instance, giSlices int) placement.ComputeSlot {
	if r.CISlices > 0 {
		return placement.ComputeSlot{Start: r.CIStart, Size: r.CISlices, ProfileID: r.CIProfileID}
	}
	return placement.ComputeSlot{Start: 0, Size: giSlices, ProfileID: -1}
}

// decideCI places a compute instance: in a GPU instance of the tenant's
// that has room for it, else in a new GPU instance at the start the
// allocator gives (decideMIG), with the compute instance at its first
// legal start.
func (m *Manager) decideCI(s *snapshot, models map[string]offer, names []string, pin string, req CreateRequest) (decision, error) {
	type giKey struct {
		gpu   string
		start int
	}
	anchors := map[string]*store.Instance{}
	var gis []placement.ComputeGI
	var ciProf profile.ComputeInstanceProfile
	seen := map[giKey]bool{}
	for i := range s.recs {
		r := &s.recs[i]
		o, ok := models[r.Model]
		// A record still being created counts: its GPU instance is
		// joined as a ready one is (the carve finds it, or makes it,
		// under the GPU's lock: giBeside), so parallel creates fill one
		// GPU instance instead of each taking a new one.
		if !ok || r.Kind != store.KindMIG || r.CISlices == 0 || (r.State != store.StateReady && r.State != store.StateCreating) ||
			r.Tenant != req.Tenant || r.GIProfileID != o.gi.ID || (pin != "" && r.GPUUUID != pin) {
			continue
		}
		k := giKey{r.GPUUUID, r.GIStart}
		if seen[k] {
			continue
		}
		seen[k] = true
		g := m.gpuOf(s, r.GPUUUID)
		if g == nil || s.unavailable(g) != "" {
			continue
		}
		gi := placement.ComputeGI{ID: fmt.Sprintf("%s@%d", r.GPUUUID, r.GIStart), Slices: o.gi.ComputeSlices}
		shareable := true
		for _, x := range s.giRecords(r.GPUUUID, r.GIStart, r.GIProfileID) {
			// Another tenant's, a whole-GI instance, or one being taken
			// down: not a GPU instance to add to.
			if x.Tenant != req.Tenant || x.Kind != store.KindMIG || x.CISlices == 0 || x.State == store.StateDestroying || x.State == store.StateFailed {
				shareable = false
			}
			gi.Used = append(gi.Used, ciSlot(x, o.gi.ComputeSlices))
		}
		if !shareable {
			continue
		}
		anchors[gi.ID] = r
		gis = append(gis, gi)
		ciProf = *o.ci
	}
	sort.Slice(gis, func(i, j int) bool { return gis[i].ID < gis[j].ID })
	if len(gis) > 0 {
		if d, err := placement.PlaceCompute(gis, ciProf); err == nil {
			r := anchors[d.GI]
			return decision{o: models[r.Model], g: m.gpuOf(s, r.GPUUUID), shared: r, start: r.GIStart, ciStart: d.Start,
				reason: fmt.Sprintf("compute slices %d+%d of GPU instance %d, beside %s", d.Start, ciProf.Slices, r.GIID, r.UUID)}, nil
		}
	}
	d, err := m.decideMIG(s, models, names, pin, req, false)
	if err != nil {
		return d, err
	}
	// An empty GPU instance: the first legal start is 0 for every size.
	d.ciStart = profile.ComputeInstanceStarts(d.o.gi.ComputeSlices, d.o.ci.Slices)[0]
	return d, nil
}

// giBeside finds the GPU instance a compute-instance record admitted into
// a shared GPU instance lives on, when the admission could not know its id
// (the record it joined was still being created): the id of another
// record of the tenant's at the same placement whose GPU instance exists
// (its gi step is done, or it is ready). None: this record's carve makes
// the GPU instance, whichever of them reaches the GPU first (the one it
// joined may not have carved yet, or failed and took its GPU instance
// away). The caller holds the GPU's lock, under which every carve and
// release of the GPU runs, so the answer holds for the carve.
func (m *Manager) giBeside(rec *store.Instance) (int, bool, error) {
	id, found := -1, false
	err := m.db.View(func(tx *store.Tx) error {
		recs, err := tx.Instances()
		if err != nil {
			return err
		}
		for _, x := range recs {
			if x.UUID == rec.UUID || x.GPUUUID != rec.GPUUUID || x.Kind != store.KindMIG || x.CISlices == 0 || x.GIID < 0 ||
				x.GIStart != rec.GIStart || x.GIProfileID != rec.GIProfileID || x.Tenant != rec.Tenant ||
				(x.State != store.StateReady && x.State != store.StateCreating) {
				continue
			}
			id, found = x.GIID, true
			return nil
		}
		return nil
	})
	return id, found, classify(err, "read the records of GPU %s", rec.GPUPCI)
}
