package api

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/spec"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// noSalt never answers a launch, so volumes stay where the API put them.
type noSalt struct{}

func (noSalt) LocalAsync(ctx context.Context, _, _ string, _ []any, _ map[string]any) (saltapi.Job, error) {
	<-ctx.Done()
	return saltapi.Job{}, ctx.Err()
}
func (noSalt) ListJob(context.Context, string) (saltapi.JobInfo, error) {
	return saltapi.JobInfo{}, nil
}

const token = "0123456789abcdef0123"

func newServer(t *testing.T) (*httptest.Server, *store.Bolt) {
	return newServerWith(t, func(*Server) {})
}

func newServerWith(t *testing.T, tune func(*Server)) (*httptest.Server, *store.Bolt) {
	return newServerOpt(t, reconciler.Options{PollInterval: time.Hour}, tune)
}

func newServerOpt(t *testing.T, opt reconciler.Options, tune func(*Server)) (*httptest.Server, *store.Bolt) {
	st, err := store.Open(filepath.Join(t.TempDir(), "v.db"))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	rec := reconciler.New(st, noSalt{}, nil, opt, nil)
	ctx, cancel := context.WithCancel(context.Background())
	go rec.Run(ctx)
	hub := store.NewHub()
	stopHub := st.Watch(hub.Publish)
	t.Cleanup(stopHub)
	srv := &Server{Requests: rec.Requests, Jobs: rec.Jobs, Health: rec.Nodes, Watch: hub, ExtraMetrics: rec.WriteMetrics, Store: st, Token: token,
		Nodes: func(context.Context) ([]string, error) { return []string{"node-1", "node-2"}, nil }}
	tune(srv)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); cancel() })
	return ts, st
}

