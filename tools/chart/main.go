// Command chart packages the Helm chart (internal/helmchart) with the
// build's version as its version and appVersion, entries timed
// SOURCE_DATE_EPOCH (1980-01-01 without it), and prints the archive's path.
//
//	chart -version 0.4.0 -o dist/ deploy/helm/salt-volumes
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/salt-volumes/salt-volumes/internal/helmchart"
)

func main() {
	version := flag.String("version", "", "the chart's version and appVersion (SemVer 2: 0.4.0, 0.4.0-dev.20261206140442+gabc1234)")
	out := flag.String("o", ".", "the directory the archive goes to")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: chart -version VERSION [-o DIR] CHART_DIR")
		os.Exit(2)
	}
	path, err := helmchart.Pack(flag.Arg(0), *version, *out, epoch())
	if err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}

func epoch() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
			return time.Unix(n, 0)
		}
	}
	return time.Unix(315532800, 0)
}
