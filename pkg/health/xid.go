package health

import "fmt"

// xidMeaning names the XIDs an operator is most likely to see.
var xidMeaning = map[uint64]string{
	13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing", 45: "preemptive cleanup",
	48: "double-bit ECC error", 62: "internal micro-controller halt", 63: "ECC page retirement or row remapping pending",
	64: "ECC page retirement or row remapping failure", 74: "NVLink error", 79: "GPU has fallen off the bus",
	92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
	119: "GSP RPC timeout", 120: "GSP error", 999: "unknown XID",
}

func xidText(x uint64) string {
	if m, ok := xidMeaning[x]; ok {
		return fmt.Sprintf("XID %d (%s)", x, m)
	}
	return fmt.Sprintf("XID %d", x)
}
