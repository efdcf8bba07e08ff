#!/usr/bin/env bash
# Builds the Salt extension wheel saltext.volumes into DIR (default dist/):
# salt/_modules, _states, _beacons, _engines and _runners as the packages
# saltext/volumes/{modules,states,beacons,engines,runners}, with the salt.loader
# entry point. Reproducible: file times from the commit (SOURCE_DATE_EPOCH).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
version=$(scripts/version.sh)
# PEP 440: 0.4.0-dev.20261206091234+gSHA -> 0.4.0.dev20261206091234+gSHA
# (0.4.0-dev alone, from a source tarball: 0.4.0.dev0)
pyversion=${version/-dev./.dev}
pyversion=${pyversion/-dev/.dev0}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg="$stage/src/saltext/volumes"
mkdir -p "$pkg"
: > "$pkg/__init__.py"
for kind in modules states beacons engines runners; do
  mkdir -p "$pkg/$kind"
  : > "$pkg/$kind/__init__.py"
  cp "salt/_$kind/salt_volumes.py" "$pkg/$kind/salt_volumes.py"
done
sed "s/@VERSION@/$pyversion/" packaging/saltext/pyproject.toml.in > "$stage/pyproject.toml"
cp packaging/saltext/README.md "$stage/README.md"
cp LICENSE "$stage/LICENSE"
find "$stage" -exec touch -h -d "@$(git log -1 --format=%ct 2>/dev/null || echo 0)" {} +
mkdir -p "$out"
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 315532800) \
  .venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir "$out" "$stage"
ls "$out"/saltext_volumes-*.whl
