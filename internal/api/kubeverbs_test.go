package api

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	saltvolumes "github.com/salt-volumes/salt-volumes"

	"github.com/salt-volumes/salt-volumes/internal/access"
	"github.com/salt-volumes/salt-volumes/internal/kubeauth"
	"github.com/salt-volumes/salt-volumes/internal/snapshots"
	"github.com/salt-volumes/salt-volumes/internal/store"
)

// fakeKube is the API server's side: any token but "refused", "throttled"
// and "plain" is alice's; RBAC allows what allow says, and every
// question is kept.
type fakeKube struct {
	mu      sync.Mutex
	asked   []kubeauth.Attributes
	sources []string
	allow   func(kubeauth.Attributes) bool
}

func (f *fakeKube) Authenticate(_ context.Context, token, source string) (*access.Principal, error) {
	f.mu.Lock()
	f.sources = append(f.sources, source)
	f.mu.Unlock()
	switch token {
	case "refused":
		return nil, access.ErrUnauthenticated
	case "throttled":
		return nil, kubeauth.ErrThrottled
	case "plain":
		return nil, &kubeauth.RefusedError{Msg: "this Kubernetes token is not made for salt-volumes (audience salt-volumes): make one with kubectl create token SERVICEACCOUNT --audience salt-volumes"}
	}
	return &access.Principal{User: "k8s:alice", Kind: "kubernetes", Groups: []string{"dev"}}, nil
}

func (f *fakeKube) Allowed(_ context.Context, _ *access.Principal, a kubeauth.Attributes) (bool, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, a)
	return f.allow != nil && f.allow(a), "", nil
}

func (f *fakeKube) take() []kubeauth.Attributes {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.asked
	f.asked = nil
	return a
}

type attrs = kubeauth.Attributes

const (
	vols  = kubeauth.Resource
	snaps = kubeauth.SnapshotResource
)

