package sim

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/profile"
)

// ErrBadSpec is wrapped by every host-description error.
var ErrBadSpec = errors.New("invalid simulated host description")

// Spec describes a simulated host: which GPUs it has and how the driver
// behaves where real drivers differ. It is the YAML users pass with
// --sim-host.
type Spec struct {
	// Version must be "v1".
	Version string    `json:"version"`
	GPUs    []GPUSpec `json:"gpus"`
	Driver  Driver    `json:"driver,omitempty"`
	Options Options   `json:"options,omitempty"`
}

// GPUSpec is one simulated GPU.
type GPUSpec struct {
	// Model is a catalog model name, e.g. "H100-SXM5-80GB".
	Model string `json:"model"`
	// PCI address of the physical function; generated when empty.
	PCI string `json:"pci,omitempty"`
	// UUID ("GPU-…"); derived from the PCI address when empty.
	UUID string `json:"uuid,omitempty"`
	// Flavour of vGPU creation: mdev, vfio or none; default the model's first flow.
	Flavour gpu.Flavour `json:"flavour,omitempty"`
	// MIG: initial MIG mode (enabled after boot).
	MIG bool `json:"mig,omitempty"`
	// VFs: whether SR-IOV VFs are enabled at boot (sriov-manage -e ran); default true
	// where the flavour needs them.
	VFs *bool `json:"vfs,omitempty"`
	// Heterogeneous: initial mixed-size vGPU mode.
	Heterogeneous bool `json:"heterogeneous,omitempty"`
	// NUMANode of the GPU.
	NUMANode int `json:"numaNode,omitempty"`
	// ECCOff: ECC is disabled (nvidia-smi -e 0); data-center GPUs ship
	// with it on. A vGPU moves only between GPUs of the same ECC setting.
	ECCOff bool `json:"eccOff,omitempty"`
	// NoLiveMigration: the driver does not move this GPU's vGPUs with a
	// running VM (nvmlGetVgpuCompatibility answers without the live bit),
	// as a host whose vGPU migration is not enabled.
	NoLiveMigration bool `json:"noLiveMigration,omitempty"`
}

// Driver describes the simulated NVIDIA driver.
type Driver struct {
	Version     string `json:"version,omitempty"`
	NVMLVersion string `json:"nvmlVersion,omitempty"`
	// Absent simulates a host without the driver: NVML Init fails with
	// LIBRARY_NOT_FOUND and no vGPU sysfs entries exist.
	Absent bool `json:"absent,omitempty"`
}

// Options are the driver behaviours the reference marks as uncertain or
// host-dependent ([X]); each is a knob.
type Options struct {
	// MIGModeNeedsReset: a MIG mode change stays pending until a GPU reset
	// even on an idle GPU (vGPU hosts, gpu-operator #2603).
	MIGModeNeedsReset bool `json:"migModeNeedsReset,omitempty"`
	// MIGModeLostOnReboot: MIG mode does not survive a host reboot (Hopper+
	// vGPU hosts per some reports; Ampere keeps it).
	MIGModeLostOnReboot bool `json:"migModeLostOnReboot,omitempty"`
	// MixSeries: in homogeneous mode, types of another series with the same
	// framebuffer size stay creatable after the first vGPU.
	MixSeries bool `json:"mixSeries,omitempty"`
	// VFsRestoredOnReboot: the boot unit re-runs sriov-manage -e after a reboot
	// (default true: set false to simulate a host that forgot).
	VFsRestoredOnReboot *bool `json:"vfsRestoredOnReboot,omitempty"`
	// NVMLSessions: each process's NVML holds a session on every GPU from
	// its first Init to its last Shutdown (or exit), and the driver refuses
	// a GPU reset and sriov-manage -d while one is open (sessions.go). Off,
	// the default, sessions are not modelled, so that the hand-driven
	// events (vgpud sim reset-gpu) work while the daemon runs.
	NVMLSessions bool `json:"nvmlSessions,omitempty"`
	// CallLatency is added to every NVML call (e.g. "50us"); fault rules add more.
	CallLatency string `json:"callLatency,omitempty"`
	// Latency is the time each GPU-changing driver operation takes, per
	// GPU (latency.go); nil: none.
	Latency *Latency `json:"latency,omitempty"`
}

