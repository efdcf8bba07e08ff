package reconciler

import (
	"sync"
	"time"
)

// queue hands volume names to workers so that one volume is never worked on
// by two workers at once: a name added while it is being processed is queued
// again when its worker is done, and repeated adds coalesce.
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []string
	dirty      map[string]bool
	processing map[string]bool
	timers     map[string]*time.Timer
	closed     bool
}

func newQueue() *queue {
	q := &queue{dirty: map[string]bool{}, processing: map[string]bool{}, timers: map[string]*time.Timer{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *queue) add(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.dirty[name] {
		return
	}
	q.dirty[name] = true
	if q.processing[name] {
		return
	}
	q.items = append(q.items, name)
	q.cond.Signal()
}

// addAfter queues name after d; a later call replaces an earlier timer, so
// each volume has at most one wake-up pending.
func (q *queue) addAfter(name string, d time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if t, ok := q.timers[name]; ok {
		t.Stop()
	}
	q.timers[name] = time.AfterFunc(d, func() {
		q.mu.Lock()
		delete(q.timers, name)
		q.mu.Unlock()
		q.add(name)
	})
}

func (q *queue) get() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.items) == 0 {
		return "", false
	}
	name := q.items[0]
	q.items[0] = ""
	q.items = q.items[1:]
	q.processing[name] = true
	delete(q.dirty, name)
	return name, true
}

func (q *queue) done(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, name)
	if q.dirty[name] && !q.closed {
		q.items = append(q.items, name)
		q.cond.Signal()
	}
}

// idle reports whether nothing is queued or being processed.
func (q *queue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && len(q.processing) == 0
}

// reopen takes names again after close (a new term of leadership).
func (q *queue) reopen() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = false
	q.items, q.dirty, q.processing, q.timers = nil, map[string]bool{}, map[string]bool{}, map[string]*time.Timer{}
}

func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, t := range q.timers {
		t.Stop()
	}
	q.cond.Broadcast()
}
