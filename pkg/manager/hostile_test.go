package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/virt"
)

// TestEmptyOrUnknownTenantNeverSelectsAll: a mutation that names its
// targets by tenant takes exactly that tenant's, never every tenant's when
// the name is empty, blank or unknown.
func TestEmptyOrUnknownTenantNeverSelectsAll(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	e.tenant("beta", unlimited())
	a := e.mustCreate("acme", "L4-4Q", "")
	b := e.mustCreate("beta", "L4-4Q", "")
	before := e.summary()
	cases := []struct {
		name, tenant string
		want         error
		msg          string
	}{
		{"empty", "", manager.ErrInvalidArgument, "empty"},
		{"blank", "  ", manager.ErrInvalidArgument, "tenant name"},
		{"unknown", "nobody", manager.ErrNotFound, "vgpuctl tenant list"},
		{"not a name", "Acme_Corp", manager.ErrInvalidArgument, "tenant name"},
	}
	for _, c := range cases {
		for _, force := range []bool{false, true} {
			err := e.m.UndefineTenant(ctx, c.tenant, force)
			if !errors.Is(err, c.want) || !strings.Contains(manager.Message(err), c.msg) {
				t.Fatalf("%s (force %v): %v, want %v saying %q", c.name, force, err, c.want, c.msg)
			}
			if c.want == manager.ErrNotFound && !strings.Contains(manager.Message(err), c.tenant) {
				t.Fatalf("%s: %q does not name the tenant", c.name, manager.Message(err))
			}
			if _, err := e.m.TenantInstances(c.tenant); !errors.Is(err, c.want) {
				t.Fatalf("TenantInstances(%q) = %v, want %v", c.tenant, err, c.want)
			}
		}
	}
	for _, r := range []string{a.UUID, b.UUID} {
		if _, err := e.m.Instance(r); err != nil {
			t.Fatalf("instance %s gone: %v", r, err)
		}
	}
	if got := e.summary(); got != before {
		t.Fatalf("host changed:\n%s\nwas\n%s", got, before)
	}
	if err := e.m.UndefineTenant(ctx, "acme", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Instance(b.UUID); err != nil {
		t.Fatalf("undefining acme took beta's instance: %v", err)
	}
}

func TestDefragmentChecksTenantAndGPU(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	before := e.summary()
	cases := []struct {
		name string
		req  manager.CreateRequest
		want error
		msg  string
	}{
		{"unknown GPU", manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: "0000:ff:00.0"}, manager.ErrNotFound, "no GPU"},
		{"GPU index out of range", manager.CreateRequest{Tenant: "acme", Profile: "3g.40gb", GPU: "9"}, manager.ErrNotFound, "no GPU"},
		{"unknown tenant", manager.CreateRequest{Tenant: "nobody", Profile: "3g.40gb"}, manager.ErrNotFound, "no tenant nobody"},
		{"empty tenant", manager.CreateRequest{Profile: "3g.40gb"}, manager.ErrInvalidArgument, "tenant"},
		{"empty profile", manager.CreateRequest{Tenant: "acme"}, manager.ErrInvalidArgument, "no profile"},
	}
	for _, c := range cases {
		for _, apply := range []bool{false, true} {
			_, err := e.m.Defragment(ctx, c.req, apply)
			if !errors.Is(err, c.want) || !strings.Contains(manager.Message(err), c.msg) {
				t.Fatalf("%s (apply %v): %v, want %v saying %q", c.name, apply, err, c.want, c.msg)
			}
		}
	}
	if _, err := e.m.Plan(ctx, manager.CreateRequest{Tenant: "nobody", Profile: "3g.40gb"}); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("plan for an unknown tenant: %v", err)
	}
	if got := e.summary(); got != before {
		t.Fatalf("host changed:\n%s\nwas\n%s", got, before)
	}
}

// unreachableVirt is a libvirt that is down; it counts the calls it got.
type unreachableVirt struct{ calls atomic.Int32 }

