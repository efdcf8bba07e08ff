// Package docs checks the repository's Markdown as a reader follows it:
// every relative link leads to a file that is there, every #anchor to a
// heading of that file, and nothing leads outside the repository.
package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// pages are the Markdown files a reader opens: the repository's own
// top-level pages and docs/.
func pages(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, glob := range []string{"*.md", "docs/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, glob))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) < 5 {
		t.Fatalf("only %d Markdown pages found under %s", len(out), root)
	}
	return out
}

var (
	link     = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	codeSpan = regexp.MustCompile("`[^`]*`")
	htmlID   = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	scheme   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped (letters, digits, '_' and '-' kept), spaces to '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// page is what the check needs of one file: its links (outside code)
// and its anchors.
type page struct {
	links   []string
	lines   []int
	anchors map[string]bool
}

func read(t *testing.T, path string) page {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := page{anchors: map[string]bool{}}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
		if strings.HasPrefix(line, "#") {
			s := slug(strings.TrimLeft(line, "#"))
			// A repeated heading gets -1, -2, ... after the first.
			if k := seen[s]; k > 0 {
				p.anchors[s+"-"+strconv.Itoa(k)] = true
			} else {
				p.anchors[s] = true
			}
			seen[s]++
		}
		for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			p.links = append(p.links, m[1])
			p.lines = append(p.lines, n)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLinksLeadSomewhere: a broken link or anchor fails with the file,
// the line and what is missing.
func TestLinksLeadSomewhere(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cache := map[string]page{}
	get := func(path string) page {
		if p, ok := cache[path]; ok {
			return p
		}
		p := read(t, path)
		cache[path] = p
		return p
	}
	checked := 0
	for _, file := range pages(t, root) {
		p := get(file)
		rel, _ := filepath.Rel(root, file)
		for i, target := range p.links {
			if scheme.MatchString(target) {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(file), path))
				if r, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(r, "..") {
					t.Errorf("%s:%d: %s leads outside the repository: the docs must stand alone", rel, p.lines[i], target)
					continue
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: %s: no such file", rel, p.lines[i], target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !get(dest).anchors[anchor] {
				t.Errorf("%s:%d: %s: no heading with that anchor in %s", rel, p.lines[i], target, filepath.Base(dest))
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links checked: the scan is missing them", checked)
	}
}

// TestSlug pins the anchor rule on headings of this repository's kinds.
func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Publishing through the master's request server (`salt.publish: master`)": "publishing-through-the-masters-request-server-saltpublish-master",
		"What `--wipe` does":                    "what---wipe-does",
		"9. Serve in the cluster and its image": "9-serve-in-the-cluster-and-its-image",
		"Control plane: `salt-volumes`":         "control-plane-salt-volumes",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}
