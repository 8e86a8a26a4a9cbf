package dbusapi

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/virt"
)

// listedVirt is a libvirt that lists domains (or hangs until its caller
// gives up) and does nothing else.
type listedVirt struct {
	manager.Virt
	domains []virt.Domain
	hang    bool
}

func (v *listedVirt) Domains(ctx context.Context) ([]virt.Domain, error) {
	if v.hang {
		<-ctx.Done()
		return nil, virt.ErrTimeout
	}
	return v.domains, nil
}

func listDomains(t *testing.T, e *env, timeoutMS uint64) ([]domainEntry, error) {
	t.Helper()
	o := map[string]dbus.Variant{}
	if timeoutMS > 0 {
		o[OptTimeout] = dbus.MakeVariant(timeoutMS)
	}
	var out []domainEntry
	err := e.client.conn.Object(BusName, ManagerPath).CallWithContext(ctxT(t), ManagerInterface+".ListDomains", 0, o).Store(&out)
	return out, err
}

// TestDBusListDomains: ListDomains reports libvirt's domains with their
// state; without libvirt, and when libvirt does not answer within the
// caller's timeout, it is refused by name.
func TestDBusListDomains(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	_, err := listDomains(t, e, 0)
	if dbusName(err) != ErrorPrefix+NameBackendFailure || !strings.Contains(err.Error(), "libvirt is not configured") {
		t.Errorf("without libvirt: %v", err)
	}

	e.m.SetVirt(&listedVirt{domains: []virt.Domain{
		{Name: "web", UUID: "6b1c2e0e-8a52-4c1b-9a55-9f7d1f3a0b01", Running: true},
		{Name: "db", UUID: "6b1c2e0e-8a52-4c1b-9a55-9f7d1f3a0b02"},
	}})
	got, err := listDomains(t, e, 0)
	if err != nil {
		t.Fatalf("ListDomains: %v", err)
	}
	want := []domainEntry{{"web", "6b1c2e0e-8a52-4c1b-9a55-9f7d1f3a0b01", DomainRunning}, {"db", "6b1c2e0e-8a52-4c1b-9a55-9f7d1f3a0b02", DomainShutOff}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ListDomains = %+v, want %+v", got, want)
	}

	e.m.SetVirt(&listedVirt{hang: true})
	start := time.Now()
	_, err = listDomains(t, e, 300)
	if dbusName(err) != ErrorPrefix+NameBackendFailure || !strings.Contains(err.Error(), "did not answer in time") {
		t.Errorf("libvirt hanging: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ListDomains with a 300 ms timeout took %s", d)
	}
}
