package controlplane

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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

// artifacts is where screenshots go: $ARTIFACTS_DIR, else test/controlplane/artifacts.
func artifacts(t *testing.T) string {
	dir := os.Getenv("ARTIFACTS_DIR")
	if dir == "" {
		dir = "artifacts"
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

func chromium(t *testing.T) string {
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Skip("no Chromium: run make setup (installs Debian's chromium)")
	return ""
}

// recorder keeps, per volume row, every phase the page showed and whether
// its delete button was disabled then, with the reason shown.
const recorder = `
window.__seen = {};
new MutationObserver(() => {
  for (const tr of document.querySelectorAll('#volumes tbody tr')) {
    const name = tr.dataset.volume, phase = tr.dataset.phase;
    const btn = tr.querySelector('button.delete');
    const why = tr.querySelector('.reason[id^="why-"]');
    const key = phase + (btn && btn.disabled ? ':disabled:' + (why ? why.textContent : '') : ':enabled');
    (window.__seen[name] = window.__seen[name] || []);
    if (!window.__seen[name].includes(key)) window.__seen[name].push(key);
  }
}).observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
true;`

func TestWebUI(t *testing.T) {
	exe := chromium(t)
	s := saltstack.Start(t, bin("salt-volume-exec"), true)
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	out, code := s.SyncAll(s.MinionID)
	require.Equal(t, 0, code, out)
	p := newPlane(t, s)
	p.Start("")
	dir := artifacts(t)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelT()

	var mu sync.Mutex
	var consoleErrors []string
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				consoleErrors = append(consoleErrors, "console.error")
			}
		case *runtime.EventExceptionThrown:
			d := e.ExceptionDetails.Text
			if x := e.ExceptionDetails.Exception; x != nil {
				d += " " + x.Description
			}
			consoleErrors = append(consoleErrors, d)
		}
	}))
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(sel))
		require.NoError(t, err, sel)
		return v
	}
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, steps...))
	}
	seenRows := func() map[string][]string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[map[string][]string](`window.__seen`))
		require.NoError(t, err)
		return v
	}
	row := func(name, phase string) string {
		return `#volumes tbody tr[data-volume="` + name + `"][data-phase="` + phase + `"]`
	}

	// Log in with the token, see the nodes view.
	do(chromedp.Navigate(p.URL+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", p.Token),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(`#nodes tr[data-node="node-1"]`))
	shot("1-nodes")
	assert.Equal(t, "up", text(`#nodes tr[data-node="node-1"] td:nth-child(2)`))

	// Node tab, create form: validation shows before submitting.
	do(chromedp.Click(`#nodes tr[data-node="node-1"] a`),
		chromedp.WaitVisible("#node-view"))
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](recorder))
	require.NoError(t, err)
	do(chromedp.Click("#show-create"),
		chromedp.SendKeys("#f-name", "Bad_Name"),
		chromedp.SendKeys("#f-size", "lots"))
	assert.Contains(t, text("#m-name"), "lowercase")
	assert.Contains(t, text("#m-size"), "unit")
	shot("2-validation")

	// A sparse volume through the form: Pending with its steps, then
	// Available with its path.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#f-name').value = ''; document.querySelector('#f-size').value = ''; true`))
	require.NoError(t, err)
	do(chromedp.SendKeys("#f-name", "ui-1"),
		chromedp.SendKeys("#f-size", "64Mi"),
		chromedp.Click(`#create-form button[type="submit"]`),
		chromedp.WaitVisible(row("ui-1", "Available")))
	shot("3-available")
	path := text(`#volumes tr[data-volume="ui-1"] .path`)
	assert.Regexp(t, `^/dev/disk/by-uuid/[0-9a-f-]{36}$`, path)
	uuids = append(uuids, strings.TrimPrefix(path, "/dev/disk/by-uuid/"))
	joined := strings.Join(seenRows()["ui-1"], " | ")
	assert.Contains(t, joined, "Pending:enabled", "a volume being created may be deleted (the deletion waits for the creation)")
	assert.Contains(t, joined, "Available:enabled")

	// Grown from its page: a smaller size is refused in the form, a larger
	// one runs the prepare state and the page shows the node's new size.
	do(chromedp.Navigate(p.URL+"/#/volume/ui-1"),
		chromedp.WaitVisible("#grow-form"),
		chromedp.SendKeys("#grow-size", "32Mi"),
		chromedp.Click("#vol-grow"))
	assert.Contains(t, text("#m-grow"), "only grow")
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#grow-size').value = ''; true`))
	require.NoError(t, err)
	do(chromedp.SendKeys("#grow-size", "96Mi"),
		chromedp.Click("#vol-grow"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#vol-status').textContent.includes('96Mi') && document.querySelector('#vol-phase').textContent === 'Available'`, chromedp.WithPollingTimeout(2*time.Minute)))
	shot("3b-grown")
	grown, err := p.Client().Get(context.Background(), "ui-1")
	require.NoError(t, err)
	assert.Equal(t, int64(96<<20), grown.Status.Size)

	// A snapshot from its page: a bad name is refused in the form; a good
	// one runs on the node and shows Ready with its method and space, then
	// is deleted from its row.
	do(chromedp.SendKeys("#snapshot-name", "Bad_Name"),
		chromedp.Click("#take-snapshot"))
	assert.Contains(t, text("#m-snapshot"), "lower-case")
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#snapshot-name').value = ''; true`))
	require.NoError(t, err)
	snapRow := `#vol-snapshots tr[data-snapshot="ui-snap"]`
	do(chromedp.SendKeys("#snapshot-name", "ui-snap"),
		chromedp.Click("#take-snapshot"),
		chromedp.Poll[chromedp.Void](`(document.querySelector('`+snapRow+` .phase') || {}).textContent === 'Ready'`, chromedp.WithPollingTimeout(time.Minute)))
	shot("3c-snapshot")
	assert.Regexp(t, `^(reflink|sparse-copy)`, text(snapRow+" td:nth-child(3)"))
	snap, err := p.Client().Snapshot(context.Background(), "ui-snap")
	require.NoError(t, err)
	assert.Equal(t, "Ready", snap.Phase)
	// Cloned from its row: a bad name refused in the form, then the
	// clone's own page, Available, its spec naming the snapshot.
	do(chromedp.Click(snapRow+" button.clone"),
		chromedp.WaitVisible("#clone-form"),
		chromedp.SendKeys("#clone-name", "Bad_Clone"),
		chromedp.Click("#make-clone"))
	assert.Contains(t, text("#m-clone"), "lower-case")
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#clone-name').value = ''; true`))
	require.NoError(t, err)
	do(chromedp.SendKeys("#clone-name", "ui-clone"),
		chromedp.Click("#make-clone"),
		chromedp.Poll[chromedp.Void](`location.hash === '#/volume/ui-clone' && document.querySelector('#vol-phase').textContent === 'Available'`, chromedp.WithPollingTimeout(2*time.Minute)))
	shot("3d-clone")
	cl, err := p.Client().Get(context.Background(), "ui-clone")
	require.NoError(t, err)
	uuids = append(uuids, cl.Spec.UUID)
	require.NotNil(t, cl.Spec.Source)
	assert.Equal(t, spec.Source{VolumeUUID: grown.Spec.UUID, Snapshot: "ui-snap"}, *cl.Spec.Source, "the clone's spec names the snapshot")
	assert.Equal(t, grown.Spec.FSType, cl.Spec.FSType)
	assert.Equal(t, "node-1", cl.Spec.Node)
	do(chromedp.Navigate(p.URL+"/#/volume/ui-1"),
		chromedp.WaitVisible(snapRow))
	do(chromedp.Click(snapRow+" button.danger"),
		chromedp.Poll[chromedp.Void](`document.querySelector('`+snapRow+`') === null && !document.querySelector('#vol-snapshots-empty').hidden`, chromedp.WithPollingTimeout(time.Minute)))
	_, err = p.Client().Snapshot(context.Background(), "ui-snap")
	assert.Error(t, err, "deleted")
	do(chromedp.Navigate(p.URL+"/#/node/node-1"),
		chromedp.WaitVisible(row("ui-1", "Available")))

	// A failing create shows Salt's reason.
	do(chromedp.Click("#show-create"),
		chromedp.SendKeys("#f-name", "ui-bad"),
		chromedp.Click(`input[name="kind"][value="raw"]`),
		chromedp.SendKeys("#f-device", "/dev/salt-volumes-ui-missing"),
		chromedp.Click(`#create-form button[type="submit"]`),
		chromedp.WaitVisible(row("ui-bad", "Failed")))
	shot("4-failed")
	reason := text(`#volumes tr[data-volume="ui-bad"] td:nth-child(6) .reason`)
	assert.Contains(t, reason, "/dev/salt-volumes-ui-missing")
	assert.Contains(t, reason, "PrepareFailed")

	// An LVM volume through the form, in a VG this node does not have: the
	// node's refusal names the field.
	do(chromedp.Click("#show-create"),
		chromedp.SendKeys("#f-name", "ui-lvm"),
		chromedp.Click(`input[name="kind"][value="lvm"]`),
		chromedp.WaitVisible("#f-vg"),
		chromedp.SendKeys("#f-vg", "vg-missing"),
		chromedp.SendKeys("#f-size", "64Mi"),
		chromedp.Click(`#create-form button[type="submit"]`),
		chromedp.WaitVisible(row("ui-lvm", "Failed")))
	reason = text(`#volumes tr[data-volume="ui-lvm"] td:nth-child(6) .reason`)
	assert.Contains(t, reason, "lvmLogicalVolume.vgName")
	assert.Contains(t, reason, `"vg-missing" does not exist`)
	assert.Contains(t, text(`#volumes tr[data-volume="ui-lvm"]`), "lvm vg-missing", "the kind column")
	lvm, err := p.Client().Get(context.Background(), "ui-lvm")
	require.NoError(t, err)
	assert.Equal(t, &spec.LVMLogicalVolume{VGName: "vg-missing", Size: "64Mi"}, lvm.Spec.LVMLogicalVolume, "the spec the form sent")

	// Phone width: readable, the table scrolls inside its box.
	do(chromedp.EmulateViewport(390, 844))
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`))
	require.NoError(t, err)
	assert.False(t, overflow, "no page-wide horizontal scroll at phone width")
	shot("5-phone")
	do(chromedp.EmulateViewport(1280, 900))

	// Delete through the confirmation naming volume and node; the row goes.
	do(chromedp.Click(`#volumes tr[data-volume="ui-1"] button.delete`),
		chromedp.WaitVisible("#confirm"))
	confirmText := text("#confirm-text")
	assert.Contains(t, confirmText, "ui-1")
	assert.Contains(t, confirmText, "node-1")
	do(chromedp.Click("#confirm-ok"),
		chromedp.WaitNotPresent(`#volumes tr[data-volume="ui-1"]`),
		chromedp.Click(`#volumes tr[data-volume="ui-bad"] button.delete`),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm-ok"),
		chromedp.WaitNotPresent(`#volumes tr[data-volume="ui-bad"]`),
		chromedp.Click(`#volumes tr[data-volume="ui-lvm"] button.delete`),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm-ok"),
		chromedp.WaitNotPresent(`#volumes tr[data-volume="ui-lvm"]`),
		chromedp.Click(`#volumes tr[data-volume="ui-clone"] button.delete`),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm-ok"),
		chromedp.WaitNotPresent(`#volumes tr[data-volume="ui-clone"]`))
	shot("6-deleted")
	assert.Contains(t, strings.Join(seenRows()["ui-1"], " | "), "Terminating:disabled:the volume is already being deleted")
	mu.Lock()
	assert.Empty(t, consoleErrors, "no console errors")
	mu.Unlock()
}
