package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
)

// vgpud is a running vgpud --sim on a private bus.
type busDaemon struct {
	bus      *testbus.Bus
	stateDir string
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{}
	err      error
	// env is added to the environment of the processes spawn starts.
	env []string
}

type busDaemonOpts struct {
	// libvirtSocket is libvirtd's socket; "" runs without libvirt.
	libvirtSocket string
	// stateDir is the state directory; "" is a new one (a daemon started
	// again on another's stateDir is that daemon after a restart).
	stateDir string
	// metricsListen is the /metrics address ("": none).
	metricsListen string
	// args are more vgpud flags.
	args []string
	// env is more of vgpud's environment (VGPUD_CRASH_AT).
	env []string
}

// startBusDaemon runs vgpud --sim on the bus and waits until it owns dev.vgpud1.
func startBusDaemon(t testing.TB, bus *testbus.Bus, o busDaemonOpts) *busDaemon {
	t.Helper()
	d := &busDaemon{bus: bus, stateDir: o.stateDir, done: make(chan struct{}), env: o.env}
	if d.stateDir == "" {
		d.stateDir = t.TempDir()
	}
	d.logPath = filepath.Join(d.stateDir, "vgpud.log")
	args := []string{"--sim", "--state-dir", d.stateDir, "--metrics-listen", o.metricsListen, "--bus-address", bus.Address(), "--log-level", "debug"}
	args = append(args, "--libvirt-socket", o.libvirtSocket)
	args = append(args, o.args...)
	if o.libvirtSocket != "" {
		args = append(args, "--libvirt-uri", "qemu:///system")
	}
	watch := busNameWatcher(t, bus)
	cmd, logf := d.spawn(t, args...)
	d.cmd = cmd
	go func() {
		d.err = cmd.Wait()
		logf.Close()
		close(d.done)
	}()
	t.Cleanup(func() { d.stop(t) })
	select {
	case <-watch:
	case <-d.done:
		t.Fatalf("vgpud exited during start-up (%v):\n%s", d.err, d.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("vgpud did not take %s within 60s:\n%s", dbusapi.BusName, d.log())
	}
	return d
}

func (d *busDaemon) spawn(t testing.TB, args ...string) (*exec.Cmd, *os.File) {
	t.Helper()
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(vgpudBin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(d.bus.Env(), d.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, logf
}

// busNameWatcher is closed when dev.vgpud1 gets an owner on the bus.
func busNameWatcher(t testing.TB, bus *testbus.Bus) <-chan struct{} {
	t.Helper()
	conn, err := dbus.Connect(bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan *dbus.Signal, 16)
	conn.Signal(sigs)
	if err := conn.AddMatchSignal(dbus.WithMatchSender("org.freedesktop.DBus"), dbus.WithMatchMember("NameOwnerChanged"), dbus.WithMatchArg(0, dbusapi.BusName)); err != nil {
		t.Fatal(err)
	}
	out := make(chan struct{})
	go func() {
		defer conn.Close()
		for s := range sigs {
			if len(s.Body) == 3 && s.Body[2] != "" {
				close(out)
				return
			}
		}
	}()
	return out
}

func (d *busDaemon) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

func (d *busDaemon) stop(t testing.TB) {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Errorf("vgpud ignored SIGTERM for 30s")
	}
	if t.Failed() {
		t.Logf("vgpud log:\n%s", tailText(d.log(), 6000))
	}
}

func tailText(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// sim runs `vgpud sim ...` on the daemon's simulated host.
func (d *busDaemon) sim(t testing.TB, args ...string) {
	t.Helper()
	d.simOut(t, args...)
}

// simOut is sim, returning what it printed.
func (d *busDaemon) simOut(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(vgpudBin, append([]string{"sim", "--sim", "--state-dir", d.stateDir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("vgpud sim %v: %v\n%s", args, err, out)
	}
	return string(out)
}

type ctlResult struct {
	out, err string
	code     int
}

// ctl runs vgpuctl against the daemon's bus.
func (d *busDaemon) ctl(t testing.TB, args ...string) ctlResult {
	t.Helper()
	return d.run(t, nil, vgpuctlBin, append([]string{"--connect", d.bus.Address()}, args...)...)
}

// asNobody prefixes a command to run it as uid/gid 65534 with no groups.
var asNobody = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}

func (d *busDaemon) ctlAsNobody(t testing.TB, args ...string) ctlResult {
	t.Helper()
	return d.run(t, asNobody, vgpuctlBin, append([]string{"--connect", d.bus.Address()}, args...)...)
}

func (d *busDaemon) run(t testing.TB, prefix []string, bin string, args ...string) ctlResult {
	t.Helper()
	all := append(append(append([]string{}, prefix...), bin), args...)
	cmd := exec.Command(all[0], all[1:]...)
	cmd.Env = d.bus.Env()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := ctlResult{out: out.String(), err: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", all, err)
	}
	return r
}

// must fails the test unless the command exited 0.
func (r ctlResult) must(t testing.TB, what string) ctlResult {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.out, r.err)
	}
	return r
}

// busctl runs busctl on the daemon's bus.
func (d *busDaemon) busctl(t testing.TB, prefix []string, args ...string) ctlResult {
	t.Helper()
	if _, err := exec.LookPath("busctl"); err != nil {
		skipMissing(t, "busctl is not installed (systemd)")
	}
	return d.run(t, prefix, "busctl", append([]string{"--address=" + d.bus.Address()}, args...)...)
}

func jsonOut[T any](t testing.TB, r ctlResult) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.out), &v); err != nil {
		t.Fatalf("bad JSON (%v):\n%s", err, r.out)
	}
	return v
}

