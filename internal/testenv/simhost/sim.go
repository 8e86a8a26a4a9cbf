package simhost

import "strings"

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
