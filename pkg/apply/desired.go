package apply

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// Format names a file format Parse understands.
type Format string

const (
	// FormatVgpud is vgpud's own format (docs/apply.md).
	FormatVgpud Format = "vgpud"
	// FormatMigParted is the mig-configs file of NVIDIA mig-parted.
	FormatMigParted Format = "mig-parted"
	// FormatVGPUDeviceManager is the vgpu-configs file of NVIDIA
	// vgpu-device-manager.
	FormatVGPUDeviceManager Format = "vgpu-device-manager"
)

// Version is the only version of every accepted format.
const Version = "v1"

// DefaultTenant owns the instances of mig-parted and vgpu-device-manager
// files when no tenant is given: those formats have no tenants.
const DefaultTenant = "default"

// Desired is a parsed and validated description of the host's desired
// layout, in vgpud's terms whatever the file's format; VgpudYAML writes
// it as a vgpud file (an imported mig-parted or vgpu-device-manager config
// converts that way).
//
// Parse checks everything that does not depend on the host; Diff checks
// the rest (that GPUs and profiles exist, quotas, MIG modes).
type Desired struct {
	Version string `json:"version"`
	// Format is the format the file was written in.
	Format Format `json:"format,omitempty"`
	// Source is the file name given to Parse; errors name it.
	Source string `json:"source,omitempty"`
	// Config is the named config selected in a mig-parted or
	// vgpu-device-manager file.
	Config string `json:"config,omitempty"`
	// Prune undefines the host's tenants that Tenants does not list.
	Prune   bool          `json:"prune,omitempty"`
	Tenants []TenantSpec  `json:"tenants,omitempty"`
	Layout  []LayoutEntry `json:"layout,omitempty"`
}

// TenantSpec is one tenant of the file. Omitted quotas are unlimited and
// an omitted class is best-effort, as `vgpuctl tenant define` has them.
type TenantSpec struct {
	Name string `json:"name"`
	// VRAM is a byte quantity ("80GiB", "unlimited"; tenant.ParseBytes).
	VRAM string `json:"vram,omitempty"`
	// Compute is a compute quantity in GPUs ("2.5", "2500m";
	// tenant.ParseCompute).
	Compute string `json:"compute,omitempty"`
	// MaxInstances is a number or "unlimited".
	MaxInstances Count  `json:"maxInstances,omitempty"`
	Class        string `json:"class,omitempty"`
	// AllowedModels and AllowedProfiles restrict what the tenant may use;
	// empty allows anything.
	AllowedModels   []string `json:"allowedModels,omitempty"`
	AllowedProfiles []string `json:"allowedProfiles,omitempty"`
	// Ensure defines the tenant when the host lacks it and otherwise
	// leaves it as it is (the importers use it for the owning tenant).
	Ensure bool `json:"ensure,omitempty"`
}

// Tenant returns the tenant the spec describes. It fails only on a spec
// Parse did not validate.
func (s TenantSpec) Tenant() (tenant.Tenant, error) {
	t := tenant.Tenant{Name: s.Name, Quota: tenant.UnlimitedQuota(), Class: tenant.BestEffort,
		AllowedModels: s.AllowedModels, AllowedProfiles: s.AllowedProfiles}
	var err error
	if s.VRAM != "" {
		if t.Quota.VRAMBytes, err = tenant.ParseBytes(s.VRAM); err != nil {
			return t, err
		}
	}
	if s.Compute != "" {
		if t.Quota.ComputeMilli, err = tenant.ParseCompute(s.Compute); err != nil {
			return t, err
		}
	}
	if t.Quota.MaxInstances, err = s.MaxInstances.Value(); err != nil {
		return t, err
	}
	if s.Class != "" {
		if t.Class, err = tenant.ParseClass(s.Class); err != nil {
			return t, err
		}
	}
	return t, t.Validate()
}

// Count is an instance count: a whole number or "unlimited"; "" is
// unlimited. In YAML it may be written as a number or a string.
type Count string

