package manager

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/store"
)

// Foreign is one device on the host that no record explains.
type Foreign struct {
	GPU    string      `json:"gpu"`
	Kind   ForeignKind `json:"kind"`
	ID     string      `json:"id"`
	Detail string      `json:"detail,omitempty"`
	// Origin says what made the device, when vgpud can tell:
	// OriginMdevctl for an mdev mdevctl defines. Detail says it too (the
	// D-Bus reply carries gpu, kind, id and detail).
	Origin string `json:"origin,omitempty"`
}

// OriginMdevctl: mdevctl defines the device (/etc/mdevctl.d). vgpud never
// re-creates or removes it; `mdevctl undefine` and `mdevctl stop` hand its
// room to vgpud (docs/operations.md, "vgpud and mdevctl").
const OriginMdevctl = "mdevctl"

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
	var errs []string
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		for _, e := range g.Errors {
			errs = append(errs, g.PCI+"\x00"+e)
		}
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
				m.warnMdevctlRecord(g, d.mdev)
				continue
			}
			name := "unknown type"
			if d.typ != nil {
				name = d.typ.Name
			}
			if d.vf != "" {
				out = append(out, Foreign{GPU: g.PCI, Kind: ForeignVF, ID: d.vf, Detail: name})
			} else if d.mdev != "" {
				out = append(out, foreignMdev(g, d.mdev, name))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GPU+out[i].ID < out[j].GPU+out[j].ID })
	m.noteForeign(out)
	for _, e := range m.discoveryErrs.fresh(errs) {
		// What discovery could not read (an mdevctl definition skipped,
		// say) is in the GPU's Errors at every pass; the log says it once.
		gpuPCI, msg, _ := strings.Cut(e, "\x00")
		m.log.Warn("discovery: part of a GPU's state could not be read", "gpu", gpuPCI, "err", msg)
	}
	return out
}

// seenSet remembers which of a repeated list's entries were seen before.
type seenSet struct {
	mu   sync.Mutex
	seen map[string]bool
}

// fresh replaces the set with list and returns the entries new to it.
func (s *seenSet) fresh(list []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]bool, len(list))
	var out []string
	for _, e := range list {
		next[e] = true
		if !s.seen[e] {
			out = append(out, e)
		}
	}
	s.seen = next
	return out
}

// foreignMdev reports an mdev no record explains, with mdevctl as its
// origin when mdevctl defines it, and why its entry in mdevctl's
// directory was skipped when it was (which origin it has is unknown then).
func foreignMdev(g *gpu.GPU, uuid, typeName string) Foreign {
	f := Foreign{GPU: g.PCI, Kind: ForeignMdev, ID: uuid, Detail: typeName}
	md := mdevOf(g, uuid)
	switch {
	case md != nil && md.Mdevctl != nil:
		f.Origin = OriginMdevctl
		f.Detail = fmt.Sprintf("%s, defined by mdevctl (start %s)", typeName, md.Mdevctl.Start)
	case md != nil && md.MdevctlProblem != "":
		f.Detail = fmt.Sprintf("%s; %s", typeName, md.MdevctlProblem)
	}
	return f
}

func mdevOf(g *gpu.GPU, uuid string) *gpu.Mdev {
	for i := range g.VGPU.Mdevs {
		if strings.EqualFold(g.VGPU.Mdevs[i].UUID, uuid) {
			return &g.VGPU.Mdevs[i]
		}
	}
	return nil
}

// warnMdevctlRecord warns when mdevctl also defines one of vgpud's own
// mdevs (an operator ran `mdevctl define` on it): with "start": "auto"
// mdevctl creates it when its parent appears at boot, racing vgpud's
// re-creation, and would bring it back after vgpud destroys the instance.
func (m *Manager) warnMdevctlRecord(g *gpu.GPU, uuid string) {
	md := mdevOf(g, uuid)
	if uuid == "" || md == nil || md.Mdevctl == nil {
		return
	}
	m.log.Warn("mdevctl also defines an mdev of vgpud's; undefine it there (mdevctl undefine -u UUID) so that only vgpud re-creates it",
		"mdev", md.UUID, "gpu", g.PCI, "mdevctl_start", md.Mdevctl.Start, "mdevctl_file", md.Mdevctl.File)
}
