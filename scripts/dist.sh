#!/usr/bin/env bash
# make dist: the release artifacts, for linux/amd64 and linux/arm64, in
# dist/ (DIST=dir elsewhere): both static binaries, a CycloneDX SBOM of each
# (cyclonedx-gomod, from the module proxy) and the licence notices of what
# each embeds (tools/notices), serve's image for both (an OCI archive,
# tools/image), the Helm chart (tools/chart), the Salt extension's wheel
# (scripts/saltext.sh), the .deb and .rpm packages (scripts/packages.sh),
# and SHA256SUMS over them all; with SIGN_KEY, signed (scripts/sign.sh).
# Reproducible: the same commit gives the same bytes, on any machine with
# the same Go (-trimpath, no build id, no VCS stamp, SBOMs without serial
# number or timestamp).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${DIST:-dist}
version=$(scripts/version.sh)
cyclonedx=github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0
rm -rf "$out"
mkdir -p "$out"
for arch in amd64 arm64; do
  for cmd in salt-volume-exec salt-volumes; do
    bin="$out/${cmd}_${version}_linux_${arch}"
    CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -trimpath -buildvcs=false \
      -ldflags "-s -w -buildid= -X main.version=$version" -o "$bin" "./cmd/$cmd"
    go run "$cyclonedx" bin -json -noserial -notimestamp -version "v$version" -output "$bin.cdx.json" "$bin"
    # Each module's licence into the SBOM (cyclonedx-gomod's own detector
    # names several wrongly), read from the module cache by tools/notices.
    go run ./tools/notices -sbom "$bin.cdx.json"
    # The licences of what the static binary embeds, beside it.
    go run ./tools/notices -o "$bin.NOTICES" "$bin"
  done
done
# serve's container image for both architectures: one OCI archive, an
# image index naming salt-volumes.io/salt-volumes:<version> (tools/image),
# each image with the licence notices of the binary it holds.
go run ./tools/image -notices -o "$out/salt-volumes-image_${version}.tar" -tag "$version" \
  -bin "amd64=$out/salt-volumes_${version}_linux_amd64,arm64=$out/salt-volumes_${version}_linux_arm64" >/dev/null
# The Helm chart, its version and appVersion this build's, reproducibly
# (tools/chart; helm 3.22's own package stamps the time it ran).
# Files git does not track would go into it unseen (the version says
# nothing of them): refused.
if untracked=$(git ls-files --others --exclude-standard deploy/helm/salt-volumes 2>/dev/null) && [ -n "$untracked" ]; then
  echo "dist: files git does not track would go into the chart: $untracked: add them to git or remove them" >&2
  exit 1
fi
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)} \
  go run ./tools/chart -version "$version" -o "$out" deploy/helm/salt-volumes >/dev/null
# The Salt extension: the same modules for every architecture.
scripts/saltext.sh "$out" >/dev/null
scripts/packages.sh "$out" >/dev/null
sums=$(cd "$out" && find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | xargs sha256sum)
printf '%s\n' "$sums" > "$out/SHA256SUMS"
# make dist SIGN_KEY=<gpg key>: the packages and SHA256SUMS signed.
if [ -n "${SIGN_KEY:-}" ]; then
  scripts/sign.sh "$out" "$SIGN_KEY"
fi
echo "dist: $version in $out"
(cd "$out" && ls -l)