// scrape reads /metrics as Prometheus would.
func scrape(t *testing.T, ts *httptest.Server) string {
	t.Helper()
	req, err := http.NewRequest("GET", ts.URL+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func do(t *testing.T, ts *httptest.Server, method, path, tok, body string) (int, map[string]any) {
	req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func errField(m map[string]any, k string) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e[k].(string)
	return s
}

func TestTokenIsRequired(t *testing.T) {
	ts, _ := newServer(t)
	for _, tok := range []string{"", "wrong-token-wrong-token"} {
		code, m := do(t, ts, "GET", "/api/v1/volumes", tok, "")
		assert.Equal(t, 401, code)
		assert.Contains(t, errField(m, "message"), "API token")
		code, _ = do(t, ts, "GET", "/metrics", tok, "")
		assert.Equal(t, 401, code)
	}
	code, _ := do(t, ts, "GET", "/healthz", "", "")
	assert.Equal(t, 200, code, "health needs no token")
	code, _ = do(t, ts, "GET", "/api/v1/volumes?access_token="+token, "", "")
	assert.Equal(t, 401, code, "a token in a URL is never accepted")
	code, _ = do(t, ts, "GET", "/metrics?access_token="+token, "", "")
	assert.Equal(t, 401, code)
}

// The watch stream takes a one-time ticket in its URL (EventSource cannot
// send headers), never the token: a ticket works once, a forged, expired
// or reused one is refused, and the token in the query is not a way in.
func TestWatchTakesATicketNotTheToken(t *testing.T) {
	var srv *Server
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) { srv = s; withAccess(&st)(s) })
	open := func(query string) *http.Response {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t.Cleanup(cancel)
		req, err := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/watch?"+query, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	assert.Equal(t, 401, open("access_token="+token).StatusCode, "the long-lived token is not taken from a URL")

	code, _ := do(t, ts, "POST", "/api/v1/watch/ticket", "", "")
	assert.Equal(t, 401, code, "a ticket needs the token")
	code, m := do(t, ts, "POST", "/api/v1/watch/ticket", token, "")
	require.Equal(t, 200, code)
	ticket, _ := m["ticket"].(string)
	require.NotEmpty(t, ticket)
	assert.NotContains(t, ticket, token)
	resp := open("ticket=" + ticket)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	assert.Equal(t, 401, open("ticket="+ticket).StatusCode, "a ticket is spent on first use")

	// Another replica of the same store takes this one's tickets.
	ts2, _ := newServerWith(t, func(s *Server) { s.Tokens = &access.Tokens{Records: st, Bootstrap: token} })
	code, m = do(t, ts, "POST", "/api/v1/watch/ticket", token, "")
	require.Equal(t, 200, code)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", ts2.URL+"/api/v1/watch?ticket="+m["ticket"].(string), nil)
	require.NoError(t, err)
	other, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	other.Body.Close()
	assert.Equal(t, 200, other.StatusCode)

	// Expired, forged, or signed by a replica of another store (even one
	// with the same bootstrap token): refused, naming the fix.
	boot := ticketCred{kind: credOurs, hash: hashBytes(token)}
	old, _, err := srv.issueTicket(context.Background(), time.Now().Add(-TicketTTL-time.Second), boot)
	require.NoError(t, err)
	resp = open("ticket=" + old)
	assert.Equal(t, 401, resp.StatusCode)
	other2 := &Server{Token: token}
	forged, _, err := other2.issueTicket(context.Background(), time.Now(), boot)
	require.NoError(t, err)
	assert.Equal(t, 401, open("ticket="+forged).StatusCode, "the key is the replicas' own, not derived from the token")
	b := []byte(ticket)
	b[len(b)-1] ^= 1
	assert.Equal(t, 401, open("ticket="+string(b)).StatusCode)
	var body map[string]any
	require.NoError(t, json.NewDecoder(open("ticket=nope").Body).Decode(&body))
	assert.Contains(t, errField(body, "message"), "POST /api/v1/watch/ticket")
}

func TestAnswersAreNotCachedOrFramed(t *testing.T) {
	ts, _ := newServer(t)
	req, _ := http.NewRequest("GET", ts.URL+"/api/v1/volumes", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")

	big := `{"name":"a","node":"n","sparseLoopDevice":{"size":"1Gi"},"mkfsOptions":["` + strings.Repeat("x", MaxBody) + `"]}`
	code, _ := do(t, ts, "POST", "/api/v1/volumes", token, big)
	assert.Equal(t, 400, code, "a body past MaxBody is refused")
}

func TestCreateValidatesAndConflicts(t *testing.T) {
	ts, st := newServer(t)
	cases := []struct{ body, field, msg string }{
		{`{"name":"a","sparseLoopDevice":{"size":"1Gi"}}`, "node", "missing"},
		{`{"name":"a","node":"n","sparseLoopDevice":{"size":"lots"}}`, "sparseLoopDevice.size", ""},
		{`{"name":"A_b","node":"n","sparseLoopDevice":{"size":"1Gi"}}`, "name", "DNS-1123"},
		{`{"name":"a","node":"n","fstype":"xfs","sparseLoopDevice":{"size":"1Gi"}}`, "spec", `unknown field "fstype"`},
		{`{"name":"a","node":"n"`, "spec", "invalid JSON"},
	}
	for _, c := range cases {
		code, m := do(t, ts, "POST", "/api/v1/volumes", token, c.body)
		assert.Equal(t, 400, code, c.body)
		assert.Equal(t, c.field, errField(m, "field"), c.body)
		assert.Contains(t, errField(m, "message"), c.msg, c.body)
	}
	assert.Zero(t, st.Len(), "refused input creates nothing")

	code, m := do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"a","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	require.Equal(t, 201, code)
	status := m["status"].(map[string]any)
	assert.Equal(t, "Unknown", status["phase"])
	assert.Equal(t, true, m["deletable"], "a volume being created may be deleted: the deletion waits for the creation")
	spec := m["spec"].(map[string]any)
	assert.Len(t, spec["uuid"], 36, "uuid generated")

	code, m = do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"a","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	assert.Equal(t, 409, code)
	assert.Equal(t, "name", errField(m, "field"))
	code, m = do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"b","uuid":"`+spec["uuid"].(string)+`","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	assert.Equal(t, 409, code)
	assert.Equal(t, "uuid", errField(m, "field"))

	code, m = do(t, ts, "DELETE", "/api/v1/volumes/a", token, "")
	assert.Equal(t, 202, code)
	assert.Equal(t, true, m["deleting"])
	assert.Contains(t, m["deleteBlockedReason"], "starts once the creation ends")
	code, m = do(t, ts, "DELETE", "/api/v1/volumes/a?forget=true", token, "")
	assert.Equal(t, 409, code)
	assert.Contains(t, errField(m, "message"), "only a Failed volume can be forgotten (it is Unknown)")
	code, m = do(t, ts, "DELETE", "/api/v1/volumes/a?forget=true&wipe=true", token, "")
	assert.Equal(t, 400, code)
	assert.Equal(t, "forget", errField(m, "field"))
	code, _ = do(t, ts, "DELETE", "/api/v1/volumes/zzz", token, "")
	assert.Equal(t, 404, code)
	code, _ = do(t, ts, "GET", "/api/v1/volumes/zzz", token, "")
	assert.Equal(t, 404, code)

	code, m = do(t, ts, "GET", "/api/v1/volumes?node=node-2", token, "")
	assert.Equal(t, 200, code)
	assert.Empty(t, m["items"])
	code, m = do(t, ts, "GET", "/api/v1/nodes", token, "")
	assert.Equal(t, 200, code)
	nodes := m["items"].([]any)
	require.Len(t, nodes, 2)
	n1 := nodes[0].(map[string]any)
	assert.Equal(t, "node-1", n1["name"])
	assert.EqualValues(t, 1, n1["volumes"])
	assert.Equal(t, map[string]any{"Unknown": 1.0}, n1["phases"])
}

func TestWatchStartsWithTheListThenStreams(t *testing.T) {
	ts, _ := newServer(t)
	code, _ := do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"first","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	require.Equal(t, 201, code)
	req, _ := http.NewRequest("GET", ts.URL+"/api/v1/watch?node=node-1", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	next := func() (string, string) {
		var typ, data string
		for sc.Scan() {
			l := sc.Text()
			if l == "" && typ != "" {
				return typ, data
			}
			if v, ok := strings.CutPrefix(l, "event: "); ok {
				typ = v
			}
			if v, ok := strings.CutPrefix(l, "data: "); ok {
				data = v
			}
		}
		return "", ""
	}
	typ, data := next()
	assert.Equal(t, "ADDED", typ)
	assert.Contains(t, data, `"name":"first"`)
	typ, _ = next()
	assert.Equal(t, "SYNCED", typ)
	do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"elsewhere","node":"node-2","sparseLoopDevice":{"size":"1Gi"}}`)
	do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"second","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	typ, data = next()
	assert.Equal(t, "ADDED", typ)
	assert.Contains(t, data, `"name":"second"`, "node-2's volume was filtered out")
}

func TestMetricsExposition(t *testing.T) {
	ts, _ := newServer(t)
	do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"a","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	text := scrape(t, ts)
	for _, want := range []string{
		"# TYPE salt_volumes_reconciles_total counter",
		"salt_volumes_jobs_reconstructed_total 0",
		"salt_volumes_jobs_relaunched_total 0",
		`salt_volumes_job_latency_seconds_bucket{le="+Inf"} 0`,
		`salt_volumes_volumes{phase="Unknown"} 1`,
		`salt_volumes_volumes{phase="Available"} 0`,
		`salt_volumes_events_rejected_total{reason="unconfirmed"} 0`,
		`salt_volumes_events_rejected_total{reason="progress"} 0`,
		"# TYPE salt_volumes_workqueue_work_duration_seconds summary",
	} {
		assert.Contains(t, text, want)
	}
	// The reconciler's client-go queue took the new volume, and a worker
	// took it from there (its pass waits on a Salt that never answers).
	assert.Regexp(t, `salt_volumes_workqueue_adds_total\{name="volumes"\} [1-9]`, text)
	done := regexp.MustCompile(`salt_volumes_workqueue_queue_duration_seconds_count\{name="volumes"\} [1-9]`)
	assert.Eventually(t, func() bool { return done.MatchString(scrape(t, ts)) }, 5*time.Second, 10*time.Millisecond)
}

func TestLimits(t *testing.T) {
	t.Run("create rate", func(t *testing.T) {
		ts, _ := newServerWith(t, func(s *Server) { s.CreatesPerSecond = 2 })
		codes := map[int]int{}
		for i := range 8 {
			code, m := do(t, ts, "POST", "/api/v1/volumes", token, fmt.Sprintf(`{"name":"r-%d","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`, i))
			codes[code]++
			if code == 429 {
				assert.Equal(t, "limit", errField(m, "code"))
			}
		}
		assert.Equal(t, 4, codes[201], "a burst of twice the rate")
		assert.Equal(t, 4, codes[429])
	})
	t.Run("volumes", func(t *testing.T) {
		ts, st := newServerOpt(t, reconciler.Options{PollInterval: time.Hour, MaxVolumes: 2}, func(*Server) {})
		for i := range 3 {
			code, m := do(t, ts, "POST", "/api/v1/volumes", token, fmt.Sprintf(`{"name":"v-%d","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`, i))
			if i < 2 {
				assert.Equal(t, 201, code)
			} else {
				assert.Equal(t, 429, code)
				assert.Contains(t, errField(m, "message"), "limits.volumes")
			}
		}
		assert.Equal(t, 2, st.Len())
		assert.Contains(t, scrape(t, ts), `salt_volumes_volumes_over_limit_total{via="api"} 1`)
	})
	t.Run("watchers", func(t *testing.T) {
		ts, _ := newServerWith(t, func(s *Server) { s.MaxWatchers = 1 })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		open := func() *http.Response {
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/api/v1/watch", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			return resp
		}
		first := open()
		defer first.Body.Close()
		require.Equal(t, 200, first.StatusCode)
		second := open()
		defer second.Body.Close()
		assert.Equal(t, 503, second.StatusCode)
	})
}

