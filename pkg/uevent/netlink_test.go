//go:build linux

package uevent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A device whose uevent file any root process may write to ask the kernel
// for a synthetic "change" event; nothing reacts to /dev/null changing.
// The kernel takes "change UUID KEY=VALUE ...", keys and values
// alphanumeric, and adds SYNTH_UUID= and SYNTH_ARG_KEY= to the event.
const synthDevice = "/sys/devices/virtual/mem/null/uevent"

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: binds a NETLINK_KOBJECT_UEVENT socket and triggers a synthetic uevent")
	}
}

func randomUUID(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// TestNetlinkReceivesKernelUevent binds the socket, proves it is in the
// kernel's group, sends it a forged message from user space (which must be
// skipped), then asks the kernel for a synthetic uevent and reads it.
func TestNetlinkReceivesKernelUevent(t *testing.T) {
	requireRoot(t)
	n, err := OpenNetlink(NetlinkOptions{})
	if err != nil {
		t.Fatalf("OpenNetlink: %v", err)
	}
	defer n.Close()
	var sa unix.Sockaddr
	if err := n.rc.Control(func(fd uintptr) { sa, err = unix.Getsockname(int(fd)) }); err != nil || sa == nil {
		t.Fatalf("getsockname: %v", err)
	}
	nl := sa.(*unix.SockaddrNetlink)
	if nl.Groups&kernelGroup == 0 || nl.Pid == 0 {
		t.Fatalf("socket bound to %+v, want the kernel group and a port id", nl)
	}
	if size, err := n.ReceiveBuffer(); err != nil || size < 256<<10 {
		t.Fatalf("receive buffer %d (%v), want at least 256 KiB", size, err)
	}
	t.Logf("bound: port %d, groups %#x", nl.Pid, nl.Groups)

	// A forged "remove" from another socket: Next must not return it.
	forger, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(forger)
	forged := Event{Action: Remove, DevPath: "/devices/pci0000:40/0000:41:00.0", Subsystem: "pci"}.Marshal()
	if err := unix.Sendto(forger, forged, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Pid: nl.Pid}); err != nil {
		t.Fatalf("send forged message: %v", err)
	}

	id := randomUUID(t)
	if err := os.WriteFile(synthDevice, []byte("change "+id+" VGPUDTEST=1"), 0); err != nil {
		t.Skipf("cannot trigger a synthetic uevent here (%v); the socket binds, reception is unproven", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ev, err := n.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v (no synthetic uevent %s)", err, id)
		}
		if ev.Action == Remove && ev.DevPath == "/devices/pci0000:40/0000:41:00.0" {
			t.Fatalf("forged user-space message delivered: %v", ev)
		}
		if ev.Env["SYNTH_UUID"] != id {
			continue // some other device's event
		}
		if ev.Action != Change || ev.DevPath != "/devices/virtual/mem/null" || ev.Subsystem != "mem" || ev.Env["SYNTH_ARG_VGPUDTEST"] != "1" || ev.Seq == 0 {
			t.Fatalf("synthetic uevent decoded as %+v", ev)
		}
		t.Logf("received %v", ev)
		return
	}
}

// TestNetlinkOverflow fills a minimal receive buffer with synthetic
// uevents: the next read reports ErrOverflow, then the socket goes on.
func TestNetlinkOverflow(t *testing.T) {
	requireRoot(t)
	n, err := OpenNetlink(NetlinkOptions{ReceiveBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// A datagram costs its truesize (a few KiB) against the buffer, so a
	// few dozen overflow the kernel's minimum.
	for i := 0; i < 64; i++ {
		if err := os.WriteFile(synthDevice, []byte("change "+randomUUID(t)+" VGPUDTEST=1"), 0); err != nil {
			t.Skipf("cannot trigger synthetic uevents here: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	overflow := false
	for i := 0; i < 64 && !overflow; i++ {
		_, err := n.Next(ctx)
		switch {
		case errors.Is(err, ErrOverflow):
			overflow = true
		case err != nil:
			t.Fatalf("Next: %v", err)
		}
	}
	if !overflow {
		t.Fatal("64 queued uevents did not overflow a minimal receive buffer")
	}
	// Drain what is still queued, so the next event fits.
	for {
		dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := n.Next(dctx)
		dcancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil && !errors.Is(err, ErrOverflow) {
			t.Fatalf("drain: %v", err)
		}
	}
	id := randomUUID(t)
	if err := os.WriteFile(synthDevice, []byte("change "+id+" VGPUDTEST=2"), 0); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := n.Next(ctx)
		if err != nil && !errors.Is(err, ErrOverflow) {
			t.Fatalf("Next after overflow: %v", err)
		}
		if ev.Env["SYNTH_UUID"] == id {
			return
		}
	}
}

func TestNetlinkStops(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name    string
		stop    func(n *Netlink, cancel context.CancelFunc)
		wantErr error
	}{
		{name: "context", stop: func(_ *Netlink, cancel context.CancelFunc) { cancel() }, wantErr: context.Canceled},
		{name: "close", stop: func(n *Netlink, _ context.CancelFunc) { n.Close() }, wantErr: ErrClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := OpenNetlink(NetlinkOptions{ReceiveBuffer: 64 << 10})
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			started := make(chan struct{})
			go func() {
				close(started)
				for {
					// Unrelated kernel uevents may arrive; keep reading
					// until the stop takes effect.
					if _, err := n.Next(ctx); err != nil {
						done <- err
						return
					}
				}
			}()
			<-started
			tt.stop(n, cancel)
			select {
			case err := <-done:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Next: %v, want %v", err, tt.wantErr)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Next did not return")
			}
			if tt.name == "context" {
				// A cancelled call leaves the socket usable.
				ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel2()
				if _, err := n.Next(ctx2); err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Next after cancel: %v", err)
				}
			}
		})
	}
}
