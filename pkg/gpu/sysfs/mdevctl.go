package sysfs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/vgpud/vgpud/pkg/gpu"
)

// mdevctl keeps persistent mdev definitions in its config directory,
// /etc/mdevctl.d: a directory per parent device, a JSON file per mdev
// named by its UUID ({"mdev_type": "nvidia-558", "start": "auto",
// "attrs": [...]}); with "start": "auto" a udev rule creates the mdev
// whenever its parent appears. vgpud reads the directory, never writes it,
// to say which foreign mdevs mdevctl owns (and would bring back at boot).
// The directory is an fs.FS so the simulator can provide its own.

// DefaultMdevctlDir is mdevctl's config directory.
const DefaultMdevctlDir = "/etc/mdevctl.d"

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// mdevctlFile is the JSON of one definition; attrs are device-specific
// and not needed here.
type mdevctlFile struct {
	MdevType string `json:"mdev_type"`
	Start    string `json:"start"`
}

// ReadMdevctl reads every definition in mdevctl's config directory fsys.
// A directory that does not exist (mdevctl not installed) holds none.
// Entries that are not definitions (mdevctl's scripts.d, files not named
// by a UUID) are skipped; a definition that does not parse is reported in
// the error, joined, while the others are still returned.
func ReadMdevctl(fsys fs.FS) ([]gpu.MdevctlDefinition, error) {
	parents, err := fs.ReadDir(fsys, ".")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mdevctl definitions: %w", err)
	}
	var out []gpu.MdevctlDefinition
	var errs []error
	for _, p := range parents {
		if !p.IsDir() {
			continue
		}
		files, err := fs.ReadDir(fsys, p.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("mdevctl definitions of %s: %w", p.Name(), err))
			continue
		}
		for _, f := range files {
			if f.IsDir() || !uuidRE.MatchString(f.Name()) {
				continue
			}
			name := path.Join(p.Name(), f.Name())
			d, err := readMdevctlFile(fsys, name)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, errors.Join(errs...)
}

func readMdevctlFile(fsys fs.FS, name string) (gpu.MdevctlDefinition, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return gpu.MdevctlDefinition{}, fmt.Errorf("mdevctl definition %s: %w", name, err)
	}
	var f mdevctlFile
	if err := json.Unmarshal(b, &f); err != nil {
		return gpu.MdevctlDefinition{}, fmt.Errorf("mdevctl definition %s: %w", name, err)
	}
	if f.MdevType == "" {
		return gpu.MdevctlDefinition{}, fmt.Errorf("mdevctl definition %s: no mdev_type", name)
	}
	if f.Start != "auto" && f.Start != "manual" {
		return gpu.MdevctlDefinition{}, fmt.Errorf("mdevctl definition %s: start %q, want auto or manual", name, f.Start)
	}
	parent, uuid := path.Split(name)
	return gpu.MdevctlDefinition{UUID: strings.ToLower(uuid), Parent: strings.TrimSuffix(parent, "/"), Type: f.MdevType, Start: f.Start, File: name}, nil
}

// ParseMdevctlList reads the output of `mdevctl list --defined`: a line
// "UUID PARENT TYPE START" per definition, optionally followed by indented
// attribute lines (--verbose), which are skipped. Any other line is an
// error naming it.
func ParseMdevctlList(r io.Reader) ([]gpu.MdevctlDefinition, error) {
	var out []gpu.MdevctlDefinition
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
			continue
		}
		f := strings.Fields(line)
		// An active device also defined shows "(defined)" in plain `list`;
		// `list --defined` prints the start policy, possibly followed by
		// "(active)" in newer versions.
		if len(f) == 5 && f[4] == "(active)" {
			f = f[:4]
		}
		if len(f) != 4 || !uuidRE.MatchString(f[0]) || (f[3] != "auto" && f[3] != "manual") {
			return nil, fmt.Errorf("mdevctl list line %d: %q is not \"UUID PARENT TYPE auto|manual\"", n, line)
		}
		out = append(out, gpu.MdevctlDefinition{UUID: strings.ToLower(f[0]), Parent: f[1], Type: f[2], Start: f[3]})
	}
	return out, sc.Err()
}

// MdevctlLine is d as `mdevctl list --defined` prints it.
func MdevctlLine(d gpu.MdevctlDefinition) string {
	return fmt.Sprintf("%s %s %s %s", d.UUID, d.Parent, d.Type, d.Start)
}
