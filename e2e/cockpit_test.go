package e2e

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/vgpud/vgpud/internal/testenv"
	browserenv "github.com/vgpud/vgpud/internal/testenv/browser"
	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/internal/testenv/libvirtd"
)

// The Cockpit page (cockpit/vgpud) in a real browser: Debian's headless
// chromium, driven by chromedp, against cockpit-ws serving a local session
// whose cockpit-bridge talks to vgpud --sim on the test's private system bus.
//
// Screenshots of every tab go to $VGPUD_COCKPIT_ARTEFACTS (else a temporary
// directory, logged); -update-screenshots also writes the GPUs tab to
// docs/img/cockpit-gpus.png and the read-only view to
// docs/img/cockpit-read-only.png.

var updateScreenshots = flag.Bool("update-screenshots", false, "write the Cockpit page's screenshots in docs/img (cockpit-gpus.png, cockpit-read-only.png)")

const (
	cockpitPage = "/cockpit/@localhost/vgpud/index.html"
	// The whole browser session of a test, so a hung page fails in time.
	cockpitBudget = 150 * time.Second
)

// cockpitTools finds chromium, cockpit-ws, cockpit-bridge and Cockpit's
// shell (cockpit-system), skipping (or,
// with VGPUD_TEST_REQUIRE_SERVICES=1, failing) the test when one is absent.
func cockpitTools(t *testing.T) (chromium, ws, bridge string) {
	t.Helper()
	if chromium = browserenv.Chromium(); chromium == "" {
		skipMissing(t, "chromium is not installed (apt-get install chromium)")
	}
	for _, p := range []string{"/usr/lib/cockpit/cockpit-ws", "/usr/libexec/cockpit-ws"} {
		if _, err := os.Stat(p); err == nil {
			ws = p
			break
		}
	}
	if ws == "" {
		skipMissing(t, "cockpit-ws is not installed (apt-get install cockpit-ws)")
	}
	p, err := exec.LookPath("cockpit-bridge")
	if err != nil {
		skipMissing(t, "cockpit-bridge is not installed (apt-get install cockpit-bridge)")
	}
	if _, err := os.Stat("/usr/share/cockpit/base1/cockpit.js"); err != nil {
		if _, err := os.Stat("/usr/share/cockpit/base1/cockpit.js.gz"); err != nil {
			skipMissing(t, "Cockpit's base1 package (cockpit.js) is not installed (cockpit-bridge)")
		}
	}
	if _, err := os.Stat("/usr/share/cockpit/shell/manifest.json"); err != nil {
		skipMissing(t, "Cockpit's shell is not installed (apt-get install cockpit-system)")
	}
	return chromium, ws, p
}

