package events

import (
	"context"
	"errors"
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
	Decoded    atomic.Int64
	Skipped    atomic.Int64
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
}

// Run connects, decodes, and reconnects with backoff until ctx is done. It
// never writes to the socket.
func (b *Bus) Run(ctx context.Context, onConnect func(), handle func(Event)) error {
	if b.Stats == nil {
		b.Stats = &Stats{}
	}
	if b.Log == nil {
		b.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	minB, maxB := b.MinBackoff, b.MaxBackoff
	if minB == 0 {
		minB = 250 * time.Millisecond
	}
	if maxB == 0 {
		maxB = 5 * time.Second
	}
	backoff := minB
	first := true
	for ctx.Err() == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, b.Network, b.Addr)
		if err != nil {
			b.Log.Debug("event bus not reachable", "addr", b.Addr, "error", err)
			if !sleep(ctx, backoff) {
				break
			}
			backoff = min(backoff*2, maxB)
			continue
		}
		if !first {
			b.Stats.Reconnects.Add(1)
		}
		first = false
		backoff = minB
		b.Log.Info("event bus connected", "addr", b.Addr)
		if onConnect != nil {
			onConnect()
		}
		b.Stats.Connected.Store(true)
		err = b.read(ctx, conn, handle)
		b.Stats.Connected.Store(false)
		conn.Close()
		if ctx.Err() != nil {
			break
		}
		b.Log.Warn("event bus disconnected; reconnecting", "addr", b.Addr, "error", err)
		if !sleep(ctx, backoff) {
			break
		}
	}
	return ctx.Err()
}

func (b *Bus) read(ctx context.Context, conn net.Conn, handle func(Event)) error {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	dec := NewDecoder(conn)
	skipped := 0
	for {
		ev, err := dec.Next()
		if n := dec.Skipped - skipped; n > 0 {
			b.Stats.Skipped.Add(int64(n))
			skipped = dec.Skipped
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return err
		}
		b.Stats.Decoded.Add(1)
		handle(ev)
	}
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