// The PCI addresses of the built-in host's GPUs (DefaultSpec), by which
// tests and examples name them.
const (
	// DefaultH100MIG is the H100 in MIG mode (vendor VFIO).
	DefaultH100MIG = "0000:41:00.0"
	// DefaultH100TS is the H100 with time-sliced vGPUs on its VFs.
	DefaultH100TS = "0000:61:00.0"
	// DefaultL4 is the L4 (vendor VFIO, NUMA node 1).
	DefaultL4 = "0000:81:00.0"
	// DefaultA10 is the A10 with legacy mdev vGPUs on its VFs (NUMA node 1).
	DefaultA10 = "0000:a1:00.0"
)

// DefaultSpec is the built-in host: MIG on an H100, time-sliced vendor-VFIO
// vGPUs on a second H100 and an L4, legacy mdev on an A10.
func DefaultSpec() *Spec {
	return &Spec{
		Version: "v1",
		GPUs: []GPUSpec{
			{Model: "H100-SXM5-80GB", PCI: DefaultH100MIG, Flavour: gpu.FlavourVFIO, MIG: true},
			{Model: "H100-SXM5-80GB", PCI: DefaultH100TS, Flavour: gpu.FlavourVFIO},
			{Model: "L4-24GB", PCI: DefaultL4, Flavour: gpu.FlavourVFIO, NUMANode: 1},
			{Model: "A10-24GB", PCI: DefaultA10, Flavour: gpu.FlavourMdev, NUMANode: 1},
		},
	}
}

// LoadSpec reads a host description file.
func LoadSpec(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read simulated host description: %w", err)
	}
	return ParseSpec(path, data)
}

// ParseSpec decodes a host description; name is used in errors. It does
// not check models against a catalog: Validate does.
func ParseSpec(name string, data []byte) (*Spec, error) {
	var s Spec
	if err := yaml.UnmarshalStrict(data, &s); err != nil {
		msg := err.Error()
		msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
		msg = strings.TrimPrefix(msg, "error unmarshaling JSON: ")
		msg = strings.TrimPrefix(msg, "while decoding JSON: ")
		return nil, fmt.Errorf("%w: %s: %s", ErrBadSpec, name, msg)
	}
	if s.Version != "v1" {
		return nil, fmt.Errorf("%w: %s: version: want \"v1\", got %q", ErrBadSpec, name, s.Version)
	}
	return &s, nil
}

