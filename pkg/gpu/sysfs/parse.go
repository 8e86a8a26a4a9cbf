package sysfs

import (
	"fmt"
	"strconv"
	"strings"
)

// CreatableType is one line of nvidia/creatable_vgpu_types.
type CreatableType struct {
	ID   int
	Name string
}

// maxAttr bounds what the parsers accept: sysfs attributes are one page.
const maxAttr = 4096

// ParseCreatable parses nvidia/creatable_vgpu_types (reference 2.3): a
// header "ID    : vGPU Name", then "%-5d : %s" per type. A file with only
// the header means nothing is creatable on this VF now.
func ParseCreatable(data []byte) ([]CreatableType, error) {
	if len(data) > maxAttr {
		return nil, fmt.Errorf("%w: creatable_vgpu_types: %d bytes, more than a page", ErrParse, len(data))
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) == 0 || !isCreatableHeader(lines[0]) {
		return nil, fmt.Errorf("%w: creatable_vgpu_types: missing header \"ID    : vGPU Name\"", ErrParse)
	}
	var out []CreatableType
	for i, l := range lines[1:] {
		if strings.TrimSpace(l) == "" {
			continue
		}
		id, name, ok := strings.Cut(l, ":")
		if !ok {
			return nil, fmt.Errorf("%w: creatable_vgpu_types line %d: no ':' in %q", ErrParse, i+2, l)
		}
		n, err := strconv.Atoi(strings.TrimSpace(id))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%w: creatable_vgpu_types line %d: type id %q is not a positive integer", ErrParse, i+2, strings.TrimSpace(id))
		}
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, fmt.Errorf("%w: creatable_vgpu_types line %d: empty type name", ErrParse, i+2)
		}
		out = append(out, CreatableType{ID: n, Name: name})
	}
	return out, nil
}

func isCreatableHeader(l string) bool {
	id, name, ok := strings.Cut(l, ":")
	return ok && strings.TrimSpace(id) == "ID" && strings.TrimSpace(name) == "vGPU Name"
}

// Description is an mdev type's description attribute.
type Description struct {
	NumHeads       int
	FrameRateLimit int
	FramebufferMiB uint64
	MaxResolution  string
	MaxInstance    int
	// Unknown keeps keys this parser does not know, for newer drivers.
	Unknown string
}

// ParseDescription parses "num_heads=4, frl_config=60, framebuffer=1024M,
// max_resolution=5120x2880, max_instance=24" (reference 1.2). Unknown keys
// are kept, not refused: newer drivers add some.
func ParseDescription(data []byte) (Description, error) {
	var d Description
	if len(data) > maxAttr {
		return d, fmt.Errorf("%w: description: %d bytes, more than a page", ErrParse, len(data))
	}
	s := strings.TrimSpace(string(data))
	if s == "" {
		return d, fmt.Errorf("%w: description: empty", ErrParse)
	}
	var unknown []string
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return d, fmt.Errorf("%w: description: %q is not key=value", ErrParse, kv)
		}
		if seen[k] {
			return d, fmt.Errorf("%w: description: key %s twice", ErrParse, k)
		}
		seen[k] = true
		num := func() (int, error) {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("%w: description: %s=%q is not a non-negative integer", ErrParse, k, v)
			}
			return n, nil
		}
		var err error
		switch k {
		case "num_heads":
			d.NumHeads, err = num()
		case "frl_config":
			d.FrameRateLimit, err = num()
		case "max_instance":
			d.MaxInstance, err = num()
		case "framebuffer":
			mib, ok := strings.CutSuffix(v, "M")
			n, perr := strconv.ParseUint(mib, 10, 32)
			if !ok || perr != nil {
				return d, fmt.Errorf("%w: description: framebuffer=%q is not <MiB>M", ErrParse, v)
			}
			d.FramebufferMiB = n
		case "max_resolution":
			w, h, ok := strings.Cut(v, "x")
			_, e1 := strconv.ParseUint(w, 10, 16)
			_, e2 := strconv.ParseUint(h, 10, 16)
			if !ok || e1 != nil || e2 != nil {
				return d, fmt.Errorf("%w: description: max_resolution=%q is not WxH", ErrParse, v)
			}
			d.MaxResolution = v
		default:
			unknown = append(unknown, kv)
		}
		if err != nil {
			return d, err
		}
	}
	d.Unknown = strings.Join(unknown, ", ")
	return d, nil
}
