package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"sigs.k8s.io/yaml"
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
		for _, n := range names {
			if _, err := fmt.Fprintln(c.out, n); err != nil {
				return err
			}
		}
		return nil
	case fmtWide:
		return table(true)
	}
	return table(false)
}

// human: the format is one for people (table or wide), where messages
// that are not objects go to stdout as before; other formats keep stdout
// for the objects.
func (c *cli) human() bool { f := c.format(); return f == fmtTable || f == fmtWide }

// say prints a message: on stdout for people, on stderr when stdout holds
// objects for a program.
func (c *cli) say(format string, a ...any) {
	w := c.out
	if !c.human() {
		w = c.errw
	}
	fmt.Fprintf(w, format, a...)
}

func (c *cli) json(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// yaml prints v as YAML through its JSON form: the same field names, the
// same "Unknown" phase, as kubectl does.
func (c *cli) yaml(v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("rendering YAML: %w", err)
	}
	_, err = c.out.Write(b)
	return err
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
// that reorder text, from text a terminal shows.
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

// cleanCell is clean for one cell of a table: one line.
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
