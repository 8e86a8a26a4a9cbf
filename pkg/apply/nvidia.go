package apply

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// The formats of NVIDIA mig-parted (api/spec/v1) and vgpu-device-manager
// (api/spec/v1): a version and named configs, each a list of entries that
// select GPUs by index ("all" or a list) and an optional PCI id filter,
// and say what to carve on them. Both tools replace what a GPU holds with
// the entry's devices; here an entry becomes a layout entry scoped to the
// kinds the tool manages, so a mig-parted config leaves time-sliced vGPUs
// alone and a vgpu-device-manager config leaves plain MIG instances alone.

type migPartedFile struct {
	Version    string                      `json:"version"`
	MigConfigs map[string][]migPartedEntry `json:"mig-configs"`
}

type migPartedEntry struct {
	DeviceFilter json.RawMessage `json:"device-filter,omitempty"`
	Devices      json.RawMessage `json:"devices"`
	MigEnabled   *bool           `json:"mig-enabled"`
	MigDevices   map[string]int  `json:"mig-devices"`
}

type vgpuDMFile struct {
	Version     string                   `json:"version"`
	VGPUConfigs map[string][]vgpuDMEntry `json:"vgpu-configs"`
}

type vgpuDMEntry struct {
	DeviceFilter json.RawMessage `json:"device-filter,omitempty"`
	Devices      json.RawMessage `json:"devices"`
	VGPUDevices  map[string]int  `json:"vgpu-devices"`
}

// importer carries what every entry of an imported config needs.
type importer struct {
	file, config, section, tenant string
}

func (im importer) bad(field string, cause error, format string, args ...any) error {
	f := fmt.Sprintf("%s.%s", im.section, im.config)
	if field != "" {
		f += field
	}
	return &FileError{File: im.file, Config: im.config, Field: f, Msg: fmt.Sprintf(format, args...), Err: cause}
}

