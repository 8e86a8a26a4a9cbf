package simhost

import (
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/profiles"
)

// DevPath is the kernel device path (sysfs-relative, as a uevent's
// DEVPATH) of the simulated host's PCI function pci.
func DevPath(pci string) string { return "devices/pci0000:00/" + pci }

// SummaryLine is the line of a sim.Host Summary that describes the GPU at
// pci, "" when there is none.
func SummaryLine(summary, pci string) string {
	for _, l := range strings.Split(summary, "\n") {
		if strings.HasPrefix(l, pci) {
			return l
		}
	}
	return ""
}

// Scenario opens a fresh simulated host for the named scenario (see
// sim.ScenarioByName), edited by edit when it is not nil, on the manual
// clock, and builds it; the host is closed when the test ends.
func Scenario(t testing.TB, name string, edit func(*sim.Scenario)) (*sim.Host, *sim.Scenario) {
	t.Helper()
	sc, err := sim.ScenarioByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&sc)
	}
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.Open(t.TempDir(), sc.Spec, cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.UseManualClock(); err != nil {
		t.Fatal(err)
	}
	if err := sc.Build(h); err != nil {
		t.Fatal(err)
	}
	return h, &sc
}