func TestDBusBusctlIntrospectAndCall(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})

	r := d.busctl(t, nil, "introspect", dbusapi.BusName, string(dbusapi.ManagerPath)).must(t, "busctl introspect")
	for _, want := range []string{"dev.vgpud1.Manager", ".CreateInstance", ".GetCapacity", ".Version", "emits-change",
		"org.freedesktop.DBus.ObjectManager", ".InterfacesAdded", "org.freedesktop.DBus.Properties", ".PropertiesChanged", ".OperationFinished"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("busctl introspect lacks %q:\n%s", want, r.out)
		}
	}
	x := d.busctl(t, nil, "introspect", "--xml-interface", dbusapi.BusName, string(dbusapi.ManagerPath)).must(t, "busctl introspect --xml-interface")
	checkIntrospection(t, x.out)

	// A mutating call with busctl: define a tenant, carve an instance.
	r = d.busctl(t, nil, "call", dbusapi.BusName, string(dbusapi.ManagerPath), dbusapi.ManagerInterface, "DefineTenant",
		"stttsa{sv}", "acme", "85899345920", "2500", "4", "guaranteed", "0").must(t, "busctl call DefineTenant")
	if strings.TrimSpace(r.out) != `o "/dev/vgpud1/tenant/acme"` {
		t.Fatalf("DefineTenant returned %q", r.out)
	}
	r = d.busctl(t, nil, "call", dbusapi.BusName, string(dbusapi.ManagerPath), dbusapi.ManagerInterface, "CreateInstance",
		"ssa{sv}", "acme", "1g.10gb", "2", "gpu", "s", sim.DefaultH100MIG, "timeout-ms", "t", "60000").must(t, "busctl call CreateInstance")
	if !strings.HasPrefix(r.out, `os "/dev/vgpud1/instance/`) {
		t.Fatalf("CreateInstance returned %q", r.out)
	}
	r = d.busctl(t, nil, "get-property", dbusapi.BusName, "/dev/vgpud1/tenant/acme", dbusapi.TenantInterface, "InstancesUsed").must(t, "busctl get-property")
	if strings.TrimSpace(r.out) != "t 1" {
		t.Fatalf("InstancesUsed = %q, want t 1", r.out)
	}
	r = d.busctl(t, nil, "tree", dbusapi.BusName).must(t, "busctl tree")
	for _, want := range []string{"/dev/vgpud1/gpu/pci_0000_41_00_0", "/dev/vgpud1/instance/", "/dev/vgpud1/tenant/acme"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("busctl tree lacks %s:\n%s", want, r.out)
		}
	}
	// A named error reaches busctl with its hint.
	r = d.busctl(t, nil, "call", dbusapi.BusName, string(dbusapi.ManagerPath), dbusapi.ManagerInterface, "CreateInstance", "ssa{sv}", "nobody", "1g.10gb", "0")
	if r.code == 0 || !strings.Contains(r.err, "vgpuctl tenant define") {
		t.Fatalf("create for an unknown tenant: exit %d, %q", r.code, r.err)
	}
}

