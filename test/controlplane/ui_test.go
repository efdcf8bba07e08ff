package controlplane

import (
	"context"
	"fmt"
	"net/http"
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

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/luks"
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
	// a11y asserts what a keyboard or screen-reader user needs of what is
	// shown: every control, link, progress bar, table and open dialog
	// has a name (a label, its text, aria-label or aria-labelledby), no
	// header cell is empty.
	a11y := func(where string) {
		t.Helper()
		bad, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
  const bad = [];
  const shown = (e) => !e.closest('[hidden]') && e.getClientRects().length > 0;
  const byIds = (v) => (v || '').split(/\s+/).map((id) => (document.getElementById(id) || {}).textContent || '').join(' ').trim();
  const name = (e) => (e.getAttribute('aria-label') || '').trim() || byIds(e.getAttribute('aria-labelledby')) ||
    [...(e.labels || [])].map((l) => l.textContent).join(' ').trim() ||
    (['BUTTON', 'A'].includes(e.tagName) ? e.textContent.trim() : '');
  for (const e of document.querySelectorAll('input:not([type=hidden]), select, textarea, button, a[href], progress, table, dialog')) {
    if (e.tagName === 'DIALOG' ? !e.open : !shown(e)) continue;
    if (!name(e)) bad.push(e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ': ' + e.outerHTML.slice(0, 100));
  }
  for (const th of document.querySelectorAll('th')) if (shown(th) && !th.textContent.trim()) bad.push('an empty header cell in table#' + th.closest('table').id);
  return bad;
})()`))
		require.NoError(t, err)
		assert.Empty(t, bad, "%s: without a name", where)
	}
	// focusOn says where the keyboard is: the element's id, or its row's
	// key and its role.
	focusOn := func() string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
  const a = document.activeElement, tr = a && a.closest('tr');
  return tr ? (tr.dataset.volume || tr.dataset.node || tr.dataset.snapshot || tr.dataset.token) + ' ' + a.dataset.role : a.id || a.tagName;
})()`))
		require.NoError(t, err)
		return v
	}

	// Log in with the token, see the nodes view.
	do(chromedp.Navigate(p.URL+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", p.Token),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(`#nodes tr[data-node="node-1"]`))
	shot("1-nodes")
	assert.Equal(t, "up", text(`#nodes tr[data-node="node-1"] td:nth-child(2)`))
	a11y("the nodes")
	// The focus stays on its link while the table is drawn again (each
	// watch event and every 30 s).
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#nodes tr[data-node="node-1"] a').focus(); render(); true`))
	require.NoError(t, err)
	assert.Equal(t, "node-1 name", focusOn(), "the focus kept across a redraw")

	// Node tab, create form: validation shows before submitting.
	do(chromedp.Click(`#nodes tr[data-node="node-1"] a`),
		chromedp.WaitVisible("#node-view"))
	// A new page: its heading has the focus (a screen reader says where
	// it is), the window's title names it.
	assert.Equal(t, "node-title", focusOn())
	title, err := chromedp.Run(ctx, chromedp.Title())
	require.NoError(t, err)
	assert.Equal(t, "Node node-1 · salt-volumes", title)
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](recorder))
	require.NoError(t, err)
	do(chromedp.Click("#show-create"),
		chromedp.SendKeys("#f-name", "Bad_Name"),
		chromedp.SendKeys("#f-size", "lots"))
	assert.Contains(t, text("#m-name"), "lowercase")
	assert.Contains(t, text("#m-size"), "unit")
	shot("2-validation")
	a11y("the create form")

	// A sparse volume through the form: Pending with its steps, then
	// Available with its path.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#f-name').value = ''; document.querySelector('#f-size').value = ''; true`))
	require.NoError(t, err)
	do(chromedp.SendKeys("#f-name", "ui-1"),
		chromedp.SendKeys("#f-size", "64Mi"),
		chromedp.Click(`#create-form button[type="submit"]`),
		chromedp.WaitVisible(row("ui-1", "Available")))
	shot("3-available")
	a11y("a node's volumes")
	st, err := chromedp.Run(ctx, chromedp.Text("#list-status"))
	require.NoError(t, err)
	assert.Contains(t, st, "Volume ui-1 asked for on node-1", "the create said, not only drawn")
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
	// is deleted from its row. What the volume holds then, and after, is
	// what the restore below is checked by.
	mount := func() string {
		t.Helper()
		mp := t.TempDir()
		require.NoError(t, exec.Command("mount", grown.Status.PersistentPath, mp).Run(), "mount %s", grown.Status.PersistentPath)
		t.Cleanup(func() { _ = exec.Command("umount", mp).Run() })
		return mp
	}
	mp := mount()
	note := filepath.Join(mp, "note")
	require.NoError(t, os.WriteFile(note, []byte("before"), 0o600))
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
	a11y("a volume's page")
	assert.Regexp(t, `^(reflink|sparse-copy)`, text(snapRow+" td:nth-child(3)"))
	// A copy's bytes, as a snapshot's row and its restore's draw them
	// (this one's copy ended before the control plane saved a report).
	bar, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
  const e = copyProgress({step: "copying", done: 1073741824, total: 4294967296});
  const p = e.querySelector("progress");
  return [p.value, p.max, p.getAttribute("aria-label"), e.textContent, copyProgress(null) === null, copyProgress({step: "copying", done: 0, total: 0}) === null].join("|");
})()`))
	require.NoError(t, err)
	assert.Equal(t, "25|100|copying 1Gi of 4Gi (25 %)|25 % copying 1Gi of 4Gi (25 %)|true|true", bar)
	snap, err := p.Client().Snapshot(context.Background(), "ui-snap")
	require.NoError(t, err)
	assert.Equal(t, "Ready", snap.Phase)
	require.NoError(t, os.WriteFile(note, []byte("after"), 0o600))
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

	// Restored from its row (#49 item 9): the dialog names what is lost
	// and takes only the volume's name typed; the node's refusal while
	// mounted shows, then, unmounted, the restore runs, the row and the
	// volume show it, and the node has the snapshot's content again.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`