// Every route asks RBAC for what it does, on the object it does it to:
// a snapshot taken is a create on the volume's snapshots subresource, a
// snapshot read or deleted is a get, list or delete of volumesnapshots by
// the snapshot's name, a watch (and its ticket) is a watch, a growth a
// patch, and what needs the role admin the verb admin. Every route of
// Handler has a row.
func TestKubernetesAttributesOfEveryRoute(t *testing.T) {
	kube := &fakeKube{}
	ts, _ := newServerWith(t, func(s *Server) { s.Kube = kube })
	rows := []struct {
		pattern, method, path, body string
		want                        attrs
	}{
		{"POST /api/v1/volumes", "POST", "/api/v1/volumes", `{"name":"v1","node":"node-1","sparseLoopDevice":{"size":"16Mi"}}`, attrs{Verb: "create", Resource: vols}},
		{"GET /api/v1/volumes", "GET", "/api/v1/volumes", "", attrs{Verb: "list", Resource: vols}},
		{"GET /api/v1/volumes/{name}", "GET", "/api/v1/volumes/v1", "", attrs{Verb: "get", Resource: vols, Name: "v1"}},
		{"GET /api/v1/volumes/{name}/usage", "GET", "/api/v1/volumes/v1/usage", "", attrs{Verb: "get", Resource: vols, Name: "v1"}},
		{"GET /api/v1/volumes/{name}/jobs", "GET", "/api/v1/volumes/v1/jobs", "", attrs{Verb: "get", Resource: vols, Name: "v1"}},
		{"GET /api/v1/volumes/{name}/history", "GET", "/api/v1/volumes/v1/history", "", attrs{Verb: "get", Resource: vols, Name: "v1"}},
		{"DELETE /api/v1/volumes/{name}", "DELETE", "/api/v1/volumes/v1", "", attrs{Verb: "delete", Resource: vols, Name: "v1"}},
		{"POST /api/v1/volumes/{name}/resize", "POST", "/api/v1/volumes/v1/resize", `{"size":"32Mi"}`, attrs{Verb: "patch", Resource: vols, Name: "v1"}},
		{"POST /api/v1/volumes/{name}/snapshots", "POST", "/api/v1/volumes/v1/snapshots", `{"name":"s1"}`, attrs{Verb: "create", Resource: vols, Subresource: "snapshots", Name: "v1"}},
		{"GET /api/v1/volumes/{name}/snapshots", "GET", "/api/v1/volumes/v1/snapshots", "", attrs{Verb: "list", Resource: snaps}},
		{"GET /api/v1/snapshots", "GET", "/api/v1/snapshots", "", attrs{Verb: "list", Resource: snaps}},
		{"GET /api/v1/snapshots/{name}", "GET", "/api/v1/snapshots/s1", "", attrs{Verb: "get", Resource: snaps, Name: "s1"}},
		{"DELETE /api/v1/snapshots/{name}", "DELETE", "/api/v1/snapshots/s1", "", attrs{Verb: "delete", Resource: snaps, Name: "s1"}},
		{"POST /api/v1/snapshots/{name}/restore", "POST", "/api/v1/snapshots/s1/restore", "", attrs{Verb: "get", Resource: snaps, Name: "s1"}},
		{"PUT /api/v1/volumes/{name}/snapshot-schedule", "PUT", "/api/v1/volumes/v1/snapshot-schedule", `{"every":"1h","keep":2}`, attrs{Verb: "create", Resource: vols, Subresource: "snapshots", Name: "v1"}},
		{"DELETE /api/v1/volumes/{name}/snapshot-schedule", "DELETE", "/api/v1/volumes/v1/snapshot-schedule", "", attrs{Verb: "create", Resource: vols, Subresource: "snapshots", Name: "v1"}},
		{"GET /api/v1/snapshot-schedules", "GET", "/api/v1/snapshot-schedules", "", attrs{Verb: "list", Resource: snaps}},
		{"GET /api/v1/watch", "GET", "/api/v1/watch", "", attrs{Verb: "watch", Resource: vols}},
		{"POST /api/v1/watch/ticket", "POST", "/api/v1/watch/ticket", "", attrs{Verb: "watch", Resource: vols}},
		{"GET /api/v1/nodes", "GET", "/api/v1/nodes", "", attrs{Verb: "list", Resource: vols}},
		{"POST /api/v1/nodes/{node}/forget", "POST", "/api/v1/nodes/node-1/forget", "", attrs{Verb: "admin", Resource: vols}},
		{"GET /metrics", "GET", "/metrics", "", attrs{Verb: "list", Resource: vols}},
		{"GET /api/v1/whoami", "GET", "/api/v1/whoami", "", attrs{Verb: "list", Resource: vols}},
		{"GET /api/v1/info", "GET", "/api/v1/info", "", attrs{Verb: "list", Resource: vols}},
		{"POST /api/v1/logout", "POST", "/api/v1/logout", "", attrs{Verb: "list", Resource: vols}},
		{"GET /api/v1/tokens", "GET", "/api/v1/tokens", "", attrs{Verb: "admin", Resource: vols}},
		{"POST /api/v1/tokens", "POST", "/api/v1/tokens", `{"name":"t","role":"viewer"}`, attrs{Verb: "admin", Resource: vols}},
		{"DELETE /api/v1/tokens/{name}", "DELETE", "/api/v1/tokens/t", "", attrs{Verb: "admin", Resource: vols}},
		{"GET /api/v1/audit", "GET", "/api/v1/audit", "", attrs{Verb: "admin", Resource: vols}},
		{"/api/", "GET", "/api/v1/nothing", "", attrs{Verb: "list", Resource: vols}},
	}
	covered := map[string]bool{"GET /healthz": true, "GET /readyz": true, "POST /api/v1/login": true, "/": true}
	for _, row := range rows {
		covered[row.pattern] = true
		kube.take()
		code, m := do(t, ts, row.method, row.path, "a-kubernetes-token", row.body)
		require.Equal(t, http.StatusForbidden, code, "%s: %v", row.pattern, m)
		assert.Equal(t, []attrs{row.want}, kube.take(), row.pattern)
		assert.Contains(t, errField(m, "message"), "k8s:alice may not "+row.want.Verb+" "+row.want.Target()+": Kubernetes RBAC does not allow it", row.pattern)
	}
	for p := range kubeRoutes {
		assert.True(t, covered[p], "kubeRoutes has %q, the table not", p)
	}
	// Every route Handler registers (read from api.go) has its row.
	src, err := os.ReadFile("api.go")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`mux\.Handle(?:Func)?\("([^"]+)"`).FindAllStringSubmatch(string(src), -1) {
		assert.True(t, covered[m[1]], "route %q has no row: say what it asks of RBAC", m[1])
	}
}

