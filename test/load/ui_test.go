package load

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allVolumesView opens the web UI's all-volumes view over total volumes on
// nodes nodes (seeded and created by TestLoad, every one Available) and
// checks what a person looking for one volume does: the count, a search,
// a node and a phase filter; a screenshot of each goes to $ARTIFACTS_DIR
// (else test/load/artifacts), and the time from sign-in to the full table
// is printed as a metric.
func allVolumesView(t *testing.T, base, token string, seeded, created, nodes int) {
	total := seeded + created
	exe := ""
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		t.Skip("no Chromium: run make setup (installs Debian's chromium)")
	}
	dir := os.Getenv("ARTIFACTS_DIR")
	if dir == "" {
		dir = "artifacts"
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelA()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelT()
	var errs []string
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			errs = append(errs, e.ExceptionDetails.Text)
		}
	}))
	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, steps...))
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(sel))
		require.NoError(t, err, sel)
		return v
	}
	rows := func() int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#volumes tbody tr').length`))
		require.NoError(t, err)
		return n
	}
	shot := func(name string) {
		t.Helper()
		buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644))
	}
	setValue := func(sel, v string, event string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const e = document.querySelector(%q); e.value = %q; e.dispatchEvent(new Event(%q)); return true; })()`, sel, v, event)))
		require.NoError(t, err)
	}

	start := time.Now()
	all := fmt.Sprintf("%d volumes", total)
	do(chromedp.Navigate(base+"/"),
		chromedp.WaitVisible("#token"),
		chromedp.SendKeys("#token", token),
		chromedp.Click(`#login-form button[type="submit"]`),
		chromedp.WaitVisible("#nav-volumes"),
		chromedp.Click("#nav-volumes"),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector('#count').textContent === %q`, all), chromedp.WithPollingTimeout(time.Minute)))
	took := time.Since(start)
	assert.Equal(t, total, rows(), "every volume of every node in one table")
	assert.Equal(t, "page", func() string {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#nav-volumes').getAttribute('aria-current') || ""`))
		require.NoError(t, err)
		return v
	}(), "the nav says where we are")
	shot(fmt.Sprintf("all-volumes-%d-on-%d-nodes", total, nodes))

	// A burst of creates while the view is open (each several watch
	// events): the table is drawn again at most once each 250 ms, not
	// once per event, and the keyboard's focus stays on the row it was
	// on.
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`
window.__redraws = 0;
new MutationObserver((recs) => { if (recs.some((r) => r.removedNodes.length > 0)) window.__redraws++; })
  .observe(document.querySelector('#volumes tbody'), {childList: true});
document.querySelector('#volumes tbody tr a').focus();
true;`))
	require.NoError(t, err)
	focusedRow := func() string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => { const a = document.activeElement; const tr = a && a.closest('#volumes tbody tr'); return tr ? a.tagName + " " + tr.dataset.volume : String(a && a.tagName); })()`))
		require.NoError(t, err)
		return v
	}
	before := focusedRow()
	require.Contains(t, before, "A ")
	// The events the page gets, counted on a watch stream of our own.
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	var events atomic.Int64
	watching := make(chan struct{})
	go func() {
		req, _ := http.NewRequestWithContext(wctx, "GET", base+"/api/v1/watch", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			close(watching)
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		synced := false
		for sc.Scan() {
			switch l := sc.Text(); {
			case l == "event: SYNCED":
				synced = true
				close(watching)
			case synced && strings.HasPrefix(l, "data:") && strings.Contains(l, `"burst-`):
				events.Add(1)
			}
		}
	}()
	<-watching
	const burst = 40
	burstStart := time.Now()
	var burstNames []string
	for i := range burst {
		name := fmt.Sprintf("burst-%03d", i)
		burstNames = append(burstNames, name)
		require.Equal(t, http.StatusCreated, post(base+"/api/v1/volumes", token, fmt.Sprintf(`{"name":%q,"node":"node-0","sparseLoopDevice":{"size":"1Gi"}}`, name)))
	}
	require.Eventually(t, func() bool { return listPhases(t, base, token, burstNames)["Available"] == burst }, time.Minute, 100*time.Millisecond)
	total += burst
	do(chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector('#count').textContent === %q && document.querySelectorAll('#volumes tbody tr[data-phase="Available"]').length === %d`,
		fmt.Sprintf("%d volumes", total), total), chromedp.WithPollingTimeout(time.Minute)))
	elapsed := time.Since(burstStart)
	redraws, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__redraws`))
	require.NoError(t, err)
	n := events.Load()
	t.Logf("%d creates, %d watch events over %s: %d redraws of the table", burst, n, elapsed.Round(time.Millisecond), redraws)
	fmt.Printf("metric ui_redraws_per_watch_event %.3f ratio\n", float64(redraws)/float64(max(n, 1)))
	require.GreaterOrEqual(t, n, int64(2*burst), "each create is at least its ADDED and its Available")
	// Drawn once per event, the ratio is 1 or more; the events of the
	// burst come within a second or two, several to each 250 ms.
	assert.LessOrEqual(t, int64(redraws)*3, n, "at most one redraw each 250 ms, not one per event")
	assert.Equal(t, before, focusedRow(), "the focus stays on its row's link")
	fmt.Printf("metric ui_all_volumes_ready_ms %.0f ms\n", float64(took.Milliseconds()))
	t.Logf("all-volumes view: %d volumes on %d nodes shown %s after sign-in", total, nodes, took.Round(time.Millisecond))

	// A search: the seeded names seed-00010 to seed-00019.
	setValue("#filter", "seed-0001", "input")
	assert.Equal(t, 10, rows())
	assert.Equal(t, fmt.Sprintf("10 of %d volumes shown", total), text("#count"))
	setValue("#filter", "", "input")

	// A node: its volumes only, each row naming it.
	setValue("#node-filter", "node-3", "change")
	want := 0
	for _, n := range []int{seeded, created} { // both go round the nodes from node-0
		for i := range n {
			if i%nodes == 3 {
				want++
			}
		}
	}
	assert.Equal(t, want, rows())
	others, err := chromedp.Run(ctx, chromedp.Evaluate[int](`[...document.querySelectorAll('#volumes tbody tr td.col-node')].filter((td) => td.textContent !== 'node-3').length`))
	require.NoError(t, err)
	assert.Zero(t, others, "only node-3's volumes")
	shot("all-volumes-node-3")

	// A phase none is in: nothing, and the page says how to get back.
	setValue("#phase-filter", "Failed", "change")
	assert.Zero(t, rows())
	assert.Contains(t, text("#none-match"), "clear the search or the filters")
	assert.Empty(t, errs, "no script errors")
}
