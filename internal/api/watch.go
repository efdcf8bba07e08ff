package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	saltvolumes "github.com/salt-volumes/salt-volumes"
	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// watch streams volume changes as server-sent events: first every current
// volume as ADDED, then each change. ?node= and ?name= filter.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	if _, ok := w.(http.Flusher); !ok {
		writeErr(w, http.StatusInternalServerError, saltvolumes.Error{Code: saltvolumes.CodeInternal, Message: "streaming unsupported"})
		return
	}
	if n := s.watchers.Add(1); s.MaxWatchers > 0 && n > int64(s.MaxWatchers) {
		s.watchers.Add(-1)
		w.Header().Set("Retry-After", "5")
		writeErr(w, http.StatusServiceUnavailable, saltvolumes.Error{Code: saltvolumes.CodeLimit, Message: fmt.Sprintf("%d watch streams are open, the limit (limits.watchers): close some or raise the limit", s.MaxWatchers)})
		return
	}
	defer s.watchers.Add(-1)
	node, name := r.URL.Query().Get("node"), r.URL.Query().Get("name")
	match := func(v *volume.Volume) bool {
		return (node == "" || v.Spec.Node == node) && (name == "" || v.Spec.Name == name)
	}
	// A small buffer: an idle watcher costs its queue, and one that falls
	// behind is dropped and reconnects for the full list.
	ch, stop := s.Watch.Subscribe(256)
	defer stop()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// Every write gets a deadline: one that a client does not take in
	// time ends the stream (and frees its slot); the client reconnects
	// and gets the list again.
	rc := http.NewResponseController(w)
	deadline := func() error {
		err := rc.SetWriteDeadline(time.Now().Add(s.WatchWriteTimeout))
		if errors.Is(err, http.ErrNotSupported) {
			return nil // not a network connection (a test recorder)
		}
		return err
	}
	send := func(typ string, v *volume.Volume) error {
		b, err := json.Marshal(saltvolumes.Event{Type: typ, Volume: v.View()})
		if err != nil {
			return err
		}
		if err := deadline(); err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		return err
	}
	flush := func() error {
		if err := deadline(); err != nil {
			return err
		}
		return rc.Flush()
	}
	// The initial list one volume at a time: a copy of the whole store
	// per watcher would make watchers cost O(store) each.
	for _, n := range s.Store.Names() {
		v, err := s.Store.Get(n)
		if err != nil || !match(v) {
			continue
		}
		if send(saltvolumes.Added, v) != nil {
			return
		}
	}
	// Tells clients the initial list is complete (wait uses it).
	if deadline() != nil {
		return
	}
	if _, err := io.WriteString(w, "event: SYNCED\ndata: {}\n\n"); err != nil || flush() != nil {
		return
	}
	hb := time.NewTicker(s.Heartbeat)
	defer hb.Stop()
	check, _ := r.Context().Value(recheckKey{}).(func(context.Context) error)
	recheck := time.NewTicker(s.WatchRecheck)
	defer recheck.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-recheck.C:
			if check == nil {
				continue
			}
			if err := check(r.Context()); err != nil {
				// The stream's token was revoked, expired or logged out
				// (or its person lost their role): say so, and end.
				msg, _ := json.Marshal(map[string]string{"reason": "the credential that opened this stream is no longer valid: " + err.Error()})
				if deadline() == nil {
					_, _ = fmt.Fprintf(w, "event: CLOSED\ndata: %s\n\n", msg)
					_ = flush()
				}
				return
			}
		case <-hb.C:
			if deadline() != nil {
				return
			}
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil || flush() != nil {
				return
			}
		case ev, ok := <-ch:
			if !ok {
				return // fell behind: the client reconnects and gets the list again
			}
			if !match(ev.Volume) {
				continue
			}
			if send(ev.Type, ev.Volume) != nil || flush() != nil {
				return
			}
		}
	}
}
