package store

import "sync"

// Hub fans the store's changes out to the API's watch streams, on every
// replica: fed by the store's watch (Watch(hub.Publish)). A watcher that
// falls a whole buffer behind is dropped (its channel closed) rather than
// slowing the store's watch; it reconnects and gets the full list again.
type Hub struct {
	mu   sync.Mutex
	subs map[chan Event]struct{}
}

func NewHub() *Hub { return &Hub{subs: map[chan Event]struct{}{}} }

// Subscribe returns a channel of changes and a function to stop.
func (h *Hub) Subscribe(buffer int) (<-chan Event, func()) {
	ch := make(chan Event, buffer)
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
func (h *Hub) Publish(ev Event) {
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
