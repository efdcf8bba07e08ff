#!/usr/bin/env bash
# scripts/sign.sh DIR KEY: signs the release artifacts in DIR with the gpg
# key KEY (a fingerprint, key id or user id in the caller's keyring,
# GNUPGHOME honoured): each .deb (debsigs, an "origin" signature inside
# the package, which debsig-verify checks), each .rpm (rpmsign, a header
# signature that rpm -K checks), then SHA256SUMS written again over the
# signed files and signed itself (SHA256SUMS.asc, detached and armored),
# and the public key exported beside them (signing-key.asc) for people to
# compare with the one they trust. make dist SIGN_KEY=KEY runs it.
# Verification: docs/releasing.md.
set -euo pipefail
dir=${1:?usage: sign.sh DIR KEY}
key=${2:?usage: sign.sh DIR KEY}
for tool in gpg debsigs rpmsign; do
  if ! command -v "$tool" >/dev/null; then
    echo "sign: $tool is missing: install gnupg, debsigs and rpm (scripts/setup.sh does)" >&2
    exit 1
  fi
done
if [ -n "${GNUPGHOME:-}" ]; then
  GNUPGHOME=$(realpath "$GNUPGHOME")
  export GNUPGHOME
fi
if ! gpg --batch --list-secret-keys "$key" >/dev/null 2>&1; then
  echo "sign: no secret key $key in ${GNUPGHOME:-~/.gnupg} (gpg --list-secret-keys)" >&2
  exit 1
fi
# One key, its primary: debsig-verify checks signatures of a primary key
# only (a signing subkey's fail every policy), so everything is signed by
# the primary key ("FPR!"), which must be able to sign.
listing=$(gpg --batch --with-colons --list-secret-keys "$key")
if [ "$(printf '%s\n' "$listing" | grep -c '^sec:')" -ne 1 ]; then
  echo "sign: $key names more than one secret key: give its fingerprint" >&2
  exit 1
fi
caps=$(printf '%s\n' "$listing" | awk -F: '/^sec:/{print $12}')
fpr=$(printf '%s\n' "$listing" | awk -F: '/^fpr:/{print $10; exit}')
case $caps in
  *s*) ;;
  *)
    echo "sign: the primary key of $fpr cannot sign (capabilities $caps): debsig-verify checks only a primary key's signatures; use a release key whose primary key signs (gpg --quick-gen-key NAME rsa4096 sign,cert)" >&2
    exit 1
    ;;
esac
key="$fpr!"
cd "$dir"
shopt -s nullglob
# A run that stops halfway leaves no SHA256SUMS to trust: make dist again.
rm -f SHA256SUMS SHA256SUMS.asc signing-key.asc
# debsigs runs "gpg --openpgp --detach-sign", which signs with SHA-1, and
# debsig-verify's gpg rejects SHA-1 signatures: a gpg of our own first on
# its PATH adds --digest-algo SHA512.
wrap=$(mktemp -d)
trap 'rm -rf "$wrap"' EXIT
real_gpg=$(command -v gpg)
printf '#!/bin/sh
exec %s "$@" --digest-algo SHA512
' "$real_gpg" > "$wrap/gpg"
chmod 755 "$wrap/gpg"
signed=0
for deb in *.deb; do
  # debsigs signs in place and refuses a package signed already.
  if ar t "$deb" | grep -qx '_gpgorigin'; then
    echo "sign: $deb carries an origin signature already: sign what make dist made, once (make dist SIGN_KEY=... builds and signs afresh)" >&2
    exit 1
  fi
  PATH="$wrap:$PATH" debsigs --sign=origin -k "$key" "$deb"
  signed=$((signed + 1))
done
rpmargs=(--define "_gpg_name $key" --define "__gpg $(command -v gpg)")
if [ -n "${GNUPGHOME:-}" ]; then
  rpmargs+=(--define "_gpg_path $GNUPGHOME")
fi
for rpm in *.rpm; do
  rpmsign "${rpmargs[@]}" --addsign "$rpm" >/dev/null
  signed=$((signed + 1))
done
# The key is not in SHA256SUMS: a sum signed by the key it names proves
# nothing about the key. Compare its fingerprint instead.
find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | xargs sha256sum > "$wrap/sums"
gpg --batch --armor --export "$fpr" > signing-key.asc
mv "$wrap/sums" SHA256SUMS
gpg --batch --yes --local-user "$key" --armor --detach-sign --output SHA256SUMS.asc SHA256SUMS
echo "sign: $signed packages and SHA256SUMS signed with $fpr in $dir"