// checkIntrospection requires complete XML: every dev.vgpud1 method and
// signal argument named and typed, every property read-only, docs on all.
func checkIntrospection(t *testing.T, doc string) {
	t.Helper()
	type annot struct {
		Name  string `xml:"name,attr"`
		Value string `xml:"value,attr"`
	}
	type xarg struct {
		Name   string  `xml:"name,attr"`
		Type   string  `xml:"type,attr"`
		Annots []annot `xml:"annotation"`
	}
	type member struct {
		Name   string  `xml:"name,attr"`
		Type   string  `xml:"type,attr"`
		Access string  `xml:"access,attr"`
		Args   []xarg  `xml:"arg"`
		Annots []annot `xml:"annotation"`
	}
	var n struct {
		Interfaces []struct {
			Name       string   `xml:"name,attr"`
			Methods    []member `xml:"method"`
			Signals    []member `xml:"signal"`
			Properties []member `xml:"property"`
			Annots     []annot  `xml:"annotation"`
		} `xml:"interface"`
	}
	if err := xml.Unmarshal([]byte(doc), &n); err != nil {
		t.Fatalf("introspection XML: %v\n%s", err, doc)
	}
	documented := func(a []annot) bool {
		for _, x := range a {
			if x.Name == "org.gtk.GDBus.DocString" && x.Value != "" {
				return true
			}
		}
		return false
	}
	found := false
	for _, i := range n.Interfaces {
		if i.Name != dbusapi.ManagerInterface {
			continue
		}
		found = true
		if !documented(i.Annots) {
			t.Error("Manager interface undocumented")
		}
		for _, m := range append(i.Methods, i.Signals...) {
			if !documented(m.Annots) {
				t.Errorf("%s undocumented", m.Name)
			}
			for _, a := range m.Args {
				if a.Name == "" || a.Type == "" || !documented(a.Annots) {
					t.Errorf("%s: argument %+v", m.Name, a)
				}
			}
		}
		for _, p := range i.Properties {
			if p.Access != "read" || p.Type == "" || !documented(p.Annots) {
				t.Errorf("property %+v", p)
			}
		}
		if len(i.Methods) < 20 || len(i.Signals) < 4 {
			t.Errorf("Manager has %d methods and %d signals", len(i.Methods), len(i.Signals))
		}
	}
	if !found {
		t.Fatal("no dev.vgpud1.Manager in the XML")
	}
}

// busSignals collects vgpud's signals on a connection of the test's own.
type busSignals struct {
	mu   sync.Mutex
	sigs []*dbus.Signal
	more chan struct{}
}