func (v *unreachableVirt) down() error { v.calls.Add(1); return virt.ErrUnreachable }
func (v *unreachableVirt) URI() string { return "qemu:///system" }
func (v *unreachableVirt) Domain(context.Context, string) (virt.Domain, error) {
	return virt.Domain{}, v.down()
}
func (v *unreachableVirt) Attach(context.Context, string, virt.Hostdev, string) (bool, error) {
	return false, v.down()
}
func (v *unreachableVirt) Detach(context.Context, string, virt.Hostdev, string) error {
	return v.down()
}
func (v *unreachableVirt) Attached(context.Context, string) ([]virt.Attached, error) {
	return nil, v.down()
}
func (v *unreachableVirt) Domains(context.Context) ([]virt.Domain, error) { return nil, v.down() }
func (v *unreachableVirt) Events(context.Context) <-chan virt.Event       { return nil }
func (v *unreachableVirt) Quiesce(context.Context) error                  { return nil }

// TestAttachChecksArgumentsBeforeLibvirt: a VM name that cannot be one,
// an unknown tenant or profile is refused without asking libvirt, with
// the argument quoted and cut short; a libvirt that is down is a backend
// failure whose message says so.
func TestAttachChecksArgumentsBeforeLibvirt(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	r := e.mustCreate("acme", "L4-4Q", "")
	lv := &unreachableVirt{}
	e.m.SetVirt(lv)
	huge := strings.Repeat("v", 1<<20)
	for _, vm := range []string{"", " ", " vm1", "vm1\n", "vm\x00x", "\xff\xfe", huge} {
		_, err := e.m.Attach(ctx, r.UUID, vm, manager.AttachOptions{})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("attach to %q: %v, want InvalidArgument", manager.QuoteArg(vm), err)
		}
		if n := len(manager.Message(err)); n > 300 {
			t.Fatalf("attach to a %d-byte name: %d-byte message", len(vm), n)
		}
		_, _, err = e.m.CreateAndAttach(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q"}, vm, manager.AttachOptions{})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("create and attach to %q: %v, want InvalidArgument", manager.QuoteArg(vm), err)
		}
	}
	for _, req := range []manager.CreateRequest{{Tenant: "", Profile: "L4-4Q"}, {Tenant: "nobody", Profile: "L4-4Q"}, {Tenant: "acme", Profile: ""}, {Tenant: "acme", Profile: "9g.900gb"}} {
		if _, _, err := e.m.CreateAndAttach(ctx, req, "vm1", manager.AttachOptions{}); err == nil || errors.Is(err, manager.ErrBackendFailure) {
			t.Fatalf("create and attach %+v: %v, want a refusal of the argument", req, err)
		}
	}
	if _, err := e.m.Attach(ctx, r.UUID, "vm1", manager.AttachOptions{Tenant: "Not_A_Name"}); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("attach for a tenant that cannot be one: %v", err)
	}
	for _, id := range []string{"", "not-a-uuid", huge} {
		if _, err := e.m.Attach(ctx, id, "vm1", manager.AttachOptions{}); !errors.Is(err, manager.ErrInvalidArgument) || len(manager.Message(err)) > 300 {
			t.Fatalf("attach instance %s: %v", manager.QuoteArg(id), err)
		}
	}
	if n := lv.calls.Load(); n != 0 {
		t.Fatalf("libvirt was asked %d times about refused arguments", n)
	}
	_, err := e.m.Attach(ctx, r.UUID, "vm1", manager.AttachOptions{})
	if !errors.Is(err, manager.ErrBackendFailure) || !strings.Contains(manager.Message(err), "libvirtd unreachable") {
		t.Fatalf("attach with libvirt down: %v; message %q should carry the cause", err, manager.Message(err))
	}
}

