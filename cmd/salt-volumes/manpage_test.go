package main

import (
	"fmt"
	"os"
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
