package e2e

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
	"github.com/vgpud/vgpud/internal/testenv/simhost"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/pkg/virt"
)

// attachEnv is the manager in-process on the simulated host, with a real
// libvirtd and QEMU.
type attachEnv struct {
	lv  *libvirtd.Env
	sim *sim.Host
	db  *store.DB
	vc  *virt.Conn
	m   *manager.Manager
}

func newAttachEnv(t testing.TB) *attachEnv {
	t.Helper()
	return newAttachEnvPolicy(t, "")
}

// newAttachEnvPolicy is newAttachEnv with an undefine policy for VMs
// undefined while nobody watched.
func newAttachEnvPolicy(t testing.TB, policy string) *attachEnv {
	t.Helper()
	lv := libvirtd.Start(t)
	ctx := context.Background()
	log := testenv.Logger(t)
	if _, ok := t.(*testing.B); ok {
		// A benchmark prints its log even when it passes; the manager's
		// debug lines of every round would bury the figures.
		log = slog.New(slog.DiscardHandler)
	}
	vc, err := virt.Connect(ctx, virt.Config{Socket: lv.Socket(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h := simhost.Start(t, simhost.Options{
		Manager: manager.Config{Virt: vc, BusyRetry: time.Millisecond, Logger: log, UndefinePolicy: policy},
	})
	// Registered after the host's, so it runs first: libvirt is closed
	// before the store and the simulated host, as the daemon closes them.
	t.Cleanup(func() { vc.Close() })
	m := h.Manager
	q := tenant.Quota{VRAMBytes: tenant.Unlimited, ComputeMilli: tenant.Unlimited, MaxInstances: tenant.Unlimited}
	if _, err := m.DefineTenant(ctx, tenant.Tenant{Name: "acme", Quota: q}); err != nil {
		t.Fatal(err)
	}
	return &attachEnv{lv: lv, sim: h.Sim, db: h.DB, vc: vc, m: m}
}

func (e *attachEnv) create(t testing.TB, profile string) store.Instance {
	t.Helper()
	r, err := e.m.Create(context.Background(), manager.CreateRequest{Tenant: "acme", Profile: profile})
	if err != nil {
		t.Fatalf("create %s: %v", profile, err)
	}
	return r
}

func validateDomainXML(t *testing.T, xml string) {
	t.Helper()
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		skipMissing(t, "virt-xml-validate not installed (libvirt-clients)")
	}
	f := filepath.Join(t.TempDir(), "domain.xml")
	if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
		t.Fatalf("virt-xml-validate: %v\n%s\n%s", err, out, xml)
	}
}

func TestAttachDetachOnRealLibvirt(t *testing.T) {
	e := newAttachEnv(t)
	ctx := context.Background()
	e.lv.DefineDomain(t, "vgpud-e2e-vm1")
	e.lv.DefineDomain(t, "vgpud-e2e-vm2")
	md := e.create(t, "A10-4Q")
	vf := e.create(t, "L4-4Q")
	for _, r := range []store.Instance{md, vf} {
		if _, err := e.m.Attach(ctx, r.UUID, "vgpud-e2e-vm1", manager.AttachOptions{}); err != nil {
			t.Fatalf("attach %s: %v", r.Profile, err)
		}
	}
	xml := e.lv.Virsh(t, "dumpxml", "--inactive", "vgpud-e2e-vm1")
	addr := strings.Split(vf.VF, ":")
	bus, slotfn := addr[1], addr[2]
	for _, want := range []string{"type='mdev'", md.MdevUUID, "model='vfio-pci'", "type='pci'", "managed='no'",
		"bus='0x" + bus + "'", "slot='0x" + slotfn[:2] + "'", "function='0x" + slotfn[3:] + "'", md.UUID, vf.UUID, "vgpud:instance"} {
		if !strings.Contains(xml, want) {
			t.Errorf("dumpxml lacks %q:\n%s", want, xml)
		}
	}
	validateDomainXML(t, xml)
	// Again: a no-op; elsewhere: a conflict; destroy while attached: busy.
	if _, err := e.m.Attach(ctx, md.UUID, "vgpud-e2e-vm1", manager.AttachOptions{}); err != nil {
		t.Fatalf("repeat attach: %v", err)
	}
	if _, err := e.m.Attach(ctx, md.UUID, "vgpud-e2e-vm2", manager.AttachOptions{}); !errors.Is(err, manager.ErrConflict) {
		t.Fatalf("attach elsewhere: %v", err)
	}
	if _, err := e.m.Attach(ctx, md.UUID, "vgpud-e2e-vm1", manager.AttachOptions{Tenant: "other"}); !errors.Is(err, manager.ErrAccessDenied) {
		t.Fatalf("attach for another tenant: %v", err)
	}
	if err := e.m.Destroy(ctx, md.UUID, manager.DestroyOptions{}); !errors.Is(err, manager.ErrBusy) {
		t.Fatalf("destroy attached: %v", err)
	}
	if _, err := e.m.Attach(ctx, vf.UUID, "no-such-vm", manager.AttachOptions{}); !errors.Is(err, manager.ErrNotFound) {
		t.Fatalf("unknown VM: %v", err)
	}
	if _, err := e.m.Attach(ctx, vf.UUID, "qemu+ssh://elsewhere/system/vgpud-e2e-vm1", manager.AttachOptions{}); !errors.Is(err, manager.ErrInvalidArgument) {
		t.Fatalf("VM on another host: %v", err)
	}
	for _, r := range []store.Instance{md, vf} {
		if err := e.m.Detach(ctx, r.UUID); err != nil {
			t.Fatalf("detach %s: %v", r.Profile, err)
		}
	}
	xml = e.lv.Virsh(t, "dumpxml", "--inactive", "vgpud-e2e-vm1")
	if strings.Contains(xml, "<hostdev") || strings.Contains(xml, md.UUID) {
		t.Fatalf("detach left devices or metadata:\n%s", xml)
	}
	// Detach-and-destroy in one call.
	if _, err := e.m.Attach(ctx, vf.UUID, "vgpud-e2e-vm1", manager.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Destroy(ctx, vf.UUID, manager.DestroyOptions{Detach: true}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(e.lv.Virsh(t, "dumpxml", "--inactive", "vgpud-e2e-vm1"), "<hostdev") {
		t.Fatal("detach-and-destroy left the hostdev")
	}
}

// On this machine there is no VFIO: a live attach to a running TCG VM
// fails, and the create-and-attach is rolled back completely. The VM has
// no <metadata> of its own (as one defined from a plain file): its
// inactive and live XML must come back exactly, with no empty <metadata/>,
// and the refusal carries libvirt's own reason.
func TestLiveAttachRollback(t *testing.T) {
	e := newAttachEnv(t)
	ctx := context.Background()
	const vm = "vgpud-e2e-live"
	e.lv.DefineBareDomain(t, vm)
	e.lv.StartDomain(t, vm)
	cfgBefore := e.lv.Virsh(t, "dumpxml", "--inactive", vm)
	liveBefore := e.lv.Virsh(t, "dumpxml", vm)
	hostBefore, _ := e.sim.Summary()
	checkRefused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, manager.ErrBackendFailure) || !errors.Is(err, virt.ErrLiveAttach) {
			t.Fatalf("%s: %v, want BackendFailure wrapping virt.ErrLiveAttach", what, err)
		}
		var le libvirt.Error
		if !errors.As(err, &le) || le.Code != uint32(libvirt.ErrConfigUnsupported) {
			t.Fatalf("%s: %v does not wrap libvirt's error (code %d)", what, err, libvirt.ErrConfigUnsupported)
		}
		msg := manager.Message(err)
		for _, w := range []string{"the running VM refused the device (libvirt error 67: " + le.Message + ")", "configuration is unchanged"} {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: message %q lacks %q", what, msg, w)
			}
		}
		if after := e.lv.Virsh(t, "dumpxml", "--inactive", vm); after != cfgBefore {
			t.Fatalf("%s: config changed:\n%s\nwas\n%s", what, after, cfgBefore)
		}
		if after := e.lv.Virsh(t, "dumpxml", vm); after != liveBefore {
			t.Fatalf("%s: live definition changed:\n%s\nwas\n%s", what, after, liveBefore)
		}
	}
	_, _, err := e.m.CreateAndAttach(ctx, manager.CreateRequest{Tenant: "acme", Profile: "A10-4Q"}, vm, manager.AttachOptions{})
	checkRefused("live create-and-attach", err)
	if hostAfter, _ := e.sim.Summary(); hostAfter != hostBefore {
		t.Fatalf("instance not released:\n%s", hostAfter)
	}
	if insts, _ := e.m.AllInstances(); len(insts) != 0 {
		t.Fatalf("records left: %+v", insts)
	}
	r := e.create(t, "A10-4Q")
	_, err = e.m.Attach(ctx, r.UUID, vm, manager.AttachOptions{})
	checkRefused("live attach", err)
	if got, err := e.m.Instance(r.UUID); err != nil || got.State != store.StateReady {
		t.Fatalf("instance after a refused attach: %+v, %v", got, err)
	}
}

