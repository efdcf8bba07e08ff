#!/usr/bin/env bash
# make dist: the release artifacts, for linux/amd64 and linux/arm64, in
# dist/ (DIST=dir elsewhere): both static binaries, a CycloneDX SBOM of each
# (cyclonedx-gomod, from the module proxy, each module's licence written in
# by tools/notices; and one of each package, the image and the wheel) and
# the licence notices of what
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
# SBOMs of what carries the binaries (tools/notices -wrap): each package
# (the binaries it ships and every module they link), serve's image (its
# binary for both architectures), the wheel (Python alone, no binary).
purlv() { local v=${1//+/%2B}; printf '%s' "${v//\~/%7E}"; }
debversion=${version/-/\~}
for pkg in salt-volume-exec salt-volumes; do
  for arch in amd64:x86_64 arm64:aarch64; do
    deb=${arch%%:*} rpm=${arch##*:}
    from="$out/${pkg}_${version}_linux_${deb}.cdx.json"
    if [ "$pkg" = salt-volumes ]; then
      # It carries the node's binary too, both architectures' (for
      # salt_volumes.installed to hand each minion its own).
      from="$from,$out/salt-volume-exec_${version}_linux_amd64.cdx.json,$out/salt-volume-exec_${version}_linux_arm64.cdx.json"
    fi
    go run ./tools/notices -wrap "$out/${pkg}_${debversion}_${deb}.deb.cdx.json" -type application -name "$pkg" \
      -version "$debversion" -purl "pkg:deb/salt-volumes/$pkg@$(purlv "$debversion")?arch=$deb" -from "$from"
    go run ./tools/notices -wrap "$out/${pkg}-${debversion}-1.${rpm}.rpm.cdx.json" -type application -name "$pkg" \
      -version "$debversion-1" -purl "pkg:rpm/salt-volumes/$pkg@$(purlv "$debversion-1")?arch=$rpm" -from "$from"
  done
done
go run ./tools/notices -wrap "$out/salt-volumes-image_${version}.tar.cdx.json" -type container -name salt-volumes.io/salt-volumes \
  -version "$version" -purl "pkg:oci/salt-volumes?repository_url=salt-volumes.io%2Fsalt-volumes&tag=$(purlv "$version")" \
  -from "$out/salt-volumes_${version}_linux_amd64.cdx.json,$out/salt-volumes_${version}_linux_arm64.cdx.json"
for whl in "$out"/saltext_volumes-*-py3-none-any.whl; do
  pyversion=${whl##*/saltext_volumes-}
  pyversion=${pyversion%-py3-none-any.whl}
  go run ./tools/notices -wrap "$whl.cdx.json" -type library -name saltext-volumes -version "$pyversion" \
    -purl "pkg:pypi/saltext-volumes@$(purlv "$pyversion")"
done
sums=$(cd "$out" && find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | xargs sha256sum)
printf '%s\n' "$sums" > "$out/SHA256SUMS"
# make dist SIGN_KEY=<gpg key>: the packages and SHA256SUMS signed.
if [ -n "${SIGN_KEY:-}" ]; then
  scripts/sign.sh "$out" "$SIGN_KEY"
fi
echo "dist: $version in $out"
(cd "$out" && ls -l)
