package apply

// Format names a file format Parse understands.
type Format string

const (
	FormatVgpud      Format = "vgpud"
	FormatMigParted  Format = "mig-parted"
	FormatVGPUDevMgr Format = "vgpu-device-manager"
)

// Desired is the parsed, validated description of the host's desired
// layout, in vgpud's own terms whatever the file's format.
type Desired struct {
	Version string        `json:"version"`
	Format  Format        `json:"format,omitempty"`
	Source  string        `json:"source,omitempty"`
	Config  string        `json:"config,omitempty"`
	Prune   bool          `json:"prune,omitempty"`
	Tenants []TenantSpec  `json:"tenants,omitempty"`
	Layout  []LayoutEntry `json:"layout,omitempty"`
}

// TenantSpec is one tenant of the file.
type TenantSpec struct {
	Name            string   `json:"name"`
	VRAM            string   `json:"vram,omitempty"`
	Compute         string   `json:"compute,omitempty"`
	MaxInstances    Count    `json:"maxInstances,omitempty"`
	Class           string   `json:"class,omitempty"`
	AllowedModels   []string `json:"allowedModels,omitempty"`
	AllowedProfiles []string `json:"allowedProfiles,omitempty"`
	Ensure          bool     `json:"ensure,omitempty"`
}

// Count is an instance count: a number or "unlimited".
type Count string

// LayoutEntry describes the instances of one GPU or a set of GPUs.
type LayoutEntry struct {
	GPU       string         `json:"gpu,omitempty"`
	Model     string         `json:"model,omitempty"`
	All       bool           `json:"all,omitempty"`
	DeviceIDs []string       `json:"deviceIDs,omitempty"`
	MIG       *bool          `json:"mig,omitempty"`
	Scope     []string       `json:"scope,omitempty"`
	Instances []InstanceSpec `json:"instances,omitempty"`
	From      string         `json:"from,omitempty"`
}

// InstanceSpec asks for Count instances of Profile for Tenant.
type InstanceSpec struct {
	Profile string `json:"profile"`
	Tenant  string `json:"tenant"`
	Count   *int   `json:"count,omitempty"`
}

// Options modify ParseWith.
type Options struct {
	Config string
	Tenant string
}

// DefaultTenant owns the instances of mig-parted and vgpu-device-manager
// files when no tenant is given.
const DefaultTenant = "default"

// Parse reads a desired-layout file.
func Parse(name string, data []byte, selectConfig string) (*Desired, error) {
	return ParseWith(name, data, Options{Config: selectConfig})
}

// ParseWith is Parse with every option.
func ParseWith(name string, data []byte, opts Options) (*Desired, error) {
	return nil, nil
}
