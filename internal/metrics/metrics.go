// Package metrics writes counters, gauges and histograms in Prometheus's
// text exposition format. A few dozen lines of ours instead of the client
// library and its dependency tree: the control plane exports a handful.
package metrics

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Counter only goes up.
type Counter struct{ v atomic.Int64 }

func (c *Counter) Inc()         { c.v.Add(1) }
func (c *Counter) Add(n int64)  { c.v.Add(n) }
func (c *Counter) Value() int64 { return c.v.Load() }

// Histogram counts observations in fixed buckets (seconds).
type Histogram struct {
	mu      sync.Mutex
	Buckets []float64
	counts  []int64
	sum     float64
	n       int64
}

// NewHistogram uses the given upper bounds, ascending.
func NewHistogram(buckets ...float64) *Histogram {
	return &Histogram{Buckets: buckets, counts: make([]int64, len(buckets))}
}

func (h *Histogram) Observe(v float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range h.Buckets {
		if v <= b {
			h.counts[i]++
		}
	}
	h.sum += v
	h.n++
}

// Count is the number of observations.
func (h *Histogram) Count() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Writer accumulates one exposition.
type Writer struct {
	w   io.Writer
	err error
}

func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

func (w *Writer) printf(format string, a ...any) {
	if w.err == nil {
		_, w.err = fmt.Fprintf(w.w, format, a...)
	}
}

// Counter writes one counter.
func (w *Writer) Counter(name, help string, v int64) {
	w.printf("# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
}

// CounterVec writes a counter with one sample per label value.
func (w *Writer) CounterVec(name, help, label string, values map[string]int64) {
	w.printf("# HELP %s %s\n# TYPE %s counter\n", name, help, name)
	for _, k := range sortedKeys(values) {
		w.printf("%s{%s=%s} %d\n", name, label, quote(k), values[k])
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Gauge writes a gauge, one sample per label value (label may be empty).
func (w *Writer) Gauge(name, help, label string, values map[string]float64) {
	w.printf("# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
	for _, k := range sortedKeys(values) {
		if label == "" {
			w.printf("%s %s\n", name, num(values[k]))
		} else {
			w.printf("%s{%s=%s} %s\n", name, label, quote(k), num(values[k]))
		}
	}
}

// Sample is one labelled value of a GaugeVec: Labels holds name, value
// pairs.
type Sample struct {
	Labels []string
	Value  float64
}

// GaugeVec writes a gauge whose samples carry several labels.
func (w *Writer) GaugeVec(name, help string, samples []Sample) {
	w.printf("# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
	for _, s := range samples {
		var b strings.Builder
		for i := 0; i+1 < len(s.Labels); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%s", s.Labels[i], quote(s.Labels[i+1]))
		}
		w.printf("%s{%s} %s\n", name, b.String(), num(s.Value))
	}
}

// Histogram writes a histogram.
func (w *Writer) Histogram(name, help string, h *Histogram) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.printf("# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for i, b := range h.Buckets {
		w.printf("%s_bucket{le=%q} %d\n", name, num(b), h.counts[i])
	}
	w.printf("%s_bucket{le=\"+Inf\"} %d\n%s_sum %s\n%s_count %d\n", name, h.n, name, num(h.sum), name, h.n)
}

// Err is the first write error.
func (w *Writer) Err() error { return w.err }

func num(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// quote writes a label value as the text exposition format reads it:
// quoted, with only the escapes it defines (\\, \" and \n), other
// control characters dropped and invalid UTF-8 replaced, so that strict
// parsers (prometheus/common's expfmt: promtool, relays) take the whole
// scrape whatever a label carries (a node's report names some).
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == '"':
			b.WriteString(`\"`)
		case r == '\n':
			b.WriteString(`\n`)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