// cockpitArtefacts is where the screenshots go.
func cockpitArtefacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("VGPUD_COCKPIT_ARTEFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	dir = filepath.Join(dir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// installPage copies cockpit/vgpud into DIR/cockpit/vgpud, a directory on
// the bridge's XDG_DATA_DIRS, readable by any uid.
func installPage(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.MkdirTemp("", "vgpud-cockpit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	dst := filepath.Join(data, "cockpit", "vgpud")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{data, filepath.Join(data, "cockpit"), dst} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(root, "cockpit", "vgpud")
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return data
}

// startCockpitWS runs cockpit-ws with a local session (its cockpit-bridge
// runs as the same user, on the private bus), as nobody when prefix says
// so, and returns its base URL once it serves the page.
func startCockpitWS(t *testing.T, bus *testbus.Bus, ws, bridge, data string, prefix []string) string {
	t.Helper()
	port := metricsFreePort(t)
	home, err := os.MkdirTemp("", "vgpud-cockpit-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if len(prefix) > 0 {
		// The bridge as nobody keeps its state in HOME.
		if err := os.Chown(home, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	args := append(append([]string{}, prefix...), ws, "--no-tls", "--local-session="+bridge,
		"--address", "127.0.0.1", "--port", fmt.Sprint(port))
	cmd := exec.Command(args[0], args[1:]...)
	env := []string{}
	for _, kv := range bus.Env() {
		if !strings.HasPrefix(kv, "XDG_DATA_DIRS=") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "XDG_DATA_DIRS="+data+":/usr/share", "HOME="+home, "XDG_DATA_HOME="+filepath.Join(home, "data"))
	logPath := filepath.Join(home, "cockpit-ws.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(logPath, 0o666)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		// The process group: cockpit-ws and the bridge it started.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("cockpit-ws log:\n%s", tailText(string(b), 4000))
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/cockpit/static/login.html")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				break
			}
		}
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("cockpit-ws exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("cockpit-ws did not answer on %s within 20s (%v)", base, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return base
}

// browser is a headless chromium tab (internal/testenv/browser) with the
// page's own steps.
type browser struct {
	*browserenv.Browser
	t testing.TB
}

func newBrowser(t *testing.T, chromium, artefacts string) *browser {
	t.Helper()
	return &browser{Browser: browserenv.New(t, chromium, artefacts, cockpitBudget), t: t}
}

func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	b.Run(what, actions...)
}

func eval[T any](b *browser, what, js string) T {
	b.t.Helper()
	return browserenv.Eval[T](b.Browser, what, js)
}

func (b *browser) waitJS(what, js string) {
	b.t.Helper()
	b.WaitJS(what, js)
}

func (b *browser) screenshot(name string) string {
	b.t.Helper()
	return b.Screenshot(name)
}

func (b *browser) tab(name string) {
	b.t.Helper()
	b.run("open tab "+name, chromedp.Click(chromedp.CSS("#tab-"+name)),
		chromedp.WaitVisible(chromedp.CSS("#page-"+name)))
}

// setSelect picks a value in a <select> as a user does (change fires).
func (b *browser) setSelect(sel, value string) {
	b.t.Helper()
	js := fmt.Sprintf(`(function(){const s=document.querySelector(%q); if(!s||!Array.from(s.options).some(o=>o.value===%q)) return false;
		s.value=%q; s.dispatchEvent(new Event("change")); return true})()`, sel, value, value)
	if !eval[bool](b, "select "+value+" in "+sel, js) {
		opts := eval[[]string](b, "options", fmt.Sprintf(`Array.from(document.querySelector(%q).options).map(o=>o.value)`, sel))
		b.t.Fatalf("%s has no option %q: %v", sel, value, opts)
	}
}

type listedInstance struct {
	UUID    string `json:"uuid"`
	Tenant  string `json:"tenant"`
	Kind    string `json:"kind"`
	Profile string `json:"profile"`
	GPU     string `json:"gpu"`
	MIG     *struct {
		Start         int `json:"start"`
		Size          int `json:"size"`
		GPUInstanceID int `json:"gpuInstanceID"`
	} `json:"mig"`
	Attachment *struct {
		VM string `json:"vm"`
	} `json:"attachment"`
}

func listInstances(t *testing.T, d *busDaemon) []listedInstance {
	t.Helper()
	return jsonOut[struct {
		Items []listedInstance `json:"items"`
	}](t, d.ctl(t, "list", "-o", "json").must(t, "vgpuctl list")).Items
}

// domMIG is one drawn GPU instance of the slot grid.
type domMIG struct {
	PCI    string `json:"pci"`
	Start  int    `json:"start"`
	Size   int    `json:"size"`
	Tenant string `json:"tenant"`
	UUIDs  string `json:"uuids"`
}

const domMIGJS = `Array.from(document.querySelectorAll("article.gpu .gi")).map(g => ({
	pci: g.closest("article.gpu").dataset.pci, start: +g.dataset.start, size: +g.dataset.size,
	tenant: g.dataset.tenant, uuids: g.dataset.uuid}))`

// checkGrid requires the page's slot grids to show exactly vgpuctl list's
// MIG instances, each at its placement.
func checkGrid(t *testing.T, b *browser, d *busDaemon) {
	t.Helper()
	drawn := eval[[]domMIG](b, "read the slot grid", domMIGJS)
	want := 0
	for _, in := range listInstances(t, d) {
		if in.MIG == nil {
			continue
		}
		want++
		found := false
		for _, g := range drawn {
			if g.PCI == in.GPU && g.Start == in.MIG.Start && g.Size == in.MIG.Size && strings.Contains(g.UUIDs, in.UUID) && strings.Contains(g.Tenant, in.Tenant) {
				found = true
			}
		}
		if !found {
			t.Errorf("instance %s (%s %s on %s slots %d+%d) is not drawn at its placement; drawn: %+v", in.UUID, in.Tenant, in.Profile, in.GPU, in.MIG.Start, in.MIG.Size, drawn)
		}
	}
	if len(drawn) != want {
		t.Errorf("the page draws %d GPU instances, vgpuctl list has %d MIG instances: %+v", len(drawn), want, drawn)
	}
}

func TestCockpitPage(t *testing.T) {
	chromium, ws, bridge := cockpitTools(t)
	artefacts := cockpitArtefacts(t)
	lv := libvirtd.Start(t)
	bus := testbus.Start(t)
	d := startBusDaemon(t, bus, busDaemonOpts{libvirtSocket: lv.Socket()})
	const vm = "vgpud-cockpit-vm"
	lv.DefineDomain(t, vm)
	// acme's VRAM quota admits a 3g.40gb (about 39.5 GiB), and then not a
	// 2g.20gb (19.6 GiB), for which the GPU has room.
	d.ctl(t, "tenant", "define", "acme", "--vram", "50GiB", "--compute", "4", "--max-instances", "8", "--class", "guaranteed").must(t, "define acme")
	d.ctl(t, "tenant", "define", "globex", "--vram", "100GiB", "--compute", "unlimited").must(t, "define globex")
	d.ctl(t, "create", "1g.10gb", "--tenant", "globex").must(t, "create 1g.10gb")
	d.ctl(t, "create", "L4-4Q", "--tenant", "globex").must(t, "create L4-4Q")
	mdev := jsonOut[struct {
		Instance struct {
			UUID string `json:"uuid"`
		} `json:"instance"`
	}](t, d.ctl(t, "create", "A10-4Q", "--tenant", "globex", "-o", "json").must(t, "create A10-4Q")).Instance

	data := installPage(t)
	base := startCockpitWS(t, bus, ws, bridge, data, nil)
	b := newBrowser(t, chromium, artefacts)
	start := time.Now()

	// Load: the default host's GPUs, the grid as vgpuctl lists it.
	gpus := jsonOut[struct {
		Items []struct {
			PCI string `json:"pci"`
		} `json:"items"`
	}](t, d.ctl(t, "gpus", "-o", "json").must(t, "vgpuctl gpus"))
	b.run("load the page", chromedp.Navigate(base+cockpitPage))
	b.waitJS("the GPUs", fmt.Sprintf(`document.querySelectorAll("article.gpu").length === %d && document.querySelectorAll("article.gpu .gi").length === 1`, len(gpus.Items)))
	for _, g := range gpus.Items {
		n := eval[int](b, "GPU card", fmt.Sprintf(`document.querySelectorAll('article.gpu[data-pci=%q]').length`, g.PCI))
		if n != 1 {
			t.Errorf("GPU %s: %d cards", g.PCI, n)
		}
	}
	checkGrid(t, b, d)
	vgpuText := eval[string](b, "vGPUs", `document.querySelector('article.gpu[data-pci="0000:81:00.0"] .vgpus').textContent`)
	if !strings.Contains(vgpuText, "L4-4Q × 1") || !strings.Contains(vgpuText, "globex") {
		t.Errorf("L4's vGPUs by type: %q", vgpuText)
	}
	b.screenshot("1-gpus")

	// Create a 3g.40gb for acme through the page; it appears at its
	// placement without a reload (the marker survives).
	t.Logf("create at %v", time.Since(start).Round(time.Millisecond))
	eval[int](b, "mark the document", `window.__noReload = 1`)
	b.tab("instances")
	b.waitJS("the profile chooser", `document.querySelector("#cf-profile option[value='H100-SXM5-80GB/3g.40gb']") !== null`)
	b.setSelect("#cf-tenant", "acme")
	b.setSelect("#cf-profile", "H100-SXM5-80GB/3g.40gb")
	b.waitJS("the plan", `document.querySelector("#cf-plan").textContent.indexOf("0000:") >= 0`)
	b.run("create", chromedp.Click(chromedp.CSS("#cf-create")))
	var created listedInstance
	b.tab("gpus")
	b.waitJS("the new instance", `Array.from(document.querySelectorAll("article.gpu .gi")).some(g => g.dataset.tenant === "acme")`)
	for _, in := range listInstances(t, d) {
		if in.Tenant == "acme" && in.Profile == "3g.40gb" {
			created = in
		}
	}
	if created.UUID == "" || created.MIG == nil {
		t.Fatalf("vgpuctl list has no 3g.40gb for acme after the page's create")
	}
	b.waitJS("the new instance at its placement", fmt.Sprintf(`document.querySelector('article.gpu[data-pci=%q] .gi[data-start="%d"][data-size="%d"][data-uuid*=%q]') !== null`,
		created.GPU, created.MIG.Start, created.MIG.Size, created.UUID))
	if eval[int](b, "reload marker", `window.__noReload || 0`) != 1 {
		t.Errorf("the page was reloaded to show the new instance")
	}
	checkGrid(t, b, d)
	b.waitJS("the version line", `document.querySelector("#version").textContent !== ""`)
	b.screenshot("2-gpus-after-create")

	// A 2g.20gb is over acme's VRAM quota: QuotaExceeded with vgpud's own
	// message, which vgpuctl prints too.
	t.Logf("quota check at %v", time.Since(start).Round(time.Millisecond))
	b.tab("instances")
	b.setSelect("#cf-profile", "H100-SXM5-80GB/2g.20gb")
	// The plan already tells (and the button stays put once it is shown).
	b.waitJS("the plan's quota refusal", `document.querySelector("#cf-plan").textContent.indexOf("VRAM quota") >= 0`)
	b.run("create over quota", chromedp.Click(chromedp.CSS("#cf-create")))
	b.waitJS("the error", `!document.querySelector("#error").hidden && document.querySelector("#error-name").textContent !== ""`)
	errName := eval[string](b, "error name", `document.querySelector("#error-name").textContent`)
	errMsg := eval[string](b, "error message", `document.querySelector("#error-message").textContent`)
	if errName != "dev.vgpud1.Error.QuotaExceeded" {
		t.Errorf("refused create shows %q: %q", errName, errMsg)
	}
	ctl := d.ctl(t, "create", "2g.20gb", "--tenant", "acme")
	if ctl.code != 6 || errMsg == "" || !strings.Contains(ctl.err, errMsg) {
		t.Errorf("the page shows %q; vgpuctl (exit %d) says %q", errMsg, ctl.code, ctl.err)
	}
	b.screenshot("3-instances-quota-exceeded")

	// Attach the A10-4Q (an mdev) to a VM of the private libvirtd.
	row := fmt.Sprintf(`#instances tr[data-uuid=%q]`, mdev.UUID)
	t.Logf("attach at %v", time.Since(start).Round(time.Millisecond))
	// The VM field is a choice of libvirt's VMs (ListDomains), with state.
	b.waitJS("the VM chooser", fmt.Sprintf(`document.querySelector('%s select.vm-select') !== null`, row))
	choices := eval[[]string](b, "VM choices", fmt.Sprintf(`Array.from(document.querySelector('%s select.vm-select').options).map(o=>o.textContent)`, row))
	if !slices.Contains(choices, vm+" (shut off)") {
		t.Errorf("VM chooser offers %q, want %q among them", choices, vm+" (shut off)")
	}
	b.setSelect(row+" select.vm-select", vm)
	b.run("attach", chromedp.Click(chromedp.CSS(row+" button.attach")))
	b.waitJS("the attachment", fmt.Sprintf(`document.querySelector('%s td.vm').textContent.indexOf(%q) === 0`, row, vm))
	xml := lv.Virsh(t, "dumpxml", "--inactive", vm)
	if !strings.Contains(xml, mdev.UUID) || !strings.Contains(xml, "type='mdev'") {
		t.Errorf("virsh dumpxml lacks the instance %s:\n%s", mdev.UUID, xml)
	}
	b.screenshot("4-instances")

	b.tab("tenants")
	b.waitJS("the tenants", `document.querySelectorAll("#tenants tr").length === 2`)
	usage := eval[string](b, "acme's usage", `document.querySelector('#tenants tr[data-tenant="acme"]').textContent`)
	if !strings.Contains(usage, "/ 50 GiB") || !strings.Contains(usage, "1 / 8") {
		t.Errorf("acme's row: %q", usage)
	}
	// Define a tenant through the form, then change its quota.
	b.run("define initech", chromedp.SendKeys(chromedp.CSS("#tf-name"), "initech"), chromedp.SendKeys(chromedp.CSS("#tf-vram"), "10"),
		chromedp.SendKeys(chromedp.CSS("#tf-compute"), "1.5"),
		chromedp.SendKeys(chromedp.CSS("#tf-max"), "2"), chromedp.Click(chromedp.CSS("#tf-define")))
	b.waitJS("initech", `document.querySelector('#tenants tr[data-tenant="initech"]') !== null`)
	type quota struct {
		VRAM    *uint64 `json:"vramBytes"`
		Compute *uint64 `json:"computeMilli"`
		Max     *uint64 `json:"maxInstances"`
	}
	show := func() quota {
		return jsonOut[struct {
			Tenant struct {
				Quota quota `json:"quota"`
			} `json:"tenant"`
		}](t, d.ctl(t, "tenant", "show", "initech", "-o", "json").must(t, "tenant show")).Tenant.Quota
	}
	if q := show(); q.VRAM == nil || *q.VRAM != 10<<30 || q.Compute == nil || *q.Compute != 1500 || q.Max == nil || *q.Max != 2 {
		t.Errorf("initech defined through the page: %+v (want VRAM 10GiB, compute 1.5, 2 instances)", q)
	}
	b.run("set initech's quota", chromedp.SetValue(chromedp.CSS("#tf-vram"), "20"), chromedp.Click(chromedp.CSS("#tf-setquota")))
	b.waitJS("initech's new quota", `document.querySelector('#tenants tr[data-tenant="initech"]').textContent.indexOf("/ 20 GiB") >= 0`)
	if q := show(); q.VRAM == nil || *q.VRAM != 20<<30 || q.Compute == nil || *q.Compute != 1500 {
		t.Errorf("initech after Set quota: %+v", q)
	}
	// An empty field is an unlimited quota (sent as the unlimited option:
	// Cockpit's bridge cannot send UINT64_MAX).
	b.run("make initech's compute unlimited", chromedp.SetValue(chromedp.CSS("#tf-compute"), ""), chromedp.Click(chromedp.CSS("#tf-setquota")))
	b.waitJS("initech's unlimited compute", `document.querySelector('#tenants tr[data-tenant="initech"]').textContent.indexOf("unlimited") >= 0`)
	if q := show(); q.Compute != nil || q.VRAM == nil || *q.VRAM != 20<<30 {
		t.Errorf("initech after an empty compute quota: %+v (want compute unlimited, VRAM 20GiB)", q)
	}
	b.screenshot("5-tenants")
	// Activity follows vgpud's share readings while it is shown: a workload
	// started on acme's GPU instance then shows up as achieved compute.
	b.tab("activity")
	b.waitJS("the shares", `document.querySelectorAll("#activity tr[data-uuid]").length === 4`)
	d.sim(t, "workload", fmt.Sprintf("%s/gi%d", created.GPU, created.MIG.GPUInstanceID), "steady")
	b.waitJS("acme's achieved compute", fmt.Sprintf(`(function(){const r=document.querySelector('#activity tr[data-uuid=%q]');
		if(!r) return false; const v=parseFloat(r.children[4].textContent); return v > 0})()`, created.UUID))
	b.screenshot("6-activity")
	b.tab("fleet")
	b.waitJS("the fleet status", `document.querySelector("#fleet-unavailable") !== null`)
	fleet := eval[string](b, "fleet", `document.querySelector("#fleet-unavailable").textContent`)
	if !strings.Contains(fleet, "dev.vgpud1.Error.Unavailable") {
		t.Errorf("fleet without fleet: shows %q", fleet)
	}
	b.screenshot("7-fleet")

	// A GPU falling off the bus is marked on the GPUs tab as vgpud
	// signals it.
	b.tab("gpus")
	d.sim(t, "lose-gpu", "0000:61:00.0")
	b.waitJS("the lost GPU", `document.querySelector('article.gpu.gpu-bad[data-pci="0000:61:00.0"][data-state="lost"]') !== null`)
	b.screenshot("8-gpu-lost")

	// In Cockpit's shell, as operators open it: the menu entry's frame.
	b.run("open the shell", chromedp.Navigate(base+"/vgpud"))
	b.waitJS("the page in the shell's frame", `Array.from(document.querySelectorAll("iframe")).some(f => {
		try { return f.contentDocument.querySelectorAll("article.gpu").length === 4 && f.contentDocument.querySelector("#version").textContent !== "" } catch (e) { return false }
	})`)
	shot := b.screenshot("9-shell")
	if *updateScreenshots {
		root, _ := testenv.RepoRoot()
		img, _ := os.ReadFile(shot)
		if err := os.WriteFile(filepath.Join(root, "docs", "img", "cockpit-gpus.png"), img, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("browser steps took %v", time.Since(start).Round(time.Millisecond))
}

// TestCockpitPagePlainUser: a session vgpud refuses (the bridge as uid
// 65534, outside group vgpud) gets the page with the reason and no data; a
// member of group vgpud where groupAccess is read gets the data, read-only,
// with vgpud's reason (GetAccess). Neither has a control that changes
// anything, and vgpud refuses a change sent over their bridge.
func TestCockpitPagePlainUser(t *testing.T) {
	chromium, ws, bridge := cockpitTools(t)
	artefacts := cockpitArtefacts(t)
	type callResult struct {
		Name    string `json:"name"`
		Message string `json:"message"`
	}
	// page loads the page as the session prefix runs the bridge as, checks
	// what every refused session shares, and returns the browser and the
	// access banner's text.
	page := func(t *testing.T, bus *testbus.Bus, prefix []string, shot string) (*browser, string) {
		data := installPage(t)
		base := startCockpitWS(t, bus, ws, bridge, data, prefix)
		b := newBrowser(t, chromium, artefacts)
		b.run("load the page", chromedp.Navigate(base+cockpitPage))
		b.waitJS("the access banner", `!document.querySelector("#access").hidden`)
		banner := eval[string](b, "banner", `document.querySelector("#access").textContent`)
		for _, tab := range []string{"gpus", "tenants", "instances"} {
			b.tab(tab)
			b.screenshot(shot + "-" + tab)
		}
		enabled := eval[[]string](b, "enabled controls", `Array.from(document.querySelectorAll("button.manage")).filter(x => !x.disabled).map(x => x.id || x.textContent)`)
		if len(enabled) != 0 {
			t.Errorf("a refused session has enabled change controls: %v", enabled)
		}
		// Past the page: the same call through the session's bridge is
		// refused by vgpud.
		res := eval[callResult](b, "create through the bridge", `window.vgpudPage.client.call("/dev/vgpud1", "dev.vgpud1.Manager", "CreateInstance",
			["acme", "1g.10gb", {}], {type: "ssa{sv}"}).then(() => ({name: "", message: "accepted"}), e => ({name: e.name, message: e.message}))`)
		if res.Name != "dev.vgpud1.Error.AccessDenied" {
			t.Errorf("CreateInstance from the session: %+v", res)
		}
		return b, banner
	}

	t.Run("no access", func(t *testing.T) {
		bus := testbus.Start(t)
		d := startBusDaemon(t, bus, busDaemonOpts{})
		d.ctl(t, "tenant", "define", "acme", "--vram", "60GiB", "--compute", "unlimited").must(t, "define acme")
		before := d.ctl(t, "list", "-o", "json").must(t, "vgpuctl list").out
		b, banner := page(t, bus, asNobody, "plain-user")
		if !strings.Contains(banner, "dev.vgpud1.Error.AccessDenied") || !strings.Contains(banner, "reading vgpud's state needs root") {
			t.Errorf("access banner: %q", banner)
		}
		if n := eval[int](b, "GPU cards", `document.querySelectorAll("article.gpu").length`); n != 0 {
			t.Errorf("a session that may not read shows %d GPUs", n)
		}
		if after := d.ctl(t, "list", "-o", "json").must(t, "vgpuctl list").out; after != before {
			t.Errorf("instances changed under a plain user:\n%s\n%s", before, after)
		}
	})

	t.Run("read-only group member", func(t *testing.T) {
		grp, err := user.LookupGroup("vgpud")
		if err != nil {
			t.Fatalf("group vgpud: %v (scripts/install-deps.sh creates it)", err)
		}
		conf := filepath.Join(t.TempDir(), "vgpud.yaml")
		if err := os.WriteFile(conf, []byte("groupAccess: read\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		bus := testbus.Start(t)
		d := startBusDaemon(t, bus, busDaemonOpts{args: []string{"--config", conf}})
		d.ctl(t, "tenant", "define", "acme", "--vram", "60GiB", "--compute", "unlimited").must(t, "define acme")
		d.ctl(t, "create", "1g.10gb", "--tenant", "acme").must(t, "create 1g.10gb")
		before := d.ctl(t, "list", "-o", "json").must(t, "vgpuctl list").out
		member := []string{"setpriv", "--reuid=65534", "--regid=65534", "--groups=" + grp.Gid}
		b, banner := page(t, bus, member, "read-only")
		if !strings.HasPrefix(banner, "Read-only") || !strings.Contains(banner, "groupAccess is read") {
			t.Errorf("access banner: %q", banner)
		}
		if lvl := eval[string](b, "access level", `document.querySelector("#access").dataset.level`); lvl != "read" {
			t.Errorf("access level %q, want read", lvl)
		}
		// The data is there: the instance in its row, the tenant, the GPUs.
		b.waitJS("the instance", `document.querySelectorAll("#instances tr[data-uuid]").length === 1`)
		b.tab("tenants")
		b.waitJS("the tenant", `document.querySelector('#tenants tr[data-tenant="acme"]') !== null`)
		b.tab("gpus")
		b.waitJS("the GPUs with the slot grid", `document.querySelectorAll("article.gpu").length > 0 && document.querySelectorAll("article.gpu .gi").length === 1`)
		b.screenshot("read-only-gpus-data")
		b.tab("instances")
		shot := b.screenshot("read-only-instances-data")
		if *updateScreenshots {
			root, _ := testenv.RepoRoot()
			img, _ := os.ReadFile(shot)
			if err := os.WriteFile(filepath.Join(root, "docs", "img", "cockpit-read-only.png"), img, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if after := d.ctl(t, "list", "-o", "json").must(t, "vgpuctl list").out; after != before {
			t.Errorf("instances changed under a read-only member:\n%s\n%s", before, after)
		}
	})
}
