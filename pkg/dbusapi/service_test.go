package dbusapi

import (
	"context"
	"encoding/xml"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
)

func TestDBusReadsAndLifecycle(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	ctx := ctxT(t)

	st, err := e.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Version != "test-1" || st.GPUs != 4 || st.Instances != 0 {
		t.Fatalf("status = %+v, want version test-1, 4 GPUs, no instances", st)
	}
	gpus, err := e.client.GPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pcis []string
	for _, g := range gpus {
		pcis = append(pcis, g.PCI)
	}
	if want := []string{sim.DefaultH100MIG, sim.DefaultH100TS, sim.DefaultL4, sim.DefaultA10}; !slices.Equal(pcis, want) {
		t.Fatalf("GPUs = %v, want %v", pcis, want)
	}
	if !gpus[0].MIG.Enabled || gpus[1].MIG.Enabled || gpus[2].VGPU.Flavour != "vfio" || gpus[3].VGPU.Flavour != "mdev" {
		t.Fatalf("GPU modes wrong: %+v", gpus)
	}

	ten := e.tenant("acme", Quota{VRAMBytes: 80 << 30, ComputeMilli: 2500, MaxInstances: 4})
	if ten.Quota.VRAMBytes != 80<<30 || ten.Class != "best-effort" {
		t.Fatalf("tenant = %+v", ten)
	}
	in := e.create("acme", "3g.40gb", sim.DefaultH100MIG)
	if in.Tenant != "acme" || in.Kind != "mig" || in.GPU != sim.DefaultH100MIG || in.State != "ready" || in.MIG == nil || in.MIG.Size != 4 {
		t.Fatalf("instance = %+v", in)
	}
	list, err := e.client.Instances(ctx, "acme")
	if err != nil || len(list) != 1 || list[0].UUID != in.UUID {
		t.Fatalf("Instances(acme) = %+v, %v", list, err)
	}
	ten, err = e.client.Tenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if ten.Usage.Instances != 1 || ten.Usage.VRAMBytes != in.VRAMBytes || !slices.Equal(ten.Instances, []string{in.UUID}) {
		t.Fatalf("tenant after create = %+v", ten)
	}
	g, err := e.client.GPU(ctx, sim.DefaultH100MIG)
	if err != nil || !slices.Contains(g.Instances, in.UUID) || len(g.MIG.Instances) != 1 {
		t.Fatalf("GPU after create = %+v, %v", g, err)
	}

	// Raw list methods agree with the objects.
	var rows []instanceEntry
	if err := e.client.call(ctx, "list", "ListInstances", []any{""}, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Object != InstancePath(in.UUID) || rows[0].Tenant != "acme" {
		t.Fatalf("ListInstances = %+v", rows)
	}
	var grows []gpuEntry
	if err := e.client.call(ctx, "list", "ListGPUs", nil, &grows); err != nil || len(grows) != 4 || grows[0].Instances != 1 {
		t.Fatalf("ListGPUs = %+v, %v", grows, err)
	}
	var trows []tenantEntry
	if err := e.client.call(ctx, "list", "ListTenants", nil, &trows); err != nil || len(trows) != 1 || trows[0].Object != TenantPath("acme") {
		t.Fatalf("ListTenants = %+v, %v", trows, err)
	}

	profs, err := e.client.Profiles(ctx, sim.DefaultL4)
	if err != nil || len(profs) == 0 {
		t.Fatalf("Profiles(l4) = %v, %v", profs, err)
	}
	for _, p := range profs {
		if p.Model != "L4-24GB" {
			t.Fatalf("Profiles(l4) has %+v", p)
		}
	}
	caps, err := e.client.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range caps {
		if c.Model == "H100-SXM5-80GB" && c.Profile == "3g.40gb" && c.Kind == "mig" {
			found = c.Count == 1
		}
	}
	if !found {
		t.Fatalf("capacity lacks one more 3g.40gb on the H100: %+v", caps)
	}
	plan, err := e.client.Plan(ctx, PlanRequest{Tenant: "acme", Profile: "3g.40gb"})
	if err != nil || !plan.Fits || plan.GPU != sim.DefaultH100MIG || plan.Start != 0 && plan.Start != 4 || !plan.QuotaOK {
		t.Fatalf("Plan = %+v, %v", plan, err)
	}

	vg := e.create("acme", "L4-4Q", "")
	doc, err := e.client.HostdevXML(ctx, vg.UUID)
	if err != nil || !strings.Contains(doc, "<hostdev") || !strings.Contains(doc, "managed=\"no\"") {
		t.Fatalf("HostdevXML(vf) = %q, %v", doc, err)
	}
	if _, err := e.client.HostdevXML(ctx, in.UUID); ErrorName(err) != NameInvalidArgument {
		t.Fatalf("HostdevXML(mig) err = %v, want InvalidArgument", err)
	}

	q := ten.Quota
	q.MaxInstances = 10
	if ten, err = e.client.SetQuota(ctx, "acme", q); err != nil || ten.Quota.MaxInstances != 10 {
		t.Fatalf("SetQuota = %+v, %v", ten, err)
	}
	rep, err := e.client.Reconcile(ctx)
	if err != nil || len(rep.Failed) != 0 {
		t.Fatalf("Reconcile = %+v, %v", rep, err)
	}
	shares, err := e.client.Shares(ctx)
	if err != nil || len(shares) != 2 || shares[0].AchievedMilli != nil {
		t.Fatalf("Shares = %+v, %v", shares, err)
	}
	if err := e.client.Destroy(ctx, in.UUID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Instance(ctx, in.UUID); ErrorName(err) != NameNotFound {
		t.Fatalf("Instance after destroy: %v, want NotFound", err)
	}
	if err := e.client.UndefineTenant(ctx, "acme", true); err != nil {
		t.Fatal(err)
	}
	if st, err := e.client.Status(ctx); err != nil || st.Tenants != 0 || st.Instances != 0 {
		t.Fatalf("status after undefine --force = %+v, %v", st, err)
	}
}

func TestDBusNamedErrors(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	ctx := ctxT(t)
	e.tenant("small", Quota{VRAMBytes: 10 << 30, ComputeMilli: Unlimited, MaxInstances: Unlimited})
	e.tenant("big", unlimitedQuota())
	e.create("big", "7g.80gb", sim.DefaultH100MIG)
	held := e.create("big", "L4-4Q", "")
	cases := []struct {
		name string
		do   func() error
		want string
	}{
		{"unknown tenant", func() error {
			_, err := e.client.Create(ctx, CreateRequest{Tenant: "nobody", Profile: "1g.10gb"})
			return err
		}, NameNotFound},
		{"over quota", func() error {
			_, err := e.client.Create(ctx, CreateRequest{Tenant: "small", Profile: "A10-24Q"})
			return err
		}, NameQuotaExceeded},
		{"unknown profile", func() error {
			_, err := e.client.Create(ctx, CreateRequest{Tenant: "big", Profile: "H100-9g.900gb"})
			return err
		}, NameInvalidArgument},
		{"GPU full", func() error {
			_, err := e.client.Create(ctx, CreateRequest{Tenant: "big", Profile: "1g.10gb", GPU: sim.DefaultH100MIG})
			return err
		}, NameNoCapacity},
		{"destroy unknown", func() error { return e.client.Destroy(ctx, "9b2a6a3c-3a49-4c51-9d47-5d2a4b1f0c11", false) }, NameNotFound},
		{"redefine other quota", func() error {
			_, err := e.client.DefineTenant(ctx, TenantSpec{Name: "small", Quota: unlimitedQuota()})
			return err
		}, NameConflict},
		{"undefine with instances", func() error { return e.client.UndefineTenant(ctx, "big", false) }, NameBusy},
		{"bad tenant name", func() error {
			_, err := e.client.DefineTenant(ctx, TenantSpec{Name: "Not_A_Label", Quota: unlimitedQuota()})
			return err
		}, NameInvalidArgument},
		{"unknown option", func() error {
			return e.client.long(ctx, "destroy", "DestroyInstance", []any{held.UUID}, map[string]dbus.Variant{"detach-please": dbus.MakeVariant(true)})
		}, NameInvalidArgument},
		{"option of wrong type", func() error {
			return e.client.long(ctx, "destroy", "DestroyInstance", []any{held.UUID}, map[string]dbus.Variant{"detach": dbus.MakeVariant("yes")})
		}, NameInvalidArgument},
		{"attach without libvirt", func() error {
			_, err := e.client.Attach(ctx, held.UUID, "vm1", AttachOptions{})
			return err
		}, NameBackendFailure},
		{"apply without pkg/apply", func() error {
			_, err := e.client.Apply(ctx, "x.yaml", []byte("version: v1\n"), "", true)
			return err
		}, NameBackendFailure},
		{"cancel unknown operation", func() error { return e.client.Cancel(ctx, "no-such-op") }, NameNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.do()
			if got := ErrorName(err); got != c.want {
				t.Fatalf("error %v (%s), want %s", err, got, c.want)
			}
			msg := err.Error()
			if msg == "" || strings.Contains(msg, "org.freedesktop") || strings.Contains(msg, "goroutine") {
				t.Fatalf("message %q should be plain text for users", msg)
			}
		})
	}
	// The raw D-Bus error name is dev.vgpud1.Error.<Name>.
	call := e.client.mgr.CallWithContext(ctx, ManagerInterface+".DestroyInstance", 0, "9b2a6a3c-3a49-4c51-9d47-5d2a4b1f0c11", map[string]dbus.Variant{})
	var de dbus.Error
	if !errors.As(call.Err, &de) || de.Name != ErrorPrefix+NameNotFound {
		t.Fatalf("raw error = %v, want %sNotFound", call.Err, ErrorPrefix)
	}
}

// TestDBusErrorMapping checks the one mapping function against every
// sentinel.
func TestDBusErrorMapping(t *testing.T) {
	sentinels := map[error]string{
		manager.ErrQuotaExceeded: NameQuotaExceeded, manager.ErrNoCapacity: NameNoCapacity, manager.ErrNotFound: NameNotFound,
		manager.ErrInvalidArgument: NameInvalidArgument, manager.ErrAccessDenied: NameAccessDenied, manager.ErrBusy: NameBusy,
		manager.ErrConflict: NameConflict, manager.ErrGPULost: NameGPULost, manager.ErrBackendFailure: NameBackendFailure,
		manager.ErrStaleClaim: NameStaleClaim,
	}
	if len(sentinels) != len(ErrorNames) {
		t.Fatalf("%d sentinels, %d names", len(sentinels), len(ErrorNames))
	}
	for s, name := range sentinels {
		de := toDBusError(errors.Join(s, errors.New("cause")))
		if de.Name != ErrorPrefix+name {
			t.Errorf("%v -> %s, want %s%s", s, de.Name, ErrorPrefix, name)
		}
		back := fromDBus(context.Background(), "x", de)
		if ErrorName(back) != name {
			t.Errorf("client reads %s as %s", de.Name, ErrorName(back))
		}
	}
	foreign := []struct{ dbusName, want string }{
		{"org.freedesktop.DBus.Error.ServiceUnknown", NameUnavailable},
		{"org.freedesktop.systemd1.NoSuchUnit", NameUnavailable},
		{"org.freedesktop.DBus.Error.AccessDenied", NameAccessDenied},
		{"org.freedesktop.DBus.Error.NoReply", NameTimeout},
		{"org.freedesktop.DBus.Error.UnknownMethod", NameBackendFailure},
	}
	for _, f := range foreign {
		err := fromDBus(context.Background(), "call", dbus.Error{Name: f.dbusName, Body: []any{"raw text"}})
		if ErrorName(err) != f.want || strings.Contains(err.Error(), "org.freedesktop") {
			t.Errorf("%s -> %s %q, want %s without D-Bus names", f.dbusName, ErrorName(err), err, f.want)
		}
	}
	// The protocol's own words stay out of the message: an API mismatch
	// gets a fixed hint, an unknown error without text one too.
	if err := fromDBus(context.Background(), "call", dbus.Error{Name: "org.freedesktop.DBus.Error.UnknownMethod", Body: []any{`No such method "Frob"`}}); strings.Contains(err.Error(), "Frob") {
		t.Errorf("UnknownMethod shows the bus's text: %q", err)
	}
	if err := fromDBus(context.Background(), "call", dbus.Error{Name: "org.example.Error.Odd"}); ErrorName(err) != NameBackendFailure || strings.Contains(err.Error(), "org.example") {
		t.Errorf("an unknown error without text: %s %q", ErrorName(err), err)
	}
}

// waitEvent reads events until match accepts one.
func waitEvent(t *testing.T, ch <-chan Event, what string, match func(Event) bool) Event {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("event stream closed waiting for %s", what)
			}
			if match(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no %s within 20s", what)
		}
	}
}

