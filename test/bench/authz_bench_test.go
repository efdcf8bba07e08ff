package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/api"
	"github.com/salt-volumes/salt-volumes/internal/client"
	"github.com/salt-volumes/salt-volumes/internal/reconciler"
	"github.com/salt-volumes/salt-volumes/internal/saltapi"
	"github.com/salt-volumes/salt-volumes/internal/store"
	"github.com/salt-volumes/salt-volumes/test/saltstack"
)

// idleSalt never answers a launch: the volumes stay where the API put
// them, so that only the API's own path is measured.
type idleSalt struct{}

func (idleSalt) LocalAsync(ctx context.Context, _, _ string, _ []any, _ map[string]any) (saltapi.Job, error) {
	<-ctx.Done()
	return saltapi.Job{}, ctx.Err()
}
func (idleSalt) ListJob(context.Context, string) (saltapi.JobInfo, error) {
	return saltapi.JobInfo{}, nil
}

// BenchmarkAuthz: what deciding who may create costs a create through the
// API, against the bootstrap admin token (a constant-time compare, no
// lookup) in the same run, interleaved:
//   - a service token: its hash read from the store;
//   - a person logged in with file eauth on a real master: the session read
//     from the store and their Salt ACL for the minion, asked of the master
//     (runner salt_volumes.access) once per 10 s and reused in between;
//   - the master's answer itself, uncached (authz_acl_miss_ms_p50).
//
// Every create is also audited, on every path alike.
func BenchmarkAuthz(b *testing.B) { authzOnce.Do(func() { measureAuthz(b) }) }

var authzOnce sync.Once

func measureAuthz(b *testing.B) {
	pw := "bench-alice-password"
	s := saltstack.StartOpts(b, binary, saltstack.Options{API: true,
		FileUsers: map[string]string{"alice": pw},
		People:    map[string]map[string]any{"file": {"alice": []any{map[string]any{"node-1": []any{`^salt_volumes\.apply_volume$`}}}}}})
	if out, code := s.SaltRun("saltutil.sync_runners"); code != 0 {
		b.Fatalf("sync_runners: %s", out)
	}
	salt, err := saltapi.New(saltapi.Config{URL: s.APIURL(), Username: s.APIUser, Password: s.APIPass, Eauth: "file", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(filepath.Join(b.TempDir(), "v.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	rec := reconciler.New(st, idleSalt{}, nil, reconciler.Options{PollInterval: time.Hour}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rec.Run(ctx)
	hub := store.NewHub()
	defer st.Watch(hub.Publish)()
	const bootstrap = "bench-bootstrap-token-0123456789"
	srv := &api.Server{Requests: rec.Requests, Jobs: rec.Jobs, Health: rec.Nodes, Watch: hub, Store: st, Token: bootstrap,
		Tokens: &access.Tokens{Records: st, Bootstrap: bootstrap}, Audit: &access.Audit{Records: st},
		Logins: &api.Logins{People: salt, Roles: access.RoleMap{Users: map[string]access.Role{"alice": access.Operator}, Eauth: []string{"file"}}, TTL: time.Hour},
		Nodes:  salt.Minions}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	admin := &client.Client{URL: ts.URL, Token: bootstrap}
	svc, err := admin.CreateToken(ctx, "bench", "operator", "")
	if err != nil {
		b.Fatal(err)
	}
	sess, err := (&client.Client{URL: ts.URL}).Login(ctx, "alice", pw, "file")
	if err != nil {
		b.Fatal(err)
	}
	paths := []struct {
		name string
		c    *client.Client
		ds   []time.Duration
	}{
		{"bootstrap", admin, nil},
		{"service", &client.Client{URL: ts.URL, Token: svc.Token}, nil},
		{"session", &client.Client{URL: ts.URL, Token: sess.Token}, nil},
	}
	n := sized(300, 5)
	for i := range n {
		for j := range paths {
			p := &paths[j]
			spec := map[string]any{"name": fmt.Sprintf("authz-%s-%d", p.name, i), "node": "node-1", "sparseLoopDevice": map[string]any{"size": "1Gi"}}
			start := time.Now()
			if _, err := p.c.Create(ctx, spec); err != nil {
				b.Fatalf("create as %s: %v", p.name, err)
			}
			p.ds = append(p.ds, time.Since(start))
		}
	}
	// The master's answer alone, as a cache miss pays it.
	var miss []time.Duration
	for range sized(20, 2) {
		start := time.Now()
		if _, err := salt.UserAccess(ctx, "alice", "file", []string{"node-1"}); err != nil {
			b.Fatal(err)
		}
		miss = append(miss, time.Since(start))
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	base := percentile(paths[0].ds, 0.99)
	metric(b, "authz_create_ms_p99_bootstrap", ms(base), "ms")
	metric(b, "authz_create_ms_p99_service_token", ms(percentile(paths[1].ds, 0.99)), "ms")
	metric(b, "authz_create_ms_p99_session", ms(percentile(paths[2].ds, 0.99)), "ms")
	metric(b, "authz_overhead_ms_p99", ms(max(percentile(paths[1].ds, 0.99), percentile(paths[2].ds, 0.99))-base), "ms")
	metric(b, "authz_acl_miss_ms_p50", ms(percentile(miss, 0.5)), "ms")
}
