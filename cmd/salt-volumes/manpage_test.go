package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite packaging/man and packaging/completion from the command tree")

// packaging is where the packages take the generated files from
// (scripts/packages.sh).
const packaging = "../../packaging"

// files is what the packages install about the CLI, generated from the
// command tree: a man page per command (cobra's GenManTree), the root's
// with ENVIRONMENT, FILES and EXIT STATUS, and cobra's completion
// scripts. Paths are relative to packaging/.
func files(t *testing.T) map[string][]byte {
	t.Helper()
	root := (&cli{out: io.Discard, errw: io.Discard}).root()
	root.InitDefaultHelpCmd() // its page too, as the root's SEE ALSO names it
	dir := t.TempDir()
	// No title (each page's own), no date: the pages are the same
	// whenever and wherever they are made.
	header := &doc.GenManHeader{Section: "1", Source: "salt-volumes", Manual: "salt-volumes manual"}
	require.NoError(t, doc.GenManTree(root, header, dir))
	pages, err := filepath.Glob(filepath.Join(dir, "*.1"))
	require.NoError(t, err)
	out := map[string][]byte{}
	th := regexp.MustCompile(`(?m)^(\.TH "[^"]*" "1" )"[^"]*"`)
	for _, p := range pages {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		b = th.ReplaceAll(b, []byte(`$1""`))
		if filepath.Base(p) == "salt-volumes.1" {
			b = rootSections(t, root, b)
		}
		out["man/"+filepath.Base(p)] = b
	}
	for name, gen := range map[string]func(io.Writer) error{
		"completion/salt-volumes.bash": func(w io.Writer) error { return root.GenBashCompletionV2(w, true) },
		"completion/_salt-volumes":     root.GenZshCompletion,
		"completion/salt-volumes.fish": func(w io.Writer) error { return root.GenFishCompletion(w, true) },
	} {
		var b bytes.Buffer
		require.NoError(t, gen(&b))
		out[name] = b.Bytes()
	}
	return out
}

// roff escapes text for a man page: backslashes, dashes, and a line
// that would start with a control character.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// rootSections adds what the root's page has beyond cobra's: the
// environment, the files and the exit codes, before the examples, and
// salt-volume-exec(8) to SEE ALSO.
func rootSections(t *testing.T, root *cobra.Command, page []byte) []byte {
	var b strings.Builder
	b.WriteString(".SH ENVIRONMENT\n")
	for _, e := range environment(root) {
		fmt.Fprintf(&b, ".TP\n.B %s\n%s\n", roff(e.name), roff(e.what))
	}
	b.WriteString(".SH FILES\n")
	for _, f := range [][2]string{
		{"/etc/salt-volumes/config.yaml", "serve's configuration."},
		{"/etc/salt-volumes/token", "the bootstrap admin token the package generates, readable by root and the salt-volumes group (SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token)."},
		{"~/.config/salt-volumes/session.json", "the session of salt-volumes login, readable by its user alone."},
		{"/usr/share/salt-volumes/master.d/salt-volumes.conf", "what the salt-master needs: review it, then copy it to /etc/salt/master.d."},
		{"/usr/share/salt-formulas/states", "the salt_volumes formulas and modules."},
	} {
		fmt.Fprintf(&b, ".TP\n.I %s\n%s\n", roff(f[0]), roff(f[1]))
	}
	b.WriteString(".SH EXIT STATUS\n")
	for _, e := range exitCodes {
		fmt.Fprintf(&b, ".TP\n.B %d\n%s\n", e.code, roff(e.what))
	}
	s := string(page)
	at := strings.Index(s, ".SH EXAMPLE")
	require.Positive(t, at, "the root's page has no EXAMPLE section to put ENVIRONMENT before")
	s = s[:at] + b.String() + s[at:]
	return []byte(strings.TrimRight(s, "\n") + "\n.PP\n.BR salt\\-volume\\-exec (8),\nthe operations guide: https://github.com/salt\\-volumes/salt\\-volumes/blob/main/docs/operations.md\n")
}

