#!/usr/bin/env bash
# Prints the version the binaries and packages carry: the vX.Y.Z tag of the
# commit when it has one (a release), else VERSION (the next release, -dev),
# the commit's time (UTC, so that builds between releases sort by it:
# 0.4.0-dev.20261206091234+g<commit>) and the commit, "dirty" for
# uncommitted changes. One commit, one version, whoever builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! git rev-parse --git-dir >/dev/null 2>&1; then
  # A source tarball: VERSION alone.
  cat VERSION
  exit 0
fi
if tag=$(git describe --tags --exact-match --match 'v[0-9]*.[0-9]*.[0-9]*' 2>/dev/null); then
  v=${tag#v}
else
  v=$(cat VERSION)
  case $v in
    # Between releases: the commit's time, so that builds sort by it.
    *-dev) v="$v.$(TZ=UTC git show -s --format=%cd --date=format-local:%Y%m%d%H%M%S HEAD)" ;;
  esac
  # An untagged commit whose VERSION names a release (a clone without the
  # tag) stays that release, with its commit: it sorts after the release.
  v="$v+g$(git rev-parse --short=12 HEAD)"
fi
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  case $v in *+*) v="$v.dirty" ;; *) v="$v+dirty" ;; esac
fi
echo "$v"