// The dashboard and alert rules shipped in deploy/monitoring use only
// metrics the server exports.
func TestMonitoringUsesExportedMetrics(t *testing.T) {
	ts, _ := newServer(t)
	exported := scrape(t, ts)
	name := regexp.MustCompile(`salt_volumes_[a-z_]+`)
	for _, f := range []string{"alerts.yaml", "grafana-dashboard.json"} {
		src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", f))
		require.NoError(t, err)
		used := name.FindAllString(string(src), -1)
		require.NotEmpty(t, used, f)
		for _, m := range used {
			base := strings.TrimSuffix(m, "_bucket")
			assert.Contains(t, exported, "# HELP "+base+" ", "%s uses %s", f, m)
		}
		if strings.HasSuffix(f, ".json") {
			var dash map[string]any
			require.NoError(t, json.Unmarshal(src, &dash), f)
		}
	}
}

// A follower passes what only the leader holds to the leader and relays
// the answer; an unreachable leader is a 502 that says which and why; a
// request already forwarded is answered where it lands (no loops).
func TestFollowerAsksTheLeader(t *testing.T) {
	leader, _ := newServerWith(t, func(s *Server) { s.Role = func() Role { return Role{Leader: true} } })
	follower, _ := newServerWith(t, func(s *Server) {
		s.Role = func() Role { return Role{LeaderID: "replica-1", URL: leader.URL} }
		s.Nodes = func(context.Context) ([]string, error) { return []string{"only-on-the-follower"}, nil }
	})
	code, body := do(t, follower, "GET", "/api/v1/nodes", token, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, fmt.Sprint(body), "node-2", "the leader's answer")
	assert.NotContains(t, fmt.Sprint(body), "only-on-the-follower")

	req, _ := http.NewRequest("GET", follower.URL+"/api/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(forwardedHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.NotContains(t, string(b), "only-on-the-follower", "a client's own forwarded header is not believed (#48 item 14)")
	assert.Contains(t, string(b), "node-2")

	leader.Close()
	code, body = do(t, follower, "GET", "/api/v1/nodes", token, "")
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Contains(t, fmt.Sprint(body), "this replica follows replica-1")
	code, _ = do(t, follower, "GET", "/readyz", "", "")
	assert.Equal(t, http.StatusOK, code)
}

// failed puts a Failed volume in the store, one that may be deleted or
// forgotten.
func failed(t *testing.T, st store.Store, name string) {
	t.Helper()
	sp, err := spec.ParseNew(strings.NewReader(`{"name":"`+name+`","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`), uuid.NewString)
	require.NoError(t, err)
	v := &volume.Volume{Spec: *sp, CreatedAt: time.Now()}
	v.Status.Phase = volume.Failed
	require.NoError(t, st.Create(context.Background(), v))
}

func TestDeleteReadsItsFlagsStrictly(t *testing.T) {
	ts, st := newServer(t)
	failed(t, st, "keep")
	for _, c := range []struct{ query, field string }{
		{"forget=yes", "forget"},
		{"forget=", "forget"},
		{"wipe=maybe", "wipe"},
		{"wipe=true&wipe=false", "wipe"},
		{"wpie=true", "wpie"},
		{"force=1", "force"},
	} {
		code, m := do(t, ts, "DELETE", "/api/v1/volumes/keep?"+c.query, token, "")
		assert.Equal(t, 400, code, c.query)
		assert.Equal(t, c.field, errField(m, "field"), c.query)
		assert.Contains(t, errField(m, "message"), c.field+":", c.query)
	}
	v, err := st.Get("keep")
	require.NoError(t, err)
	assert.False(t, v.DeleteRequested || v.ForgetRequested || v.Wipe, "a refused request changes nothing")

	// forget=1 drops the record only: before, it was read as "not forget"
	// and deleted the storage.
	code, m := do(t, ts, "DELETE", "/api/v1/volumes/keep?forget=1", token, "")
	require.Equal(t, 202, code, m)
	assert.Nil(t, m["deleting"], "a forget is not a deletion")
	if v, err := st.Get("keep"); err == nil {
		assert.False(t, v.DeleteRequested, "forget=1 must not delete the storage")
	}

	failed(t, st, "gone")
	code, m = do(t, ts, "DELETE", "/api/v1/volumes/gone?wipe=TRUE&forget=0", token, "")
	require.Equal(t, 202, code, m)
	v, err = st.Get("gone")
	require.NoError(t, err)
	assert.True(t, v.DeleteRequested && v.Wipe, "wipe=TRUE wipes")

	code, m = do(t, ts, "GET", "/api/v1/volumes?nod=node-1", token, "")
	assert.Equal(t, 400, code)
	assert.Contains(t, errField(m, "message"), "it knows node")
	code, m = do(t, ts, "GET", "/api/v1/volumes/gone?verbose=1", token, "")
	assert.Equal(t, 400, code)
	assert.Equal(t, "verbose", errField(m, "field"))
}

func TestCreateBodyIsDecodedOnceAndStrictly(t *testing.T) {
	ts, st := newServer(t)
	for _, c := range []struct{ body, field, msg string }{
		{`{"name":"a1","name":"b1","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`, "name", "given twice"},
		{`{"name":"a1","node":"node-9","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`, "node", "given twice"},
		{`{"name":"a1","node":"node-1","sparseLoopDevice":{"size":"1Gi","size":"1Ti"}}`, "sparseLoopDevice.size", "given twice"},
		{`null`, "spec", "must be a JSON object"},
		{` [{"name":"a1"}]`, "spec", "not an array"},
		{`"a1"`, "spec", "not a string"},
		{`7`, "spec", "not a number"},
	} {
		code, m := do(t, ts, "POST", "/api/v1/volumes", token, c.body)
		assert.Equal(t, 400, code, c.body)
		assert.Equal(t, c.field, errField(m, "field"), c.body)
		assert.Contains(t, errField(m, "message"), c.msg, c.body)
	}
	assert.Zero(t, st.Len(), "refused input creates nothing")
	code, m := do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"a1","uuid":null,"node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	require.Equal(t, 201, code, m)
	assert.Len(t, m["spec"].(map[string]any)["uuid"], 36, "a null uuid is generated")
}

func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	ts, _ := newServer(t)
	for _, h := range []string{"bearer " + token, "BEARER " + token, "Bearer " + token} {
		req, err := http.NewRequest("GET", ts.URL+"/api/v1/volumes", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", h)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, h[:6])
	}
	for _, h := range []string{"Basic " + token, token, "Bearer"} {
		req, _ := http.NewRequest("GET", ts.URL+"/api/v1/volumes", nil)
		req.Header.Set("Authorization", h)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 401, resp.StatusCode, "another scheme or no token is refused")
	}
}

