package manager

import (
	"fmt"
	"sort"

	"github.com/vgpud/vgpud/pkg/store"
)

// Foreign is one device on the host that no record explains.
type Foreign struct {
	GPU    string      `json:"gpu"`
	Kind   ForeignKind `json:"kind"`
	ID     string      `json:"id"`
	Detail string      `json:"detail,omitempty"`
}

// ForeignKind is what a Foreign device is. The values are API: the D-Bus
// Reconcile reply and the JSON "kind" field carry them as they are.
type ForeignKind string

const (
	// ForeignGPUInstance: a MIG GPU instance; ID is its GPU instance id.
	ForeignGPUInstance ForeignKind = "gpu-instance"
	// ForeignVF: an SR-IOV virtual function holding a vGPU type; ID is
	// its PCI address.
	ForeignVF ForeignKind = "vf"
	// ForeignMdev: a mediated device; ID is its UUID.
	ForeignMdev ForeignKind = "mdev"
)

// foreign lists devices no record explains.
func (m *Manager) foreign() []Foreign {
	var s *snapshot
	if err := m.db.View(func(tx *store.Tx) (err error) { s, err = m.snapshot(tx); return err }); err != nil {
		// The report lists none this pass; capacity still counts them
		// (placement reads the host, not this list).
		m.log.Warn("list devices no record explains", "err", err)
		return nil
	}
	var out []Foreign
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		for _, gi := range g.MIG.Instances {
			if len(s.giRecords(g.UUID, gi.Placement.Start, gi.ProfileID)) == 0 {
				out = append(out, Foreign{GPU: g.PCI, Kind: ForeignGPUInstance, ID: fmt.Sprint(gi.ID),
					Detail: fmt.Sprintf("profile %d at %d+%d", gi.ProfileID, gi.Placement.Start, gi.Placement.Size)})
			}
		}
		md, _ := m.catalog().Model(g.Model) // nil for a model the catalog lacks: skipped
		if md == nil {
			continue
		}
		for _, d := range s.devices(g, md) {
			if d.rec != nil {
				continue
			}
			name := "unknown type"
			if d.typ != nil {
				name = d.typ.Name
			}
			if d.vf != "" {
				out = append(out, Foreign{GPU: g.PCI, Kind: ForeignVF, ID: d.vf, Detail: name})
			} else if d.mdev != "" {
				out = append(out, Foreign{GPU: g.PCI, Kind: ForeignMdev, ID: d.mdev, Detail: name})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GPU+out[i].ID < out[j].GPU+out[j].ID })
	m.noteForeign(out)
	return out
}
