package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
	"github.com/salt-volumes/salt-volumes/test/serveproc"
	"github.com/salt-volumes/salt-volumes/test/testenv"
)

func secret(t *testing.T) string {
	b := make([]byte, 12)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// pamUser creates a local Unix user with a password for the master's PAM
// eauth, removed when the test ends.
func pamUser(t *testing.T) (string, string) {
	name := "svt" + secret(t)[:8]
	pw := secret(t)
	out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	require.NoError(t, err, "useradd: %s", out)
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	cmd := exec.Command("chpasswd")
	cmd.Stdin = strings.NewReader(name + ":" + pw + "\n")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "chpasswd: %s", out)
	return name, pw
}

// People log in with their Salt identity, and their own Salt ACL decides
// on which minions they may change volumes: file eauth and PAM, on a real
// master with two minions.
func TestPeopleLogInWithSalt(t *testing.T) {
	alicePw, carolPw, malloryPw, davePw := secret(t), secret(t), secret(t), secret(t)
	pamName, pamPw := pamUser(t)
	nodeACL := func(target string) []any {
		return []any{map[string]any{target: []any{`^salt_volumes\.apply_volume$`, `^test\.ping$`}}}
	}
	s := saltstack.StartOpts(t, bin("salt-volume-exec"), saltstack.Options{API: true,
		FileUsers: map[string]string{"alice": alicePw, "carol": carolPw, "mallory": malloryPw, "dave": davePw},
		People: map[string]map[string]any{
			"file": {"alice": nodeACL("node-1"), "carol": []any{`^test\.ping$`}, "mallory": nodeACL("*"), "dave": nodeACL("node-1")},
			"pam":  {pamName: nodeACL("node-2")},
		}})
	var uuids []string
	t.Cleanup(func() { testenv.Cleanup(s.StateDir, uuids, t.Logf) })
	s.AddMinion("node-2")
	out, code := s.SyncAll("*")
	require.Equal(t, 0, code, out)
	out, code = s.SaltRun("saltutil.sync_runners")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "runners.salt_volumes")

	p := serveproc.New(t, s, bin("salt-volumes"))
	// "pam:mallory" is a PAM user's entry: the file user mallory is not
	// that user (#48 item 9). dave is an admin whose Salt ACL covers
	// node-1 alone.
	p.Start(fmt.Sprintf("access:\n  users: {alice: operator, carol: viewer, %s: operator, 'pam:mallory': admin, dave: admin}\n  sessionTTL: 1h\n  eauth: [file, pam]\n", pamName))
	ctx := context.Background()
	anon := &client.Client{URL: p.URL}
	login := func(user, pw, eauth string) client.Session {
		t.Helper()
		sess, err := anon.Login(ctx, user, pw, eauth)
		require.NoError(t, err, user)
		require.True(t, strings.HasPrefix(sess.Token, "svs_"))
		return sess
	}
	as := func(sess client.Session) *client.Client { return &client.Client{URL: p.URL, Token: sess.Token} }
	forbidden := func(err error) string {
		t.Helper()
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		require.Equal(t, http.StatusForbidden, ce.Status, ce.Error())
		return ce.Error()
	}
	sparse := func(name, node string) map[string]any {
		return map[string]any{"name": name, "node": node, "sparseLoopDevice": map[string]any{"size": "16Mi"}}
	}

	alice := login("alice", alicePw, "file")
	assert.Equal(t, "operator", string(alice.Role))
	assert.Equal(t, []string{"node-1"}, alice.Scopes, "her ACL's minions, as the master matched them")
	assert.Equal(t, []string{"node-1"}, alice.Grants)
	assert.WithinDuration(t, time.Now().Add(time.Hour), alice.Expire, time.Minute, "access.sessionTTL")

	t.Run("alice creates on node-1 and is refused on node-2, by her Salt ACL", func(t *testing.T) {
		v, err := as(alice).Create(ctx, sparse("alice-1", "node-1"))
		require.NoError(t, err)
		uuids = append(uuids, v.Spec.UUID)
		_, errs, code := p.CLI("wait", "alice-1", "--for", "Available", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
		// The job cache: published by the control plane's account, on
		// alice's behalf.
		got, err := p.Client().Get(ctx, "alice-1")
		require.NoError(t, err)
		out, code := s.SaltRun("jobs.list_job", got.Status.JobID, "--out=json")
		require.Equal(t, 0, code, out)
		var job struct {
			User     string         `json:"User"`
			Metadata map[string]any `json:"Metadata"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &job), out)
		assert.Equal(t, "salt-volumes", job.User)
		assert.Equal(t, map[string]any{"salt-volumes": map[string]any{"requestedBy": map[string]any{"alice-1": "alice"}}}, job.Metadata)
		_, err = as(alice).Create(ctx, sparse("alice-2", "node-2"))
		msg := forbidden(err)
		assert.Contains(t, msg, "alice may not change volumes on node-2")
		assert.Contains(t, msg, "grants salt_volumes.apply_volume on node-1 only")
		_, err = p.Client().Get(ctx, "alice-2")
		assert.Error(t, err, "nothing was created")
		_, err = as(alice).Create(ctx, map[string]any{"name": "alice-raw", "node": "node-1", "rawBlockDevice": map[string]any{"devicePath": "/dev/loop999"}})
		assert.Contains(t, forbidden(err), "needs role admin")
	})

	t.Run("a PAM user acts on node-2 alone", func(t *testing.T) {
		pam := login(pamName, pamPw, "pam")
		assert.Equal(t, []string{"node-2"}, pam.Scopes)
		v, err := as(pam).Create(ctx, sparse("pam-1", "node-2"))
		require.NoError(t, err)
		uuids = append(uuids, v.Spec.UUID)
		_, err = as(pam).Delete(ctx, "alice-1", false)
		assert.Contains(t, forbidden(err), pamName+" may not change volumes on node-1")
		_, errs, code := p.CLI("wait", "pam-1", "--for", "Available", "--timeout", "2m")
		require.Equal(t, 0, code, errs)
		_, err = as(pam).Delete(ctx, "pam-1", false)
		require.NoError(t, err)
	})

	t.Run("carol reads, watches and scrapes, and changes nothing", func(t *testing.T) {
		carol := login("carol", carolPw, "file")
		assert.Equal(t, "viewer", string(carol.Role))
		assert.Empty(t, carol.Scopes)
		items, err := as(carol).List(ctx, "")
		require.NoError(t, err)
		assert.NotEmpty(t, items)
		req, _ := http.NewRequest(http.MethodGet, p.URL+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+carol.Token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode)
		seen := make(chan struct{})
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			_ = as(carol).Watch(wctx, "", "alice-1", func(saltvolumes.Event) bool { close(seen); return false })
		}()
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
			t.Fatal("carol's watch saw nothing")
		}
		_, err = as(carol).Create(ctx, sparse("carol-1", "node-1"))
		assert.Contains(t, forbidden(err), "carol (role viewer)")
		_, err = as(carol).Delete(ctx, "alice-1", false)
		forbidden(err)
	})

	t.Run("wrong passwords and users without a role are refused, the password never logged", func(t *testing.T) {
		_, err := anon.Login(ctx, "alice", "not-"+alicePw, "file")
		var ce *client.Error
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, 401, ce.Status)
		_, err = anon.Login(ctx, "mallory", malloryPw, "file")
		assert.Contains(t, forbidden(err), "mallory logged in to Salt, but has no salt-volumes role")
		logs := p.LogText()
		for _, pw := range []string{alicePw, malloryPw, carolPw, pamPw} {
			assert.NotContains(t, logs, pw)
		}
		assert.Equal(t, 2.0, p.Metric("salt_volumes_logins_refused_total"))
	})

	t.Run("the CLI logs in, keeps the session for its user alone, and logs out", func(t *testing.T) {
		home := t.TempDir()
		cli := func(stdin string, args ...string) (string, string, int) {
			cmd := exec.Command(bin("salt-volumes"), args...)
			cmd.Env = append(os.Environ(), "SALT_VOLUMES_URL="+p.URL, "SALT_VOLUMES_TOKEN=", "XDG_CONFIG_HOME="+home)
			cmd.Stdin = strings.NewReader(stdin)
			return testenv.Run(t, cmd)
		}
		out, errs, code := cli(alicePw+"\n", "login", "--user", "alice", "--eauth", "file")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "logged in as alice (role operator)")
		assert.Contains(t, out, "change volumes on: node-1")
		st, err := os.Stat(filepath.Join(home, "salt-volumes", "session.json"))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
		out, errs, code = cli("", "whoami")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "alice\trole operator\t(session)")
		_, errs, code = cli("", "create", "alice-3", "--node", "node-2", "--size", "16Mi")
		assert.Equal(t, 6, code)
		assert.Contains(t, errs, "alice may not change volumes on node-2")
		out, errs, code = cli("", "logout")
		require.Equal(t, 0, code, errs)
		assert.Contains(t, out, "logged out alice")
		_, errs, code = cli("", "ls")
		assert.Equal(t, 2, code, "no session left: %s", errs)
	})

	t.Run("in Chromium: alice signs in, creates on node-1, is refused on node-2 with the reason, sees who created the volume, signs out", func(t *testing.T) {
		aliceSessions := func() int {
			out, errs, code := p.CLI("token", "list", "-o", "json")
			require.Equal(t, 0, code, errs)
			return strings.Count(out, `"user": "alice"`)
		}
		before := aliceSessions()
		b := newBrowser(t, p)
		row := func(name, phase string) string {
			return `#volumes tbody tr[data-volume="` + name + `"][data-phase="` + phase + `"]`
		}
		b.do(chromedp.Navigate(p.URL+"/"),
			chromedp.WaitVisible("#l-user"),
			chromedp.SendKeys("#l-user", "alice"),
			chromedp.SendKeys("#l-password", alicePw),
			chromedp.SetValue("#l-eauth", "file"),
			chromedp.Click(`#salt-login-form button[type="submit"]`),
			chromedp.WaitVisible(`#nodes tr[data-node="node-2"]`))
		require.Eventually(t, func() bool { return b.text("#who") == "alice (operator)" }, 10*time.Second, 100*time.Millisecond)
		b.do(chromedp.Click(`#nodes tr[data-node="node-1"] a`),
			chromedp.WaitVisible("#node-view"),
			chromedp.Click("#show-create"),
			chromedp.SendKeys("#f-name", "alice-ui"),
			chromedp.SendKeys("#f-size", "16Mi"),
			chromedp.Click(`#create-form button[type="submit"]`),
			chromedp.WaitVisible(row("alice-ui", "Available")))
		v, err := p.Client().Get(ctx, "alice-ui")
		require.NoError(t, err)
		uuids = append(uuids, v.Spec.UUID)
		b.do(chromedp.Navigate(p.URL+"/#/node/node-2"),
			chromedp.WaitVisible("#node-view"),
			chromedp.Click("#show-create"),
			chromedp.SendKeys("#f-name", "alice-ui-2"),
			chromedp.SendKeys("#f-size", "16Mi"),
			chromedp.Click(`#create-form button[type="submit"]`))
		require.Eventually(t, func() bool { return strings.Contains(b.text("#create-error"), "may not change volumes on node-2") }, 10*time.Second, 100*time.Millisecond)
		assert.Contains(t, b.text("#create-error"), "grants salt_volumes.apply_volume on node-1 only")
		b.do(chromedp.Navigate(p.URL+"/#/volume/alice-ui"),
			chromedp.WaitVisible("#vol-history li"))
		assert.Regexp(t, `^created by alice \d+s ago \(job \d{20}: succeeded\)$`, b.text("#vol-history li"))
		b.shot("people-alice-volume")
		b.do(chromedp.Click("#logout"), chromedp.WaitVisible("#l-user"))
		assert.Equal(t, "Logged out.", b.text("#login-error"))
		b.noConsoleErrors()
		assert.Equal(t, before, aliceSessions(), "the browser's session is gone on the server too")
	})

	t.Run("the audit shows who did what and what was refused", func(t *testing.T) {
		out, errs, code := p.CLI("audit", "-o", "json")
		require.Equal(t, 0, code, errs)
		var trail struct{ Items []map[string]any }
		require.NoError(t, json.Unmarshal([]byte(out), &trail))
		entries := trail.Items
		var got []string
		for _, e := range entries {
			vol, _ := e["volume"].(string)
			node, _ := e["node"].(string)
			got = append(got, fmt.Sprintf("%s %s %s %s %s@%s", e["user"], e["decision"], e["method"], e["route"], vol, node))
		}
		created, err := p.Client().Get(ctx, "alice-1")
		require.NoError(t, err)
		var withJob bool
		for _, e := range entries {
			if e["user"] == "alice" && e["volume"] == "alice-1" && e["decision"] == "allowed" {
				withJob = e["jobId"] == created.Status.JobID && e["outcome"] == "succeeded"
			}
		}
		assert.True(t, withJob, "alice's create names the Salt job that carried it out, and how it ended")
		for _, want := range []string{
			"alice allowed POST /api/v1/login @",
			"alice allowed POST /api/v1/volumes alice-1@node-1",
			"alice refused POST /api/v1/volumes alice-2@node-2",
			"alice refused POST /api/v1/volumes alice-raw@node-1",
			pamName + " allowed POST /api/v1/volumes pam-1@node-2",
			pamName + " refused DELETE /api/v1/volumes/alice-1 alice-1@node-1",
			"carol refused POST /api/v1/volumes carol-1@node-1",
			"carol refused DELETE /api/v1/volumes/alice-1 alice-1@node-1",
			"unverified:alice refused POST /api/v1/login @",
			"mallory refused POST /api/v1/login @",
			"alice refused POST /api/v1/volumes alice-3@node-2",
			"alice refused POST /api/v1/volumes alice-ui-2@node-2",
		} {
			assert.Contains(t, got, want)
		}
	})

	t.Run("a token dave makes stays within dave's Salt ACL (#48 item 8)", func(t *testing.T) {
		dave := login("dave", davePw, "file")
		assert.Equal(t, "admin", string(dave.Role))
		tok, err := as(dave).CreateToken(ctx, "daves-ci", "admin", "")
		require.NoError(t, err)
		ci := &client.Client{URL: p.URL, Token: tok.Token}
		_, err = ci.Create(ctx, sparse("dave-2", "node-2"))
		assert.Contains(t, forbidden(err), "token:daves-ci (made by dave) may not change volumes on node-2")
		_, err = p.Client().Get(ctx, "dave-2")
		assert.Error(t, err, "nothing was created")
		_, err = as(alice).CreateToken(ctx, "alices", "operator", "")
		assert.Contains(t, forbidden(err), "needs role admin")
	})

	t.Run("a watch stream ends when its session is logged out (#48 item 12)", func(t *testing.T) {
		carol := login("carol", carolPw, "file")
		ended := make(chan error, 1)
		synced := make(chan struct{})
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		go func() {
			ended <- as(carol).Watch(wctx, "", "", func(ev saltvolumes.Event) bool {
				if ev.Type == client.Synced {
					close(synced)
				}
				return true
			})
		}()
		<-synced
		require.NoError(t, as(carol).Logout(ctx))
		select {
		case err := <-ended:
			require.Error(t, err)
			assert.Contains(t, err.Error(), "watch ended by the server")
		case <-time.After(30 * time.Second):
			t.Fatal("the stream outlived its session by 30 s")
		}
	})

	t.Run("logins are JSON, keyed by eauth, and throttled under a parallel flood (#48 items 9, 10, 15)", func(t *testing.T) {
		post := func(ctype, body string) int {
			req, _ := http.NewRequest(http.MethodPost, p.URL+"/api/v1/login", strings.NewReader(body))
			req.Header.Set("Content-Type", ctype)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			return resp.StatusCode
		}
		assert.Equal(t, http.StatusUnsupportedMediaType, post("text/plain", `{"username":"alice","password":"`+alicePw+`","eauth":"file"}`))
		_, err := anon.Login(ctx, "mallory", malloryPw, "file")
		assert.Contains(t, forbidden(err), "mallory logged in to Salt, but has no salt-volumes role", "pam:mallory is not the file user mallory")
		before := p.Metric("salt_volumes_logins_refused_total")
		codes := make(chan int, 40)
		for range 40 {
			go func() { codes <- post("application/json", `{"username":"alice","password":"wrong","eauth":"file"}`) }()
		}
		var tooMany int
		for range 40 {
			if <-codes == http.StatusTooManyRequests {
				tooMany++
			}
		}
		assert.GreaterOrEqual(t, tooMany, 36, "at most the free attempts reach the master")
		assert.Equal(t, before+40, p.Metric("salt_volumes_logins_refused_total"))
	})

}
