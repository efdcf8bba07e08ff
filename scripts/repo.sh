#!/usr/bin/env bash
# make repo: turns the packages of make dist (DIST, default dist/) into an
# apt repository and a yum/dnf repository under REPO (default repo/),
# signed with the gpg key SIGN_KEY (GNUPGHOME honoured), ready to publish
# as static files:
#   REPO/apt: pool/main/*.deb, dists/stable/{Release,InRelease,Release.gpg}
#             and dists/stable/main/binary-{amd64,arm64}/Packages(.gz)
#             (apt-ftparchive);
#   REPO/rpm: the .rpms, repodata/ (createrepo_c) with repomd.xml.asc,
#             and salt-volumes.repo, a dnf/yum repository file;
#   REPO/signing-key.asc: the public key, for signed-by / gpgkey.
# A repository is the unit a fleet trusts: apt and dnf check the signed
# index, which names every package's digest. Each run writes REPO afresh
# with dist's packages only: keep older releases' packages in DIST to
# keep them installable. How to add them:
# docs/operations.md, "Installing from a repository".
set -euo pipefail
cd "$(dirname "$0")/.."
dist=${DIST:-dist}
out=${REPO:-repo}
key=${SIGN_KEY:-}
if [ -z "$key" ]; then
  echo "repo: set SIGN_KEY to the gpg key that signs the repositories (make repo SIGN_KEY=<fingerprint>)" >&2
  exit 1
fi
for tool in gpg apt-ftparchive createrepo_c rpmkeys; do
  if ! command -v "$tool" >/dev/null; then
    echo "repo: $tool is missing: install gnupg, apt-utils and createrepo-c (scripts/setup.sh does)" >&2
    exit 1
  fi
done
if ! gpg --batch --list-secret-keys "$key" >/dev/null 2>&1; then
  echo "repo: no secret key $key in ${GNUPGHOME:-~/.gnupg} (gpg --list-secret-keys)" >&2
  exit 1
fi
shopt -s nullglob
debs=("$dist"/*.deb)
rpms=("$dist"/*.rpm)
if [ ${#debs[@]} -eq 0 ] || [ ${#rpms[@]} -eq 0 ]; then
  echo "repo: no .deb or no .rpm in $dist: run make dist first" >&2
  exit 1
fi
if [ -n "${GNUPGHOME:-}" ]; then
  GNUPGHOME=$(realpath "$GNUPGHOME")
  export GNUPGHOME
fi
rm -rf "$out"
mkdir -p "$out/apt/pool/main" "$out/rpm"
gpg --batch --armor --export "$key" > "$out/signing-key.asc"
# dnf checks each package's signature too (gpgcheck=1 below): each .rpm
# must carry a good signature by this key, checked as dnf would, against
# the exported key alone (in an rpm database of our own).
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
rpmkeys --dbpath "$db" --import "$out/signing-key.asc"
for rpm in "${rpms[@]}"; do
  if ! rpmkeys --dbpath "$db" --checksig "$rpm" | grep -q ': digests signatures OK$'; then
    rm -rf "$out"
    echo "repo: $rpm carries no good signature by $key (rpmkeys --checksig): make dist SIGN_KEY=$key first" >&2
    exit 1
  fi
done
cp "${debs[@]}" "$out/apt/pool/main/"
cp "${rpms[@]}" "$out/rpm/"

# apt: one suite, "stable", one component, both architectures.
(
  cd "$out/apt"
  for arch in amd64 arm64; do
    d=dists/stable/main/binary-$arch
    mkdir -p "$d"
    apt-ftparchive --arch "$arch" packages pool/main > "$d/Packages"
    gzip -9n < "$d/Packages" > "$d/Packages.gz"
  done
  apt-ftparchive \
    -o APT::FTPArchive::Release::Origin=salt-volumes \
    -o APT::FTPArchive::Release::Label=salt-volumes \
    -o APT::FTPArchive::Release::Suite=stable \
    -o APT::FTPArchive::Release::Codename=stable \
    -o APT::FTPArchive::Release::Architectures="amd64 arm64" \
    -o APT::FTPArchive::Release::Components=main \
    -o APT::FTPArchive::Release::Description="salt-volumes packages" \
    release dists/stable > Release.tmp
  mv Release.tmp dists/stable/Release
  gpg --batch --yes --local-user "$key" --digest-algo SHA512 --clearsign --output dists/stable/InRelease dists/stable/Release
  gpg --batch --yes --local-user "$key" --digest-algo SHA512 --armor --detach-sign --output dists/stable/Release.gpg dists/stable/Release
)

# dnf/yum: the index signed (repo_gpgcheck) as well as each package
# (gpgcheck, make dist SIGN_KEY).
createrepo_c --quiet --simple-md-filenames --no-database "$out/rpm" >/dev/null
gpg --batch --yes --local-user "$key" --digest-algo SHA512 --armor --detach-sign --output "$out/rpm/repodata/repomd.xml.asc" "$out/rpm/repodata/repomd.xml"
cat > "$out/rpm/salt-volumes.repo" <<'EOF'
[salt-volumes]
name=salt-volumes
# Where you publish REPO/rpm:
baseurl=https://packages.example.org/salt-volumes/rpm
enabled=1
gpgcheck=1
repo_gpgcheck=1
gpgkey=https://packages.example.org/salt-volumes/signing-key.asc
EOF
echo "repo: apt and rpm repositories of $(basename "${debs[0]}" | cut -d_ -f2) signed with $key in $out"
