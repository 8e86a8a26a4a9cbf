package uevent

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func msg(parts ...string) []byte { return []byte(strings.Join(parts, "\x00") + "\x00") }

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    Event
		wantErr error
	}{
		{
			name: "pci-add",
			in: msg("add@/devices/pci0000:40/0000:40:01.1/0000:41:00.4", "ACTION=add",
				"DEVPATH=/devices/pci0000:40/0000:40:01.1/0000:41:00.4", "SUBSYSTEM=pci", "PCI_ID=10DE:2330",
				"PCI_SLOT_NAME=0000:41:00.4", "SEQNUM=4711"),
			want: Event{Action: Add, DevPath: "/devices/pci0000:40/0000:40:01.1/0000:41:00.4", Subsystem: "pci", Seq: 4711,
				Env: map[string]string{"ACTION": "add", "DEVPATH": "/devices/pci0000:40/0000:40:01.1/0000:41:00.4",
					"SUBSYSTEM": "pci", "PCI_ID": "10DE:2330", "PCI_SLOT_NAME": "0000:41:00.4", "SEQNUM": "4711"}},
		},
		{
			name: "mdev-remove-without-redundant-keys",
			in:   msg("remove@/devices/pci0000:a0/0000:a1:00.4/5b1a0f6e-8e0a-4f37-9c3e-1b2f0a8d9e01", "SUBSYSTEM=mdev"),
			want: Event{Action: Remove, DevPath: "/devices/pci0000:a0/0000:a1:00.4/5b1a0f6e-8e0a-4f37-9c3e-1b2f0a8d9e01", Subsystem: "mdev",
				Env: map[string]string{"ACTION": "remove", "DEVPATH": "/devices/pci0000:a0/0000:a1:00.4/5b1a0f6e-8e0a-4f37-9c3e-1b2f0a8d9e01", "SUBSYSTEM": "mdev"}},
		},
		{
			name: "bind-with-driver-and-empty-value",
			in:   msg("bind@/devices/pci0000:00/0000:00:02.0", "SUBSYSTEM=pci", "DRIVER=nvidia", "EMPTY="),
			want: Event{Action: Bind, DevPath: "/devices/pci0000:00/0000:00:02.0", Subsystem: "pci",
				Env: map[string]string{"ACTION": "bind", "DEVPATH": "/devices/pci0000:00/0000:00:02.0", "SUBSYSTEM": "pci", "DRIVER": "nvidia", "EMPTY": ""}},
		},
		{name: "libudev-rebroadcast", in: append([]byte("libudev\x00"), 0xfe, 0xed, 0xca, 0xfe), wantErr: ErrNotKernel},
		{name: "no-at", in: msg("add/devices/x", "SUBSYSTEM=pci"), wantErr: ErrMalformed},
		{name: "empty", in: nil, wantErr: ErrMalformed},
		{name: "empty-devpath", in: msg("add@"), wantErr: ErrMalformed},
		{name: "relative-devpath", in: msg("add@devices/x"), wantErr: ErrMalformed},
		{name: "upper-case-action", in: msg("ADD@/devices/x"), wantErr: ErrMalformed},
		{name: "action-disagrees", in: msg("add@/devices/x", "ACTION=remove"), wantErr: ErrMalformed},
		{name: "devpath-disagrees", in: msg("add@/devices/x", "DEVPATH=/devices/y"), wantErr: ErrMalformed},
		{name: "bad-seqnum", in: msg("add@/devices/x", "SEQNUM=12a"), wantErr: ErrMalformed},
		{name: "key-without-value-sign", in: msg("add@/devices/x", "JUSTAKEY"), wantErr: ErrMalformed},
		{name: "empty-key", in: msg("add@/devices/x", "=v"), wantErr: ErrMalformed},
		{name: "oversized", in: append(msg("add@/devices/x"), make([]byte, maxMessage)...), wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Parse: err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse:\n got %+v\nwant %+v", got, tt.want)
			}
			again, err := Parse(got.Marshal())
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("Marshal round trip: %+v, %v", again, err)
			}
		})
	}
}

func TestEventName(t *testing.T) {
	tests := []struct{ devpath, want string }{
		{"/devices/pci0000:40/0000:40:01.1/0000:41:00.0", "0000:41:00.0"},
		{"/devices/pci0000:a0/0000:a1:00.4/5b1a0f6e-8e0a-4f37-9c3e-1b2f0a8d9e01", "5b1a0f6e-8e0a-4f37-9c3e-1b2f0a8d9e01"},
		{"/devices/x/", "x"},
		{"/", ""},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := (Event{DevPath: tt.devpath}).Name(); got != tt.want {
				t.Fatalf("Name(%q) = %q, want %q", tt.devpath, got, tt.want)
			}
		})
	}
}