func TestDBusSignalsForCreate(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	sub := e.dial()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := sub.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := e.create("acme", "L4-4Q", "")
	added := waitEvent(t, events, "InterfacesAdded for the instance", func(ev Event) bool {
		return ev.Signal == "InterfacesAdded" && ev.Kind == "instance" && ev.ID == in.UUID
	})
	// A resync may catch the instance while it is still being carved.
	if st := added.Changed["State"]; added.Changed["Tenant"] != "acme" || (st != "ready" && st != "creating") {
		t.Fatalf("InterfacesAdded carries %v", added.Changed)
	}
	ch := waitEvent(t, events, "PropertiesChanged on the tenant", func(ev Event) bool {
		return ev.Signal == "PropertiesChanged" && ev.Kind == "tenant" && ev.ID == "acme"
	})
	if ch.Changed["InstancesUsed"] != uint64(1) {
		t.Fatalf("tenant PropertiesChanged = %v", ch.Changed)
	}
	waitEvent(t, events, "PropertiesChanged on the GPU", func(ev Event) bool {
		return ev.Signal == "PropertiesChanged" && ev.Kind == "gpu" && ev.ID == sim.DefaultL4
	})
	waitEvent(t, events, "OperationFinished", func(ev Event) bool {
		return ev.Signal == "OperationFinished" && ev.Operation == "create" && ev.ID == in.UUID
	})
	if err := e.client.Destroy(ctxT(t), in.UUID, false); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, events, "InterfacesRemoved", func(ev Event) bool {
		return ev.Signal == "InterfacesRemoved" && ev.ID == in.UUID
	})
}

