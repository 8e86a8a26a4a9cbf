package uevent

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzParse feeds raw datagrams as a uevent socket could receive them.
// Parse must not panic, must classify every failure as ErrMalformed or
// ErrNotKernel, and what it accepts must survive Marshal and Parse again.
func FuzzParse(f *testing.F) {
	seeds := [][]byte{
		msg("add@/devices/pci0000:40/0000:40:01.1/0000:41:00.4", "ACTION=add", "DEVPATH=/devices/pci0000:40/0000:40:01.1/0000:41:00.4",
			"SUBSYSTEM=pci", "PCI_ID=10DE:2330", "PCI_SLOT_NAME=0000:41:00.4", "SEQNUM=4711"),
		msg("remove@/devices/pci0000:a0/0000:a1:00.4/5b1a0f6e-8e0a-4f37-9c3e-1b2f0a8d9e01", "SUBSYSTEM=mdev", "MDEV_TYPE=nvidia-558"),
		msg("change@/devices/pci0000:60/0000:61:00.4", "SUBSYSTEM=pci", "NVIDIA_VGPU_TYPE=0"),
		msg("bind@/devices/pci0000:00/0000:00:02.0", "DRIVER=nvidia"),
		[]byte("libudev\x00\xfe\xed\xca\xfe"),
		[]byte("add@"),
		[]byte("@/devices/x\x00"),
		[]byte("add@/x\x00=\x00"),
		[]byte("add@/x\x00SEQNUM=18446744073709551616\x00"),
		{},
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNotKernel) {
				t.Fatalf("Parse(%q): unclassified error %v", b, err)
			}
			return
		}
		_ = ev.Name()
		_ = ev.String()
		again, err := Parse(ev.Marshal())
		if err != nil {
			t.Fatalf("Parse(Marshal(%+v)): %v", ev, err)
		}
		if !reflect.DeepEqual(again, ev) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again, ev)
		}
	})
}