window.__restores = [];
new MutationObserver(() => {
  const s = document.querySelector('`+snapRow+` .restore-status');
  const v = s ? s.dataset.restore : '';
  if (v && window.__restores[window.__restores.length - 1] !== v) window.__restores.push(v);
}).observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
true;`))
	require.NoError(t, err)
	restore := func() (string, string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__restores = []; true`))
		require.NoError(t, err)
		do(chromedp.Click(snapRow+" button.restore"),
			chromedp.WaitVisible("#restore-dialog"),
			chromedp.SendKeys("#restore-confirm", "ui-1"),
			chromedp.Click("#restore-ok"))
		waited := chromedp.Do(ctx, chromedp.Poll[chromedp.Void](`window.__restores.includes('Restoring') && window.__restores[window.__restores.length - 1] !== 'Restoring'`,
			chromedp.WithPollingTimeout(90*time.Second)))
		seen, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__restores`))
		require.NoError(t, err)
		require.NoError(t, waited, "the row showed %v; the page said %q", seen, text("#m-snapshot"))
		return seen[len(seen)-1], text(snapRow + " .restore-status")
	}
	do(chromedp.Click(snapRow+" button.restore"),
		chromedp.WaitVisible("#restore-dialog"))
	warning := text("#restore-text")
	for _, w := range []string{"Everything written to ui-1 since snapshot ui-snap was taken at", "is lost", "node-1"} {
		assert.Contains(t, warning, w)
	}
	do(chromedp.SendKeys("#restore-confirm", "ui-2\r"))
	wrong, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#restore-dialog').open && document.querySelector('#restore-ok').disabled`))
	require.NoError(t, err)
	assert.True(t, wrong, "a wrong name leaves the dialog open, its Restore button disabled")
	shot("3e-restore-confirm")
	a11y("the restore dialog")
	do(chromedp.Click("#restore-cancel"), chromedp.WaitNotVisible("#restore-dialog"))
	assert.Equal(t, "ui-snap restore", focusOn(), "closed, the dialog gives the focus back to the button that opened it")
	snap, err = p.Client().Snapshot(context.Background(), "ui-snap")
	require.NoError(t, err)
	assert.Nil(t, snap.Restore, "nothing was asked of the node")

	phase, outcome := restore()
	assert.Equal(t, "Failed", phase, outcome)
	assert.Contains(t, outcome, "is in use")
	assert.Contains(t, outcome, "mounted on "+mp)
	assert.Contains(t, text("#vol-restore"), "failed")
	b, err := os.ReadFile(note)
	require.NoError(t, err)
	assert.Equal(t, "after", string(b), "refused: nothing changed")

	require.NoError(t, exec.Command("umount", mp).Run())
	_ = exec.Command("udevadm", "settle").Run()
	started := time.Now()
	for try := 1; ; try++ {
		phase, outcome = restore()
		// An LVM scan after the umount opens every block device for a
		// moment: the node refuses then, naming it (as in
		// TestSnapshotsThroughTheControlPlane).
		if phase == "Restored" || try == 5 || !strings.Contains(outcome, "(lvm)") {
			break
		}
		t.Logf("try %d: %s", try, outcome)
		time.Sleep(time.Second)
	}
	require.Equal(t, "Restored", phase, outcome)
	t.Logf("restore through the UI: %s", time.Since(started).Round(100*time.Millisecond))
	assert.Contains(t, text("#vol-restore"), "Last restored from snapshot ui-snap")
	shot("3f-restored")
	mp = mount()
	b, err = os.ReadFile(filepath.Join(mp, "note"))
	require.NoError(t, err)
	assert.Equal(t, "before", string(b), "the snapshot's content")
	require.NoError(t, exec.Command("umount", mp).Run(), "the volume is deleted below")

	// A snapshot schedule from the page (#49 item 10): bad values refused
	// in the form or by the control plane, naming the field and changing
	// nothing; then set, changed and shown with its owner; a viewer sees
	// it (below) and cannot change it; removed at the end. Every 30 days:
	// a new schedule starts with its next slot, which a run of this test
	// does not reach.
	schedules := func() []saltvolumes.SnapshotSchedule {
		t.Helper()
		items, err := p.Client().SnapshotSchedules(context.Background(), "ui-1", "api")
		require.NoError(t, err)
		return items
	}
	setValue := func(sel, v string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector(`+jsString(sel)+`).value = `+jsString(v)+`; true`))
		require.NoError(t, err)
	}
	do(chromedp.WaitVisible("#schedule-form"), chromedp.WaitVisible("#vol-schedules-empty"))
	setValue("#schedule-every", "30d")
	do(chromedp.Click("#set-schedule"))
	assert.Contains(t, text("#m-schedule"), "how many of its snapshots")
	setValue("#schedule-keep", "3")
	setValue("#schedule-max-age", "1d")
	do(chromedp.Click("#set-schedule"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#m-schedule').textContent.includes('maxAge')`, chromedp.WithPollingTimeout(10*time.Second)))
	assert.Contains(t, text("#m-schedule"), "shorter than every")
	assert.Empty(t, schedules(), "a refused schedule changes nothing")
	setValue("#schedule-max-age", "")
	schedRow := `#vol-schedules li[data-source="api"]`
	do(chromedp.Click("#set-schedule"),
		chromedp.WaitVisible(schedRow))
	assert.Contains(t, text(schedRow), "every 30d, keeps 3")
	assert.Contains(t, text(schedRow), "Set through the API by")
	assert.Contains(t, text(schedRow), "No snapshot taken yet. Next at")
	assert.Equal(t, "Change schedule", text("#set-schedule"))
	assert.Empty(t, text("#m-schedule"))
	got := schedules()
	require.Len(t, got, 1)
	assert.Equal(t, "30d", got[0].Every)
	assert.Equal(t, 3, got[0].Keep)
	keep, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#schedule-keep').value`))
	require.NoError(t, err)
	assert.Equal(t, "3", keep, "the form shows the schedule")
	setValue("#schedule-keep", "5")
	setValue("#schedule-max-age", "60d")
	do(chromedp.Click("#set-schedule"),
		chromedp.Poll[chromedp.Void](`document.querySelector('`+schedRow+`').textContent.includes('keeps 5, prunes past 60d')`, chromedp.WithPollingTimeout(10*time.Second)))
	got = schedules()
	require.Len(t, got, 1)
	assert.Equal(t, 5, got[0].Keep)
	assert.Equal(t, "60d", got[0].MaxAge)
	shot("3g-schedule")

	// The fleet's snapshots, the tokens and the audit trail (#51): pages
	// of their own, linked from the header.
	do(chromedp.Click("#nav-snapshots"),
		chromedp.WaitVisible(`#snapshots tr[data-snapshot="ui-snap"]`))
	fleetRow := text(`#snapshots tr[data-snapshot="ui-snap"]`)
	for _, w := range []string{"ui-1", "node-1", "Ready"} {
		assert.Contains(t, fleetRow, w)
	}
	setValue("#snap-filter", "no-such-snapshot")
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#snap-filter').dispatchEvent(new Event('input'))`))
	require.NoError(t, err)
	assert.Regexp(t, `^0 of \d+ snapshots shown$`, text("#snap-count"))
	shot("3h-snapshots")
	a11y("the fleet's snapshots")

	whoami := func(secret string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, p.URL+"/api/v1/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	do(chromedp.Click("#nav-tokens"),
		chromedp.WaitVisible("#token-form"),
		chromedp.Click("#make-token"))
	assert.Contains(t, text("#m-token"), "Name it")
	do(chromedp.SendKeys("#token-name", "ui-bot"),
		chromedp.SetValue("#token-role", "operator"),
		chromedp.SendKeys("#token-expires", "1d"),
		chromedp.Click("#make-token"),
		chromedp.WaitVisible("#token-secret"),
		chromedp.WaitVisible(`#tokens tr[data-token="ui-bot"]`))
	secret, err := chromedp.Run(ctx, chromedp.Value("#token-secret-value"))
	require.NoError(t, err)
	require.NotEmpty(t, secret, "the new token's secret is shown once")
	focusedOn, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.activeElement.id + " " + (document.activeElement.selectionEnd - document.activeElement.selectionStart)`))
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprintf("token-secret-value %d", len(secret)), focusedOn, "the keyboard is on the secret, selected: one keystroke copies it")
	assert.Equal(t, http.StatusOK, whoami(secret), "the shown secret works")
	assert.Contains(t, text(`#tokens tr[data-token="ui-bot"]`), "operator")
	shot("3i-tokens")
	a11y("the tokens, a secret shown")
	do(chromedp.Click("#token-secret-done"), chromedp.WaitNotVisible("#token-secret"))
	gone, err := chromedp.Run(ctx, chromedp.Value("#token-secret-value"))
	require.NoError(t, err)
	assert.Empty(t, gone, "the secret is gone from the page")
	do(chromedp.Click(`#tokens tr[data-token="ui-bot"] button.revoke`),
		chromedp.WaitVisible("#confirm"))
	assert.Contains(t, text("#confirm-text"), "Revoke service token ui-bot")
	do(chromedp.Click("#confirm-ok"),
		chromedp.WaitNotPresent(`#tokens tr[data-token="ui-bot"]`))
	assert.Equal(t, http.StatusUnauthorized, whoami(secret), "revoked")

	do(chromedp.Click("#nav-audit"),
		chromedp.WaitVisible("#audit-form"),
		chromedp.SendKeys("#audit-volume", "ui-1"),
		chromedp.Click("#audit-show"),
		chromedp.Poll[chromedp.Void](`(() => { const s = document.querySelector('#audit tbody').textContent; return s.includes('PUT /api/v1/volumes/ui-1/snapshot-schedule') && !s.includes('/api/v1/tokens'); })()`, chromedp.WithPollingTimeout(10*time.Second)))
	audit := text("#audit tbody")
	a11y("the audit trail")
	assert.Contains(t, audit, "POST /api/v1/volumes/ui-1/snapshots")
	assert.Contains(t, audit, "failed (400)", "the refused schedule is on record")
	assert.NotContains(t, audit, "whoami", "filtered to the volume")
	shot("3j-audit")
	do(chromedp.Navigate(p.URL+"/#/volume/ui-1"), chromedp.WaitVisible(snapRow))
	assert.Contains(t, text("#vol-history"), "snapshot schedule by ", "the history names what was done")
	assert.Contains(t, text("#vol-history"), "snapshot schedule failed for ")

	// A viewer sees the snapshots, no button that changes them.
	out, errs, code := p.CLI("token", "create", "ui-viewer", "--role", "viewer", "--expires", "1d")
	require.Equal(t, 0, code, errs)
	do(chromedp.Click("#logout"),
		chromedp.WaitVisible("#token"),
		chromedp.SetValue("#token", strings.TrimSpace(out)),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(snapRow),
		chromedp.Poll[chromedp.Void](`document.querySelector('#vol-role').textContent.includes('viewer')`, chromedp.WithPollingTimeout(10*time.Second)))
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#volume-view button, #volume-view form')].filter((e) => e.offsetParent !== null).map((e) => e.id || e.textContent)`))
	require.NoError(t, err)
	assert.Empty(t, shown, "a viewer's volume page has no action")
	shot("3k-viewer")
	assert.Contains(t, text(snapRow+" .restore-status"), "Restored", "a viewer sees the last restore")
	assert.Contains(t, text(schedRow), "every 30d, keeps 5", "a viewer sees the schedule")
	hiddenNav, err := chromedp.Run(ctx, chromedp.Evaluate[[]bool](`['#nav-snapshots', '#nav-audit', '#nav-tokens'].map((s) => document.querySelector(s).offsetParent === null)`))
	require.NoError(t, err)
	assert.Equal(t, []bool{false, true, true}, hiddenNav, "a viewer has the snapshots page, not the audit's or the tokens'")
	do(chromedp.Navigate(p.URL+"/#/audit"),
		chromedp.Poll[chromedp.Void](`document.querySelector('#m-audit').textContent !== ''`, chromedp.WithPollingTimeout(10*time.Second)))
	assert.Contains(t, text("#m-audit"), "admin", "the refusal says what it needs")
	do(chromedp.Navigate(p.URL+"/#/volume/ui-1"), chromedp.WaitVisible(snapRow))
	do(chromedp.Navigate(p.URL+"/#/node/node-1"),
		chromedp.WaitVisible(row("ui-1", "Available")))
	shown, err = chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#node-view button:not(th button)')].filter((e) => e.offsetParent !== null).map((e) => e.id || e.textContent)`))
	require.NoError(t, err)
	assert.Empty(t, shown, "a viewer's node page has no action but sorting")
	assert.Contains(t, text("#node-role"), "needs role operator")
	do(chromedp.Navigate(p.URL + "/#/volume/ui-1"))

	// An operator changes volumes and snapshots; what only an admin may
	// do is shown disabled with the reason, and the admin pages are not
	// linked.
	out, errs, code = p.CLI("token", "create", "ui-operator", "--role", "operator", "--expires", "1d")
	require.Equal(t, 0, code, errs)
	do(chromedp.Click("#logout"),
		chromedp.WaitVisible("#token"),
		chromedp.SetValue("#token", strings.TrimSpace(out)),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(snapRow+" button.restore"),
		chromedp.WaitVisible("#schedule-form"))
	clickable, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#volume-view button, header a')].filter((e) => e.offsetParent !== null && !e.disabled).map((e) => e.id || e.className || e.textContent)`))
	require.NoError(t, err)
	for _, want := range []string{"vol-delete", "vol-grow", "take-snapshot", "clone", "restore", "danger", "set-schedule", "remove-schedule", "nav-snapshots"} {
		assert.Contains(t, clickable, want, "an operator may")
	}
	for _, not := range []string{"nav-audit", "nav-tokens"} {
		assert.NotContains(t, clickable, not, "an admin's")
	}
	shot("3l-operator")
	do(chromedp.Click("#logout"),
		chromedp.WaitVisible("#token"),
		chromedp.SetValue("#token", p.Token),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible(snapRow+" button.danger"))
	do(chromedp.WaitVisible("#remove-schedule"),
		chromedp.Click("#remove-schedule"),
		chromedp.WaitNotPresent(schedRow),
		chromedp.WaitVisible("#vol-schedules-empty"))
	assert.Empty(t, schedules(), "the schedule is removed")
	assert.Equal(t, "Set schedule", text("#set-schedule"))
	do(chromedp.Click(snapRow+" button.danger"),
		chromedp.WaitVisible("#confirm"))
	for _, w := range []string{"Delete snapshot ui-snap of volume ui-1 on node node-1?", "is gone with it", "clones made from the snapshot stay"} {
		assert.Contains(t, text("#confirm-text"), w)
	}
	do(chromedp.Click("#confirm-cancel"), chromedp.WaitNotVisible("#confirm"))
	_, err = p.Client().Snapshot(context.Background(), "ui-snap")
	require.NoError(t, err, "cancelled: the snapshot stays")
	do(chromedp.Click(snapRow+" button.danger"),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm-ok"),
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
	reason := text(`#volumes tr[data-volume="ui-bad"] td.phase-cell .reason`)
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
	reason = text(`#volumes tr[data-volume="ui-lvm"] td.phase-cell .reason`)
	assert.Contains(t, reason, "lvmLogicalVolume.vgName")
	assert.Contains(t, reason, `"vg-missing" does not exist`)
	assert.Contains(t, text(`#volumes tr[data-volume="ui-lvm"]`), "lvm vg-missing", "the kind column")
	lvm, err := p.Client().Get(context.Background(), "ui-lvm")
	require.NoError(t, err)
	assert.Equal(t, &spec.LVMLogicalVolume{VGName: "vg-missing", Size: "64Mi"}, lvm.Spec.LVMLogicalVolume, "the spec the form sent")

	// An encrypted sparse volume through the form. This machine's kernel
	// has no device-mapper: the node refuses it before writing anything,
	// and says why (the booted guests run encrypted volumes end to end).
	encPhase := "Failed"
	if luks.Ready() == nil {
		encPhase = "Available"
	}
	do(chromedp.Click("#show-create"),
		chromedp.SendKeys("#f-name", "ui-enc"),
		chromedp.Click(`input[name="kind"][value="sparse"]`),
		chromedp.WaitVisible("#f-enc"),
		chromedp.SetValue("#f-enc", "keyfile"),
		chromedp.SendKeys("#f-size", "64Mi"),
		chromedp.Click(`#create-form button[type="submit"]`),
		chromedp.WaitVisible(row("ui-enc", encPhase)))
	if encPhase == "Failed" {
		assert.Contains(t, text(`#volumes tr[data-volume="ui-enc"] td.phase-cell .reason`), "cannot open LUKS2 containers")
	}
	encVol, err := p.Client().Get(context.Background(), "ui-enc")
	require.NoError(t, err)
	assert.Equal(t, &spec.Encryption{Provider: "keyfile"}, encVol.Spec.Encryption, "the spec the form sent")

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
		chromedp.Click(`#volumes tr[data-volume="ui-enc"] button.delete`),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm-ok"),
		chromedp.WaitNotPresent(`#volumes tr[data-volume="ui-enc"]`),
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
