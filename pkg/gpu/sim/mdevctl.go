package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// The simulated host's mdevctl config directory, DIR/mdevctl.d, laid out
// as /etc/mdevctl.d is (<parent>/<uuid> JSON files). vgpud only reads it;
// MdevctlDefine writes a definition the way `mdevctl define` does, for
// tests and demos of a host where an operator uses mdevctl too. Unlike
// mdevctl, it does not create the mdev: start it through the sysfs view
// (the parent's mdev_supported_types/<type>/create), as mdevctl would.

// MdevctlDir is the simulated host's mdevctl config directory, for
// sysfs.Sysfs.WithMdevctl.
func (h *Host) MdevctlDir() string { return filepath.Join(h.dir, "mdevctl.d") }

// MdevctlDefine writes mdevctl's definition of mdev uuid on parent (a PCI
// address) with type ("nvidia-558") and start ("auto" or "manual").
func (h *Host) MdevctlDefine(parent, uuid, typ, start string) error {
	if start != "auto" && start != "manual" {
		return fmt.Errorf("mdevctl define %s: start %q, want auto or manual", uuid, start)
	}
	b, err := json.MarshalIndent(map[string]any{"mdev_type": typ, "start": start, "attrs": []any{}}, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Join(h.MdevctlDir(), parent)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mdevctl define %s: %w", uuid, err)
	}
	if err := os.WriteFile(filepath.Join(dir, uuid), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("mdevctl define %s: %w", uuid, err)
	}
	return nil
}