// start checks the version and selection common to both formats.
func start[E any](name, section, version string, configs map[string][]E, opts Options) (importer, []E, error) {
	im := importer{file: name, config: opts.Config, section: section, tenant: opts.Tenant}
	fe := func(field, format string, args ...any) error {
		return &FileError{File: name, Config: opts.Config, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if version != Version {
		return im, nil, fe("version", "want %q, got %q", Version, version)
	}
	if len(configs) == 0 {
		return im, nil, fe(section, "at least one named config is required")
	}
	if opts.Config == "" {
		return im, nil, fe("", "select one of its %s configs (%s), e.g. `vgpuctl apply -f FILE --select NAME`", section, configNames(configs))
	}
	entries, ok := configs[opts.Config]
	if !ok {
		return im, nil, fe(section, "no config %q; the file has: %s", opts.Config, configNames(configs))
	}
	if len(entries) == 0 {
		return im, nil, fe(section+"."+opts.Config, "at least one entry is required")
	}
	if im.tenant == "" {
		im.tenant = DefaultTenant
	}
	if err := tenant.ValidateName(im.tenant); err != nil {
		return im, nil, &FileError{File: name, Config: opts.Config, Msg: "bad owning tenant", Err: err}
	}
	return im, entries, nil
}

func (im importer) desired(format Format) *Desired {
	return &Desired{Version: Version, Format: format, Source: im.file, Config: im.config,
		Tenants: []TenantSpec{{Name: im.tenant, Ensure: true}}}
}

// selection turns an entry's devices and device-filter into layout entries
// (one per listed index, or one for all).
func (im importer) selection(i int, devices, filter json.RawMessage) ([]LayoutEntry, error) {
	field := fmt.Sprintf("[%d]", i)
	var ids []string
	if len(filter) > 0 && string(filter) != "null" {
		var one string
		if err := json.Unmarshal(filter, &one); err == nil {
			if one != "" {
				ids = []string{one}
			}
		} else if err := json.Unmarshal(filter, &ids); err != nil {
			return nil, im.bad(field+".device-filter", nil, "want a PCI id or a list of them (\"0x233010DE\")")
		}
		if len(ids) == 0 {
			// An empty filter must not read as "no filter": that would
			// widen the entry to every GPU.
			return nil, im.bad(field+".device-filter", nil, "empty; give a PCI id (\"0x233010DE\") or leave device-filter out to match every GPU")
		}
		for j, id := range ids {
			if _, err := parseDeviceID(id); err != nil {
				return nil, im.bad(fmt.Sprintf("%s.device-filter[%d]", field, j), err, "bad PCI device id")
			}
		}
	}
	if len(devices) == 0 || string(devices) == "null" {
		return nil, im.bad(field, nil, "missing required field devices (all, or a list of GPU indices)")
	}
	var all string
	if err := json.Unmarshal(devices, &all); err == nil {
		if all != "all" {
			return nil, im.bad(field+".devices", nil, "want all or a list of GPU indices, got %q", all)
		}
		return []LayoutEntry{{All: true, DeviceIDs: ids, Source: fmt.Sprintf("%s.%s%s", im.section, im.config, field)}}, nil
	}
	var idx []int
	if err := json.Unmarshal(devices, &idx); err != nil {
		return nil, im.bad(field+".devices", nil, "want all or a list of GPU indices, got %s", compact(devices))
	}
	if len(idx) == 0 {
		return nil, im.bad(field+".devices", nil, "empty list; give all or GPU indices")
	}
	var out []LayoutEntry
	seen := map[int]bool{}
	for j, n := range idx {
		if n < 0 {
			return nil, im.bad(fmt.Sprintf("%s.devices[%d]", field, j), nil, "GPU index %d is negative", n)
		}
		if seen[n] {
			return nil, im.bad(fmt.Sprintf("%s.devices[%d]", field, j), nil, "GPU index %d is listed twice", n)
		}
		seen[n] = true
		// A filter on listed indices narrows them, as in mig-parted: it is
		// checked by Diff against the GPU the index names.
		out = append(out, LayoutEntry{GPU: strconv.Itoa(n), DeviceIDs: ids, Source: fmt.Sprintf("%s.%s%s", im.section, im.config, field)})
	}
	return out, nil
}

func compact(b json.RawMessage) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	s := buf.String()
	if len(s) > 60 {
		s = s[:60] + "…"
	}
	return s
}

// migProfileRE is mig-parted's profile grammar (go-nvlib's
// parseMigProfile): [<C>c.]<G>g.<GB>gb, then "+" attributes or "-"
// negated ones, comma-separated.
var migProfileRE = regexp.MustCompile(`^(?:([0-9]+)c\.)?([0-9]+)g\.([0-9]+)gb(?:([+-])([a-z0-9.,]+))?$`)

// migAttributes are the attribute suffixes mig-parted's configs use and
// the catalog names its profiles with: media extensions (+me), all media
// engines (+me.all), none of them (-me), graphics (+gfx).
var migAttributes = map[string]bool{"+me": true, "+me.all": true, "-me": true, "+gfx": true}

// migProfile maps a mig-parted profile to vgpud's name: the one place
// where mig-parted's profile names are read ("1g.10gb", "1g.24gb+gfx",
// "1g.24gb-me", "1c.3g.40gb"). An attribute the catalog has no profile
// for, or several at once, is refused by name.
func migProfile(s string) (string, error) {
	m := migProfileRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return "", fmt.Errorf("%q is not a MIG profile (want e.g. 1g.10gb, 3g.40gb, 1c.3g.40gb, 1g.10gb+me, 1g.24gb-me)", s)
	}
	attr := m[4] + m[5]
	if attr != "" && !migAttributes[attr] {
		return "", fmt.Errorf("%q: MIG profile attribute %q is not known (vgpud knows +me, +me.all, -me and +gfx, one at a time)", s, attr)
	}
	return migComputeProfile(s, m[1], m[2], m[2]+"g."+m[3]+"gb"+attr)
}

// migComputeProfile reads the compute-instance part of a mig-parted
// profile ("<C>c." before the GPU instance). A compute instance narrower
// than its GPU instance keeps its name ("1c.3g.40gb": one compute slice of
// a 3g.40gb, several sharing one GPU instance); one as wide as its GPU
// instance is the GPU-instance profile ("3c.3g.40gb" is "3g.40gb"), as
// nvidia-smi names it; a wider one is refused.
//
// Counts are compared as numbers and written as nvidia-smi writes them:
// "01c.3g.40gb" is "1c.3g.40gb", "03c.3g.40gb" is "3g.40gb".
func migComputeProfile(s, computeSlices, giSlices, gi string) (string, error) {
	if computeSlices == "" {
		return gi, nil
	}
	// The grammar admits digits only; a count too long for an int is out
	// of every range.
	c, cerr := strconv.Atoi(computeSlices)
	g, gerr := strconv.Atoi(giSlices)
	switch {
	case cerr != nil || gerr != nil || c == 0 || c > g:
		return "", fmt.Errorf("%q: a compute instance of %s slices does not fit a GPU instance of %s", s, computeSlices, giSlices)
	case c == g:
		return gi, nil
	}
	return strconv.Itoa(c) + "c." + gi, nil
}