// A read-only identity (get, list and watch on volumes and
// volumesnapshots, as deploy/kubernetes' salt-volumes-viewer) reads and
// watches, and takes, deletes or changes nothing.
func TestKubernetesViewerTakesNoSnapshot(t *testing.T) {
	kube := &fakeKube{allow: func(a kubeauth.Attributes) bool {
		return a.Subresource == "" && (a.Resource == vols || a.Resource == snaps) &&
			(a.Verb == "get" || a.Verb == "list" || a.Verb == "watch")
	}}
	ts, st := newServerWith(t, func(s *Server) {
		s.Kube = kube
		s.Snapshots = &snapshots.Service{Records: s.Store.(*store.Bolt)}
	})
	code, m := do(t, ts, "POST", "/api/v1/watch/ticket", "viewer", "")
	assert.Equal(t, http.StatusOK, code, m)
	code, m = do(t, ts, "GET", "/api/v1/volumes", "viewer", "")
	assert.Equal(t, http.StatusOK, code, m)
	for _, c := range []struct{ method, path, body, msg string }{
		{"POST", "/api/v1/volumes/v1/snapshots", `{"name":"s1"}`, "may not create volumes.salt-volumes.io/snapshots v1"},
		{"DELETE", "/api/v1/snapshots/s1", "", "may not delete volumesnapshots.salt-volumes.io s1"},
		{"POST", "/api/v1/volumes/v1/resize", `{"size":"1Gi"}`, "may not patch volumes.salt-volumes.io v1"},
		{"DELETE", "/api/v1/volumes/v1", "", "may not delete volumes.salt-volumes.io v1"},
		{"POST", "/api/v1/volumes", `{"name":"v2","node":"node-1","sparseLoopDevice":{"size":"16Mi"}}`, "may not create volumes.salt-volumes.io"},
	} {
		code, m := do(t, ts, c.method, c.path, "viewer", c.body)
		assert.Equal(t, http.StatusForbidden, code, c.path)
		assert.Contains(t, errField(m, "message"), c.msg)
	}

	// A restore asks get on the snapshot, then delete on its volume: it
	// loses what a deletion loses.
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "s1",
		[]byte(`{"name":"s1","volume":"v1","volumeUUID":"u","node":"node-1","phase":"Ready"}`)))
	kube.take()
	code, m = do(t, ts, "POST", "/api/v1/snapshots/s1/restore", "viewer", "")
	assert.Equal(t, http.StatusForbidden, code, m)
	assert.Contains(t, errField(m, "message"), "may not delete volumes.salt-volumes.io v1")
	assert.Equal(t, []attrs{{Verb: "get", Resource: snaps, Name: "s1"}, {Verb: "delete", Resource: vols, Name: "v1"}}, kube.take())

	// A wipe asks admin on the volume once delete is granted.
	kube.allow = func(a kubeauth.Attributes) bool { return a.Verb == "delete" }
	kube.take()
	code, m = do(t, ts, "DELETE", "/api/v1/volumes/v1?wipe=true", "viewer", "")
	assert.Equal(t, http.StatusForbidden, code, m)
	assert.Equal(t, []attrs{{Verb: "delete", Resource: vols, Name: "v1"}, {Verb: "admin", Resource: vols, Name: "v1"}}, kube.take())
}