func TestUndefinedVMReleasesItsInstances(t *testing.T) {
	e := newAttachEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.m.WatchVirt(ctx, "release")
	e.lv.DefineDomain(t, "vgpud-e2e-gone")
	r := e.create(t, "L4-4Q")
	if _, err := e.m.Attach(ctx, r.UUID, "vgpud-e2e-gone", manager.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	// libvirtd restarts mid-test: the next operation works by itself.
	e.lv.Restart(t)
	keep := e.create(t, "L4-4Q")
	if _, err := e.m.Attach(ctx, keep.UUID, "vgpud-e2e-gone", manager.AttachOptions{}); err != nil {
		t.Fatalf("attach after libvirtd restart: %v", err)
	}
	e.lv.Virsh(t, "undefine", "vgpud-e2e-gone")
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err1 := e.m.Instance(r.UUID)
		_, err2 := e.m.Instance(keep.UUID)
		if errors.Is(err1, manager.ErrNotFound) && errors.Is(err2, manager.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances of the undefined VM not released: %v, %v", err1, err2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s, _ := e.sim.Summary(); strings.Contains(s, " vf0") {
		t.Fatalf("device left on the host:\n%s", s)
	}
}

// Reconcile checks attachments from libvirt's side too: a VM holding an
// instance whose attachment record was lost gets the record back; a stopped
// VM naming an instance vgpud no longer has is cleared of it; a VM
// undefined while nobody watched loses its attachments, and its instances
// are kept or released by the policy.
func TestReconcileCrossChecksLibvirt(t *testing.T) {
	for _, policy := range []string{"keep", "release"} {
		t.Run(policy, func(t *testing.T) {
			e := newAttachEnvPolicy(t, policy)
			ctx := context.Background()
			vm := e.lv.DefineDomain(t, "vgpud-e2e-xcheck").Name
			gone := e.lv.DefineDomain(t, "vgpud-e2e-undefined").Name
			lostRecord := e.create(t, "L4-4Q")
			lostInstance := e.create(t, "A10-4Q")
			orphaned := e.create(t, "L4-4Q")
			for _, a := range []struct {
				r  store.Instance
				vm string
			}{{lostRecord, vm}, {lostInstance, vm}, {orphaned, gone}} {
				if _, err := e.m.Attach(ctx, a.r.UUID, a.vm, manager.AttachOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// Records lost behind vgpud's back; a VM undefined while it did
			// not watch.
			if err := e.db.Update(func(tx *store.Tx) error {
				if err := tx.DeleteAttachment(lostRecord.UUID); err != nil {
					return err
				}
				if err := tx.DeleteAttachment(lostInstance.UUID); err != nil {
					return err
				}
				return tx.DeleteInstance(lostInstance.UUID)
			}); err != nil {
				t.Fatal(err)
			}
			e.lv.Virsh(t, "undefine", gone)
			rep, err := e.m.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("attachments: %q", rep.Attachments)
			views, _ := e.m.AllInstances()
			byID := map[string]manager.InstanceView{}
			for _, v := range views {
				byID[v.UUID] = v
			}
			if a := byID[lostRecord.UUID].Attachment; a == nil || a.Domain != vm {
				t.Fatalf("lost attachment record not restored: %+v", byID[lostRecord.UUID])
			}
			if xml := e.lv.Virsh(t, "dumpxml", "--inactive", vm); strings.Contains(xml, lostInstance.MdevUUID) {
				t.Fatalf("VM still names the instance vgpud no longer has:\n%s", xml)
			}
			o, kept := byID[orphaned.UUID]
			switch {
			case kept && o.Attachment != nil:
				t.Fatalf("attachment to the undefined VM kept: %+v", o.Attachment)
			case policy == "keep" && !kept:
				t.Fatal("instance of the undefined VM released under policy keep")
			case policy == "release" && kept:
				t.Fatal("instance of the undefined VM kept under policy release")
			}
			again, err := e.m.Reconcile(ctx)
			if err != nil || len(again.Attachments) != 0 {
				t.Fatalf("second reconcile: %q, %v", again.Attachments, err)
			}
		})
	}
}

// BenchmarkAttachVsVirsh times the attach of an existing instance to a
// shut-off VM through the manager (intent, checks, libvirt config and
// metadata, records) against `virsh attach-device --config` of the same
// hostdev XML (the manager's own, from Manager.Hostdev) on the same libvirtd
// and VM, alternating, each followed by a detach outside the timed part. It
// reports the median of each and their ratio (manager/virsh, goal at most
// 1.3), two figures from one run; it asserts nothing about time.
func BenchmarkAttachVsVirsh(b *testing.B) {
	e := newAttachEnv(b)
	ctx := context.Background()
	vm := e.lv.DefineDomain(b, "vgpud-e2e-bench")
	r := e.create(b, "A10-4Q")
	h, err := e.m.Hostdev(r.UUID)
	if err != nil {
		b.Fatal(err)
	}
	xml, err := virt.HostdevXML(h)
	if err != nil {
		b.Fatal(err)
	}
	f := filepath.Join(b.TempDir(), "hostdev.xml")
	if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
		b.Fatal(err)
	}
	var ours, theirs []time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := e.m.Attach(ctx, r.UUID, vm.Name, manager.AttachOptions{}); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(start))
		b.StopTimer()
		if err := e.m.Detach(ctx, r.UUID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		start = time.Now()
		e.lv.Virsh(b, "attach-device", vm.Name, f, "--config")
		theirs = append(theirs, time.Since(start))
		b.StopTimer()
		e.lv.Virsh(b, "detach-device", vm.Name, f, "--config")
		b.StartTimer()
	}
	med := func(d []time.Duration) time.Duration {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[len(d)/2]
	}
	mo, mt := med(ours), med(theirs)
	b.ReportMetric(float64(mo.Microseconds())/1000, "ms-manager")
	b.ReportMetric(float64(mt.Microseconds())/1000, "ms-virsh")
	b.ReportMetric(float64(mo)/float64(mt), "manager/virsh")
}

// TestVMNamesWithXMLMetacharacters: a domain whose name holds every XML
// metacharacter libvirt allows in a name is attached to and detached from
// like any other (vgpud writes every document with libvirtxml, which
// escapes them); names libvirt can never hold are refused before libvirt
// is asked, and leave every domain as it was.
func TestVMNamesWithXMLMetacharacters(t *testing.T) {
	e := newAttachEnv(t)
	ctx := context.Background()
	name := `vm<&'">]]>x`
	e.lv.DefineDomain(t, name)
	before := e.lv.Virsh(t, "dumpxml", "--inactive", name)
	r := e.create(t, "L4-4Q")
	for _, bad := range []string{"", " ", name + "\n", strings.Repeat("v", 1<<20), "a<b\x00"} {
		if _, err := e.m.Attach(ctx, r.UUID, bad, manager.AttachOptions{}); !errors.Is(err, manager.ErrInvalidArgument) {
			t.Fatalf("attach to %s: %v, want InvalidArgument", manager.QuoteArg(bad), err)
		}
	}
	if after := e.lv.Virsh(t, "dumpxml", "--inactive", name); after != before {
		t.Fatalf("a refused attach changed the domain:\n%s", after)
	}
	a, err := e.m.Attach(ctx, r.UUID, name, manager.AttachOptions{})
	if err != nil {
		t.Fatalf("attach to %q: %v", name, err)
	}
	if a.Domain != name {
		t.Fatalf("attachment names VM %q, want %q", a.Domain, name)
	}
	xml := e.lv.Virsh(t, "dumpxml", "--inactive", name)
	if !strings.Contains(xml, r.UUID) || !strings.Contains(xml, "<hostdev") {
		t.Fatalf("dumpxml lacks the device or its metadata:\n%s", xml)
	}
	validateDomainXML(t, xml)
	if err := e.m.Detach(ctx, r.UUID); err != nil {
		t.Fatalf("detach from %q: %v", name, err)
	}
	if after := e.lv.Virsh(t, "dumpxml", "--inactive", name); strings.Contains(after, "<hostdev") || strings.Contains(after, r.UUID) {
		t.Fatalf("detach left the device or its metadata:\n%s", after)
	}
}
