package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// browser is a headless Chromium on the control plane's web UI.
type browser struct {
	t   *testing.T
	p   *plane
	ctx context.Context

	mu     sync.Mutex
	errors []string
}

func newBrowser(t *testing.T, p *plane) *browser {
	exe := chromium(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelT(); cancel(); cancelA() })
	b := &browser{t: t, p: p, ctx: ctx}
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				b.errors = append(b.errors, "console.error")
			}
		case *runtime.EventExceptionThrown:
			msg := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				msg += " " + e.ExceptionDetails.Exception.Description
			}
			b.errors = append(b.errors, msg)
		}
	}))
	return b
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	require.NoError(b.t, chromedp.Do(b.ctx, steps...))
}

func (b *browser) login() {
	b.t.Helper()
	b.do(chromedp.Navigate(b.p.URL+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", b.p.Token),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(`#nodes tr[data-node="node-1"]`))
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Text(sel))
	require.NoError(b.t, err, sel)
	return v
}

func (b *browser) attr(sel, name string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.querySelector(`+jsString(sel)+`).getAttribute(`+jsString(name)+`) || ""`))
	require.NoError(b.t, err, sel)
	return v
}

// eventually reads sel's text (or attribute, with attr non-empty) until ok
// accepts it or 40 s pass (the page reloads reports every 30 s), and returns the last value read: the page
// follows the nodes' reports, which a busy machine delays by a few
// seconds, so a check of what the user sees waits as the user would.
func (b *browser) eventually(sel, attr string, ok func(string) bool) string {
	b.t.Helper()
	end := time.Now().Add(40 * time.Second)
	for {
		var v string
		if attr == "" {
			v = b.text(sel)
		} else {
			v = b.attr(sel, attr)
		}
		if ok(v) || time.Now().After(end) {
			return v
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func contains(sub string) func(string) bool {
	return func(s string) bool { return strings.Contains(s, sub) }
}

func (b *browser) shot(name string) {
	b.t.Helper()
	buf, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	require.NoError(b.t, err)
	require.NoError(b.t, os.WriteFile(filepath.Join(artifacts(b.t), name+".png"), buf, 0o644))
}

func (b *browser) noConsoleErrors() {
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(b.t, b.errors, "no console errors")
}

func jsString(s string) string {
	out := []byte{'"'}
	for _, c := range []byte(s) {
		if c == '"' || c == '\\' {
			out = append(out, '\\')
		}
		out = append(out, c)
	}
	return string(append(out, '"'))
}
