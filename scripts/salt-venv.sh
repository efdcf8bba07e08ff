#!/usr/bin/env bash
# Prints the path of a virtualenv holding the newest installable point
# release of one Salt line (3006, 3007, 3008), creating it once in the cache
# outside the repository. The Salt matrix (make test-salt SALT=<line>) runs
# the Salt-facing suites against it.
#
# Why these releases: the newest point releases on PyPI pin a certifi newer
# than the registry serves here; these are the newest whose dependencies
# resolve on this machine's Python 3.11. Raise them as the registry allows.
set -euo pipefail
cd "$(dirname "$0")/.."

line=${1:?usage: scripts/salt-venv.sh 3006|3007|3008}
case "$line" in
  3006) release=3006.29 ;;
  3007) release=3007.16 ;;
  3008) release=3008.3 ;;
  *) echo "salt-venv: unknown Salt line '$line': use 3006, 3007 or 3008" >&2; exit 2 ;;
esac

# The pinned release is the project's own .venv (scripts/setup.sh).
if [ "salt==$release" = "$(grep -E '^salt==' salt/requirements.txt)" ] && [ -x .venv/bin/salt-call ]; then
  echo "$PWD/.venv"
  exit 0
fi

cache=${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}
venv="$cache/salt-$release"
# The same CherryPy and pytest as the pinned line (salt/requirements.txt),
# so that only Salt differs between the lines.
reqs=$(grep -E '^(cherrypy|pytest)==' salt/requirements.txt)
want="salt==$release"$'\n'"$reqs"
# The marker is written last: a half-built virtualenv (a run killed during
# pip) lacks it and is built again from scratch.
if [ "$(cat "$venv/.requirements.installed" 2>/dev/null)" != "$want" ]; then
  echo "salt-venv: installing Salt $release into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086 # one requirement per word
  "$venv/bin/pip" install -q --disable-pip-version-check $want >&2
  printf '%s' "$want" > "$venv/.requirements.installed"
fi
echo "$venv"
