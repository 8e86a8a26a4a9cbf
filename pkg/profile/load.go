package profile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// ErrInvalid is wrapped by every catalog error: bad YAML, an unknown field,
// a failed validation rule.
var ErrInvalid = errors.New("invalid catalog")

// Catalog is a validated set of models.
type Catalog struct {
	models []*Model
	byName map[string]*Model
}

// Models returns the models sorted by name.
func (c *Catalog) Models() []*Model { return c.models }

// Model returns the model with catalog name name.
func (c *Catalog) Model(name string) (*Model, bool) {
	m, ok := c.byName[name]
	return m, ok
}

// Identify returns the model of a GPU from its PCI device id (the upper 16
// bits of NVML's PciDeviceId, or sysfs "device") and, to tell apart SKUs
// that share a device id, its NVML product name.
func (c *Catalog) Identify(pciDeviceID uint16, product string) (*Model, bool) {
	var byID []*Model
	for _, m := range c.models {
		for _, id := range m.PCIDeviceIDs {
			if v, err := parseHex16(id); err == nil && v == pciDeviceID {
				byID = append(byID, m)
			}
		}
	}
	for _, m := range byID {
		if m.Product == product {
			return m, true
		}
	}
	if len(byID) > 0 {
		return byID[0], true
	}
	for _, m := range c.models {
		if product != "" && m.Product == product {
			return m, true
		}
	}
	return nil, false
}

// Parse decodes and validates one model file. name is used in error messages.
func Parse(name string, data []byte) (*Model, error) {
	var m Model
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %s%s", ErrInvalid, name, modelLabel(data), cleanYAMLError(err))
	}
	m.source = name
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, name, err)
	}
	return &m, nil
}

// modelLabel returns "model <name>: " for a file that failed to decode, so
// that the error names the model as well as the file: a lenient decode finds
// the name when the strict one failed on a field; for a syntax error, the
// first top-level "name:" line is taken. It returns "" when neither works.
func modelLabel(data []byte) string {
	var probe struct {
		Name string `json:"name"`
	}
	if err := yaml.Unmarshal(data, &probe); err == nil {
		if probe.Name != "" {
			return "model " + probe.Name + ": "
		}
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "name:"); ok {
			if v, _, _ = strings.Cut(v, "#"); strings.TrimSpace(v) != "" {
				return "model " + strings.Trim(strings.TrimSpace(v), `"'`) + ": "
			}
		}
	}
	return ""
}

// cleanYAMLError drops the converter's internal wording so that the message
// names the problem and its line.
func cleanYAMLError(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "error converting YAML to JSON: ")
	s = strings.TrimPrefix(s, "error unmarshaling JSON: ")
	s = strings.TrimPrefix(s, "while decoding JSON: ")
	return s
}

// Load reads every *.yaml file of base, then of each override directory in
// order; an override file whose model name is already known replaces that
// model, a new name adds one. A missing override directory, or an empty
// path (none configured), is not an error.
func Load(base fs.FS, overrideDirs ...string) (*Catalog, error) {
	byName := map[string]*Model{}
	if err := loadFS(base, ".", byName, false); err != nil {
		return nil, err
	}
	for _, dir := range overrideDirs {
		if dir == "" {
			continue
		}
		fsys := os.DirFS(dir)
		if _, err := fs.Stat(fsys, "."); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := loadFS(fsys, dir, byName, true); err != nil {
			return nil, err
		}
	}
	c := &Catalog{byName: byName}
	for _, m := range byName {
		c.models = append(c.models, m)
	}
	sort.Slice(c.models, func(i, j int) bool { return c.models[i].Name < c.models[j].Name })
	// One driver branch gives each vGPU type id one meaning on every GPU.
	typeOwner := map[int]*Model{}
	for _, m := range c.models {
		if m.VGPU == nil {
			continue
		}
		for _, t := range m.VGPU.Types {
			if o, dup := typeOwner[t.ID]; dup {
				return nil, fmt.Errorf("%w: %s: model %s: vgpu type %s: id %d already used by model %s (%s)",
					ErrInvalid, m.source, m.Name, t.Name, t.ID, o.Name, o.source)
			}
			typeOwner[t.ID] = m
		}
	}
	return c, nil
}

func loadFS(fsys fs.FS, label string, byName map[string]*Model, override bool) error {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return fmt.Errorf("read catalog directory %s: %w", label, err)
	}
	seen := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !(strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".yml")) {
			continue
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return fmt.Errorf("read catalog file %s: %w", path.Join(label, e.Name()), err)
		}
		file := path.Join(label, e.Name())
		if label == "." {
			file = "profiles/" + e.Name()
		}
		m, err := Parse(file, data)
		if err != nil {
			return err
		}
		if prev, dup := seen[m.Name]; dup {
			return fmt.Errorf("%w: %s: model %s: name already defined in %s", ErrInvalid, file, m.Name, prev)
		}
		seen[m.Name] = file
		if _, exists := byName[m.Name]; exists && !override {
			return fmt.Errorf("%w: %s: model %s: name already defined", ErrInvalid, file, m.Name)
		}
		byName[m.Name] = m
	}
	return nil
}

func parseHex16(s string) (uint16, error) {
	if !strings.HasPrefix(s, "0x") {
		return 0, fmt.Errorf("want 0x-prefixed hex, got %q", s)
	}
	v, err := strconv.ParseUint(s[2:], 16, 16)
	if err != nil || len(s) != 6 {
		return 0, fmt.Errorf("want 4 hex digits as 0xNNNN, got %q", s)
	}
	return uint16(v), nil
}
