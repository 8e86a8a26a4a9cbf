package sim_test

import (
	"strings"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// A host of more than six GPUs without pci: fields gets a valid, distinct
// address for each, around the ones a spec names.
func TestSpecGeneratedAddresses(t *testing.T) {
	cat := catalog(t)
	text := "version: v1\ngpus:\n" + strings.Repeat("  - {model: L4-24GB}\n", 9) + "  - {model: L4-24GB, pci: '0000:01:00.0'}\n"
	s, err := sim.ParseSpec("host.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(cat); err != nil {
		t.Fatalf("10 GPUs, 9 without pci: %v", err)
	}
	seen := map[string]bool{}
	for i, g := range s.GPUs {
		a, err := gpu.ParsePCI(g.PCI)
		if err != nil || a.Device != 0 || a.Function != 0 || seen[g.PCI] {
			t.Fatalf("gpus[%d] got %q (%v; seen %v)", i, g.PCI, err, seen[g.PCI])
		}
		seen[g.PCI] = true
	}
	if s.GPUs[0].PCI != "0000:41:00.0" || s.GPUs[5].PCI != "0000:e1:00.0" {
		t.Errorf("the first six keep the built-in addresses: %s, %s", s.GPUs[0].PCI, s.GPUs[5].PCI)
	}
}
