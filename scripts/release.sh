#!/usr/bin/env bash
# make release VERSION=X.Y.Z: turns the tree into release X.Y.Z and begins
# the next one, in two commits:
#   "Release X.Y.Z", tagged vX.Y.Z (annotated): VERSION, the chart's
#   version and appVersion and deploy/kubernetes' image tag say X.Y.Z, and
#   CHANGELOG.md's "## X.Y.Z (unreleased)" gets the day's date;
#   "Begin X.(Y+1).0-dev" (X.Y.(Z+1)-dev after a patch release): the same
#   files say the next version, -dev, under a new "(unreleased)" section,
#   so that every later build sorts above the release (scripts/version.sh).
# It pushes nothing. Refuses, changing nothing, a version that is not
# X.Y.Z, one VERSION does not announce, an existing tag, uncommitted
# changes, or a CHANGELOG without the release's section.
set -euo pipefail
cd "$(dirname "$0")/.."
new=${1:-}
fail() { echo "release: $*" >&2; exit 2; }
[[ $new =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "VERSION=$new is not X.Y.Z: run e.g. make release VERSION=$(sed 's/-dev$//' VERSION)"
cur=$(cat VERSION)
[ "$cur" = "$new-dev" ] || fail "VERSION says $cur, not $new-dev: release that one, or change VERSION first"
[ -z "$(git status --porcelain --untracked-files=no)" ] || fail "the tree has uncommitted changes: commit or stash them first"
! git rev-parse -q --verify "refs/tags/v$new" >/dev/null || fail "tag v$new exists already"
grep -q "^## $new (unreleased)\$" CHANGELOG.md || fail "CHANGELOG.md has no '## $new (unreleased)' section: write what the release changes there first"

set_version() {
  printf '%s\n' "$1" > VERSION
  sed -i -E "s/^(version|appVersion): .*/\\1: $1/" deploy/helm/salt-volumes/Chart.yaml
  sed -i -E "s#(image: salt-volumes\\.io/salt-volumes:).*#\\1$1#" deploy/kubernetes/serve.yaml
}

start=$(git rev-parse HEAD)
trap 'echo "release: stopped midway (no tag was made): git log -2 and git status show where; git reset --hard '"$start"' puts the branch back" >&2' ERR
set_version "$new"
sed -i "s/^## $new (unreleased)\$/## $new ($(TZ=UTC date +%F))/" CHANGELOG.md
git commit -q -am "Release $new"

# A minor release begins the next minor version; a patch release (on a
# branch from an older release's tag) the next patch.
IFS=. read -r major minor patch <<<"$new"
if [ "$patch" = 0 ]; then next="$major.$((minor + 1)).0"; else next="$major.$minor.$((patch + 1))"; fi
set_version "$next-dev"
# The next release's section, above the one just released.
awk -v head="## $next (unreleased)" '!done && /^## / { print head; print ""; done = 1 } { print }' CHANGELOG.md > CHANGELOG.md.new
mv CHANGELOG.md.new CHANGELOG.md
git commit -q -am "Begin $next-dev"
# The tag last: a run stopped before it leaves no tag to undo.
git tag -a "v$new" -m "salt-volumes $new" HEAD~1
trap - ERR
echo "release: tagged v$new; the branch now carries $next-dev. Publish both: git push origin HEAD v$new"