// TestManPagesAndCompletionsAreGenerated: packaging/man and
// packaging/completion are what the command tree makes; go test
// -run TestManPagesAndCompletionsAreGenerated -update rewrites them.
func TestManPagesAndCompletionsAreGenerated(t *testing.T) {
	want := files(t)
	have := map[string]bool{}
	for _, glob := range []string{"man/salt-volumes*.1", "completion/*"} {
		m, err := filepath.Glob(filepath.Join(packaging, glob))
		require.NoError(t, err)
		for _, p := range m {
			rel, err := filepath.Rel(packaging, p)
			require.NoError(t, err)
			have[rel] = true
		}
	}
	if *update {
		for rel := range have {
			if _, ok := want[rel]; !ok {
				require.NoError(t, os.Remove(filepath.Join(packaging, rel)))
			}
		}
		for rel, b := range want {
			require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(packaging, rel)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(packaging, rel), b, 0o644))
		}
		return
	}
	for rel := range have {
		if _, ok := want[rel]; !ok {
			t.Errorf("packaging/%s: no command makes it (a command renamed or removed?); -update removes it", rel)
		}
	}
	names := make([]string, 0, len(want))
	for rel := range want {
		names = append(names, rel)
	}
	sort.Strings(names)
	for _, rel := range names {
		b, err := os.ReadFile(filepath.Join(packaging, rel))
		if err != nil {
			t.Errorf("packaging/%s: %v; run go test ./cmd/salt-volumes -run TestManPagesAndCompletionsAreGenerated -update", rel, err)
			continue
		}
		if !bytes.Equal(b, want[rel]) {
			t.Errorf("packaging/%s is not what the command tree makes; run go test ./cmd/salt-volumes -run TestManPagesAndCompletionsAreGenerated -update", rel)
		}
	}
}

// commandsOf is every command of the tree a person may run, root first.
func commandsOf(root *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{root}
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			out = append(out, commandsOf(c)...)
		}
	}
	return out
}

// TestHelpAndManPagesKeepTheirPromises: every command's help exits 0 and
// shows an example; every command has its man page, naming each of its
// flags; the root's help and page give every exit code and environment
// variable. A command, flag or code added without them fails here.
func TestHelpAndManPagesKeepTheirPromises(t *testing.T) {
	root := (&cli{out: io.Discard, errw: io.Discard}).root()
	root.InitDefaultHelpCmd()
	pages := files(t)
	// The text a reader sees: font escapes and escaped dashes dropped.
	text := func(b []byte) string {
		s := regexp.MustCompile(`\\f[BIRP]|\\f\(CW`).ReplaceAllString(string(b), "")
		return strings.ReplaceAll(s, `\-`, "-")
	}
	cmds := commandsOf(root)
	require.Greater(t, len(cmds), 30, "the tree lost its commands")
	for _, cmd := range cmds {
		path := strings.Fields(cmd.CommandPath())[1:]
		t.Run(strings.Join(append([]string{"salt-volumes"}, path...), " "), func(t *testing.T) {
			var out, errw bytes.Buffer
			code := run(append(path, "--help"), &out, &errw)
			assert.Equal(t, exitOK, code, errw.String())
			assert.Contains(t, out.String(), "Examples:\n  ", "no example in its help")
			assert.NotEmpty(t, cmd.Long, "no description beyond its line")
			page, ok := pages["man/"+strings.ReplaceAll(cmd.CommandPath(), " ", "-")+".1"]
			require.True(t, ok, "no man page")
			man := text(page)
			cmd.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
				assert.Contains(t, man, "--"+f.Name, "the man page does not give --%s", f.Name)
				assert.Contains(t, out.String(), "--"+f.Name, "the help does not give --%s", f.Name)
			})
		})
	}
	var out bytes.Buffer
	require.Equal(t, exitOK, run([]string{"--help"}, &out, io.Discard))
	man := text(pages["man/salt-volumes.1"])
	_, exits, ok := strings.Cut(man, ".SH EXIT STATUS")
	require.True(t, ok, "the root's man page has no EXIT STATUS")
	exits, _, _ = strings.Cut(exits, ".SH")
	for _, e := range exitCodes {
		assert.Contains(t, exits, fmt.Sprintf(".B %d\n", e.code), "the man page's EXIT STATUS")
		assert.Regexp(t, fmt.Sprintf(`(?m)^  %d +\S`, e.code), out.String(), "salt-volumes --help's exit codes")
	}
	for code := exitOK; code <= exitRetry; code++ {
		assert.Contains(t, exits, fmt.Sprintf(".B %d\n", code), "exit code %d is not documented", code)
	}
	for _, sec := range []string{".SH ENVIRONMENT", ".SH FILES", ".SH SEE ALSO"} {
		assert.Contains(t, man, sec)
	}
	for _, e := range rootEnv {
		assert.Contains(t, man, ".B "+e.env+"\n")
		assert.Contains(t, out.String(), "  "+e.env+" ")
	}
}