// UnmarshalJSON takes a number or a string.
func (c *Count) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case string(b) == "null":
		*c = ""
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = Count(s)
	default:
		var n json.Number
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("maxInstances: want a number or \"unlimited\", got %s", compact(b))
		}
		*c = Count(n.String())
	}
	return nil
}

// MarshalJSON writes a number when the count is one.
func (c Count) MarshalJSON() ([]byte, error) {
	if _, err := strconv.ParseUint(string(c), 10, 64); err == nil {
		return []byte(c), nil
	}
	return json.Marshal(string(c))
}

// Value is the count, tenant.Unlimited for "" and "unlimited".
func (c Count) Value() (uint64, error) {
	s := strings.TrimSpace(string(c))
	if s == "" || strings.EqualFold(s, "unlimited") {
		return tenant.Unlimited, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w %q: want a whole number of instances or \"unlimited\"", tenant.ErrInvalidQuantity, string(c))
	}
	return n, nil
}

// LayoutEntry describes the instances of one GPU or of a set of GPUs.
// Exactly one of GPU, Model and All selects the GPUs. A GPU an entry
// covers is described completely (within Scope): vgpud instances on it
// that the entry does not list are destroyed. When entries overlap, a GPU
// entry wins over a Model entry, which wins over an All entry.
// Index orders of LayoutEntry.IndexOrder.
const (
	IndexNVML = "nvml"
	IndexPCI  = "pci"
)

type LayoutEntry struct {
	// GPU is one GPU by PCI address, UUID or NVML index.
	GPU string `json:"gpu,omitempty"`
	// Model covers every GPU of this catalog model ("H100-SXM5-80GB").
	Model string `json:"model,omitempty"`
	// All covers every GPU of the host.
	All bool `json:"all,omitempty"`
	// DeviceIDs narrows Model and All to GPUs whose PCI device and vendor
	// id is listed, written as mig-parted does: "0x233010DE".
	DeviceIDs []string `json:"deviceIDs,omitempty"`
	// MIG is the GPU's MIG mode; when nil it follows from the profiles
	// (MIG profiles and MIG-backed vGPU types need it on, time-sliced vGPU
	// types off) and is left alone when they say nothing.
	MIG *bool `json:"mig,omitempty"`
	// Scope lists the instance kinds the entry describes (mig, mig-vgpu,
	// vgpu, passthrough); instances of other kinds on the GPU are left
	// alone unless a MIG mode change needs the GPU empty. Empty: all kinds.
	Scope []store.InstanceKind `json:"scope,omitempty"`
	// Scheduler pins the time-sliced vGPU scheduler of the GPUs, or hands
	// them to the share loop (mode adaptive); nil leaves it alone.
	Scheduler *SchedulerSpec `json:"scheduler,omitempty"`
	// Instances are the wanted instances.
	Instances []InstanceSpec `json:"instances,omitempty"`
	// IndexOrder says how a numeric GPU counts: "" (or "nvml") by NVML's
	// index, as mig-parted counts; "pci" by PCI address, the n-th GPU in
	// address order, as vgpu-device-manager counts.
	IndexOrder string `json:"indexOrder,omitempty"`
	// Optional entries are skipped when they select no GPU of this host,
	// as mig-parted and vgpu-device-manager skip an entry whose devices or
	// device filter match nothing: one config can then hold entries for
	// several models. Diff lists what it skipped, and fails when it skips
	// every entry. NVIDIA's formats set it on every entry.
	Optional bool `json:"optional,omitempty"`
	// Source says where the entry was written ("layout[2]",
	// "mig-configs.custom[1]"); errors name it. Parse sets it.
	Source string `json:"source,omitempty"`
}

// InstanceSpec asks for Count instances of Profile owned by Tenant.
type InstanceSpec struct {
	// Profile is any name `vgpuctl create` takes: "3g.40gb",
	// "H100-SXM5-80GB/3g.40gb", "H100XM-3-40C", "NVIDIA L4-4Q", "passthrough".
	Profile string `json:"profile"`
	Tenant  string `json:"tenant"`
	// Count defaults to 1; 0 asks for none.
	Count *int `json:"count,omitempty"`
	// Scheduler pins the vGPU scheduler of the GPU instances that hold
	// these instances (MIG-backed vGPU types of Blackwell GB20x GPUs, whose
	// GPU instances time-slice their vGPUs), or drops the pins (mode
	// adaptive); nil leaves them alone.
	Scheduler *SchedulerSpec `json:"scheduler,omitempty"`
}