func TestForgetNodeTakesExactlyTheListedVolumes(t *testing.T) {
	ts, st := newServer(t)
	failed(t, st, "n1")
	for _, c := range []struct{ body, msg string }{
		{``, `{"volumes": ["NAME", ...]}`},
		{`{"volumes":[]}`, "empty"},
		{`{"volume":["n1"]}`, `{"volumes": ["NAME", ...]}`},
		{`{"volumes":["n1"]} {}`, `{"volumes": ["NAME", ...]}`},
	} {
		code, m := do(t, ts, "POST", "/api/v1/nodes/node-1/forget", token, c.body)
		assert.Equal(t, 400, code, c.body)
		assert.Equal(t, "volumes", errField(m, "field"), c.body)
		assert.Contains(t, errField(m, "message"), c.msg, c.body)
	}
	code, m := do(t, ts, "POST", "/api/v1/nodes/node-2/forget", token, `{"volumes":["n1"]}`)
	assert.Equal(t, 409, code, "n1 is not node-2's")
	assert.Contains(t, errField(m, "message"), "not volumes of node node-2: n1")
	v, err := st.Get("n1")
	require.NoError(t, err)
	assert.False(t, v.ForgetRequested, "a refused drain changes nothing")

	code, m = do(t, ts, "POST", "/api/v1/nodes/node-1/forget", token, `{"volumes":["n1"]}`)
	require.Equal(t, 202, code, m)
	assert.Len(t, m["items"], 1)
}

