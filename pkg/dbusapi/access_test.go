package dbusapi

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/godbus/dbus/v5"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
)

// getAccess calls Manager.GetAccess on c, with the flag that lets polkit
// ask for a password: the answer must not depend on it.
func getAccess(t *testing.T, c *Client) (canRead, canManage bool, reason string) {
	t.Helper()
	call := c.conn.Object(BusName, ManagerPath).CallWithContext(ctxT(t), ManagerInterface+".GetAccess", dbus.FlagAllowInteractiveAuthorization)
	if err := call.Store(&canRead, &canManage, &reason); err != nil {
		t.Fatalf("GetAccess: %v", err)
	}
	return canRead, canManage, reason
}

// TestDBusGetAccess: GetAccess says what each caller may do and why not,
// as the calls themselves would decide, asking polkit without interaction;
// with groupAccess read (GroupReadOnly) the group reads and its changes
// go to polkit.
func TestDBusGetAccess(t *testing.T) {
	for _, readOnly := range []bool{false, true} {
		name := "groupAccess manage"
		if readOnly {
			name = "groupAccess read"
		}
		t.Run(name, func(t *testing.T) {
			st := &stranger{}
			var grant, interactive atomic.Bool
			e := newEnv(t, testbus.Options{}, func(_ *env, o *Options) {
				o.Group = "root"
				o.GroupReadOnly = readOnly
				o.credentials = st.credentials
				o.polkit = func(_ context.Context, _ string, i bool) (bool, error) {
					if i {
						interactive.Store(true)
					}
					return grant.Load(), nil
				}
			})
			e.tenant("acme", unlimitedQuota())
			if r, m, why := getAccess(t, e.client); !r || !m || why != "" {
				t.Errorf("root: read %v, manage %v, reason %q; want both, no reason", r, m, why)
			}
			c := e.dial()

			// A member of the group.
			st.set(c.conn.Names()[0], 0)
			r, m, why := getAccess(t, c)
			if !r || m == readOnly {
				t.Errorf("group member: read %v, manage %v; want read, manage %v", r, m, !readOnly)
			}
			createErr := c.conn.Object(BusName, ManagerPath).CallWithContext(ctxT(t), ManagerInterface+".CreateInstance", 0, "acme", "L4-4Q", map[string]dbus.Variant{}).Err
			if readOnly {
				if !strings.Contains(why, "groupAccess is read") || !strings.Contains(why, PolkitAction) {
					t.Errorf("group member's reason: %q", why)
				}
				if dbusName(createErr) != ErrorPrefix+NameAccessDenied {
					t.Errorf("a read-only group member's create: %v", createErr)
				} else if !strings.Contains(createErr.Error(), why) {
					t.Errorf("the refusal %q is not the reason GetAccess gave (%q)", createErr, why)
				}
				if _, err := c.Objects(ctxT(t)); err != nil {
					t.Errorf("a read-only group member reads: %v", err)
				}
				// polkit says yes: the member may change.
				grant.Store(true)
				if r, m, why := getAccess(t, c); !r || !m || why != "" {
					t.Errorf("read-only group member with polkit's grant: read %v, manage %v, reason %q", r, m, why)
				}
				grant.Store(false)
			} else if why != "" || createErr != nil {
				t.Errorf("group member: reason %q, create: %v", why, createErr)
			}

			// A stranger (another connection: the credentials of one are
			// cached): no reads; changes as polkit says.
			c = e.dial()
			st.set(c.conn.Names()[0])
			r, m, why = getAccess(t, c)
			if r || m || !strings.Contains(why, "reading vgpud's state needs root or membership in group root") {
				t.Errorf("stranger: read %v, manage %v, reason %q", r, m, why)
			}
			grant.Store(true)
			if r, m, why := getAccess(t, c); r || !m || !strings.Contains(why, "reading") {
				t.Errorf("stranger with polkit's grant: read %v, manage %v, reason %q", r, m, why)
			}
			if interactive.Load() {
				t.Error("GetAccess let polkit ask for a password")
			}
		})
	}
}

// TestDBusUnlimitedOption: the unlimited option makes the quotas it names
// unlimited whatever their argument (Cockpit cannot send UINT64_MAX), and
// an unknown quota name is refused with nothing changed.
func TestDBusUnlimitedOption(t *testing.T) {
	e := newEnv(t, testbus.Options{}, nil)
	mgr := e.client.conn.Object(BusName, ManagerPath)
	quota := func(name string) [3]uint64 {
		t.Helper()
		ts, err := e.m.Tenants()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range ts {
			if v.Name == name {
				return [3]uint64{v.Quota.VRAMBytes, v.Quota.ComputeMilli, v.Quota.MaxInstances}
			}
		}
		t.Fatalf("no tenant %s", name)
		return [3]uint64{}
	}
	unl := func(names ...string) map[string]dbus.Variant {
		return map[string]dbus.Variant{"unlimited": dbus.MakeVariant(names)}
	}
	if err := mgr.CallWithContext(ctxT(t), ManagerInterface+".DefineTenant", 0, "acme", uint64(0), uint64(500), uint64(0), "", unl(QuotaVRAM, QuotaInstances)).Err; err != nil {
		t.Fatalf("DefineTenant with unlimited: %v", err)
	}
	if got, want := quota("acme"), [3]uint64{uint64(Unlimited), 500, uint64(Unlimited)}; got != want {
		t.Errorf("defined quota %v, want %v", got, want)
	}
	if err := mgr.CallWithContext(ctxT(t), ManagerInterface+".SetQuota", 0, "acme", uint64(1<<30), uint64(0), uint64(3), unl(QuotaCompute)).Err; err != nil {
		t.Fatalf("SetQuota with unlimited: %v", err)
	}
	if got, want := quota("acme"), [3]uint64{1 << 30, uint64(Unlimited), 3}; got != want {
		t.Errorf("set quota %v, want %v", got, want)
	}
	if err := e.client.conn.Object(BusName, TenantPath("acme")).CallWithContext(ctxT(t), TenantInterface+".SetQuota", 0, uint64(0), uint64(0), uint64(0), unl(QuotaVRAM, QuotaCompute, QuotaInstances)).Err; err != nil {
		t.Fatalf("Tenant.SetQuota with unlimited: %v", err)
	}
	if got, want := quota("acme"), [3]uint64{uint64(Unlimited), uint64(Unlimited), uint64(Unlimited)}; got != want {
		t.Errorf("tenant object's quota %v, want %v", got, want)
	}
	err := mgr.CallWithContext(ctxT(t), ManagerInterface+".SetQuota", 0, "acme", uint64(1), uint64(1), uint64(1), unl("gpus")).Err
	if dbusName(err) != ErrorPrefix+NameInvalidArgument || !strings.Contains(err.Error(), `"gpus" is not a quota`) {
		t.Errorf("unknown quota name: %v", err)
	}
	if got, want := quota("acme"), [3]uint64{uint64(Unlimited), uint64(Unlimited), uint64(Unlimited)}; got != want {
		t.Errorf("a refused SetQuota changed the quota to %v", got)
	}
}
