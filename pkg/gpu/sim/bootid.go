package sim

import "fmt"

// BootID names the simulated host's current boot, as
// /proc/sys/kernel/random/boot_id names a real host's: it changes with
// every simulated reboot.
func (h *Host) BootID() (string, error) {
	var boot int
	err := h.view(func(st *state) error { boot = st.Boot; return nil })
	if err != nil {
		return "", fmt.Errorf("simulated host: read boot: %w", err)
	}
	return fmt.Sprintf("sim-boot-%d", boot), nil
}