// A resize body is read strictly, and what cannot grow is refused naming
// the field; nothing changes.
func TestResizeRefusals(t *testing.T) {
	ts, st := newServer(t)
	code, _ := do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"a","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	require.Equal(t, 201, code)
	code, _ = do(t, ts, "POST", "/api/v1/volumes", token, `{"name":"r","node":"node-1","rawBlockDevice":{"devicePath":"/dev/sdb"}}`)
	require.Equal(t, 201, code)
	for _, c := range []struct {
		path, body string
		code       int
		msg        string
	}{
		{"/api/v1/volumes/a/resize", ``, 400, `{"size": "20Gi"}`},
		{"/api/v1/volumes/a/resize", `{"sise":"2Gi"}`, 400, `{"size": "20Gi"}`},
		{"/api/v1/volumes/a/resize", `{"size":"2Gi"} {}`, 400, `{"size": "20Gi"}`},
		{"/api/v1/volumes/a/resize", `{"size":"lots"}`, 400, "lots"},
		{"/api/v1/volumes/a/resize", `{"size":"512Mi"}`, 400, "shrinking is refused"},
		{"/api/v1/volumes/r/resize", `{"size":"2Gi"}`, 400, "a raw volume is the size of its device"},
		{"/api/v1/volumes/a/resize", `{"toDevice":true}`, 400, "missing: the size the volume grows to"},
		{"/api/v1/volumes/a/resize", `{"size":"2Gi","toDevice":true}`, 400, `{"toDevice": true}`},
		{"/api/v1/volumes/a/resize", `{"size":""}`, 400, `{"size": "20Gi"}`},
		{"/api/v1/volumes/a/resize", `{"size":"2Gi"}`, 409, "only an Available volume grows"},
		{"/api/v1/volumes/r/resize", `{"toDevice":true}`, 409, "only an Available volume grows"},
	} {
		code, m := do(t, ts, "POST", c.path, token, c.body)
		assert.Equal(t, c.code, code, c.body)
		assert.Equal(t, "size", errField(m, "field"), c.body)
		assert.Contains(t, errField(m, "message"), c.msg, c.body)
	}
	code, _ = do(t, ts, "POST", "/api/v1/volumes/nope/resize", token, `{"size":"2Gi"}`)
	assert.Equal(t, 404, code)
	v, err := st.Get("a")
	require.NoError(t, err)
	assert.Equal(t, "1Gi", string(v.Spec.SparseLoopDevice.Size), "nothing changed")
}

