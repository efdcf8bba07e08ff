package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	yaml "go.yaml.in/yaml/v3"
)

// format is -o, table when not given.
func (c *cli) format() string {
	if c.output == "" {
		return fmtTable
	}
	return c.output
}

// list is how JSON and YAML print a list, whatever its length: one shape
// for scripts, as the API's.
type list[T any] struct {
	Items []T `json:"items"`
}

func listOf[T any](items []T) list[T] {
	if items == nil {
		items = []T{}
	}
	return list[T]{Items: items}
}

// emit prints what a command answers in the -o format: v as JSON or YAML
// (a list as listOf), its names (kind/name), or the table for people.
func (c *cli) emit(v any, names []string, table func(wide bool) error) error {
	switch c.format() {
	case fmtJSON:
		return c.json(v)
	case fmtYAML:
		return c.yaml(v)
	case fmtName:
		return c.names(names)
	case fmtWide:
		return table(true)
	}
	return table(false)
}

// names prints kind/name, one a line, for xargs and the like: a name the
// API could not have made (a newline in it would make two arguments, an
// escape sequence a terminal's command) is left out, said on stderr
// quoted, and the command fails once the others are printed.
func (c *cli) names(names []string) error {
	var bad []string
	for _, n := range names {
		if !validKindName(n) {
			bad = append(bad, strconv.QuoteToASCII(n))
			continue
		}
		if _, err := fmt.Fprintln(c.out, n); err != nil {
			return err
		}
	}
	if len(bad) > 0 {
		return failf(exitFailed, "left out %d name(s) the server answered that are not names of their kind: %s", len(bad), strings.Join(bad, ", "))
	}
	return nil
}

// human: the format is one for people (table or wide), where messages
// that are not objects go to stdout as before; other formats keep stdout
// for the objects.
func (c *cli) human() bool { f := c.format(); return f == fmtTable || f == fmtWide }

// say prints a message (cleaned): on stdout for people, on stderr when
// stdout holds objects for a program.
func (c *cli) say(format string, a ...any) {
	w := c.out
	if !c.human() {
		w = c.errw
	}
	fmt.Fprint(w, clean(fmt.Sprintf(format, a...)))
}

func (c *cli) json(v any) error {
	b, err := jsonBytes(v, "  ")
	if err != nil {
		return err
	}
	_, err = c.out.Write(b)
	return err
}

// jsonBytes is v as JSON (indented by indent, or one line), a line, with
// what a terminal would act on or that reorders text escaped as \uXXXX
// where encoding/json leaves it raw: DEL, the C1 controls, the
// bidirectional formatting characters. They are only ever in strings,
// where the escape reads back as the same character.
func jsonBytes(v any, indent string) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", indent)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return escapeInvisible(buf.Bytes()), nil
}

// escapeInvisible writes each rune unsafeRune refuses, in JSON or in
// YAML whose strings holding one are double-quoted, as \uXXXX: a valid
// escape in a JSON string and a YAML double-quoted scalar alike.
func escapeInvisible(b []byte) []byte {
	if !bytes.ContainsFunc(b, unsafeRune) {
		return b
	}
	var out bytes.Buffer
	for _, r := range string(b) {
		if unsafeRune(r) {
			fmt.Fprintf(&out, "\\u%04X", r)
			continue
		}
		out.WriteRune(r)
	}
	return out.Bytes()
}

// unsafeRune: a character JSON and YAML must not print raw (encoding/json
// escapes the C0 controls itself): DEL and the C1 controls, which a
// terminal may act on, those that reorder text, and the noncharacters
// U+FFFE and U+FFFF, which a YAML stream may not hold.
func unsafeRune(r rune) bool {
	return r == 0x7F || (r >= 0x80 && r <= 0x9F) || isBidi(r) || r == 0xFFFE || r == 0xFFFF
}

// yaml prints v as YAML through its JSON form: the same field names, the
// same "Unknown" phase, as kubectl does.
func (c *cli) yaml(v any) error {
	b, err := yamlBytes(v)
	if err != nil {
		return fmt.Errorf("rendering YAML: %w", err)
	}
	_, err = c.out.Write(b)
	return err
}

// yamlBytes is v as YAML through its JSON form, keys sorted, as
// sigs.k8s.io/yaml writes it; a string holding a character unsafeRune
// refuses is written double-quoted with it escaped (a plain or
// single-quoted scalar has no escapes).
func yamlBytes(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	// JSON is YAML, once what a YAML stream may not hold raw is escaped.
	if err := yaml.Unmarshal(escapeInvisible(j), &doc); err != nil {
		return nil, err
	}
	restyle(&doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return escapeInvisible(buf.Bytes()), nil
}

// restyle makes a node read from JSON print as block YAML: keys sorted,
// no flow style, strings plain (the encoder quotes those that need it)
// but those with a character to escape, double-quoted.
func restyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.ContainsFunc(n.Value, unsafeRune) {
		n.Style = yaml.DoubleQuotedStyle
	}
	if n.Kind == yaml.MappingNode {
		type pair struct{ k, v *yaml.Node }
		pairs := make([]pair, 0, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			pairs = append(pairs, pair{n.Content[i], n.Content[i+1]})
		}
		slices.SortStableFunc(pairs, func(a, b pair) int { return strings.Compare(a.k.Value, b.k.Value) })
		for i, p := range pairs {
			n.Content[2*i], n.Content[2*i+1] = p.k, p.v
		}
	}
	for _, c := range n.Content {
		restyle(c)
	}
}

// table is a tabwriter whose cells are cleaned of control characters:
// what the server says (a node's message, a label) may come from a
// hostile minion, and must not move a terminal's cursor or fake lines.
type table struct {
	tw *tabwriter.Writer
}

// newTable starts a table with its heading line, unless --no-headers.
func (c *cli) newTable(head ...string) *table {
	t := &table{tw: tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)}
	if !c.noHeaders {
		fmt.Fprintln(t.tw, strings.Join(head, "\t"))
	}
	return t
}

func (t *table) row(cells ...string) {
	for i, s := range cells {
		cells[i] = cleanCell(s)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// clean drops control characters (but newlines) and the invisible ones
// that reorder text, from text a terminal shows: what every piece of the
// server's text goes through before it is printed for people (tables,
// messages, errors), cleanCell for one line of it.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\n':
			return r
		case r == '\t':
			return ' '
		case unicode.IsControl(r), isBidi(r):
			return -1
		}
		return r
	}, s)
}

// cleanCell is clean for one cell of a table, or one line: newlines
// become spaces.
func cleanCell(s string) string {
	return strings.ReplaceAll(clean(s), "\n", " ")
}

// isBidi: the bidirectional formatting characters (Trojan Source).
func isBidi(r rune) bool {
	return (r >= 0x202A && r <= 0x202E) || (r >= 0x2066 && r <= 0x2069) || r == 0x200E || r == 0x200F || r == 0x061C
}

// line prints one line of server text, cleaned.
func line(w io.Writer, format string, a ...any) {
	fmt.Fprintln(w, cleanCell(fmt.Sprintf(format, a...)))
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// ago is a duration in its largest whole unit: 3d, 5h, 12m, 40s.
func ago(d time.Duration, prefix string) string {
	if d < 0 {
		return "expired"
	}
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%s%dd", prefix, int(d.Hours()/24))
	case d >= time.Hour:
		return fmt.Sprintf("%s%dh", prefix, int(d.Hours()))
	case d >= time.Minute:
		return fmt.Sprintf("%s%dm", prefix, int(d.Minutes()))
	}
	return fmt.Sprintf("%s%ds", prefix, int(d.Seconds()))
}