func TestDBusGPULostSignal(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := e.dial().Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := e.client.GPU(ctx, sim.DefaultA10)
	if err != nil {
		t.Fatal(err)
	}
	e.m.MarkGPUFailed(g.UUID, "XID 79")
	lost := waitEvent(t, events, "GPULost", func(ev Event) bool { return ev.Signal == "GPULost" })
	if lost.ID != sim.DefaultA10 || lost.Message != "XID 79" {
		t.Fatalf("GPULost = %+v", lost)
	}
	if g, err := e.client.GPU(ctx, sim.DefaultA10); err != nil || g.State != "failed" {
		t.Fatalf("failed GPU reads %+v, %v", g, err)
	}
	// An operator returns it to service.
	if err := e.client.ClearGPU(ctx, sim.DefaultA10); err != nil {
		t.Fatal(err)
	}
	if g, err := e.client.GPU(ctx, sim.DefaultA10); err != nil || g.State != "ok" {
		t.Fatalf("cleared GPU reads %+v, %v", g, err)
	}
	if err := e.client.ClearGPU(ctx, "0000:ff:00.0"); ErrorName(err) != NameNotFound {
		t.Fatalf("clear an unknown GPU: %v, want NotFound", err)
	}
}

func TestDBusIntrospection(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	in := e.create("acme", "L4-4Q", "")
	ctx := ctxT(t)
	for _, c := range []struct {
		path     dbus.ObjectPath
		iface    string
		children []string
	}{
		{"/", "", []string{"dev"}},
		{ManagerPath, ManagerInterface, []string{"gpu", "instance", "tenant"}},
		{ManagerPath + "/gpu", "", []string{"pci_0000_41_00_0", "pci_0000_61_00_0", "pci_0000_81_00_0", "pci_0000_a1_00_0"}},
		{ManagerPath + "/tenant", "", []string{"acme"}},
		{GPUPath(sim.DefaultL4), GPUInterface, nil},
		{InstancePath(in.UUID), InstanceInterface, nil},
		{TenantPath("acme"), TenantInterface, nil},
	} {
		var doc string
		if err := e.client.conn.Object(BusName, c.path).CallWithContext(ctx, introspectInterface+".Introspect", 0).Store(&doc); err != nil {
			t.Fatalf("Introspect %s: %v", c.path, err)
		}
		var n xNode
		if err := xml.Unmarshal([]byte(doc), &n); err != nil {
			t.Fatalf("Introspect %s: bad XML: %v\n%s", c.path, err, doc)
		}
		var kids []string
		for _, k := range n.Children {
			kids = append(kids, k.Name)
		}
		if !slices.Equal(kids, c.children) {
			t.Errorf("%s children = %v, want %v", c.path, kids, c.children)
		}
		if c.iface == "" {
			continue
		}
		// The object's own interface and the standard ones it has
		// (Properties, ObjectManager, Introspectable, Peer) are documented.
		kind, _ := parsePath(c.path)
		for _, name := range objectIfaces(kind) {
			var x *xIface
			for i := range n.Interfaces {
				if n.Interfaces[i].Name == name {
					x = &n.Interfaces[i]
				}
			}
			if x == nil {
				t.Fatalf("%s: no interface %s", c.path, name)
			}
			checkDocumented(t, x)
		}
	}
}