// A request that kept meeting newer writes was not recorded: 409 "busy",
// ask again; never 202, never a 500.
func TestStoreConflictIsBusy(t *testing.T) {
	rec := httptest.NewRecorder()
	storeErr(rec, fmt.Errorf("recording the request on v: the volume kept changing: %w", &store.ConflictError{Name: "v"}))
	assert.Equal(t, http.StatusConflict, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.Contains(t, rec.Body.String(), `"code": "busy"`)
}

// Volumes read back from the store (after a restart, on a follower, from
// Volume objects) carry their size as a quantity only: the metric reads
// it, and for a raw volume the size its node reported.
func TestSizeMetricOfStoredVolumes(t *testing.T) {
	ts, st := newServer(t)
	sparse := &volume.Volume{Spec: spec.Spec{Name: "kept", Node: "node-1", UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301",
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
	raw := &volume.Volume{Spec: spec.Spec{Name: "disk", Node: "node-1", UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3302",
		RawBlockDevice: &spec.RawBlockDevice{DevicePath: "/dev/sdb"}}}
	raw.Status.Size = 5 << 30
	require.NoError(t, st.Create(context.Background(), sparse))
	require.NoError(t, st.Create(context.Background(), raw))
	got := map[string]float64{}
	for _, line := range strings.Split(scrape(t, ts), "\n") {
		var name string
		var v float64
		if _, err := fmt.Sscanf(line, "salt_volumes_volume_size_bytes{volume=%q,node=\"node-1\"} %g", &name, &v); err == nil {
			got[name] = v
		}
	}
	assert.Equal(t, map[string]float64{"kept": 1 << 30, "disk": 5 << 30}, got)
}

// Watchers that never read cannot hold the watch slots: a write that does
// not complete within WatchWriteTimeout ends the stream.
func TestStalledWatchersAreDropped(t *testing.T) {
	ts, st := newServerWith(t, func(s *Server) {
		s.MaxWatchers = 2
		s.WatchWriteTimeout = 200 * time.Millisecond
		s.Heartbeat = 10 * time.Millisecond
	})
	// Enough to fill the socket buffers between a server and a client that
	// reads nothing: the initial list alone blocks the stream.
	pad := strings.Repeat("x", 63)
	for i := range 600 {
		v := &volume.Volume{Spec: spec.Spec{Name: fmt.Sprintf("v-%d", i), Node: "node-1", UUID: uuid.NewString(),
			SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}}
		v.Status.Message = strings.Repeat(pad, 64)
		require.NoError(t, st.Create(context.Background(), v))
	}
	addr := strings.TrimPrefix(ts.URL, "http://")
	for range 2 {
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1) })
			if err != nil {
				return err
			}
			return serr
		}}
		conn, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = fmt.Fprintf(conn, "GET /api/v1/watch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", token)
		require.NoError(t, err)
	}
	// Both stalled streams are ended by their write deadline; a third
	// watcher then gets a slot.
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest("GET", ts.URL+"/api/v1/watch?name=v-1", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 100*time.Millisecond, "a slot frees up once the stalled watchers are dropped")
}

