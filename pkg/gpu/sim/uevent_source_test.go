package sim_test

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/uevent"
)

// UeventSource delivers what another process sharing the host emits, as
// the kernel would on netlink (the event equals Parse of its wire form),
// and nothing emitted before it was opened.
func TestUeventSource(t *testing.T) {
	e := newEnv(t, nil)
	if err := e.h.EmitUevent("change", "devices/pci0000:40/0000:40:01.1/0000:41:00.0", "pci", nil); err != nil {
		t.Fatal(err)
	}
	src, err := e.h.UeventSource()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })

	other, err := sim.Open(e.h.Dir(), nil, e.cat, sim.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	if err := other.EmitUevent("add", "devices/pci0000:40/0000:40:01.1/0000:41:00.4", "pci", map[string]string{"PCI_SLOT_NAME": "0000:41:00.4"}); err != nil {
		t.Fatal(err)
	}
	_, seq, err := e.h.UeventsSince(0)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := src.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	want := uevent.Event{Action: uevent.Add, DevPath: "/devices/pci0000:40/0000:40:01.1/0000:41:00.4", Subsystem: "pci", Seq: seq,
		Env: map[string]string{"ACTION": "add", "DEVPATH": "/devices/pci0000:40/0000:40:01.1/0000:41:00.4", "SUBSYSTEM": "pci",
			"SEQNUM": strconv.FormatUint(seq, 10), "PCI_SLOT_NAME": "0000:41:00.4"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Next = %+v, want %+v", got, want)
	}
	wire, err := uevent.Parse(got.Marshal())
	if err != nil {
		t.Fatalf("Parse(Marshal): %v", err)
	}
	if !reflect.DeepEqual(wire, got) {
		t.Fatalf("the kernel's wire form of %+v parses to %+v", got, wire)
	}
}
