#!/usr/bin/env bash
# The .deb and .rpm packages of one release, for linux/amd64 and arm64, in
# DIR (default dist/), from the binaries scripts/dist.sh built there:
# salt-volume-exec (node) and salt-volumes (control plane, with the Salt
# formulas and a master.d snippet). nfpm from the module proxy; file times
# from the commit, so the same commit gives the same bytes.
# The upgrade test packages an earlier release with this packaging:
# SOURCE=dir takes the Salt formulas and modules and the master snippet
# (its ACL names what that release calls) from that tree,
# VERSION=v names the binaries and the packages, ARCHES limits the
# architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
src=${SOURCE:-.}
version=${VERSION:-$(scripts/version.sh)}
nfpm=github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
SOURCE_DATE_EPOCH=$(git -C "$src" log -1 --format=%ct 2>/dev/null || echo 315532800)
export SOURCE_DATE_EPOCH VERSION=$version
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# Debian's changelog of a native package: one entry, pointing at ours.
debversion=${version/-/\~}
{
  printf 'salt-volumes (%s) unstable; urgency=medium\n\n' "$debversion"
  # Two lines: a version between releases is long, and Debian wants
  # changelog lines under 80 columns.
  printf '  * Release %s.\n  * What changed: CHANGELOG.md upstream.\n\n' "$version"
  printf ' -- salt-volumes developers <salt-volumes@users.noreply.github.com>  %s\n' \
    "$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9 -n >"$stage/changelog.Debian.gz"

gzip -9 -n <packaging/man/salt-volume-exec.8 >"$stage/salt-volume-exec.8.gz"
# The CLI's man pages, one per command, and its completion scripts, as
# its command tree makes them (go test ./cmd/salt-volumes -run
# TestManPagesAndCompletionsAreGenerated -update). nfpm expands no glob
# for rpm's type: doc: each page gets its entries, put where
# salt-volumes.yaml says @man-pages@.
mkdir -p "$stage/man" "$stage/completion"
manpages=$stage/man-pages.yaml
: >"$manpages"
for page in packaging/man/salt-volumes*.1; do
  gz=$(basename "$page").gz
  gzip -9 -n <"$page" >"$stage/man/$gz"
  printf '  - src: man/%s\n    dst: /usr/share/man/man1/%s\n    file_info: {mode: 0644}\n    packager: deb\n' "$gz" "$gz" >>"$manpages"
  printf '  - src: man/%s\n    dst: /usr/share/man/man1/%s\n    type: doc\n    file_info: {mode: 0644}\n    packager: rpm\n' "$gz" "$gz" >>"$manpages"
done
if ! grep -q '^  - src: man/salt-volumes.1.gz$' "$manpages"; then
  echo "packages: no packaging/man/salt-volumes.1" >&2
  exit 1
fi
cp packaging/completion/salt-volumes.bash packaging/completion/_salt-volumes packaging/completion/salt-volumes.fish "$stage/completion/"

# The restore unit of the formula, its template filled in with the
# package's paths.
sed -E -e 's#\{\{ *exec_path[^}]*\}\}#/usr/bin/salt-volume-exec#g' \
  -e 's#\{\{ *state_dir[^}]*\}\}#/var/lib/salt-volumes#g' \
  "$src/salt/states/salt_volumes/files/salt-volumes-restore.service" >"$stage/salt-volumes-restore.service"
sed 's#/usr/local/bin/salt-volumes#/usr/bin/salt-volumes#' "deploy/salt-volumes.service" >"$stage/salt-volumes.service"
cp "deploy/config.yaml" "$stage/config.yaml"
# The master.d snippet, with file_roots at the packaged formulas.
mkdir -p "$stage/master.d"
sed -e '/^ *- \/opt\/salt-volumes\/salt$/d' \
  -e 's#/opt/salt-volumes/salt/states#/usr/share/salt-formulas/states#' \
  -e 's#^\# master\. Paths assume.*#\# master, as the salt-volumes package ships it: review it, then copy it there.#' \
  "$src/deploy/master.d/salt-volumes.conf" >"$stage/master.d/salt-volumes.conf"
if grep -q /opt/ "$stage/master.d/salt-volumes.conf" "$stage"/*.service; then
  echo "packages: a path of the source layout is left in a packaged file" >&2
  exit 1
fi

for arch in ${ARCHES:-amd64 arm64}; do
  rm -rf "$stage/formulas"
  mkdir -p "$stage/formulas"
  cp -r "$src/salt/states/salt_volumes" "$stage/formulas/"
  for kind in modules states beacons engines runners; do
    # Releases before 0.4.0 (the upgrade test packages 0.3.0 with today's
    # packaging) have no runner.
    [ -f "$src/salt/_$kind/salt_volumes.py" ] || continue
    mkdir -p "$stage/formulas/_$kind"
    cp "$src/salt/_$kind/salt_volumes.py" "$stage/formulas/_$kind/"
  done
  # What salt_volumes.installed copies to nodes without the node package:
  # the binary of each architecture the release is built for, picked by
  # the minion's osarch grain (an arm64 node of an amd64 master gets the
  # arm64 one); the plain name, a link to this package's own, for
  # formulas from before 0.4.0.
  for a in ${ARCHES:-amd64 arm64}; do
    install -m 0755 "$out/salt-volume-exec_${version}_linux_$a" "$stage/formulas/salt_volumes/files/salt-volume-exec.$a"
  done
  ln -sfn "salt-volume-exec.$arch" "$stage/formulas/salt_volumes/files/salt-volume-exec"
  install -m 0755 "$out/salt-volume-exec_${version}_linux_$arch" "$stage/salt-volume-exec"
  install -m 0755 "$out/salt-volumes_${version}_linux_$arch" "$stage/salt-volumes"
  # The licences of what each static binary embeds, collected from its
  # build info and the module cache (tools/notices); gzipped for Debian
  # (policy 12.3), plain for RPM's %license.
  for bin in salt-volume-exec salt-volumes; do
    go run ./tools/notices -o "$stage/$bin.NOTICES" "$stage/$bin"
    gzip -9nc "$stage/$bin.NOTICES" >"$stage/$bin.NOTICES.gz"
  done
  cp packaging/nfpm/* LICENSE "$stage/"
  sed -i -e "/^  # @man-pages@\$/{r $manpages" -e 'd}' "$stage/salt-volumes.yaml"
  find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
  for pkg in salt-volume-exec salt-volumes; do
    for packager in deb rpm; do
      (cd "$stage" && ARCH=$arch go run "$nfpm" package --config "$pkg.yaml" \
        --packager "$packager" --target "$out/" >/dev/null)
    done
  done
done
# nfpm names the RPM payload's files by absolute paths: cpio -id, how
# people look inside an RPM, would write them over the machine's /usr and
# /etc. tools/rpmpaths makes them relative, as rpmbuild does.
go run ./tools/rpmpaths "$out"/*.rpm
ls "$out"/*.deb "$out"/*.rpm