// checkDocumented insists on what "complete" introspection means here:
// every method, argument, property and signal named, typed and documented,
// and every property read-only.
func checkDocumented(t *testing.T, x *xIface) {
	t.Helper()
	hasDoc := func(a []xAnnot) bool {
		for _, an := range a {
			if an.Name == docAnnotation && an.Value != "" {
				return true
			}
		}
		return false
	}
	if !hasDoc(x.Annots) {
		t.Errorf("%s: no doc", x.Name)
	}
	for _, m := range x.Methods {
		if !hasDoc(m.Annots) {
			t.Errorf("%s.%s: no doc", x.Name, m.Name)
		}
		for _, a := range m.Args {
			if _, err := dbus.ParseSignature(a.Type); a.Name == "" || a.Type == "" || err != nil || !hasDoc(a.Annots) {
				t.Errorf("%s.%s: argument %+v not named, typed and documented", x.Name, m.Name, a)
			}
		}
	}
	for _, p := range x.Props {
		if p.Access != "read" || p.Type == "" || !hasDoc(p.Annots) {
			t.Errorf("%s.%s: property %+v", x.Name, p.Name, p)
		}
	}
	for _, s := range x.Signals {
		if !hasDoc(s.Annots) {
			t.Errorf("%s.%s: no doc", x.Name, s.Name)
		}
		for _, a := range s.Args {
			if a.Name == "" || a.Type == "" || !hasDoc(a.Annots) {
				t.Errorf("%s.%s: argument %+v", x.Name, s.Name, a)
			}
		}
	}
}

