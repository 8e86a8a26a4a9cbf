// Package managersource is the share loop's inventory Source on the
// manager (pkg/manager): it translates the manager's GPUs, instances and
// tenants into package share's types. It sits beside package share, which
// imports pkg/gpu only, because it needs the manager's, the store's and
// the catalog's types. cmd/vgpud imports it.
//
// Imports: pkg/manager, pkg/profile, pkg/share, pkg/store, pkg/tenant.
package managersource

import (
	"context"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/share"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Manager is what the source reads of a *manager.Manager.
type Manager interface {
	GPUs() ([]manager.GPUView, error)
	AllInstances() ([]manager.InstanceView, error)
	Tenants() ([]manager.TenantView, error)
}

// Source is a share.Source over a manager. It reads the manager at every
// call; wrap it in a share.Cache.
type Source struct {
	m       Manager
	catalog func() *profile.Catalog
}

var _ share.Source = (*Source)(nil)

// New returns the source over m. catalog returns the GPU catalog in force
// (a reload may replace it), which gives each MIG GPU's memory slices.
func New(m Manager, catalog func() *profile.Catalog) *Source {
	return &Source{m: m, catalog: catalog}
}

// Inventory returns the manager's GPUs, instances and tenants. It fails as
// the manager does, or with ctx's error when ctx has ended.
func (s *Source) Inventory(ctx context.Context) (share.Inventory, error) {
	if err := ctx.Err(); err != nil {
		return share.Inventory{}, err
	}
	gpus, err := s.m.GPUs()
	if err != nil {
		return share.Inventory{}, err
	}
	insts, err := s.m.AllInstances()
	if err != nil {
		return share.Inventory{}, err
	}
	tenants, err := s.m.Tenants()
	if err != nil {
		return share.Inventory{}, err
	}
	var inv share.Inventory
	guaranteed := map[string]bool{}
	for _, t := range tenants {
		g := t.Class == tenant.Guaranteed
		guaranteed[t.Name] = g
		inv.Tenants = append(inv.Tenants, share.Tenant{Name: t.Name, Guaranteed: g})
	}
	cat := s.catalog()
	for _, g := range gpus {
		x := share.GPU{Index: g.Index, UUID: g.UUID, PCI: g.PCI, Model: g.Model, Product: g.Product, MIG: g.MIG.Enabled,
			Flavour: string(g.VGPU.Flavour), State: g.State}
		if sc := g.Scheduler; sc != nil && sc.Mode == manager.SchedPinned {
			x.Pinned, x.PinnedPolicy, x.PinnedPending = true, share.Policy(sc.Policy), sc.Pending
		}
		if md, ok := cat.Model(g.Model); ok && md.MIG != nil {
			x.MIGSlots = md.MIG.MemorySlices
		}
		for _, s := range g.GPUInstanceSchedulers {
			if s.GPUInstance < 0 {
				continue // a pin with no GPU instance now: nothing runs under it
			}
			x.GPUInstanceSchedulers = append(x.GPUInstanceSchedulers, share.GPUInstanceScheduler{GI: s.GPUInstance, Profile: s.Profile,
				Pinned: s.Mode == manager.SchedPinned, Policy: share.Policy(s.Policy), Timeslice: s.Timeslice, Pending: s.Pending})
		}
		inv.GPUs = append(inv.GPUs, x)
	}
	for _, v := range insts {
		r := v.Instance
		x := share.Instance{UUID: r.UUID, Tenant: r.Tenant, Guaranteed: guaranteed[r.Tenant], GPU: r.GPUUUID, RecordKind: string(r.Kind), Profile: r.Profile,
			MdevUUID: r.MdevUUID, VF: r.VF, GI: r.GIID, GIStart: r.GIStart, GISize: r.GISize, TypeID: r.TypeID,
			ComputeMilli: r.ComputeMilli, VRAMBytes: r.VRAMBytes, State: string(r.State)}
		switch r.Kind {
		case store.KindVGPU:
			x.Kind, x.GI = share.TimeSliced, -1
		case store.KindMIG, store.KindMIGVGPU:
			x.Kind = share.MIG
		default:
			x.Kind = share.Passthrough
		}
		if v.Attachment != nil {
			x.VM, x.VMUUID = v.Attachment.Domain, v.Attachment.DomainUUID
		}
		inv.Instances = append(inv.Instances, x)
	}
	return inv, nil
}
