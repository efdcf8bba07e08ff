package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeAgreesWithTheBuild: the Go version and the Salt releases the
// README's compatibility table names are the ones go.mod and the Salt
// matrix (scripts/salt-venv.sh) use.
func TestReadmeAgreesWithTheBuild(t *testing.T) {
	readme := readFile(t, "README.md")

	gomod := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readFile(t, "go.mod"))
	if gomod == nil {
		t.Fatal("go.mod has no go line")
	}
	if !regexp.MustCompile(`(?m)^\| building \| Go ` + regexp.QuoteMeta(gomod[1]) + ` \|`).MatchString(readme) {
		t.Errorf("README's compatibility table does not say Go %s, which go.mod asks for", gomod[1])
	}

	var tested []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(300\d)\) release=(300\d\.\d+) ;;`).FindAllStringSubmatch(readFile(t, "scripts/salt-venv.sh"), -1) {
		tested = append(tested, m[2])
	}
	if len(tested) < 3 {
		t.Fatalf("scripts/salt-venv.sh names %d Salt releases; the pattern no longer reads it", len(tested))
	}
	row := regexp.MustCompile(`(?m)^\| Salt \| ([^|]+) \|`).FindStringSubmatch(readme)
	if row == nil {
		t.Fatal("README's compatibility table has no Salt row")
	}
	if got, want := strings.TrimSpace(row[1]), strings.Join(tested, ", "); got != want {
		t.Errorf("README says Salt %q is tested; the matrix tests %q", got, want)
	}
	pinned := regexp.MustCompile(`(?m)^salt==(\S+)`).FindStringSubmatch(readFile(t, "salt/requirements.txt"))
	if pinned == nil || !strings.Contains(row[1], pinned[1]) {
		t.Errorf("make test's pinned Salt (salt/requirements.txt: %v) is not among the README's tested releases %q", pinned, row[1])
	}
}