// TestDBusPropertyTypes checks that the properties the objects carry are
// exactly those introspection declares, with the declared types.
func TestDBusPropertyTypes(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	e.create("acme", "A10-4Q", "")
	snap := e.svc.current()
	check := func(what string, props map[string]dbus.Variant, defs []propDef) {
		if len(props) != len(defs) {
			t.Errorf("%s: %d properties, %d declared", what, len(props), len(defs))
		}
		for _, d := range defs {
			v, ok := props[d.name]
			if !ok || v.Signature().String() != d.sig {
				t.Errorf("%s.%s: got %v (%v), declared %s", what, d.name, v.Signature(), ok, d.sig)
			}
		}
	}
	check("Manager", snap.manager, e.svc.ifaces[ManagerInterface].props)
	for p, o := range snap.objects {
		check(string(p), o.props, e.svc.ifaces[o.iface].props)
	}
}

func TestDBusPropertiesReadOnly(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	err := e.client.mgr.CallWithContext(ctxT(t), propertiesInterface+".Set", 0, ManagerInterface, "Version", dbus.MakeVariant("x")).Err
	var de dbus.Error
	if !errors.As(err, &de) || de.Name != "org.freedesktop.DBus.Error.PropertyReadOnly" {
		t.Fatalf("Set = %v, want PropertyReadOnly", err)
	}
}

func TestDBusNameTaken(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	_, err := Start(context.Background(), e.m, Options{Address: e.bus.Address()})
	if err == nil || !strings.Contains(err.Error(), "another vgpud") {
		t.Fatalf("second Start = %v, want an error naming another vgpud", err)
	}
}

// slowCreate makes the next GPU-instance creation hang for d and then fail,
// so a cancelled create leaves nothing behind on the host.
func slowCreate(t *testing.T, e *env, d time.Duration) {
	t.Helper()
	if err := e.sim.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: d.String(), Return: 2, Count: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestDBusCallerTimeoutCancels(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	slowCreate(t, e, 5*time.Second)
	failed, unsub := e.m.Subscribe()
	defer unsub()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := e.client.Create(ctx, CreateRequest{Tenant: "acme", Profile: "1g.10gb", GPU: sim.DefaultH100MIG})
	if ErrorName(err) == "" {
		t.Fatal("create under a 500ms timeout succeeded past a 5s driver stall")
	}
	// The daemon got the caller's timeout: the create fails for the
	// deadline, not for the stalled call's own error (the fault's return
	// code), which it would see at its default timeout.
	ev := waitManager(t, failed, manager.EventOperationFailed)
	if !strings.Contains(ev.Detail, "did not answer in time") {
		t.Fatalf("the create failed with %q, not at the caller's timeout", ev.Detail)
	}
	// The record stays until the stalled driver call returns; then the
	// create is undone.
	waitNoInstances(t, e)
}

// waitNoInstances waits until the manager holds no instance.
func waitNoInstances(t *testing.T, e *env) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		insts, err := e.m.AllInstances()
		if err == nil && len(insts) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances left after a timed-out create: %+v (%v)", insts, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitManager(t *testing.T, ch <-chan manager.Event, kind manager.EventKind) manager.Event {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev := <-ch:
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s event within 20s", kind)
		}
	}
}

