package manager

import (
	"fmt"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/placement"
)

// vgpuFull words the refusal of a time-sliced vGPU that no GPU offering
// its type can take: how many GPUs offer it, why each is full, and what
// they could still take. Placement words it from the GPUs it was allowed
// to consider, and decideVGPU hides from it the GPUs without a free VF or
// mdev parent, so on a GPU whose VFs are all taken it would count none.
func (m *Manager) vgpuFull(s *snapshot, models map[string]offer, pin, typ, requested string, cause error) error {
	var full []string
	offering, out := 0, 0 // out: failed, lost or passed through
	free := map[string]int{}
	for _, h := range m.vgpuHosts(s) {
		o, ok := models[h.Model]
		if !ok || (pin != "" && h.ID != pin) {
			continue
		}
		if _, ok := h.Types[typ]; !ok {
			continue
		}
		offering++
		g := m.gpuOf(s, h.ID)
		if s.unavailable(g) != "" {
			out++
		}
		md := o.model
		for name := range h.Types {
			if t, ok := md.VGPUTypeByName(name); ok {
				if n := min(placement.VGPURoom(h, name), s.freeDevices(g, t.ID)); n > 0 {
					free[name] += n
				}
			}
		}
		full = append(full, g.PCI+": "+m.vgpuFullWhy(s, g, h, o, typ))
	}
	var parts []string
	for _, name := range keys(free) {
		parts = append(parts, fmt.Sprintf("%s×%d", name, free[name]))
	}
	instead := "nothing"
	if len(parts) > 0 {
		instead = strings.Join(parts, ", ")
	}
	gpus := fmt.Sprintf("%d GPUs offer it and all are full", offering)
	switch {
	case pin != "":
		gpus = "the GPU asked for offers it and is full"
	case offering == 1 && out == 1:
		gpus = "1 GPU offers it and it is out of service"
	case offering == 1:
		gpus = "1 GPU offers it and it is full"
	case out == offering:
		gpus = fmt.Sprintf("%d GPUs offer it and all are out of service", offering)
	case out > 0:
		gpus = fmt.Sprintf("%d GPUs offer it: %d full, %d out of service", offering, offering-out, out)
	}
	msg := fmt.Sprintf("place %s: vGPU type %s: %s (%s); creatable there now: %s", requested, typ, gpus, strings.Join(full, "; "), instead)
	// The cause's own text counts the GPUs differently; msg replaces it.
	return &opError{kind: ErrNoCapacity, msg: msg, cause: cause, shown: true}
}

// migOutOfService words the refusal of a MIG profile (or MIG-backed vGPU)
// that placement could put nowhere, naming the GPUs offering it that are
// failed, lost or passed through and why: placement never sees why a GPU
// is unavailable, so its own text would only say that every GPU is.
func (m *Manager) migOutOfService(s *snapshot, models map[string]offer, pin, requested string, cause error) error {
	var out []string
	for i := range s.inv.GPUs {
		g := &s.inv.GPUs[i]
		if _, ok := models[g.Model]; !ok || !g.MIG.Capable || (pin != "" && g.UUID != pin) {
			continue
		}
		if why := s.unavailable(g); why != "" {
			out = append(out, g.PCI+": "+why)
		}
	}
	if len(out) == 0 {
		return classify(cause, "place %s", requested)
	}
	what := strings.TrimSuffix(cause.Error(), ": "+placement.ErrNoCapacity.Error())
	msg := fmt.Sprintf("place %s: %s; out of service: %s", requested, what, strings.Join(out, "; "))
	return &opError{kind: ErrNoCapacity, msg: msg, cause: cause, shown: true}
}

// vgpuFullWhy says why g takes no more vGPUs of type typ.
func (m *Manager) vgpuFullWhy(s *snapshot, g *gpu.GPU, h placement.VGPUHost, o offer, typ string) string {
	if why := s.unavailable(g); why != "" {
		return why
	}
	if g.MIG.Enabled {
		return "MIG is on (time-sliced vGPUs need it off)"
	}
	if s.freeDevices(g, o.typ.ID) == 0 {
		switch {
		case g.VGPU.Flavour == gpu.FlavourVFIO && len(g.VGPU.VFs) == 0:
			return "no SR-IOV VFs are enabled (run /usr/lib/nvidia/sriov-manage -e ALL)"
		case g.VGPU.Flavour == gpu.FlavourVFIO:
			return fmt.Sprintf("all %d of its VFs hold a vGPU", len(g.VGPU.VFs))
		}
		return "no free mdev parent for the type"
	}
	var held []string
	total := 0
	for _, name := range keys(h.Current) {
		if n := h.Current[name]; n > 0 {
			held = append(held, fmt.Sprintf("%s×%d", name, n))
			total += n
		}
	}
	c := h.Types[typ]
	switch {
	case !h.Heterogeneous && total > 0 && h.Current[typ] != total:
		return "holds " + strings.Join(held, ", ") + " (homogeneous mode: one type per GPU)"
	case !h.Heterogeneous:
		return fmt.Sprintf("holds %d of the %d %s it takes", h.Current[typ], c.Max, typ)
	}
	return "holds " + strings.Join(held, ", ") + fmt.Sprintf(" (heterogeneous mode: its %d MiB of framebuffer or the type's mixed-mode limit is used up)", h.MemoryMiB)
}
