package reconciler

import (
	"sync"

	"github.com/salt-volumes/salt-volumes/internal/volume"
)

// Watch event types.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
)

// WatchEvent is one change of one volume.
type WatchEvent struct {
	Type   string         `json:"type"`
	Volume *volume.Volume `json:"volume"`
}

// Hub fans volume changes out to watchers. A watcher that falls a whole
// buffer behind is dropped (its channel closed) rather than slowing the
// reconciler; it reconnects and gets the full list again.
type Hub struct {
	mu   sync.Mutex
	subs map[chan WatchEvent]struct{}
}

func NewHub() *Hub { return &Hub{subs: map[chan WatchEvent]struct{}{}} }

// Subscribe returns a channel of changes and a function to stop.
func (h *Hub) Subscribe(buffer int) (<-chan WatchEvent, func()) {
	ch := make(chan WatchEvent, buffer)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// Publish sends a change to every watcher.
func (h *Hub) Publish(typ string, v *volume.Volume) {
	ev := WatchEvent{Type: typ, Volume: v}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- ev:
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// Watchers is the number of subscribers.
func (h *Hub) Watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}