// The client's address reaches the reviewer; a token it would not review
// (too many new ones from that address) is a 429 that made no review; one
// not made for serve's audience a 401 saying how to make one.
func TestKubernetesTokenRefusals(t *testing.T) {
	kube := &fakeKube{}
	ts, _ := newServerWith(t, func(s *Server) { s.Kube = kube })
	code, _ := do(t, ts, "GET", "/api/v1/volumes", "refused", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Equal(t, []string{"127.0.0.1"}, kube.sources)

	req, err := http.NewRequest("GET", ts.URL+"/api/v1/volumes", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer throttled")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	code, m := do(t, ts, "GET", "/api/v1/volumes", "plain", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, errField(m, "message"), "kubectl create token SERVICEACCOUNT --audience salt-volumes")

	// Our own tokens never reach the reviewer.
	kube.sources = nil
	code, _ = do(t, ts, "GET", "/api/v1/volumes", "svt_nothing", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Empty(t, kube.sources)
}

// A Kubernetes identity restoring a volume a claim holds is asked for
// admin on that volume, not on the snapshot's name the route carries: an
// RBAC rule on volumes of that name must decide (#48's last review).
func TestKubernetesRestoreOfAHeldVolumeAsksAdminOnTheVolume(t *testing.T) {
	kube := &fakeKube{allow: func(a kubeauth.Attributes) bool { return a.Verb != "admin" }}
	var st *store.Bolt
	ts, _ := newServerWith(t, func(s *Server) {
		s.Kube = kube
		st = s.Store.(*store.Bolt)
		s.Snapshots = &snapshots.Service{Records: st}
	})
	v := available(t, st, `{"name":"claimed","node":"node-1","sparseLoopDevice":{"size":"1Gi"}}`)
	v.Status.PersistentVolume = &saltvolumes.PersistentVolume{Name: "pv-claimed", Phase: "Bound", Claim: "tenant/db"}
	require.NoError(t, st.Update(context.Background(), v))
	rec, err := json.Marshal(map[string]any{"name": "nightly", "volume": "claimed", "volumeUUID": v.Spec.UUID, "node": "node-1",
		"phase": snapshots.Ready, "createdAt": time.Now(), "spec": v.Spec})
	require.NoError(t, err)
	require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "nightly", rec))
	kube.take()

	code, m := do(t, ts, "POST", "/api/v1/snapshots/nightly/restore", "viewer", "")
	assert.Equal(t, http.StatusForbidden, code, m)
	assert.Equal(t, []attrs{
		{Verb: "get", Resource: snaps, Name: "nightly"},
		{Verb: "delete", Resource: vols, Name: "claimed"},
		{Verb: "admin", Resource: vols, Name: "claimed"},
	}, kube.take())
	got, err := st.GetRecord(context.Background(), snapshots.Kind, "nightly")
	require.NoError(t, err)
	assert.NotContains(t, string(got), snapshots.Restoring, "nothing was asked of the node")
}

// A thick LVM snapshot's restore uses it up (it merges into its volume):
// a Kubernetes identity is asked delete on the snapshot too, as its
// deletion asks; a thin one's restore keeps it and asks no more.
func TestKubernetesRestoreOfAThickLVMSnapshotAsksDeleteOnIt(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		want         []attrs
	}{
		{"thick: delete on the snapshot too", "lvm-thick", []attrs{
			{Verb: "get", Resource: snaps, Name: "nightly"},
			{Verb: "delete", Resource: vols, Name: "data"},
			{Verb: "delete", Resource: snaps, Name: "nightly"},
		}},
		{"thin: kept, not asked", "lvm-thin", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Everything but deleting snapshots.
			kube := &fakeKube{allow: func(a kubeauth.Attributes) bool { return !(a.Verb == "delete" && a.Resource == snaps) }}
			var st *store.Bolt
			ts, _ := newServerWith(t, func(s *Server) {
				s.Kube = kube
				st = s.Store.(*store.Bolt)
				s.Snapshots = &snapshots.Service{Records: st}
			})
			v := available(t, st, `{"name":"data","node":"node-1","lvmLogicalVolume":{"vgName":"vg0","size":"1Gi"}}`)
			rec, err := json.Marshal(map[string]any{"name": "nightly", "volume": "data", "volumeUUID": v.Spec.UUID, "node": "node-1",
				"phase": snapshots.Ready, "createdAt": time.Now(), "spec": v.Spec, "method": tc.method, "lv": "vg0/svsnap-x-nightly"})
			require.NoError(t, err)
			require.NoError(t, st.PutRecord(context.Background(), snapshots.Kind, "nightly", rec))
			kube.take()
			code, m := do(t, ts, "POST", "/api/v1/snapshots/nightly/restore", "viewer", "")
			if tc.want == nil {
				assert.NotEqual(t, http.StatusForbidden, code, m)
				for _, a := range kube.take() {
					assert.False(t, a.Verb == "delete" && a.Resource == snaps, "asked %v", a)
				}
				return
			}
			assert.Equal(t, http.StatusForbidden, code, m)
			assert.Contains(t, errField(m, "message"), "may not delete volumesnapshots.salt-volumes.io nightly")
			assert.Equal(t, tc.want, kube.take())
			got, err := st.GetRecord(context.Background(), snapshots.Kind, "nightly")
			require.NoError(t, err)
			assert.NotContains(t, string(got), snapshots.Restoring, "nothing was asked of the node")
		})
	}
}