func parseMigParted(name string, data []byte, opts Options) (*Desired, error) {
	var f migPartedFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, &FileError{File: name, Config: opts.Config, Msg: "not a mig-parted file: " + cleanYAMLError(err)}
	}
	im, entries, err := start(name, "mig-configs", f.Version, f.MigConfigs, opts)
	if err != nil {
		return nil, err
	}
	d := im.desired(FormatMigParted)
	for i, e := range entries {
		field := fmt.Sprintf("[%d]", i)
		sel, err := im.selection(i, e.Devices, e.DeviceFilter)
		if err != nil {
			return nil, err
		}
		if e.MigEnabled == nil {
			return nil, im.bad(field, nil, "missing required field mig-enabled")
		}
		if *e.MigEnabled && e.MigDevices == nil {
			return nil, im.bad(field, nil, "mig-devices is required when mig-enabled is true ({} for none)")
		}
		if !*e.MigEnabled && len(e.MigDevices) > 0 {
			return nil, im.bad(field+".mig-devices", nil, "MIG devices listed while mig-enabled is false")
		}
		var ins []InstanceSpec
		names := map[string]string{}
		for _, p := range sortedKeys(e.MigDevices) {
			n := e.MigDevices[p]
			fp := fmt.Sprintf("%s.mig-devices[%q]", field, p)
			prof, err := migProfile(p)
			if err != nil {
				return nil, im.bad(fp, err, "bad MIG profile")
			}
			if n < 0 {
				return nil, im.bad(fp, nil, "count %d is negative", n)
			}
			if prev, dup := names[prof]; dup {
				return nil, im.bad(fp, nil, "the same profile as %q", prev)
			}
			names[prof] = p
			if n == 0 {
				continue
			}
			ins = append(ins, InstanceSpec{Profile: prof, Tenant: im.tenant, Count: &n})
		}
		for _, s := range sel {
			s.Optional = true
			s.MIG = e.MigEnabled
			s.Scope = []store.InstanceKind{store.KindMIG, store.KindMIGVGPU}
			s.Instances = ins
			d.Layout = append(d.Layout, s)
		}
	}
	return d, nil
}

// vGPU type grammars of vgpu-device-manager (pkg/types/vgpu_type.go):
// time-sliced <GPU>-<GB><S>, where the GPU name may carry dash-separated
// words ("RTX5000-Ada-4Q"), and MIG-backed <GPU>-<G>-<GB><S>[ATTR] with
// ATTR one of ME, NOME, MEALL, GFX ("A30-1-6CME", "DC-1-24CGFX"); S is
// the series A, B, C or Q.
var (
	vgpuTimeSlicedRE = regexp.MustCompile(`^[A-Z0-9]+(?:-[a-zA-Z]+)*-(?:0|[1-9][0-9]*)[ABCQ]$`)
	vgpuMIGBackedRE  = regexp.MustCompile(`^[A-Z0-9]+-[1-9]-(?:0|[1-9][0-9]*)[ABCQ](?:ME|NOME|MEALL|GFX)?$`)
)

func isVGPUType(s string) bool {
	return vgpuTimeSlicedRE.MatchString(s) || vgpuMIGBackedRE.MatchString(s)
}

func parseVGPUDeviceManager(name string, data []byte, opts Options) (*Desired, error) {
	var f vgpuDMFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, &FileError{File: name, Config: opts.Config, Msg: "not a vgpu-device-manager file: " + cleanYAMLError(err)}
	}
	im, entries, err := start(name, "vgpu-configs", f.Version, f.VGPUConfigs, opts)
	if err != nil {
		return nil, err
	}
	d := im.desired(FormatVGPUDeviceManager)
	for i, e := range entries {
		field := fmt.Sprintf("[%d]", i)
		sel, err := im.selection(i, e.Devices, e.DeviceFilter)
		if err != nil {
			return nil, err
		}
		if e.VGPUDevices == nil {
			return nil, im.bad(field, nil, "missing required field vgpu-devices ({} for none)")
		}
		var ins []InstanceSpec
		for _, t := range sortedKeys(e.VGPUDevices) {
			n := e.VGPUDevices[t]
			ft := fmt.Sprintf("%s.vgpu-devices[%q]", field, t)
			// Type names there lack the driver's "NVIDIA " prefix; accept it anyway.
			typ := strings.TrimPrefix(strings.TrimSpace(t), "NVIDIA ")
			if !isVGPUType(typ) {
				return nil, im.bad(ft, nil, "%q is not a vGPU type name (want e.g. L4-4Q, A100-4C, RTX5000-Ada-4Q, A100-1-5C, A30-1-6CME, DC-1-24CGFX)", t)
			}
			if n <= 0 {
				return nil, im.bad(ft, nil, "count %d: want at least 1", n)
			}
			ins = append(ins, InstanceSpec{Profile: typ, Tenant: im.tenant, Count: &n})
		}
		for _, s := range sel {
			s.Optional = true
			if s.GPU != "" {
				// vgpu-device-manager counts GPUs in PCI address order
				// (go-nvlib nvpci.GetGPUs), not by NVML index.
				s.IndexOrder = IndexPCI
			}
			s.Scope = []store.InstanceKind{store.KindVGPU, store.KindMIGVGPU}
			s.Instances = ins
			d.Layout = append(d.Layout, s)
		}
	}
	return d, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
