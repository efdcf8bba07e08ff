package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestManPageNamesEveryCommandAndExitCode: the man page the packages
// install lists every command the CLI takes (aliases aside) and every exit
// code it returns; a command or code added without it fails here.
func TestManPageNamesEveryCommandAndExitCode(t *testing.T) {
	raw, err := os.ReadFile("../../packaging/man/salt-volumes.1")
	if err != nil {
		t.Fatal(err)
	}
	// The text a reader sees: font escapes and the escaped dash dropped.
	man := regexp.MustCompile(`\\f[BIRP]`).ReplaceAllString(string(raw), "")
	man = strings.ReplaceAll(man, `\-`, "-")
	aliases := map[string]bool{"list": true, "delete": true}
	for name := range commands {
		if aliases[name] {
			continue
		}
		if !regexp.MustCompile(`(?m)^\.B[R]? .*\b` + regexp.QuoteMeta(name) + `\b`).MatchString(man) {
			t.Errorf("the man page does not list the command %q", name)
		}
		if !strings.Contains(usage, "salt-volumes "+name) {
			t.Errorf("salt-volumes --help does not show the command %q", name)
		}
	}
	_, exits, ok := strings.Cut(man, ".SH EXIT STATUS")
	if !ok {
		t.Fatal("the man page has no EXIT STATUS section")
	}
	exits, _, _ = strings.Cut(exits, ".SH")
	for code := exitOK; code <= exitDenied; code++ {
		if !strings.Contains(exits, fmt.Sprintf("%d ", code)) {
			t.Errorf("the man page's EXIT STATUS does not give exit code %d", code)
		}
		if !strings.Contains(usage, fmt.Sprintf("%d ", code)) {
			t.Errorf("salt-volumes --help does not give exit code %d", code)
		}
	}
}

// TestHelpNamesEveryFlag: every flag a command defines (fs.String("name",
// ...) and the like, read from this package's source) is shown by
// salt-volumes --help; a flag added without it fails here. (The man page
// lists commands and exit codes; its flags come with #51's generated
// pages.)
func TestHelpNamesEveryFlag(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	def := regexp.MustCompile(`fs\.(?:String|Bool|Duration|Int|Int64|Float64|Uint|Var)(?:Var)?\((?:[^,"]+, )?"([a-z][a-z0-9-]*)"`)
	seen := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllStringSubmatch(string(src), -1) {
			seen++
			name := m[1]
			if !regexp.MustCompile(`(^|[\s\[(|/])--?` + regexp.QuoteMeta(name) + `\b`).MatchString(usage) {
				t.Errorf("%s defines the flag --%s, which salt-volumes --help does not show", f, name)
			}
		}
	}
	if seen < 40 {
		t.Fatalf("found %d flag definitions; the pattern no longer reads this package", seen)
	}
}
