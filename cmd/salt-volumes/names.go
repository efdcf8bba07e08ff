package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// argName reads an argument naming an object of one of kinds: NAME, or
// KIND/NAME as -o name prints it (ls -o name | xargs -n1 salt-volumes rm).
// Another kind's name is a usage error rather than a lookup of the wrong
// object.
func argName(cmd *cobra.Command, arg string, kinds ...string) (string, error) {
	k, n, ok := strings.Cut(arg, "/")
	if !ok {
		return arg, nil
	}
	for _, kind := range kinds {
		if (k == kind || k == kind+"s") && n != "" && !strings.Contains(n, "/") {
			return n, nil
		}
	}
	return "", usagef(cmd, "%q is not a %s: give NAME or %s/NAME", arg, kinds[0], kinds[0])
}

// argNames is argName for each argument, all of the first kind.
func argNames(cmd *cobra.Command, args []string, kinds ...string) ([]string, error) {
	out := make([]string, len(args))
	for i, a := range args {
		n, err := argName(cmd, a, kinds...)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// named prefixes names with their kind, as -o name prints them.
func named(kind string, names ...string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = kind + "/" + n
	}
	return out
}

// validName says whether name is one the API makes for kind (the rules
// of internal/spec and internal/access): a volume's, an API snapshot
// schedule's (its volume's) and a token's a DNS-1123 label of at most 63;
// a snapshot's lower-case letters, digits, '-' and '.', at most 63, a
// letter or digit at each end; a node's a Salt minion id (letters,
// digits, '.', '_', '-', at most 253, a letter or digit first). What the
// server answers is checked before it is printed as a name: -o name's
// lines are arguments of other commands.
func validName(kind, name string) bool {
	switch kind {
	case "volume", "schedule", "token":
		return dns1123Label(name)
	case "snapshot":
		return dns1123Label(strings.ReplaceAll(name, ".", "-"))
	case "node":
		if name == "" || len(name) > 253 {
			return false
		}
		for i := 0; i < len(name); i++ {
			c := name[i]
			alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
			if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
				return false
			}
		}
		return true
	}
	return false
}

// validKindName is validName of kind/name.
func validKindName(kn string) bool {
	k, n, ok := strings.Cut(kn, "/")
	return ok && validName(k, n)
}

// dns1123Label: ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$, at most 63.
func dns1123Label(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