func TestAllowListsRefuseWhatCannotBeNames(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	allow := func(models, profiles []string) tenant.Tenant {
		return tenant.Tenant{Name: "acme", Quota: unlimited(), AllowedModels: models, AllowedProfiles: profiles}
	}
	for _, tn := range []tenant.Tenant{
		allow([]string{"../x"}, nil), allow([]string{"a"}, nil), allow(nil, []string{"../x"}),
		allow(nil, []string{"NOPE"}), allow(nil, []string{"3g.40gb\n"}),
	} {
		if _, err := e.m.DefineTenant(ctx, tn); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("define with %v %v: %v, want InvalidArgument", tn.AllowedModels, tn.AllowedProfiles, err)
		}
	}
	// Names of the right form that this catalog lacks are kept (a tenant
	// file may serve a fleet) and shown.
	if _, err := e.m.DefineTenant(ctx, allow([]string{"NOPE", "H100-SXM5-80GB"}, []string{"9g.900gb", "3g.40gb", "passthrough"})); err != nil {
		t.Fatal(err)
	}
	v, err := e.m.Tenant("acme")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(v.NotInCatalog, ","), "model NOPE,profile 9g.900gb"; got != want {
		t.Fatalf("NotInCatalog = %q, want %q", got, want)
	}
}

// TestBackendFailureCarriesItsCause: when the host fails an operation,
// the cause (the errno, with what to do about it) is in the message users
// read, not only in the log.
func TestBackendFailureCarriesItsCause(t *testing.T) {
	e := newEnv(t, nil)
	e.tenant("acme", unlimited())
	// sysfs mounted read-only, as in a container that was not given it.
	if err := e.sim.AddFault(sim.Fault{Op: "write:create", Errno: int(syscall.EROFS), Count: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := e.create("acme", "A10-4Q", "")
	if !errors.Is(err, manager.ErrBackendFailure) {
		t.Fatalf("create on a read-only sysfs: %v, want BackendFailure", err)
	}
	msg := manager.Message(err)
	for _, want := range []string{"read-only file system", "remount it read-write"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

// TestNilUUIDRefused: the nil UUID, in any spelling uuid.Parse takes, is
// no instance's: a create or create-and-attach asking for it is refused
// by name, as is every method naming an instance by it, and nothing
// changes. It used to become an instance's UUID.
func TestNilUUIDRefused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.tenant("acme", unlimited())
	e.mustCreate("acme", "L4-4Q", "")
	e.m.SetVirt(&unreachableVirt{})
	before := e.summary()
	for _, id := range []string{"00000000-0000-0000-0000-000000000000", "00000000000000000000000000000000",
		"{00000000-0000-0000-0000-000000000000}", "urn:uuid:00000000-0000-0000-0000-000000000000"} {
		want := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, manager.ErrInvalidArgument) || !strings.Contains(manager.Message(err), "nil UUID") {
				t.Fatalf("%s %s: %v, want InvalidArgument naming the nil UUID", what, id, err)
			}
		}
		_, err := e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", UUID: id})
		want("create", err)
		_, _, err = e.m.CreateAndAttach(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", UUID: id}, "vm1", manager.AttachOptions{})
		want("create and attach", err)
		_, err = e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q", PlacementConsumer: id})
		if !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("create for placement consumer %s: %v, want InvalidArgument", id, err)
		}
		want("destroy", e.m.Destroy(ctx, id, manager.DestroyOptions{}))
		_, err = e.m.Attach(ctx, id, "vm1", manager.AttachOptions{})
		want("attach", err)
		want("detach", e.m.Detach(ctx, id))
		_, err = e.m.Instance(id)
		want("instance", err)
	}
	if got := e.summary(); got != before {
		t.Fatalf("host changed:\n%s\nwas\n%s", got, before)
	}
	insts, err := e.m.AllInstances()
	if err != nil || len(insts) != 1 {
		t.Fatalf("instances %+v, %v; want the one made before", insts, err)
	}
}
