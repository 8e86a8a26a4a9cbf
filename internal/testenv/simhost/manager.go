package simhost

import (
	"context"
	"testing"

	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
)

// The helpers below drive a manager, whoever built it (Start, or a
// daemon in the test's process), and fail the test on an error.

// DefineTenant defines the tenant name with unlimited quotas.
func DefineTenant(t testing.TB, m *manager.Manager, name string) {
	t.Helper()
	if _, err := m.DefineTenant(context.Background(), tenant.Tenant{Name: name, Quota: tenant.UnlimitedQuota()}); err != nil {
		t.Fatal(err)
	}
}

// MustCreate creates an instance of profile on the GPU at pci for tn.
func MustCreate(t testing.TB, m *manager.Manager, tn, profile, pci string) store.Instance {
	t.Helper()
	r, err := m.Create(context.Background(), manager.CreateRequest{Tenant: tn, Profile: profile, GPU: pci})
	if err != nil {
		t.Fatalf("create %s on %s: %v", profile, pci, err)
	}
	return r
}

// InstanceStates is every instance's state by its UUID.
func InstanceStates(t testing.TB, m *manager.Manager) map[string]store.InstanceState {
	t.Helper()
	views, err := m.AllInstances()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.InstanceState{}
	for _, v := range views {
		out[v.UUID] = v.State
	}
	return out
}

// GPU is the manager's view of the GPU at pci.
func GPU(t testing.TB, m *manager.Manager, pci string) manager.GPUView {
	t.Helper()
	v, err := m.GPU(pci)
	if err != nil {
		t.Fatalf("GPU %s: %v", pci, err)
	}
	return v
}
