package dist

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// git runs git in dir as a throwaway identity.
func git(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com"}, env...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

func versionIn(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(dir, "scripts", "version.sh")).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// debLess: dpkg orders a before b.
func debLess(t *testing.T, a, b string) bool {
	t.Helper()
	return exec.Command("dpkg", "--compare-versions", debVersion(a), "lt", debVersion(b)).Run() == nil
}

// Builds between releases sort by their commit's time, below the release
// they lead to and above the one before (#52 item 8); make release tags the
// release and begins the next, every file that names the version
// following, and refuses what it cannot do, changing nothing.
func TestVersionsAndRelease(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "repo")
	out, err := exec.Command("git", "clone", "-q", repo, dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	cur, err := os.ReadFile(filepath.Join(dir, "VERSION"))
	require.NoError(t, err)
	if !strings.HasSuffix(strings.TrimSpace(string(cur)), "-dev") {
		t.Skipf("VERSION is %s, a release's: this tree is a release, not a branch between releases", strings.TrimSpace(string(cur)))
	}
	next := strings.TrimSuffix(strings.TrimSpace(string(cur)), "-dev")
	require.Regexp(t, `^\d+\.\d+\.\d+$`, next, "VERSION announces the next release")

	// Two commits a minute apart, the older one's hash "larger": the
	// versions sort by time, not by hash.
	commitAt := func(at time.Time) string {
		t.Helper()
		env := []string{"GIT_COMMITTER_DATE=" + at.Format(time.RFC3339), "GIT_AUTHOR_DATE=" + at.Format(time.RFC3339)}
		git(t, dir, env, "commit", "-q", "--allow-empty", "-m", "a build between releases")
		return versionIn(t, dir)
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	v1 := commitAt(t0)
	v2 := commitAt(t0.Add(time.Minute))
	dev := regexp.MustCompile(`^` + regexp.QuoteMeta(next) + `-dev\.(\d{14})\+g[0-9a-f]{12}$`)
	require.Regexp(t, dev, v1)
	assert.Equal(t, t0.Format("20060102150405"), dev.FindStringSubmatch(v1)[1], "the commit's time, UTC")
	assert.True(t, debLess(t, v1, v2), "%s before %s", v1, v2)
	assert.True(t, debLess(t, v2, next), "a build before its release")
	assert.True(t, debLess(t, "0.3.0", v1), "and after the last one")

	release := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(dir, "scripts", "release.sh"), args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	head := git(t, dir, nil, "rev-parse", "HEAD")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"0.4"}, "is not X.Y.Z"},
		{[]string{"9.9.9"}, "VERSION says " + next + "-dev"},
	} {
		out, err := release(tc.args...)
		require.Error(t, err, out)
		assert.Contains(t, out, tc.want)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "VERSION"), []byte(next+"-dev\n\n"), 0o644))
	out2, err := release(next)
	require.Error(t, err, out2)
	assert.Contains(t, out2, "uncommitted changes")
	git(t, dir, nil, "checkout", "-q", "VERSION")
	assert.Equal(t, head, git(t, dir, nil, "rev-parse", "HEAD"), "refused: nothing committed")
	assert.Empty(t, git(t, dir, nil, "tag", "--list", "v"+next))

	out3, err := release(next)
	require.NoError(t, err, out3)
	file := func(rev, path string) string { return git(t, dir, nil, "show", rev+":"+path) }
	tag := "v" + next
	assert.Equal(t, next, file(tag, "VERSION"))
	chartAt := func(rev string) string { return file(rev, "deploy/helm/salt-volumes/Chart.yaml") }
	assert.Contains(t, chartAt(tag), "\nversion: "+next+"\n")
	assert.Contains(t, chartAt(tag), "\nappVersion: "+next+"\n")
	assert.Contains(t, file(tag, "deploy/kubernetes/serve.yaml"), "image: salt-volumes.io/salt-volumes:"+next+"\n")
	assert.Contains(t, file(tag, "CHANGELOG.md"), "\n## "+next+" ("+time.Now().UTC().Format("2006-01-02")+")\n")
	git(t, dir, nil, "checkout", "-q", tag)
	assert.Equal(t, next, versionIn(t, dir), "the tagged commit is the release")
	git(t, dir, nil, "checkout", "-q", "-")

	parts := strings.Split(next, ".")
	minor, err := strconv.Atoi(parts[1])
	require.NoError(t, err)
	patch, err := strconv.Atoi(parts[2])
	require.NoError(t, err)
	after := parts[0] + "." + strconv.Itoa(minor+1) + ".0" // a minor release begins the next minor
	if patch > 0 {
		after = parts[0] + "." + parts[1] + "." + strconv.Itoa(patch+1) // a patch release the next patch
	}
	assert.Equal(t, after+"-dev", file("HEAD", "VERSION"))
	assert.Contains(t, chartAt("HEAD"), "\nappVersion: "+after+"-dev\n")
	assert.Contains(t, file("HEAD", "deploy/kubernetes/serve.yaml"), "image: salt-volumes.io/salt-volumes:"+after+"-dev\n")
	cl := file("HEAD", "CHANGELOG.md")
	assert.Less(t, strings.Index(cl, "## "+after+" (unreleased)"), strings.Index(cl, "## "+next+" ("), "the next release's section above")
	later := versionIn(t, dir)
	assert.True(t, debLess(t, next, later), "builds after the release sort above it: %s", later)
	out4, err := release(next)
	require.Error(t, err, out4)
}