// N is the number of instances asked for.
func (s InstanceSpec) N() int {
	if s.Count == nil {
		return 1
	}
	return *s.Count
}

// FileError is a problem with a desired-layout file: which file, which
// named config, which field, and what is wrong. It wraps Kind, a manager
// sentinel (manager.ErrInvalidArgument unless a GPU or tenant the file
// names is missing, or the host refuses the layout), and the cause.
type FileError struct {
	File   string `json:"file"`
	Config string `json:"config,omitempty"`
	Field  string `json:"field,omitempty"`
	Msg    string `json:"message"`
	Kind   error  `json:"-"`
	Err    error  `json:"-"`
}

func (e *FileError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Config != "" {
		fmt.Fprintf(&b, " (config %s)", e.Config)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

func (e *FileError) Unwrap() []error {
	kind := e.Kind
	if kind == nil {
		kind = manager.ErrInvalidArgument
	}
	if e.Err != nil {
		return []error{kind, e.Err}
	}
	return []error{kind}
}

// Options modify ParseWith.
type Options struct {
	// Config selects a named config of a mig-parted or
	// vgpu-device-manager file; required there, refused for vgpud files.
	Config string
	// Tenant owns the instances of a mig-parted or vgpu-device-manager
	// config (default DefaultTenant). It is defined, unlimited, when the
	// host lacks it, and left as it is otherwise.
	Tenant string
}

// Parse reads a desired-layout file in any accepted format, detected by
// its top-level keys (mig-configs: mig-parted; vgpu-configs:
// vgpu-device-manager; anything else: vgpud). name is used in errors.
// selectConfig picks the named config of a mig-parted or
// vgpu-device-manager file, optionally followed by "@TENANT" to name the
// owning tenant ("all-1g.10gb@acme"); without it the tenant is
// DefaultTenant. Errors are *FileError wrapping manager.ErrInvalidArgument.
func Parse(name string, data []byte, selectConfig string) (*Desired, error) {
	opts := Options{Config: selectConfig}
	if i := strings.LastIndex(selectConfig, "@"); i >= 0 {
		opts.Config, opts.Tenant = selectConfig[:i], selectConfig[i+1:]
		if opts.Tenant == "" {
			return nil, &FileError{File: name, Config: opts.Config, Msg: fmt.Sprintf("config selection %q names no tenant after '@'", selectConfig)}
		}
	}
	return ParseWith(name, data, opts)
}

// maxFileSize bounds what Parse reads: a layout for a large host is a few
// kilobytes, and the YAML decoder's work grows with its input.
const maxFileSize = 4 << 20

// ParseWith is Parse with the tenant given separately.
func ParseWith(name string, data []byte, opts Options) (*Desired, error) {
	bad := func(field, format string, args ...any) error {
		return &FileError{File: name, Config: opts.Config, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if len(data) > maxFileSize {
		return nil, bad("", "%d bytes is larger than the %d a layout file may have", len(data), maxFileSize)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, bad("", "not YAML: %s", cleanYAMLError(err))
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil || top == nil {
		return nil, bad("", "want a mapping with a version key at the top, as in docs/apply.md")
	}
	_, mig := top["mig-configs"]
	_, vgpu := top["vgpu-configs"]
	var d *Desired
	switch {
	case mig && vgpu:
		return nil, bad("", "has both mig-configs and vgpu-configs; give one file of each")
	case mig:
		d, err = parseMigParted(name, data, opts)
	case vgpu:
		d, err = parseVGPUDeviceManager(name, data, opts)
	default:
		if opts.Config != "" || opts.Tenant != "" {
			return nil, bad("", "a vgpud file has no named configs or default tenant to select (got %q); its tenants and layout say everything", opts.Config+tenantSuffix(opts.Tenant))
		}
		d, err = parseVgpud(name, data)
	}
	if err != nil {
		return nil, err
	}
	if err := d.validate(); err != nil {
		return nil, err
	}
	return d, nil
}

func tenantSuffix(t string) string {
	if t == "" {
		return ""
	}
	return "@" + t
}

// cleanYAMLError drops the decoder's layering from its message.
func cleanYAMLError(err error) string {
	msg := err.Error()
	for _, p := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	return msg
}

// vgpudFile is the vgpud format as written.
type vgpudFile struct {
	Version string       `json:"version"`
	Prune   bool         `json:"prune,omitempty"`
	Tenants []TenantSpec `json:"tenants,omitempty"`
	Layout  []vgpudEntry `json:"layout,omitempty"`
}

type vgpudEntry struct {
	GPU        string               `json:"gpu,omitempty"`
	Model      string               `json:"model,omitempty"`
	All        bool                 `json:"all,omitempty"`
	DeviceIDs  []string             `json:"deviceIDs,omitempty"`
	MIG        *bool                `json:"mig,omitempty"`
	Scope      []store.InstanceKind `json:"scope,omitempty"`
	Scheduler  *SchedulerSpec       `json:"scheduler,omitempty"`
	Instances  []InstanceSpec       `json:"instances,omitempty"`
	IndexOrder string               `json:"indexOrder,omitempty"`
	Optional   bool                 `json:"optional,omitempty"`
}

func parseVgpud(name string, data []byte) (*Desired, error) {
	var f vgpudFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, &FileError{File: name, Msg: cleanYAMLError(err)}
	}
	if f.Version != Version {
		return nil, &FileError{File: name, Field: "version", Msg: fmt.Sprintf("want %q, got %q", Version, f.Version)}
	}
	d := &Desired{Version: Version, Format: FormatVgpud, Source: name, Prune: f.Prune, Tenants: f.Tenants}
	for i, e := range f.Layout {
		d.Layout = append(d.Layout, LayoutEntry{GPU: e.GPU, Model: e.Model, All: e.All, DeviceIDs: e.DeviceIDs,
			MIG: e.MIG, Scope: e.Scope, Scheduler: e.Scheduler, Instances: e.Instances, IndexOrder: e.IndexOrder, Optional: e.Optional,
			Source: fmt.Sprintf("layout[%d]", i)})
	}
	return d, nil
}

// VgpudYAML writes d in vgpud's own format: Parse of the result gives d
// back but for Format, Source, Config and the entries' Source.
func (d *Desired) VgpudYAML() ([]byte, error) {
	f := vgpudFile{Version: Version, Prune: d.Prune, Tenants: d.Tenants}
	for _, e := range d.Layout {
		f.Layout = append(f.Layout, vgpudEntry{GPU: e.GPU, Model: e.Model, All: e.All, DeviceIDs: e.DeviceIDs,
			MIG: e.MIG, Scope: e.Scope, Scheduler: e.Scheduler, Instances: e.Instances, IndexOrder: e.IndexOrder, Optional: e.Optional})
	}
	return yaml.Marshal(f)
}

// parseDeviceID reads a PCI device and vendor id as mig-parted writes it,
// "0x233010DE" (device 0x2330, vendor 0x10DE). mig-parted's subsystem
// form "0x233010DE:0x16C110DE" is refused: vgpud does not read subsystem ids.
func parseDeviceID(s string) (uint32, error) {
	if strings.Contains(s, ":") {
		return 0, fmt.Errorf("%q: subsystem ids are not supported; give the device and vendor id alone (\"0x233010DE\")", s)
	}
	hex := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	v, err := strconv.ParseUint(hex, 16, 32)
	if err != nil || len(hex) != 8 || len(hex) == len(s) {
		return 0, fmt.Errorf("%q: want 0x followed by the 4-digit device and 4-digit vendor id, e.g. \"0x233010DE\"", s)
	}
	return uint32(v), nil
}

// configNames lists the named configs of a file for error messages.
func configNames[V any](m map[string]V) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
