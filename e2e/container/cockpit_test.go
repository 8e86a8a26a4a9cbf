package container

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/sys/unix"

	browserenv "github.com/vgpud/vgpud/internal/testenv/browser"
)

// The web console's users, with passwords PAM checks. With groupAccess:
// read both may read (group vgpud); polkit decides their changes: the
// shipped example rule lets group vgpud-operators change, and the action's
// default (auth_admin_keep) refuses a session that cannot be asked for a
// password, as Cockpit's page cannot.
const (
	webAdmin    = "ct-admin"
	webViewer   = "ct-viewer"
	webPassword = "vgpud-Test-7"
	webPage     = "/cockpit/@localhost/vgpud/index.html"
)

// TestCockpitLogin: Cockpit as a host runs it (its own cockpit.socket and
// cockpit.service under the container's systemd), a real login through
// Cockpit's login page (PAM), the page the package installed, and polkit
// deciding: the administrator gets the change controls and creates an
// instance; the plain user sees the same data read-only, with vgpud's
// reason, and a change sent over the plain user's bridge is refused.
func TestCockpitLogin(t *testing.T) {
	chromium := browserenv.Chromium()
	if chromium == "" {
		if os.Getenv("VGPUD_TEST_REQUIRE_SERVICES") != "" {
			t.Fatal("chromium is not installed, and VGPUD_TEST_REQUIRE_SERVICES is set")
		}
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	artefacts := os.Getenv("VGPUD_COCKPIT_ARTEFACTS")
	if artefacts == "" {
		artefacts = t.TempDir()
	}
	artefacts = artefacts + "/" + t.Name()
	if err := os.MkdirAll(artefacts, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", artefacts)

	must(t, fmt.Sprintf("useradd -m -s /bin/sh -G vgpud,%s %s && useradd -m -s /bin/sh -G vgpud %s && printf '%%s:%%s\\n' %s %s %s %s | chpasswd",
		operatorGroup, webAdmin, webViewer, webAdmin, webPassword, webViewer, webPassword))
	t.Cleanup(func() { _, _ = ct.sh(context.Background(), "userdel -r -f "+webAdmin+"; userdel -r -f "+webViewer) })
	// groupAccess: read, restored afterwards for the other tests.
	must(t, "cp /etc/vgpud/vgpud.yaml /root/vgpud.yaml.saved && sed -i 's/^groupAccess: manage$/groupAccess: read/' /etc/vgpud/vgpud.yaml && grep -qx 'groupAccess: read' /etc/vgpud/vgpud.yaml && systemctl restart vgpud.service")
	t.Cleanup(func() {
		if out, err := ct.sh(context.Background(), "cp /root/vgpud.yaml.saved /etc/vgpud/vgpud.yaml && systemctl restart vgpud.service"); err != nil {
			t.Errorf("restore vgpud.yaml: %v\n%s", err, out)
		}
	})
	// Plain HTTP, as the test's browser reaches it through a forwarded port.
	must(t, "mkdir -p /etc/cockpit && printf '[WebService]\\nAllowUnencrypted = true\\n' >/etc/cockpit/cockpit.conf && systemctl start cockpit.socket")
	t.Cleanup(func() { _, _ = ct.sh(context.Background(), "systemctl stop cockpit.service cockpit.socket") })
	ensureTenant(t, "ct-web")
	create(t, "1g.10gb", "ct-web")
	base := "http://" + ct.forward(t, "127.0.0.1:9090")

	// login logs user in as Cockpit's login page does (GET /cockpit/login
	// with the user's password as Basic authorization: cockpit-ws hands it
	// to cockpit-session, which asks PAM) and opens vgpud's page in the
	// session.
	login := func(t *testing.T, user, password string) (*browserenv.Browser, int) {
		b := browserenv.New(t, chromium, artefacts, 150*time.Second)
		b.Run("open the login page", chromedp.Navigate(base+"/"))
		b.WaitJS("the login page", `document.getElementById("login-user-input") !== null`)
		status := browserenv.Eval[int](b, "log in as "+user, fmt.Sprintf(`fetch("/cockpit/login", {headers: {Authorization: "Basic " + btoa(%q + ":" + %q)}}).then(r => r.status)`, user, password))
		if status != 200 {
			return b, status
		}
		b.Run("open the page", chromedp.Navigate(base+webPage))
		b.WaitJS("vgpud's answer on access", `document.querySelector("#access") !== null && document.querySelector("#access").dataset.level !== undefined`)
		return b, status
	}
	loggedIn := func(t *testing.T, user string) *browserenv.Browser {
		b, status := login(t, user, webPassword)
		if status != 200 {
			t.Fatalf("login as %s: HTTP %d", user, status)
		}
		return b
	}

	t.Run("wrong password", func(t *testing.T) {
		if _, status := login(t, webAdmin, "not-"+webPassword); status != 401 {
			t.Errorf("login with a wrong password: HTTP %d, want 401", status)
		}
	})

	t.Run("administrator", func(t *testing.T) {
		b := loggedIn(t, webAdmin)
		if lvl := browserenv.Eval[string](b, "access level", `document.querySelector("#access").dataset.level`); lvl != "manage" {
			t.Fatalf("%s's access level %q, want manage (banner %q)", webAdmin, lvl,
				browserenv.Eval[string](b, "banner", `document.querySelector("#access").textContent`))
		}
		b.Run("instances", chromedp.Click(chromedp.CSS("#tab-instances")), chromedp.WaitVisible(chromedp.CSS("#page-instances")))
		b.WaitJS("the instances and the offers", `document.querySelectorAll("#instances tr[data-uuid]").length > 0 && document.querySelector("#cf-profile").options.length > 0`)
		before := len(instances(t))
		b.Run("choose the tenant", chromedp.Evaluate[chromedp.Void](`(function(){const s=document.querySelector("#cf-tenant"); s.value="ct-web"; s.dispatchEvent(new Event("change"))})()`))
		b.Screenshot("admin-instances")
		b.Run("create", chromedp.Click(chromedp.CSS("#cf-create")))
		b.WaitJS("the new instance", fmt.Sprintf(`document.querySelectorAll("#instances tr[data-uuid]").length > %d || !document.querySelector("#error").hidden`, before))
		if msg := browserenv.Eval[string](b, "error", `document.querySelector("#error").hidden ? "" : document.querySelector("#error").textContent`); msg != "" {
			t.Fatalf("create as %s: %s", webAdmin, msg)
		}
		if after := len(instances(t)); after != before+1 {
			t.Errorf("instances %d after the administrator's create, were %d", after, before)
		}
		b.Screenshot("admin-after-create")
	})

	t.Run("plain user", func(t *testing.T) {
		before := ctlList(t)
		b := loggedIn(t, webViewer)
		banner := browserenv.Eval[string](b, "banner", `document.querySelector("#access").textContent`)
		if lvl := browserenv.Eval[string](b, "access level", `document.querySelector("#access").dataset.level`); lvl != "read" ||
			!strings.Contains(banner, "groupAccess is read") {
			t.Errorf("%s: access level %q, banner %q; want read, with vgpud's reason", webViewer, lvl, banner)
		}
		b.Run("instances", chromedp.Click(chromedp.CSS("#tab-instances")), chromedp.WaitVisible(chromedp.CSS("#page-instances")))
		b.WaitJS("the instances, read-only", `document.querySelectorAll("#instances tr[data-uuid]").length > 0`)
		enabled := browserenv.Eval[[]string](b, "enabled controls", `Array.from(document.querySelectorAll("button.manage")).filter(x => !x.disabled).map(x => x.id || x.textContent)`)
		if len(enabled) != 0 {
			t.Errorf("the plain user has enabled change controls: %v", enabled)
		}
		b.Screenshot("plain-user-instances")
		type callResult struct {
			Name    string `json:"name"`
			Message string `json:"message"`
		}
		res := browserenv.Eval[callResult](b, "create through the bridge", `window.vgpudPage.client.call("/dev/vgpud1", "dev.vgpud1.Manager", "CreateInstance",
			["ct-web", "1g.10gb", {}], {type: "ssa{sv}"}).then(() => ({name: "", message: "accepted"}), e => ({name: e.name, message: e.message}))`)
		if res.Name != "dev.vgpud1.Error.AccessDenied" {
			t.Errorf("CreateInstance from the plain user's session: %+v", res)
		}
		if after := ctlList(t); after != before {
			t.Errorf("instances changed under the plain user:\n%s\nwere\n%s", after, before)
		}
		if s := strings.TrimSpace(must(t, "systemctl is-active polkit.service || true")); s != "active" {
			t.Errorf("polkitd is %s: the refusal did not come from it", s)
		}
	})
}

// ctlList is vgpuctl's instance list, as root.
func ctlList(t *testing.T) string {
	t.Helper()
	return mustCtl(t, "-o", "json", "list")
}

// forward listens on the host's loopback and carries each connection to
// addr in the container's network namespace (the container has a loopback
// of its own, and the browser runs on the host). It returns the host
// address.
func (c *container) forward(t *testing.T, addr string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer down.Close()
				up, err := c.dialInside(addr)
				if err != nil {
					t.Logf("forward to %s in the container: %v", addr, err)
					return
				}
				defer up.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(up, down); up.(*net.TCPConn).CloseWrite(); close(done) }()
				_, _ = io.Copy(down, up)
				down.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// dialInside connects to addr from the container's network namespace: a
// socket belongs to the namespace of the thread that made it, so a locked
// thread enters the namespace, dials, and comes back (a thread that cannot
// come back is left locked, and ends with its goroutine).
func (c *container) dialInside(addr string) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer own.Close()
		target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", c.init))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter the container's network namespace: %w", err)}
			return
		}
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{conn, err}
	}()
	r := <-ch
	return r.conn, r.err
}
