// Package browser drives Debian's headless chromium for the web console's
// tests (chromedp): one tab with a time budget, JavaScript evaluated and
// waited on, screenshots saved as test artefacts, and the page's console
// logged when a test fails. Used by e2e (cockpit-ws on the host) and
// e2e/container (Cockpit under the container's systemd).
//
// Imports: nothing from vgpud.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Chromium is the path of Debian's chromium, or "" when it is not
// installed.
func Chromium() string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser is a headless chromium tab.
type Browser struct {
	t   testing.TB
	ctx context.Context
	dir string // screenshots
}

// New starts chromium (ExecPath) with one tab; what the test does in it
// must end within budget. Screenshots go to dir.
func New(t testing.TB, chromium, dir string, budget time.Duration) *Browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	// The first Do starts the browser; the budget applies to what follows.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	var mu sync.Mutex
	var console []string
	if err := chromedp.Listen(bctx, func(ev any) {
		var line string
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			var parts []string
			for _, a := range e.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			line = string(e.Type) + ": " + strings.Join(parts, " ")
		case *runtime.EventExceptionThrown:
			line = "exception: " + e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				line += " " + e.ExceptionDetails.Exception.Description
			}
		default:
			return
		}
		mu.Lock()
		console = append(console, line)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() && len(console) > 0 {
			t.Logf("browser console:\n%s", strings.Join(console, "\n"))
		}
	})
	ctx, cancel := context.WithTimeout(bctx, budget)
	t.Cleanup(cancel)
	return &Browser{t: t, ctx: ctx, dir: dir}
}

// Run does actions, failing the test with what when one fails.
func (b *Browser) Run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// Eval runs a JavaScript expression (awaiting a promise) and returns its
// value decoded from JSON.
func Eval[T any](b *Browser, what, js string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// WaitJS waits until a JavaScript expression is truthy; on a timeout the
// test fails with the page's text, and its screenshot is failure.png.
func (b *Browser) WaitJS(what, js string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		if buf, serr := chromedp.Run(b.ctx, chromedp.FullScreenshot(100)); serr == nil {
			_ = os.WriteFile(filepath.Join(b.dir, "failure.png"), buf, 0o644) // best effort: the failure is reported either way
		}
		if len(text) > 3000 {
			text = "..." + text[len(text)-3000:]
		}
		b.t.Fatalf("wait for %s (%s): %v\npage text:\n%s", what, js, err, text)
	}
}

// Screenshot saves the whole page as dir/name.png and returns the path.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	buf, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.dir, name+".png")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		b.t.Fatal(err)
	}
	return p
}
