package controlplane

import (
	"context"
	"os"
	"path/filepath"
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
			b.errors = append(b.errors, e.ExceptionDetails.Text)
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
