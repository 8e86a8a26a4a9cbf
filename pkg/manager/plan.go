package manager

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"

	"github.com/vgpud/vgpud/pkg/placement"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Plan is where a request would go and what would stay free; nothing on
// the host changes.
type Plan struct {
	Profile      string `json:"profile"`
	Kind         string `json:"kind"`
	Model        string `json:"model"`
	GPU          string `json:"gpu"`
	GPUPCI       string `json:"gpuPCI"`
	Start        int    `json:"start"`
	VF           string `json:"vf,omitempty"`
	MdevParent   string `json:"mdevParent,omitempty"`
	VRAMBytes    uint64 `json:"vramBytes"`
	ComputeMilli uint64 `json:"computeMilli"`
	Reason       string `json:"reason"`
	// Fits is false when the request would be refused; Refusal says why.
	Fits    bool   `json:"fits"`
	Refusal string `json:"refusal,omitempty"`
	// QuotaOK is false when the tenant's quota refuses it (QuotaMessage says why).
	QuotaOK      bool   `json:"quotaOK"`
	QuotaMessage string `json:"quotaMessage,omitempty"`
	// Moves would admit a request refused for fragmentation (see Defragment).
	Moves []placement.Move `json:"moves,omitempty"`
	// FreeAfter is the capacity left once the request is placed.
	FreeAfter []Capacity `json:"freeAfter,omitempty"`
}

// Capacity is how many more instances of one profile fit now, per model.
type Capacity struct {
	Model   string `json:"model"`
	Profile string `json:"profile"`
	Kind    string `json:"kind"`
	// Count sums over GPUs; each profile is counted on its own.
	Count int `json:"count"`
	GPUs  int `json:"gpus"`
}

// Plan answers "where would this go, and what would stay free".
func (m *Manager) Plan(ctx context.Context, req CreateRequest) (Plan, error) {
	// No tenant skips the quota check (a capacity question); a tenant
	// that is given must be one the host has.
	if req.Tenant != "" {
		if err := m.knownTenant(req.Tenant); err != nil {
			return Plan{}, err
		}
	}
	offers, err := m.offersFor(req.Profile)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Profile: req.Profile, Kind: string(offers[0].kind), Start: -1}
	err = m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		d, derr := m.decide(s, offers, req)
		if derr != nil {
			p.Refusal = Message(derr)
			if errors.Is(derr, placement.ErrFragmented) || errors.Is(derr, ErrNoCapacity) {
				if moves, _, merr := m.defragPlan(s, offers, req); merr == nil {
					p.Moves = moves
				}
			}
			p.FreeAfter = m.capacity(s)
			return nil
		}
		p.Fits = true
		p.Model, p.GPU, p.GPUPCI, p.Reason = d.o.model.Name, d.g.UUID, d.g.PCI, d.reason
		p.VRAMBytes, p.ComputeMilli, p.VF, p.MdevParent = d.o.vram(), d.o.compute(), d.vf, d.parent
		if d.o.gi != nil {
			p.Start = d.start
		}
		p.QuotaOK = true
		if req.Tenant != "" {
			t, err := tx.Tenant(req.Tenant)
			if err != nil {
				p.QuotaOK, p.QuotaMessage = false, fmt.Sprintf("tenant %s does not exist", req.Tenant)
			} else {
				vram, compute, n := s.usage(req.Tenant)
				if qerr := t.Admit(tenant.Usage{VRAMBytes: vram, ComputeMilli: compute, Instances: n},
					tenant.Request{VRAMBytes: p.VRAMBytes, ComputeMilli: p.ComputeMilli, Model: p.Model, Profile: d.o.name()}); qerr != nil {
					p.QuotaOK, p.QuotaMessage = false, qerr.Error()
				}
			}
		}
		// What stays free: the same view with the request placed.
		rec := m.record(CreateRequest{UUID: uuid.NewString(), Tenant: req.Tenant, Profile: req.Profile}, d)
		s.recs = append(s.recs, rec)
		s.byGPU[rec.GPUUUID] = append(s.byGPU[rec.GPUUUID], &s.recs[len(s.recs)-1])
		p.FreeAfter = m.capacity(s)
		return nil
	})
	if err != nil {
		return Plan{}, classify(err, "plan %s", req.Profile)
	}
	return p, nil
}

// Capacity reports how many more of each profile fit on the host now.
func (m *Manager) Capacity() ([]Capacity, error) {
	var out []Capacity
	err := m.db.View(func(tx *store.Tx) error {
		s, err := m.snapshot(tx)
		if err != nil {
			return err
		}
		out = m.capacity(s)
		return nil
	})
	if err != nil {
		return nil, classify(err, "capacity")
	}
	return out, nil
}

// capacity adds up, per model, the room of each GPU (roomOn). Its rows
// are the MIG profiles of the models with a GPU that takes MIG instances
// and the MIG-backed vGPU types riding on them, every time-sliced type of
// the GPUs with a vGPU flow, and the whole GPU of every model.
func (m *Manager) capacity(s *snapshot) []Capacity {
	rooms := map[string]room{}
	for i := range s.inv.GPUs {
		if g := &s.inv.GPUs[i]; g.Model != "" {
			rooms[g.UUID] = m.roomOn(s, g)
		}
	}
	var out []Capacity
	listed := map[Capacity]bool{}
	row := func(model string, kind store.InstanceKind, profile string) {
		c := Capacity{Model: model, Profile: profile, Kind: string(kind)}
		if listed[c] {
			return
		}
		listed[c] = true
		for i := range s.inv.GPUs {
			if g := &s.inv.GPUs[i]; g.Model == model {
				n := rooms[g.UUID][roomKey{kind, profile}]
				c.Count += n
				if n > 0 {
					c.GPUs++
				}
			}
		}
		out = append(out, c)
	}
	for _, f := range placement.Capacity(m.migPool(s)) {
		row(f.Model, store.KindMIG, f.Profile)
		// MIG-backed vGPU types ride on the same GPU instances.
		md, _ := m.catalog().Model(f.Model) // nil for a model the catalog lacks: skipped
		if md == nil || md.VGPU == nil {
			continue
		}
		for _, t := range md.VGPU.Types {
			if t.MIGBacked() && *t.GPUInstanceProfile == f.ProfileID {
				row(f.Model, store.KindMIGVGPU, t.Name)
			}
		}
	}
	for _, h := range m.vgpuHosts(s) {
		for name := range h.Types {
			row(h.Model, store.KindVGPU, name)
		}
	}
	for i := range s.inv.GPUs {
		if g := &s.inv.GPUs[i]; g.Model != "" {
			row(g.Model, store.KindPassthrough, ProfilePassthrough)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Profile < out[j].Profile
	})
	return out
}

// defragPlan asks placement which moves of movable MIG instances would
// admit a refused MIG request.
func (m *Manager) defragPlan(s *snapshot, offers []offer, req CreateRequest) ([]placement.Move, placement.Decision, error) {
	if offers[0].gi == nil {
		return nil, placement.Decision{}, fail(ErrNoCapacity, nil, "only MIG requests can be admitted by moving instances")
	}
	var names []string
	for _, o := range offers {
		names = append(names, o.model.Name)
	}
	pin := ""
	if req.GPU != "" {
		// A pin that names no GPU is an error, never "any GPU".
		g, err := m.gpuByAnyID(req.GPU)
		if err != nil {
			return nil, placement.Decision{}, err
		}
		pin = g.UUID
	}
	return placement.Defragment(m.migPool(s), placement.Request{Profile: offers[0].gi.Name, GPU: pin, Models: names, Tenant: req.Tenant, Affinity: req.Affinity})
}