// A follower forwards a caller's token only over https or on this host.
func TestForwardableLeaders(t *testing.T) {
	for raw, want := range map[string]bool{
		"https://master-1:8443":   true,
		"https://10.0.0.5:8443":   true,
		"http://127.0.0.1:8080":   true,
		"http://localhost:8080":   true,
		"http://[::1]:8080":       true,
		"http://10.0.0.5:8080":    false,
		"http://master-1:8080":    false,
		"http://0.0.0.0:8080":     false,
		"ftp://127.0.0.1:8080":    false,
		"http://127.0.0.1.nip.io": false,
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		assert.Equal(t, want, Forwardable(u), raw)
	}
}

func hashBytes(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// #48 item 14: a replica believes a forward signed with the replicas' key
// (answering it itself, whatever it thinks of its role) and nothing else.
func TestOnlyAReplicasForwardIsBelieved(t *testing.T) {
	var st *store.Bolt
	var bURL string
	a, _ := newServerWith(t, func(s *Server) {
		withAccess(&st)(s)
		s.Role = func() Role { return Role{LeaderID: "replica-b", URL: bURL} }
		s.Nodes = func(context.Context) ([]string, error) { return []string{"seen-by-a"}, nil }
	})
	b, _ := newServerWith(t, func(s *Server) {
		s.Tokens = &access.Tokens{Records: st, Bootstrap: token}
		// b believes a leads: a forward it did not believe would go
		// back to a.
		s.Role = func() Role { return Role{LeaderID: "replica-a", URL: a.URL} }
		s.Nodes = func(context.Context) ([]string, error) { return []string{"seen-by-b"}, nil }
	})
	bURL = b.URL
	code, body := do(t, a, "GET", "/api/v1/nodes", token, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, fmt.Sprint(body), "seen-by-b", "b believed a's signed forward and answered itself")

	for _, forged := range []string{"1", "1700000000.AAAA", fmt.Sprintf("%d.%s", time.Now().Unix(), strings.Repeat("A", 43))} {
		req, _ := http.NewRequest("GET", b.URL+"/api/v1/nodes", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(forwardedHeader, forged)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Not believed: b passes it on to a (its leader), signed, and
		// a answers.
		assert.Contains(t, string(raw), "seen-by-a", forged)
	}
}
