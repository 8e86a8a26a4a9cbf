package dbusapi

import (
	"context"
	"encoding/xml"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/godbus/dbus/v5"

	"github.com/vgpud/vgpud/internal/testenv"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

func TestAuthorizationDecision(t *testing.T) {
	const group = 977
	cases := []struct {
		name      string
		caller    Caller
		access    access
		haveGroup bool
		polkit    *bool // nil: polkit not asked (off or absent)
		want      bool
		// groupReads: groupAccess is read.
		groupReads bool
	}{
		{"public for anyone", Caller{UID: 65534}, accessPublic, true, nil, true, false},
		{"root reads", Caller{UID: 0}, accessRead, false, nil, true, false},
		{"root manages", Caller{UID: 0}, accessManage, false, nil, true, false},
		{"group member reads", Caller{UID: 1000, GIDs: []uint32{100, group}}, accessRead, true, nil, true, false},
		{"group member manages", Caller{UID: 1000, GIDs: []uint32{group}}, accessManage, true, nil, true, false},
		{"group absent on host", Caller{UID: 1000, GIDs: []uint32{group}}, accessRead, false, nil, false, false},
		{"stranger reads", Caller{UID: 1000, GIDs: []uint32{100}}, accessRead, true, nil, false, false},
		{"stranger manages without polkit", Caller{UID: 1000}, accessManage, true, nil, false, false},
		{"polkit grants a change", Caller{UID: 1000}, accessManage, true, ptr(true), true, false},
		{"polkit refuses a change", Caller{UID: 1000}, accessManage, true, ptr(false), false, false},
		{"polkit never grants a read", Caller{UID: 1000}, accessRead, true, ptr(true), false, false},
		{"read-only group member reads", Caller{UID: 1000, GIDs: []uint32{group}}, accessRead, true, ptr(false), true, true},
		{"read-only group member manages without polkit", Caller{UID: 1000, GIDs: []uint32{group}}, accessManage, true, nil, false, true},
		{"read-only group member refused by polkit", Caller{UID: 1000, GIDs: []uint32{group}}, accessManage, true, ptr(false), false, true},
		{"read-only group member granted by polkit", Caller{UID: 1000, GIDs: []uint32{group}}, accessManage, true, ptr(true), true, true},
		{"root manages with a read-only group", Caller{UID: 0}, accessManage, true, ptr(false), true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var pk func() (bool, error)
			if c.polkit != nil {
				pk = func() (bool, error) { return *c.polkit, nil }
			}
			got, err := decision(c.caller, c.access, group, c.haveGroup, c.groupReads, pk)
			if err != nil || got != c.want {
				t.Fatalf("decision = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// stranger makes the service see one connection as uid 65534 with no
// groups; every other caller is root, as the test process is.
type stranger struct {
	mu     sync.Mutex
	sender string
	gids   []uint32
}

func (s *stranger) set(sender string, gids ...uint32) {
	s.mu.Lock()
	s.sender, s.gids = sender, gids
	s.mu.Unlock()
}

func (s *stranger) credentials(_ context.Context, sender string) (Caller, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sender == s.sender {
		return Caller{UID: 65534, GIDs: s.gids}, nil
	}
	return Caller{UID: 0}, nil
}

// callEvery calls every method of the given access on its kind of object
// with zero arguments and returns the D-Bus error of each.
func callEvery(t *testing.T, e *env, c *Client, want access, instance string) map[string]error {
	t.Helper()
	out := map[string]error{}
	paths := map[string]dbus.ObjectPath{
		ManagerInterface: ManagerPath, GPUInterface: GPUPath(sim.DefaultL4), InstanceInterface: InstancePath(instance), TenantInterface: TenantPath("acme"),
		propertiesInterface: ManagerPath, objectManagerInterface: ManagerPath,
	}
	for iface, path := range paths {
		for _, m := range e.svc.ifaces[iface].methods {
			if m.fn == nil || m.access != want {
				continue
			}
			args := make([]any, len(m.inT))
			for i, tp := range m.inT {
				args[i] = reflect.Zero(tp).Interface()
				switch {
				case tp.Kind() == reflect.Map:
					args[i] = reflect.MakeMap(tp).Interface()
				case tp == reflect.TypeOf(dbus.Variant{}):
					args[i] = dbus.MakeVariant("")
				}
			}
			if iface == propertiesInterface {
				args[0] = ManagerInterface
			}
			out[iface+"."+m.name] = c.conn.Object(BusName, path).CallWithContext(ctxT(t), iface+"."+m.name, 0, args...).Err
		}
	}
	return out
}

func dbusName(err error) string {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name
	}
	return ""
}

func TestDBusUnprivilegedCallerIsRefused(t *testing.T) {
	st := &stranger{}
	var polkitAsked atomic.Int32
	e := newEnv(t, testbus.Options{}, func(_ *env, o *Options) {
		o.credentials = st.credentials
		o.polkit = func(context.Context, string, bool) (bool, error) { polkitAsked.Add(1); return false, nil }
	})
	e.tenant("acme", unlimitedQuota())
	in := e.create("acme", "L4-4Q", "")
	before, err := e.client.Objects(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	nobody := e.dial()
	st.set(nobody.conn.Names()[0])

	for _, level := range []access{accessRead, accessManage} {
		for method, err := range callEvery(t, e, nobody, level, in.UUID) {
			if dbusName(err) != ErrorPrefix+NameAccessDenied {
				t.Errorf("%s (%s) as uid 65534: %v, want AccessDenied", method, level, err)
			}
		}
	}
	if polkitAsked.Load() == 0 {
		t.Error("polkit was never asked about a change")
	}
	after, err := e.client.Objects(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("state changed under refused calls:\nbefore %+v\nafter  %+v", before, after)
	}
	// The client's typed reads are refused the same way; the version is public.
	if _, err := nobody.Objects(ctxT(t)); ErrorName(err) != NameAccessDenied {
		t.Errorf("Objects as uid 65534: %v", err)
	}
	if _, err := nobody.Events(ctxT(t)); ErrorName(err) != NameAccessDenied {
		t.Errorf("Events as uid 65534: %v", err)
	}
	if v, err := nobody.Version(ctxT(t)); err != nil || v != "test-1" {
		t.Errorf("Version as uid 65534 = %q, %v; want the version", v, err)
	}
	// Introspection works but names no GPU, instance or tenant.
	var doc string
	if err := nobody.conn.Object(BusName, ManagerPath+"/instance").CallWithContext(ctxT(t), introspectInterface+".Introspect", 0).Store(&doc); err != nil {
		t.Fatal(err)
	}
	var n xNode
	if err := xml.Unmarshal([]byte(doc), &n); err != nil || len(n.Children) != 0 {
		t.Fatalf("introspection shows uid 65534 %d instances (%v)", len(n.Children), err)
	}
	// Denials are logged with the uid and the method.
	log := e.log.String()
	for _, want := range []string{`msg="access denied" uid=65534 method=dev.vgpud1.Manager.CreateInstance`, "method=dev.vgpud1.Instance.Destroy", "method=org.freedesktop.DBus.ObjectManager.GetManagedObjects"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

func TestDBusGroupAndPolkitGrant(t *testing.T) {
	st := &stranger{}
	var grant atomic.Bool
	var asked atomic.Int32
	e := newEnv(t, testbus.Options{}, func(_ *env, o *Options) {
		o.Group = "root"
		o.credentials = st.credentials
		o.polkit = func(context.Context, string, bool) (bool, error) { asked.Add(1); return grant.Load(), nil }
	})
	e.tenant("acme", unlimitedQuota())
	c := e.dial()

	// A member of the group reads and changes.
	st.set(c.conn.Names()[0], 0)
	if _, err := c.Objects(ctxT(t)); err != nil {
		t.Fatalf("group member reads: %v", err)
	}
	if _, err := c.Create(ctxT(t), CreateRequest{Tenant: "acme", Profile: "L4-4Q"}); err != nil {
		t.Fatalf("group member creates: %v", err)
	}
	// A stranger polkit authorizes changes but still cannot read.
	st.set(c.conn.Names()[0])
	e.svc.creds.forget(c.conn.Names()[0])
	grant.Store(true)
	var p dbus.ObjectPath
	var id string
	if err := c.call(ctxT(t), "create", "CreateInstance", []any{"acme", "L4-4Q", map[string]dbus.Variant{}}, &p, &id); err != nil {
		t.Fatalf("polkit-authorized create: %v", err)
	}
	if _, err := c.Objects(ctxT(t)); ErrorName(err) != NameAccessDenied {
		t.Fatalf("polkit-authorized stranger reads: %v, want AccessDenied", err)
	}

	// The client's changes succeed for that caller: it cannot read the
	// object back, so it reports what the reply said instead of failing a
	// change that happened (a script would repeat it).
	in, err := c.Create(ctxT(t), CreateRequest{Tenant: "acme", Profile: "L4-4Q"})
	if err != nil || in.UUID == "" || in.Tenant != "acme" || in.Profile != "L4-4Q" {
		t.Fatalf("polkit-authorized Create = %+v, %v", in, err)
	}
	if got, err := e.client.Instance(ctxT(t), in.UUID); err != nil || got.Tenant != "acme" {
		t.Fatalf("the instance Create reported: %+v, %v", got, err)
	}
	q := Quota{VRAMBytes: 8 << 30, ComputeMilli: 1000, MaxInstances: 2}
	if ten, err := c.DefineTenant(ctxT(t), TenantSpec{Name: "beta", Quota: unlimitedQuota()}); err != nil || ten.Name != "beta" || ten.Class != "best-effort" {
		t.Fatalf("polkit-authorized DefineTenant = %+v, %v", ten, err)
	}
	if ten, err := c.SetQuota(ctxT(t), "beta", q); err != nil || ten.Quota != q {
		t.Fatalf("polkit-authorized SetQuota = %+v, %v", ten, err)
	}
	if ten, err := e.client.Tenant(ctxT(t), "beta"); err != nil || ten.Quota != q {
		t.Fatalf("beta after SetQuota: %+v, %v", ten, err)
	}

	// What only computes needs read access, so polkit (which grants
	// changes) is not asked and the stranger is refused.
	asked.Store(0)
	if _, err := c.Apply(ctxT(t), "x.yaml", []byte("version: v1\n"), "", true); ErrorName(err) != NameAccessDenied {
		t.Errorf("polkit-authorized Apply dry run: %v, want AccessDenied", err)
	}
	if _, err := c.Defragment(ctxT(t), PlanRequest{Tenant: "acme", Profile: "7g.80gb"}, false); ErrorName(err) != NameAccessDenied {
		t.Errorf("polkit-authorized Defragment without apply: %v, want AccessDenied", err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("polkit was asked %d times about computations that change nothing", n)
	}
	// Applying is a change: polkit's grant lets it through authorization
	// (this service has no Applier, hence BackendFailure).
	if _, err := c.Apply(ctxT(t), "x.yaml", []byte("version: v1\n"), "", false); ErrorName(err) != NameBackendFailure {
		t.Errorf("polkit-authorized Apply: %v, want BackendFailure (no Applier)", err)
	}
}

// TestCancelUsesTheAuthorizedCaller: Cancel decides by the uid that
// authorization found, not by a credential cache that may have started
// over meanwhile (a miss there read as uid 0, root, who may cancel all).
func TestCancelUsesTheAuthorizedCaller(t *testing.T) {
	log := &testenv.Buffer{}
	s := newService(nil, Options{Logger: slog.New(slog.NewTextHandler(log, nil))})
	cancelled := false
	if err := s.ops.add(&op{id: "op-1", sender: ":1.5", uid: 1000, member: ManagerInterface + ".CreateInstance", cancel: func() { cancelled = true }}); err != nil {
		t.Fatal(err)
	}
	// The stranger's credentials are not in the cache.
	c := &call{svc: s, ctx: context.Background(), sender: ":1.9", path: ManagerPath, member: ManagerInterface + ".Cancel", caller: Caller{UID: 65534}}
	if err := s.cancelOp(c, "op-1"); err == nil || toDBusError(err).Name != ErrorPrefix+NameAccessDenied || cancelled {
		t.Fatalf("uid 65534 cancelling uid 1000's operation: %v (cancelled %v), want AccessDenied", err, cancelled)
	}
	if !strings.Contains(log.String(), `msg="access denied" uid=65534 method=dev.vgpud1.Manager.Cancel`) {
		t.Errorf("the refused Cancel is not logged with uid and method:\n%s", log)
	}
	c.caller = Caller{UID: 1000}
	if err := s.cancelOp(c, "op-1"); err != nil || !cancelled {
		t.Fatalf("the owner's Cancel: %v (cancelled %v)", err, cancelled)
	}
}

// fakePolkit answers CheckAuthorization on the bus as polkitd would.
type fakePolkit struct {
	mu      sync.Mutex
	allow   string // the bus name allowed
	subject polkitSubject
	action  string
	flags   uint32
}

func (f *fakePolkit) CheckAuthorization(subject polkitSubject, action string, _ map[string]string, flags uint32, _ string) (polkitResult, *dbus.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subject, f.action, f.flags = subject, action, flags
	name, _ := subject.Details["name"].Value().(string)
	return polkitResult{IsAuthorized: subject.Kind == "system-bus-name" && name == f.allow && action == PolkitAction, Details: map[string]string{}}, nil
}

func TestDBusPolkitOnTheBus(t *testing.T) {
	st := &stranger{}
	e := newEnv(t, testbus.Options{Extra: `<policy user="root"><allow own="org.freedesktop.PolicyKit1"/><allow send_destination="org.freedesktop.PolicyKit1"/></policy>`},
		func(_ *env, o *Options) { o.credentials = st.credentials })
	e.tenant("acme", unlimitedQuota())
	c := e.dial()
	st.set(c.conn.Names()[0])

	// Without polkitd on the bus a stranger's change is refused.
	if _, err := c.DefineTenant(ctxT(t), TenantSpec{Name: "other", Quota: unlimitedQuota()}); ErrorName(err) != NameAccessDenied {
		t.Fatalf("change without polkitd: %v", err)
	}
	pk := &fakePolkit{allow: c.conn.Names()[0]}
	pconn, err := dbus.Connect(e.bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	if err := pconn.Export(pk, "/org/freedesktop/PolicyKit1/Authority", "org.freedesktop.PolicyKit1.Authority"); err != nil {
		t.Fatal(err)
	}
	if r, err := pconn.RequestName("org.freedesktop.PolicyKit1", dbus.NameFlagDoNotQueue); err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("own polkit's name: %v %v", r, err)
	}
	if _, err := c.DefineTenant(ctxT(t), TenantSpec{Name: "other", Quota: unlimitedQuota()}); err != nil {
		t.Fatalf("change polkit allows: %v", err)
	}
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.action != PolkitAction || pk.subject.Kind != "system-bus-name" {
		t.Fatalf("polkit asked about %q for %+v", pk.action, pk.subject)
	}
	// The client allows interactive authorization on changes, so polkit
	// may ask for the password auth_admin_keep wants.
	if pk.flags&1 == 0 {
		t.Fatalf("CheckAuthorization flags %#x: AllowUserInteraction not set", pk.flags)
	}
}
