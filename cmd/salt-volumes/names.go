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