func subscribeSignals(t testing.TB, bus *testbus.Bus) *busSignals {
	t.Helper()
	conn, err := dbus.Connect(bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := make(chan *dbus.Signal, 1024)
	conn.Signal(ch)
	if err := conn.AddMatchSignal(dbus.WithMatchSender(dbusapi.BusName), dbus.WithMatchPathNamespace(dbusapi.ManagerPath)); err != nil {
		t.Fatal(err)
	}
	l := &busSignals{more: make(chan struct{}, 1)}
	go func() {
		for s := range ch {
			l.mu.Lock()
			l.sigs = append(l.sigs, s)
			l.mu.Unlock()
			select {
			case l.more <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

// wait returns the first signal match accepts, waiting up to 20s.
func (l *busSignals) wait(t testing.TB, what string, match func(*dbus.Signal) bool) *dbus.Signal {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		l.mu.Lock()
		for _, s := range l.sigs {
			if match(s) {
				l.mu.Unlock()
				return s
			}
		}
		l.mu.Unlock()
		select {
		case <-l.more:
		case <-deadline:
			t.Fatalf("no %s within 20s", what)
		}
	}
}

func TestDBusSubscriberSeesCreate(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	d.ctl(t, "tenant", "define", "acme", "--vram", "80GiB", "--compute", "2500m").must(t, "tenant define")
	sigs := subscribeSignals(t, bus)
	in := jsonOut[struct {
		Instance dbusapi.Instance `json:"instance"`
	}](t, d.ctl(t, "create", "L4-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	path := dbusapi.InstancePath(in.UUID)
	added := sigs.wait(t, "InterfacesAdded for the new instance", func(s *dbus.Signal) bool {
		return s.Name == "org.freedesktop.DBus.ObjectManager.InterfacesAdded" && len(s.Body) == 2 && s.Body[0] == path
	})
	ifaces := added.Body[1].(map[string]map[string]dbus.Variant)
	if ifaces[dbusapi.InstanceInterface]["Tenant"].Value() != "acme" {
		t.Fatalf("InterfacesAdded carries %v", ifaces)
	}
	sigs.wait(t, "PropertiesChanged of the tenant", func(s *dbus.Signal) bool {
		if s.Name != "org.freedesktop.DBus.Properties.PropertiesChanged" || s.Path != dbusapi.TenantPath("acme") {
			return false
		}
		ch, _ := s.Body[1].(map[string]dbus.Variant)
		return ch["InstancesUsed"].Value() == uint64(1)
	})
	sigs.wait(t, "PropertiesChanged of the manager", func(s *dbus.Signal) bool {
		return s.Name == "org.freedesktop.DBus.Properties.PropertiesChanged" && s.Path == dbusapi.ManagerPath
	})
	sigs.wait(t, "OperationFinished", func(s *dbus.Signal) bool {
		return s.Name == dbusapi.ManagerInterface+".OperationFinished" && len(s.Body) == 2 && s.Body[0] == "create" && s.Body[1] == in.UUID
	})
}

// TestDBusSignalsBeforeReply: a change's signals reach the caller's own
// connection before the method's reply (dbus-api.md, "Changes are
// signalled"), in the bus's delivery order.
func TestDBusSignalsBeforeReply(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	conn, err := dbus.Connect(bus.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sigs := make(chan *dbus.Signal, 256)
	conn.Signal(sigs)
	if err := conn.AddMatchSignal(dbus.WithMatchSender(dbusapi.BusName), dbus.WithMatchPathNamespace(dbusapi.ManagerPath)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call := conn.Object(dbusapi.BusName, dbusapi.ManagerPath).CallWithContext(ctx, dbusapi.ManagerInterface+".CreateInstance", 0,
		"acme", "L4-4Q", map[string]dbus.Variant{})
	var path dbus.ObjectPath
	var id string
	if err := call.Store(&path, &id); err != nil {
		t.Fatal(err)
	}
	// Sequence numbers count the messages as the connection read them.
	want := map[string]bool{"InterfacesAdded " + string(path): false, "PropertiesChanged " + string(dbusapi.TenantPath("acme")): false,
		"PropertiesChanged " + string(dbusapi.GPUPath(sim.DefaultL4)): false, "PropertiesChanged " + string(dbusapi.ManagerPath): false}
	for missing := len(want); missing > 0; {
		select {
		case s := <-sigs:
			key := s.Name[strings.LastIndexByte(s.Name, '.')+1:] + " " + string(s.Path)
			if strings.HasSuffix(s.Name, ".InterfacesAdded") && len(s.Body) > 0 {
				p, _ := s.Body[0].(dbus.ObjectPath)
				key = "InterfacesAdded " + string(p)
			}
			if seen, ok := want[key]; ok && !seen {
				if s.Sequence >= call.ResponseSequence {
					t.Errorf("%s arrived after the reply", key)
				}
				want[key] = true
				missing--
			}
		case <-ctx.Done():
			t.Fatalf("signals missing: %v", want)
		}
	}
}

func TestDBusSecondDaemonRefused(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	second := &busDaemon{bus: bus, stateDir: t.TempDir()}
	second.logPath = filepath.Join(second.stateDir, "vgpud.log")
	cmd, logf := second.spawn(t, "--sim", "--state-dir", second.stateDir, "--metrics-listen", "", "--bus-address", bus.Address(), "--libvirt-socket", "")
	err := cmd.Wait()
	logf.Close()
	if err == nil {
		t.Fatal("a second vgpud on the same bus started")
	}
	if log := second.log(); !strings.Contains(log, "another vgpud") {
		t.Fatalf("second vgpud's error does not say why:\n%s", log)
	}
	d.ctl(t, "version").must(t, "first vgpud still answers")
}

func TestDBusCallerTimeoutCancelsAndUndoes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault []string
	}{
		// The driver call fails late: nothing to take away.
		{"call fails late", []string{"--return", "2"}},
		// The driver call succeeds after the caller gave up: the GPU
		// instance it makes must not be left behind.
		{"call lands late", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bus := testbus.Start(t)
			d := startBusDaemon(t, bus, busDaemonOpts{})
			d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
			d.sim(t, append([]string{"fault", "--op", "CreateGpuInstanceWithPlacement", "--delay", "4s", "--count", "1"}, tc.fault...)...)
			sigs := subscribeSignals(t, bus)
			start := time.Now()
			r := d.ctl(t, "--timeout", "1s", "create", "1g.10gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG)
			if r.code != 11 || !strings.Contains(r.err, "Timeout") {
				t.Fatalf("create under --timeout 1s: exit %d, %s", r.code, r.err)
			}
			sigs.wait(t, "OperationFailed for the timed-out create", func(s *dbus.Signal) bool {
				return s.Name == dbusapi.ManagerInterface+".OperationFailed" && len(s.Body) == 3 && s.Body[0] == "create"
			})
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("the daemon answered after %v; the caller allowed 1s", took)
			}
			// The record stays until the driver answers and the undo is done.
			waitNoInstances(t, d, 30*time.Second)
			if out := d.simOut(t, "summary"); strings.Contains(out, "gi") {
				t.Fatalf("a GPU instance is left on the host after the undo:\n%s", out)
			}
		})
	}
}

// waitNoInstances waits until vgpuctl list is empty.
func waitNoInstances(t *testing.T, d *busDaemon, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		l := jsonOut[struct {
			Items []dbusapi.Instance `json:"items"`
		}](t, d.ctl(t, "list", "-o", "json").must(t, "list"))
		if len(l.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("instances left after a cancelled create: %+v", l.Items)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDBusUnprivilegedCaller runs callers as uid 65534 with no groups:
// every read and every change is refused with dev.vgpud1.Error.AccessDenied,
// nothing changes, and each denial is logged with the uid and the method.
func TestDBusUnprivilegedCaller(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		skipMissing(t, "setpriv is not installed (util-linux)")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: running callers as another uid needs root")
	}
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	d.ctl(t, "tenant", "define", "acme", "--vram", "80GiB", "--compute", "2500m").must(t, "tenant define")
	in := jsonOut[struct {
		Instance dbusapi.Instance `json:"instance"`
	}](t, d.ctl(t, "create", "L4-4Q", "--tenant", "acme", "-o", "json").must(t, "create")).Instance
	// Everything a refused call could change: instances, tenants, and the
	// GPUs' modes and MIG GPU instances.
	state := func() string {
		return d.ctl(t, "list", "-o", "json").must(t, "list").out + d.ctl(t, "tenant", "list", "-o", "json").must(t, "tenant list").out +
			d.ctl(t, "gpus", "-o", "json").must(t, "gpus").out
	}
	before := state()

	// Every method of every interface, called raw as uid 65534.
	got := nobodyCalls(t, d, map[string]dbus.ObjectPath{
		dbusapi.ManagerInterface: dbusapi.ManagerPath, dbusapi.GPUInterface: dbusapi.GPUPath(sim.DefaultL4),
		dbusapi.InstanceInterface: dbusapi.InstancePath(in.UUID), dbusapi.TenantInterface: dbusapi.TenantPath("acme"),
	})
	if len(got) < 30 {
		t.Fatalf("only %d methods called: %v", len(got), got)
	}
	for method, name := range got {
		if method == dbusapi.ManagerInterface+".GetAccess" {
			// Public: it tells any caller what it may do, and why not.
			if name != "ok" {
				t.Errorf("%s as uid 65534: %s, want an answer", method, name)
			}
			continue
		}
		if name != dbusapi.ErrorPrefix+dbusapi.NameAccessDenied {
			t.Errorf("%s as uid 65534: %s, want %sAccessDenied", method, name, dbusapi.ErrorPrefix)
		}
		if !strings.Contains(d.log(), "uid=65534 method="+method+" ") {
			t.Errorf("no denial logged for %s", method)
		}
	}

	// vgpuctl as uid 65534: every verb that reads or changes is refused
	// (exit 3); the version is public.
	for _, args := range [][]string{
		{"gpus"}, {"gpu", "show", sim.DefaultL4}, {"profiles"}, {"capacity"}, {"list"}, {"show", in.UUID}, {"dumpxml", in.UUID},
		{"plan", "1g.10gb"}, {"top", "-n", "1"}, {"events", "--count", "1"}, {"tenant", "list"}, {"tenant", "show", "acme"},
		{"create", "L4-4Q", "--tenant", "acme"}, {"destroy", in.UUID}, {"attach", "vm1", in.UUID}, {"detach", in.UUID},
		{"tenant", "define", "evil", "--vram", "1GiB", "--compute", "1"}, {"tenant", "set-quota", "acme", "--vram", "1TiB"},
		{"tenant", "undefine", "acme", "--force"}, {"reconcile"}, {"gpu", "mig", sim.DefaultH100TS, "on"}, {"defrag", "7g.80gb", "--tenant", "acme"},
	} {
		r := d.ctlAsNobody(t, args...)
		if r.code != 3 || !strings.Contains(r.err, "AccessDenied") || !strings.Contains(r.err, "group vgpud") {
			t.Errorf("vgpuctl %v as uid 65534: exit %d, %q; want 3 and AccessDenied with the hint", args, r.code, r.err)
		}
	}
	if r := d.ctlAsNobody(t, "version"); r.code != 0 || !strings.Contains(r.out, "vgpud ") || strings.Contains(r.out, "unknown") {
		t.Errorf("vgpuctl version as uid 65534: exit %d %q %q", r.code, r.out, r.err)
	}
	// Introspection is public but names no GPU, instance or tenant.
	// (--xml-interface: plain busctl introspect also reads every
	// property's value, which uid 65534 may not.)
	r := d.busctl(t, asNobody, "introspect", "--xml-interface", dbusapi.BusName, string(dbusapi.ManagerPath)).must(t, "busctl introspect as uid 65534")
	if !strings.Contains(r.out, `"CreateInstance"`) {
		t.Errorf("introspection as uid 65534 lacks the methods:\n%s", r.out)
	}
	r = d.busctl(t, asNobody, "tree", dbusapi.BusName)
	if strings.Contains(r.out, "acme") || strings.Contains(r.out, "pci_") || strings.Contains(r.out, strings.ReplaceAll(in.UUID, "-", "_")) {
		t.Errorf("busctl tree as uid 65534 shows objects:\n%s", r.out)
	}
	// A busctl call of a change, as uid 65534: refused with the hint.
	r = d.busctl(t, asNobody, "call", dbusapi.BusName, string(dbusapi.ManagerPath), dbusapi.ManagerInterface, "DestroyInstance", "sa{sv}", in.UUID, "0")
	if r.code == 0 || !strings.Contains(r.err, "changing vgpud's state needs root") {
		t.Errorf("busctl DestroyInstance as uid 65534: exit %d %q", r.code, r.err)
	}

	if after := state(); before != after {
		t.Fatalf("state changed under refused calls:\nbefore %s\nafter  %s", before, after)
	}
	// The bus policy keeps vgpud's signals (tenant, instance and VM names)
	// from uid 65534; root's changes happen meanwhile.
	if n := nobodySignals(t, d, func() {
		d.ctl(t, "create", "A10-4Q", "--tenant", "acme").must(t, "create as root")
		d.ctl(t, "tenant", "set-quota", "acme", "--max-instances", "9").must(t, "set-quota as root")
	}); n != 0 {
		t.Fatalf("uid 65534 received %d of vgpud's signals", n)
	}
}

// nobodyCalls runs this test binary as uid 65534 to call, raw, every method
// the objects' introspection lists, and returns each one's error name.
func nobodyCalls(t *testing.T, d *busDaemon, paths map[string]dbus.ObjectPath) map[string]string {
	t.Helper()

	spec, _ := json.Marshal(paths)
	cmd := exec.Command(asNobody[0], append(asNobody[1:], helperBinary(t), "-test.run=^TestNobodyHelper$")...)
	cmd.Env = append(d.bus.Env(), "VGPUD_E2E_NOBODY="+string(spec))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(line, "NOBODY-RESULT "); ok {
			var res map[string]string
			if err := json.Unmarshal([]byte(j), &res); err != nil {
				t.Fatal(err)
			}
			return res
		}
	}
	t.Fatalf("helper printed no ctlResult:\n%s", out)
	return nil
}

// helperBinary is a copy of this test binary that uid 65534 can run (the
// original's directory is private to root).
func helperBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vgpud-e2e-helper-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "e2e.test")
	if err := copyExecutable(self, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// nobodySignals subscribes to vgpud's signals as uid 65534, has act make
// changes, and returns how many signals reached the subscriber.
func nobodySignals(t *testing.T, d *busDaemon, act func()) int {
	t.Helper()
	cmd := exec.Command(asNobody[0], append(asNobody[1:], helperBinary(t), "-test.run=^TestNobodyHelper$")...)
	cmd.Env = append(d.bus.Env(), "VGPUD_E2E_NOBODY=signals")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "SUBSCRIBED" {
	}
	act()
	fmt.Fprintln(stdin, "done")
	for lines.Scan() {
		if n, ok := strings.CutPrefix(lines.Text(), "NOBODY-SIGNALS "); ok {
			var count int
			fmt.Sscan(n, &count)
			return count
		}
	}
	t.Fatal("signal helper printed no count")
	return 0
}

// nobodySignalsHelper counts the vgpud signals a uid 65534 subscriber
// receives between "SUBSCRIBED" and the parent's "done". A bus round trip
// after "done" makes sure every signal emitted before it has been routed.
func nobodySignalsHelper(t *testing.T) {
	conn, err := dbus.ConnectSystemBus()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch := make(chan *dbus.Signal, 1024)
	conn.Signal(ch)
	if err := conn.AddMatchSignal(dbus.WithMatchSender(dbusapi.BusName)); err != nil {
		t.Fatal(err)
	}
	fmt.Println("SUBSCRIBED")
	bufio.NewScanner(os.Stdin).Scan()
	var id string
	if err := conn.BusObject().Call("org.freedesktop.DBus.GetId", 0).Store(&id); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		select {
		case s := <-ch:
			if s.Sender != "org.freedesktop.DBus" {
				n++
			}
			continue
		default:
		}
		break
	}
	fmt.Printf("NOBODY-SIGNALS %d\n", n)
}

func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestNobodyHelper is not a test: nobodyCalls and nobodySignals run it as
// uid 65534.
func TestNobodyHelper(t *testing.T) {
	spec := os.Getenv("VGPUD_E2E_NOBODY")
	if spec == "" {
		t.Skip("helper process for TestDBusUnprivilegedCaller")
	}
	if spec == "signals" {
		nobodySignalsHelper(t)
		return
	}
	var paths map[string]dbus.ObjectPath
	if err := json.Unmarshal([]byte(spec), &paths); err != nil {
		t.Fatal(err)
	}
	conn, err := dbus.ConnectSystemBus()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res := map[string]string{}
	for iface, path := range paths {
		obj := conn.Object(dbusapi.BusName, path)
		var doc string
		if err := obj.Call("org.freedesktop.DBus.Introspectable.Introspect", 0).Store(&doc); err != nil {
			t.Fatalf("introspect %s: %v", path, err)
		}
		var n struct {
			Interfaces []struct {
				Name    string `xml:"name,attr"`
				Methods []struct {
					Name string `xml:"name,attr"`
					Args []struct {
						Type      string `xml:"type,attr"`
						Direction string `xml:"direction,attr"`
					} `xml:"arg"`
				} `xml:"method"`
			} `xml:"interface"`
		}
		if err := xml.Unmarshal([]byte(doc), &n); err != nil {
			t.Fatal(err)
		}
		for _, i := range n.Interfaces {
			if i.Name != iface && !(iface == dbusapi.ManagerInterface && (i.Name == "org.freedesktop.DBus.ObjectManager" || i.Name == "org.freedesktop.DBus.Properties")) {
				continue
			}
			for _, m := range i.Methods {
				var args []any
				for _, a := range m.Args {
					if a.Direction == "in" {
						args = append(args, dbusZero(a.Type))
					}
				}
				if i.Name == "org.freedesktop.DBus.Properties" {
					args[0] = dbusapi.ManagerInterface
					if m.Name == "Get" {
						args[1] = "Instances"
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := obj.CallWithContext(ctx, i.Name+"."+m.Name, 0, args...).Err
				cancel()
				name := "ok"
				if de, ok := err.(dbus.Error); ok {
					name = de.Name
				} else if err != nil {
					name = err.Error()
				}
				res[i.Name+"."+m.Name] = name
			}
		}
	}
	b, _ := json.Marshal(res)
	fmt.Printf("NOBODY-RESULT %s\n", b)
}

// dbusZero is a zero value of the D-Bus types the API uses.
func dbusZero(sig string) any {
	switch sig {
	case "s":
		return ""
	case "b":
		return false
	case "t":
		return uint64(0)
	case "u":
		return uint32(0)
	case "i":
		return int32(0)
	case "o":
		return dbus.ObjectPath("/")
	case "v":
		return dbus.MakeVariant("")
	case "as":
		return []string{}
	case "a{sv}":
		return map[string]dbus.Variant{}
	}
	panic("dbusZero: no zero value for " + sig)
}

// TestDBusInterruptedClientCancels interrupts vgpuctl (SIGINT) during a
// slow create: it exits 130 and vgpud cancels and undoes the operation.
func TestDBusInterruptedClientCancels(t *testing.T) {
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{})
	d.ctl(t, "tenant", "define", "acme", "--vram", "unlimited", "--compute", "unlimited").must(t, "tenant define")
	d.sim(t, "fault", "--op", "CreateGpuInstanceWithPlacement", "--delay", "6s", "--return", "2", "--count", "1")
	sigs := subscribeSignals(t, bus)
	cmd := exec.Command(vgpuctlBin, "--connect", bus.Address(), "create", "1g.10gb", "--tenant", "acme", "--gpu", sim.DefaultH100MIG)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The create is in flight once its record shows (admission is
	// recorded before the driver is called).
	deadline := time.Now().Add(20 * time.Second)
	for {
		l := jsonOut[struct {
			Items []dbusapi.Instance `json:"items"`
		}](t, d.ctl(t, "list", "-o", "json").must(t, "list"))
		if len(l.Items) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the create was never admitted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	start := time.Now()
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Fatalf("interrupted vgpuctl: %v, stderr %q; want exit 130", err, errb.String())
	}
	sigs.wait(t, "OperationFailed of the interrupted create", func(s *dbus.Signal) bool {
		return s.Name == dbusapi.ManagerInterface+".OperationFailed" && len(s.Body) == 3 && s.Body[0] == "create"
	})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("vgpud cancelled %v after the interrupt", took)
	}
	// The undo finishes once the driver call (6 s) returns.
	waitNoInstances(t, d, 40*time.Second)
}
