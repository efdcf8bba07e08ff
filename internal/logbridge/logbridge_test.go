package logbridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"k8s.io/klog/v2"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "not a JSON line: %s", line)
		out = append(out, m)
	}
	return out
}

// The etcd client's zap logs come out as serve's JSON lines, with their
// fields, at serve's level.
func TestZapLinesAreServesLines(t *testing.T) {
	var buf lockedBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "etcd-client")
	z := Zap(log)
	z.Debug("not shown")
	z.With(zap.String("endpoint", "https://127.0.0.1:2379")).Warn("retrying of unary invoker failed",
		zap.Error(errors.New("context deadline exceeded")), zap.Duration("after", 2*time.Second), zap.Int("attempt", 3))
	lines := buf.lines(t)
	require.Len(t, lines, 1, "debug is below serve's level")
	l := lines[0]
	assert.Equal(t, "WARN", l["level"])
	assert.Equal(t, "retrying of unary invoker failed", l["msg"])
	assert.Equal(t, "etcd-client", l["component"])
	assert.Equal(t, "https://127.0.0.1:2379", l["endpoint"])
	assert.Equal(t, "context deadline exceeded", l["error"])
	assert.EqualValues(t, 3, l["attempt"])
}

// client-go's klog lines too, as component client-go.
func TestKlogLinesAreServesLines(t *testing.T) {
	var buf lockedBuffer
	Klog(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(func() { klog.ClearLogger() })
	klog.InfoS("caches populated", "type", "*v1.PersistentVolume")
	klog.Flush()
	lines := buf.lines(t)
	require.NotEmpty(t, lines)
	l := lines[len(lines)-1]
	assert.Equal(t, "caches populated", l["msg"])
	assert.Equal(t, "client-go", l["component"])
	assert.Equal(t, "*v1.PersistentVolume", l["type"])
}
