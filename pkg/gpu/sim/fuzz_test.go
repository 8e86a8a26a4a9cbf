package sim_test

import (
	"errors"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

func FuzzParseSpec(f *testing.F) {
	cat := catalog(f)
	for _, s := range []string{
		"version: v1\ngpus: [{model: L4-24GB}]",
		"version: v1\ngpus:\n - {model: H100-SXM5-80GB, mig: true, pci: '0000:41:00.0'}\n - {model: A10-24GB, flavour: mdev}\n",
		"version: v1\ngpus: [{model: L4-24GB}]\noptions: {callLatency: 1ms, mixSeries: true}",
		"version: v2", "", "{", "gpus: 3", "version: v1\ngpus: [{model: L4-24GB, vfs: true, uuid: GPU-x}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := sim.ParseSpec("fuzz.yaml", data)
		if err == nil {
			err = s.Validate(cat)
		}
		if err != nil && !errors.Is(err, sim.ErrBadSpec) {
			t.Fatalf("error %v does not wrap ErrBadSpec", err)
		}
	})
}
