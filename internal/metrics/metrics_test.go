package metrics

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// A label value is written as the text exposition format defines it:
// only \\, \" and \n escaped, nothing else a strict parser (expfmt)
// refuses: no other escape, no control character, valid UTF-8. Not in
// go.mod, expfmt is stood in for by the format's grammar.
func TestLabelValuesAsTheTextFormatDefines(t *testing.T) {
	in := []string{"plain", "tab\there", "bell\x01\x7f\u0085", `back\slash`, `qu"ote`, "new\nline", "bad\xffutf8", "é中", `\t`}
	want := []string{"plain", "tabhere", "bell", `back\slash`, `qu"ote`, "new\nline", "bad\uFFFDutf8", "é中", `\t`}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	var samples []Sample
	gauges := map[string]float64{}
	counters := map[string]int64{}
	for _, v := range in {
		samples = append(samples, Sample{Labels: []string{"a", v, "b", v}, Value: 1})
		gauges[v], counters[v] = 1, 1
	}
	w.GaugeVec("g_vec", "help", samples)
	w.Gauge("g", "help", "l", gauges)
	w.CounterVec("c", "help", "l", counters)
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !utf8.ValidString(out) {
		t.Fatalf("not UTF-8: %q", out)
	}
	value := `"((?:[^"\\\n\x00-\x1f\x7f]|\\[\\"n])*)"`
	line := regexp.MustCompile(`^[a-z_]+\{[a-z]+=` + value + `(?:,[a-z]+=` + value + `)*\} [0-9]+$`)
	one := regexp.MustCompile(`[a-z]+=` + value)
	unescape := strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\n`, "\n")
	got := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if !line.MatchString(l) {
			t.Errorf("not a sample line of the text format: %q", l)
			continue
		}
		for _, m := range one.FindAllStringSubmatch(l, -1) {
			got[unescape.Replace(m[1])]++
		}
	}
	for _, v := range want {
		if got[v] != 4 {
			t.Errorf("label value %q read back %d times, want 4 (%v)", v, got[v], got)
		}
	}
}