func TestDBusCancelByID(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	slowCreate(t, e, 10*time.Second)
	failed, unsub := e.m.Subscribe()
	defer unsub()
	done := make(chan error, 1)
	go func() {
		o := map[string]dbus.Variant{OptOperationID: dbus.MakeVariant("op-1")}
		var p dbus.ObjectPath
		var id string
		done <- e.client.call(context.Background(), "create", "CreateInstance", []any{"acme", "1g.10gb", o}, &p, &id)
	}()
	// Cancel can only name an operation once the daemon has it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := e.dial().Cancel(ctxT(t), "op-1")
		if err == nil {
			break
		}
		if ErrorName(err) != NameNotFound || time.Now().After(deadline) {
			t.Fatalf("Cancel: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "cancelled") {
			t.Fatalf("cancelled create returned %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("create did not return after Cancel")
	}
	waitManager(t, failed, manager.EventOperationFailed)
}

func TestDBusCallerLeavingCancels(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	slowCreate(t, e, 10*time.Second)
	events, unsub := e.m.Subscribe()
	defer unsub()
	leaver, err := Dial(context.Background(), e.bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	call := leaver.mgr.Go(ManagerInterface+".CreateInstance", 0, make(chan *dbus.Call, 1), "acme", "1g.10gb", map[string]dbus.Variant{})
	// The create is in flight once the manager admitted it (it emits
	// nothing before; its record is what the daemon holds).
	testenv.WaitFor(t, "the create to be admitted", 10*time.Second, func() bool {
		insts, _ := e.m.TenantInstances("acme")
		return len(insts) == 1
	})
	start := time.Now()
	leaver.Close()
	<-call.Done
	waitManager(t, events, manager.EventOperationFailed)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("operation of a caller that left ran on for %v", took)
	}
}

// fixedShares is a share engine with fixed figures, set while the service
// may already be asking for them.
type fixedShares struct {
	mu   sync.Mutex
	rows []Share
}

func (f *fixedShares) Shares(context.Context) ([]Share, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows, nil
}

func (f *fixedShares) set(rows []Share) {
	f.mu.Lock()
	f.rows = rows
	f.mu.Unlock()
}

func TestDBusSharesFromTheEngine(t *testing.T) {
	src := &fixedShares{}
	e := newEnv(t, testbus.Options{}, func(_ *env, o *Options) { o.Shares = src })
	e.tenant("acme", unlimitedQuota())
	a := e.create("acme", "L4-4Q", "")
	b := e.create("acme", "A10-4Q", "")
	src.set([]Share{{Instance: a.UUID, EntitledMilli: 166, AchievedMilli: 120, DemandMilli: 200, Interference: 0.277}})
	rows, err := e.client.Shares(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]ShareRow{}
	for _, r := range rows {
		byID[r.Instance] = r
	}
	if r := byID[a.UUID]; r.AchievedMilli == nil || *r.AchievedMilli != 120 || *r.DemandMilli != 200 || *r.Interference != 0.277 {
		t.Fatalf("reported instance: %+v", r)
	}
	// acme is best effort: entitled to nothing, whatever the engine or the
	// instance's compute says (as the metric and docs/metrics.md have it).
	if r := byID[a.UUID]; r.EntitledMilli != 0 {
		t.Fatalf("best-effort instance reported entitled %d, want 0", r.EntitledMilli)
	}
	if r := byID[b.UUID]; r.EntitledMilli != 0 || r.AchievedMilli != nil || r.Interference != nil {
		t.Fatalf("unreported best-effort instance: %+v", r)
	}
	// A guaranteed tenant's instance the engine does not report keeps its
	// entitled compute.
	if _, err := e.client.DefineTenant(ctxT(t), TenantSpec{Name: "gold", Quota: unlimitedQuota(), Class: "guaranteed"}); err != nil {
		t.Fatal(err)
	}
	c := e.create("gold", "L4-4Q", "")
	rows, err = e.client.Shares(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Instance == c.UUID && (r.EntitledMilli != c.ComputeMilli || c.ComputeMilli == 0) {
			t.Fatalf("guaranteed instance: entitled %d, want %d", r.EntitledMilli, c.ComputeMilli)
		}
	}
}

// TestDBusApplyReportsProgress: a failed call's reply carries only the
// error, so when a step of Apply fails the error's message says how far it
// got; the name stays that of the failed step.
func TestDBusApplyReportsProgress(t *testing.T) {
	e := newEnv(t, testbus.Options{}, func(e *env, o *Options) { o.Apply = NewApplier(e.m, apply.Limits{}) })
	// The second GPU instance creation fails: changes are define gamma,
	// then three creates; the fourth is not attempted.
	if err := e.sim.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Return: 2, Skip: 1, Count: 1}); err != nil {
		t.Fatal(err)
	}
	layout := "version: v1\ntenants:\n  - name: gamma\nlayout:\n  - gpu: \"" + sim.DefaultH100MIG + "\"\n    instances:\n      - {profile: 1g.10gb, tenant: gamma, count: 3}\n"
	_, err := e.client.Apply(ctxT(t), "layout.yaml", []byte(layout), "", false)
	if err == nil {
		t.Fatal("apply went through a failing driver call")
	}
	for _, want := range []string{"apply stopped at change 3 of 4 (create 1g.10gb for tenant gamma", "Done before it: 2; not attempted: 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("apply error %q lacks %q", err, want)
		}
	}
	if ErrorName(err) == NameBackendFailure && strings.Contains(err.Error(), "apply not available") {
		t.Fatalf("no Applier: %v", err)
	}
	if insts, _ := e.m.TenantInstances("gamma"); len(insts) != 1 {
		t.Fatalf("gamma holds %d instances after the failed apply, want the 1 done before it", len(insts))
	}
}

