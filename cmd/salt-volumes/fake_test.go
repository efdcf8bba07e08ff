package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/spec"
)

// fakeAPI is a salt-volumes API for the CLI's tests: a handler per
// "METHOD /path", every request kept as "METHOD /path?query
// Authorization".
type fakeAPI struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []string
}

func newFakeAPI(t *testing.T, routes map[string]http.HandlerFunc) *fakeAPI {
	t.Helper()
	a := &fakeAPI{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.reqs = append(a.reqs, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization")))
		a.mu.Unlock()
		if h, ok := routes[r.Method+" "+r.URL.Path]; ok {
			h(w, r)
			return
		}
		// "METHOD /path/*": every path under it.
		for k, h := range routes {
			if p, ok := strings.CutSuffix(k, "*"); ok && strings.HasPrefix(r.Method+" "+r.URL.Path, p) {
				h(w, r)
				return
			}
		}
		replyErr(http.StatusNotFound, "not_found", r.Method+" "+r.URL.Path+" is not an API endpoint", "")(w, r)
	}))
	t.Cleanup(a.Close)
	return a
}

// lose runs h, then closes the connection without its answer: a request
// the server acted on whose answer was lost.
func lose(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h != nil {
			h(httptest.NewRecorder(), r)
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		_ = conn.Close()
	}
}

func (a *fakeAPI) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.reqs...)
}

func reply(status int, v any) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
}

func replyErr(status int, code, msg, retryAfter string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		reply(status, map[string]any{"error": saltvolumes.Error{Code: code, Message: msg}})(w, r)
	}
}

// stream answers a watch: events (a "SYNCED" one as it is), then, with
// hold, nothing more until the client goes; without, the end of the
// stream.
func stream(hold bool, events ...saltvolumes.Event) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			data := []byte("{}")
			if ev.Type != "SYNCED" {
				data, _ = json.Marshal(ev)
			}
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Type, data)
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
		if hold {
			<-r.Context().Done()
		}
	}
}

func ev(typ string, v saltvolumes.View) saltvolumes.Event {
	return saltvolumes.Event{Type: typ, Volume: v}
}

var synced = saltvolumes.Event{Type: "SYNCED"}

// vol is a sparse volume of node-1 in phase, at step.
func vol(name string, phase saltvolumes.Phase, step string) saltvolumes.View {
	v := saltvolumes.View{Spec: spec.Spec{Name: name, UUID: "3f2504e0-4f89-41d3-9a0c-0305e82c3301", Node: "node-1", Mode: spec.ModeFilesystem,
		SparseLoopDevice: &spec.SparseLoopDevice{Size: "1Gi"}}, CreatedAt: time.Now()}
	v.Status.Phase, v.Status.Step = phase, step
	return v
}

// sv runs the CLI with args: stdout, stderr, exit code.
func sv(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return svIn(t, "", args...)
}

// svIn is sv with stdin.
func svIn(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errw bytes.Buffer
	code := runIO(args, strings.NewReader(stdin), &out, &errw)
	return out.String(), errw.String(), code
}

// at is the connection flags of a server, with token "t".
func at(a *fakeAPI, args ...string) []string {
	return append(args, "--url", a.URL, "--token", "t")
}