// Validate checks the spec against the catalog and fills defaults.
func (s *Spec) Validate(cat *profile.Catalog) error {
	if len(s.GPUs) == 0 {
		return fmt.Errorf("%w: gpus: at least one GPU", ErrBadSpec)
	}
	if len(s.GPUs) > 64 {
		return fmt.Errorf("%w: gpus: at most 64 GPUs, got %d", ErrBadSpec, len(s.GPUs))
	}
	if _, err := s.callLatency(); err != nil {
		return fmt.Errorf("%w: options.callLatency: %w", ErrBadSpec, err)
	}
	if s.Options.Latency != nil {
		if _, err := s.Options.Latency.parse(); err != nil {
			return fmt.Errorf("%w: options.latency.%w", ErrBadSpec, err)
		}
	}
	seenPCI, seenUUID := map[string]int{}, map[string]int{}
	busy := givenBuses(s.GPUs)
	for i := range s.GPUs {
		g := &s.GPUs[i]
		fld := fmt.Sprintf("gpus[%d]", i)
		m, ok := cat.Model(g.Model)
		if !ok {
			names := []string{}
			for _, m := range cat.Models() {
				names = append(names, m.Name)
			}
			return fmt.Errorf("%w: %s.model: %q is not in the catalog (known: %s)", ErrBadSpec, fld, g.Model, strings.Join(names, ", "))
		}
		if g.PCI == "" {
			bus, ok := defaultBus(i, busy)
			if !ok {
				return fmt.Errorf("%w: %s.pci: no free PCI bus left for a generated address; give pci: fields", ErrBadSpec, fld)
			}
			busy[bus] = true
			g.PCI = fmt.Sprintf("0000:%02x:00.0", bus)
		}
		pci, err := gpu.NormalizePCI(g.PCI)
		if err != nil {
			return fmt.Errorf("%w: %s.pci: %w", ErrBadSpec, fld, err)
		}
		if a, _ := gpu.ParsePCI(pci); a.Function != 0 || a.Device > 0x0f {
			return fmt.Errorf("%w: %s.pci: %s must be function 0 on device 00-0f (room for its VFs)", ErrBadSpec, fld, pci)
		}
		g.PCI = pci
		if j, dup := seenPCI[pci]; dup {
			return fmt.Errorf("%w: %s.pci: %s already used by gpus[%d]", ErrBadSpec, fld, pci, j)
		}
		seenPCI[pci] = i
		if g.UUID == "" {
			g.UUID = uuidFor(pci)
		}
		if !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) != 40 {
			return fmt.Errorf("%w: %s.uuid: %q is not GPU-<36-char UUID>", ErrBadSpec, fld, g.UUID)
		}
		if j, dup := seenUUID[g.UUID]; dup {
			return fmt.Errorf("%w: %s.uuid: already used by gpus[%d]", ErrBadSpec, fld, j)
		}
		seenUUID[g.UUID] = i
		if g.Flavour == "" {
			g.Flavour = gpu.FlavourNone
			if m.VGPU != nil && len(m.VGPU.Flows) > 0 {
				g.Flavour = gpu.Flavour(m.VGPU.Flows[0])
			}
		}
		switch g.Flavour {
		case gpu.FlavourNone:
		case gpu.FlavourMdev, gpu.FlavourVFIO:
			if m.VGPU == nil || !hasFlow(m, string(g.Flavour)) {
				return fmt.Errorf("%w: %s.flavour: model %s does not offer the %s flow", ErrBadSpec, fld, m.Name, g.Flavour)
			}
		default:
			return fmt.Errorf("%w: %s.flavour: %q is not mdev, vfio or none", ErrBadSpec, fld, g.Flavour)
		}
		if g.MIG && m.MIG == nil {
			return fmt.Errorf("%w: %s.mig: model %s has no MIG", ErrBadSpec, fld, m.Name)
		}
		if g.Heterogeneous && (m.VGPU == nil || !m.VGPU.Heterogeneous) {
			return fmt.Errorf("%w: %s.heterogeneous: model %s has no heterogeneous vGPU mode", ErrBadSpec, fld, m.Name)
		}
		if g.Heterogeneous && g.MIG {
			return fmt.Errorf("%w: %s.heterogeneous: not available with MIG enabled", ErrBadSpec, fld)
		}
		if g.VFs != nil && *g.VFs && (m.VGPU == nil || m.VGPU.SRIOVVFs == 0) {
			return fmt.Errorf("%w: %s.vfs: model %s has no SR-IOV", ErrBadSpec, fld, m.Name)
		}
	}
	return nil
}

func hasFlow(m *profile.Model, f string) bool {
	for _, x := range m.VGPU.Flows {
		if x == f {
			return true
		}
	}
	return false
}

// givenBuses are the PCI buses of domain 0 the spec's GPUs name.
func givenBuses(gpus []GPUSpec) map[int]bool {
	out := map[int]bool{}
	for _, g := range gpus {
		if pci, err := gpu.NormalizePCI(g.PCI); err == nil && g.PCI != "" {
			if a, err := gpu.ParsePCI(pci); err == nil && a.Domain == 0 {
				out[int(a.Bus)] = true
			}
		}
	}
	return out
}

// defaultBus is the bus of the i-th GPU's generated address: 0x41, 0x61,
// ... 0xe1 for the first six (the built-in host's), then the lowest bus
// from 0x01 that no GPU uses, so any number of GPUs up to the limit gets a
// valid address.
func defaultBus(i int, busy map[int]bool) (int, bool) {
	if b := 0x41 + 0x20*i; b <= 0xff && !busy[b] {
		return b, true
	}
	for b := 0x01; b <= 0xff; b++ {
		if !busy[b] && (b < 0x41 || (b-0x41)%0x20 != 0) {
			return b, true
		}
	}
	return 0, false
}