// TestDBusRemovalOrder: when one refresh finds a tenant and its instances
// gone (a forced undefine that the manager reports in one batch), the
// instances' InterfacesRemoved come before the tenant's, so no instance
// outlives its tenant for a subscriber.
func TestDBusRemovalOrder(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	a := e.create("acme", "L4-4Q", "")
	b := e.create("acme", "A10-4Q", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := e.dial().Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One diff from the current objects to the GPUs alone, as one refresh
	// after the undefine would see it.
	prev := e.svc.current()
	next := &snapshot{manager: prev.manager, objects: map[dbus.ObjectPath]*object{}}
	for p, o := range prev.objects {
		if o.kind == kindGPU {
			next.objects[p] = o
		}
	}
	e.svc.emitDiff(prev, next)
	removed := map[string]bool{}
	waitEvent(t, events, "InterfacesRemoved of the tenant", func(ev Event) bool {
		if ev.Signal != "InterfacesRemoved" {
			return false
		}
		if ev.Kind == "tenant" && ev.ID == "acme" {
			if !removed[a.UUID] || !removed[b.UUID] {
				t.Errorf("tenant removed before its instances (instances removed so far: %v)", removed)
			}
			return true
		}
		removed[ev.ID] = true
		return false
	})
}

// TestDBusSignalsBeforeReply: a method that changes state emits its
// signals before it replies, so the caller's own connection has them,
// in order, ahead of the reply.
func TestDBusSignalsBeforeReply(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	conn := e.dial().conn
	sigs := make(chan *dbus.Signal, 256)
	conn.Signal(sigs)
	if err := conn.AddMatchSignal(dbus.WithMatchSender(BusName), dbus.WithMatchPathNamespace(ManagerPath)); err != nil {
		t.Fatal(err)
	}
	call := conn.Object(BusName, ManagerPath).CallWithContext(ctxT(t), ManagerInterface+".CreateInstance", 0, "acme", "L4-4Q", map[string]dbus.Variant{})
	var path dbus.ObjectPath
	var id string
	if err := call.Store(&path, &id); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"InterfacesAdded " + string(path): false, "PropertiesChanged " + string(TenantPath("acme")): false,
		"PropertiesChanged " + string(GPUPath(sim.DefaultL4)): false, "PropertiesChanged " + string(ManagerPath): false}
	timeout := time.After(20 * time.Second)
	for missing := len(want); missing > 0; {
		select {
		case s := <-sigs:
			key := s.Name[strings.LastIndexByte(s.Name, '.')+1:] + " " + string(s.Path)
			if s.Name == "org.freedesktop.DBus.ObjectManager.InterfacesAdded" {
				p, _ := s.Body[0].(dbus.ObjectPath)
				key = "InterfacesAdded " + string(p)
			}
			if seen, ok := want[key]; ok && !seen {
				if s.Sequence >= call.ResponseSequence {
					t.Errorf("%s came after the reply (sequence %d, reply %d)", key, s.Sequence, call.ResponseSequence)
				}
				want[key] = true
				missing--
			}
		case <-timeout:
			t.Fatalf("signals missing: %v", want)
		}
	}
}

