package events

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"time"
)

// Source delivers events until its context ends. OnConnect runs each time
// the source (re)connects: events fired while disconnected are lost, so the
// caller reconciles from another source of truth (the job cache) there.
type Source interface {
	Run(ctx context.Context, onConnect func(), handle func(Event)) error
}

// Stats are counters a caller can export as metrics.
type Stats struct {
	Decoded atomic.Int64
	Skipped atomic.Int64
	// Ignored counts events passed over undecoded: not ours (Relevant).
	Ignored    atomic.Int64
	Reconnects atomic.Int64
	// Connected is true while the source is connected.
	Connected atomic.Bool
}

// Bus reads the master event bus over a Unix socket (ipc_mode: ipc, the
// default) or TCP (ipc_mode: tcp, 127.0.0.1:4512).
type Bus struct {
	Network string // "unix" or "tcp"
	Addr    string
	Log     *slog.Logger
	Stats   *Stats
	// MinBackoff and MaxBackoff bound the reconnect delay.
	MinBackoff, MaxBackoff time.Duration
	// Want and Lazy are the decoder's (serve: Relevant, true); zero values
	// decode every event whole.
	Want Want
	Lazy bool
}

// Run connects, decodes, and reconnects with backoff until ctx is done. It
// never writes to the socket.
func (b *Bus) Run(ctx context.Context, onConnect func(), handle func(Event)) error {
	l := &loop{what: "event bus " + b.Addr, stats: b.Stats, log: b.Log, minB: b.MinBackoff, maxB: b.MaxBackoff}
	b.Stats = l.init()
	return l.run(ctx, onConnect,
		func(ctx context.Context) (io.ReadCloser, error) {
			var d net.Dialer
			return d.DialContext(ctx, b.Network, b.Addr)
		},
		func(r io.Reader) error { return b.read(r, handle, l.log) })
}

func (b *Bus) read(r io.Reader, handle func(Event), log *slog.Logger) error {
	dec := NewDecoder(r)
	dec.Want, dec.Lazy = b.Want, b.Lazy
	skipped, ignored := 0, 0
	logged := false
	for {
		ev, err := dec.Next()
		if n := dec.Skipped - skipped; n > 0 {
			b.Stats.Skipped.Add(int64(n))
			skipped = dec.Skipped
		}
		if n := dec.Ignored - ignored; n > 0 {
			b.Stats.Ignored.Add(int64(n))
			ignored = dec.Ignored
		}
		if err != nil {
			return err
		}
		if !logged {
			// Once per connection: which Salt answered shows here first.
			logged = true
			log.Info("event bus framing", "framing", dec.Framing().String(), "addr", b.Addr)
		}
		b.Stats.Decoded.Add(1)
		handle(ev)
	}
}

// loop is the connect / read / reconnect-with-backoff cycle both sources
// share, so their reconnect behaviour and counters cannot drift apart.
type loop struct {
	what       string
	stats      *Stats
	log        *slog.Logger
	minB, maxB time.Duration
}

func (l *loop) init() *Stats {
	if l.stats == nil {
		l.stats = &Stats{}
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.minB == 0 {
		l.minB = 250 * time.Millisecond
	}
	if l.maxB == 0 {
		l.maxB = 5 * time.Second
	}
	return l.stats
}

// run opens a stream, reads it until it breaks, and opens it again, calling
// onConnect on every (re)connect: events fired in between are lost, so the
// caller catches up from another source of truth there.
func (l *loop) run(ctx context.Context, onConnect func(), open func(context.Context) (io.ReadCloser, error), read func(io.Reader) error) error {
	backoff := l.minB
	first := true
	for ctx.Err() == nil {
		rc, err := open(ctx)
		if err != nil {
			l.log.Debug("not reachable", "source", l.what, "error", err)
			if !sleep(ctx, backoff) {
				break
			}
			backoff = min(backoff*2, l.maxB)
			continue
		}
		if !first {
			l.stats.Reconnects.Add(1)
		}
		first, backoff = false, l.minB
		l.log.Info("connected", "source", l.what)
		if onConnect != nil {
			onConnect()
		}
		stop := context.AfterFunc(ctx, func() { rc.Close() })
		l.stats.Connected.Store(true)
		err = read(rc)
		l.stats.Connected.Store(false)
		stop()
		rc.Close()
		if ctx.Err() != nil {
			break
		}
		l.log.Warn("disconnected; reconnecting", "source", l.what, "error", err)
		if !sleep(ctx, backoff) {
			break
		}
	}
	return ctx.Err()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