// The scheduler through D-Bus: pinned on an idle GPU, pending while a VM
// runs a vGPU there, shown on the GPU object, refused with a named error
// for a bad policy.
func TestDBusSetGPUScheduler(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	ctx := ctxT(t)
	// 4 ms is 250 Hz: the driver holds it as asked (3 ms, 333 Hz, would
	// be held and shown as 3.003 ms).
	r, err := e.client.SetGPUScheduler(ctx, sim.DefaultL4, "", "equal_share", 4*time.Millisecond)
	if err != nil || r.Mode != "pinned" || r.Pending {
		t.Fatalf("pin: %+v, %v", r, err)
	}
	g, err := e.client.GPU(ctx, sim.DefaultL4)
	if err != nil || g.Scheduler == nil || g.Scheduler.Policy != "equal_share" || g.Scheduler.Timeslice != 4*time.Millisecond {
		t.Fatalf("GPU shows %+v, %v", g.Scheduler, err)
	}
	in := e.create("acme", "L4-4Q", sim.DefaultL4)
	if in.VGPU == nil {
		t.Fatalf("L4-4Q instance without a vGPU: %+v", in)
	}
	dev := in.VGPU.MdevUUID
	if dev == "" {
		dev = in.VGPU.VF
	}
	if err := e.sim.OpenDevice(dev, "5f0b7a52-93a4-4f0e-8f35-2c1d0f6f7e01", "vm1"); err != nil {
		t.Fatal(err)
	}
	r, err = e.client.SetGPUScheduler(ctx, sim.DefaultL4, "pinned", "fixed_share", 0)
	if err != nil || !r.Pending || r.Detail == "" {
		t.Fatalf("pin while a VM runs: %+v, %v (want pending)", r, err)
	}
	if g, _ := e.client.GPU(ctx, sim.DefaultL4); g.Scheduler == nil || !g.Scheduler.Pending || g.Scheduler.Policy != "fixed_share" {
		t.Fatalf("GPU shows %+v, want fixed_share pending", g.Scheduler)
	}
	if _, err := e.client.SetGPUScheduler(ctx, sim.DefaultL4, "pinned", "round_robin", 0); ErrorName(err) != NameInvalidArgument {
		t.Fatalf("bad policy: %v, want InvalidArgument", err)
	}
}

// TestDBusApplyCancelSaysWhatStays: a cancelled apply stops between
// changes and keeps the changes it did; neither the daemon's reply nor
// the client's own message may promise that they are undone.
func TestDBusApplyCancelSaysWhatStays(t *testing.T) {
	layout := "version: v1\ntenants:\n  - name: gamma\nlayout:\n  - gpu: \"" + sim.DefaultH100MIG + "\"\n    instances:\n      - {profile: 1g.10gb, tenant: gamma, count: 3}\n"
	// setup is a daemon whose second GPU-instance creation stalls.
	setup := func(t *testing.T) *env {
		e := newEnv(t, testbus.Options{}, func(e *env, o *Options) { o.Apply = NewApplier(e.m, apply.Limits{}) })
		if err := e.sim.AddFault(sim.Fault{Op: "CreateGpuInstanceWithPlacement", Delay: "3s", Skip: 1, Count: 1}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	// ready counts gamma's ready instances and all of them.
	ready := func(e *env) (int, int) {
		insts, _ := e.m.TenantInstances("gamma")
		n := 0
		for _, in := range insts {
			if in.State == "ready" {
				n++
			}
		}
		return n, len(insts)
	}
	waitFor := func(t *testing.T, what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 20s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	check := func(t *testing.T, e *env, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("a cancelled apply succeeded")
		}
		for _, bad := range []string{"what it did is undone", "undoes what it started"} {
			if strings.Contains(err.Error(), bad) {
				t.Errorf("cancelled apply: %q promises an undo (%q)", err, bad)
			}
		}
		if !strings.Contains(err.Error(), "the changes already done stay") {
			t.Errorf("cancelled apply: %q does not say the changes done stay", err)
		}
		// The first create stays, as the message says; the third never began.
		waitFor(t, "settled apply", func() bool { r, all := ready(e); return r >= 1 && r == all && all < 3 })
	}
	t.Run("daemon", func(t *testing.T) {
		e := setup(t)
		done := make(chan error, 1)
		go func() {
			o := map[string]dbus.Variant{OptOperationID: dbus.MakeVariant("apply-1")}
			var changes, result, summary string
			done <- e.client.call(context.Background(), "apply", "Apply", []any{layout, "", false, o}, &changes, &result, &summary)
		}()
		waitFor(t, "first create", func() bool { r, _ := ready(e); return r >= 1 })
		if err := e.dial().Cancel(ctxT(t), "apply-1"); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		check(t, e, <-done)
	})
	t.Run("client", func(t *testing.T) {
		e := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := e.client.Apply(ctx, "layout.yaml", []byte(layout), "", false)
			done <- err
		}()
		waitFor(t, "first create", func() bool { r, _ := ready(e); return r >= 1 })
		cancel() // Ctrl-C
		check(t, e, <-done)
	})
}
