#!/usr/bin/env bash
# Installs what building and testing salt-volumes needs on a bare Debian or
# Ubuntu machine. Idempotent: installs only what is missing.
#   scripts/setup.sh        everything make test needs
#   scripts/setup.sh demo   what make demo needs: the tools a sparse volume
#                           runs, Go's modules and Salt in .venv (a few
#                           minutes from bare, not the test setup's ~15)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case $mode in
  all | demo) ;;
  *) echo "setup: unknown mode '$mode': use no argument (everything) or demo" >&2; exit 2 ;;
esac

# What a node's sparse volumes and the demo's local Salt need.
base=(e2fsprogs xfsprogs util-linux gdisk mount python3-venv)
need=()
# vagrant, vagrant-libvirt and shellcheck check the Vagrant cluster's files
# in make test; the cluster itself cannot start here. The filesystem, crypto,
# RAID-cache and image tools write the foreign signatures the adversarial
# suite (test/nodeexec) must refuse to overwrite. containerd, runc, the CNI
# plugins and a static busybox let the real kubelet of test/kubecluster run
# the pods that mount our volumes. qemu and debootstrap build and boot the
# Debian guests of the booted-machine tests (test/booted); qemu-user-static
# runs the arm64 binaries of make dist, and lintian and rpmlint (with rpm
# and groff for its checks) judge its packages (test/dist); gnupg, debsigs
# and debsig-verify sign them with a throwaway key and check the signatures;
# apt-ftparchive (apt-utils) and createrepo-c make repositories of them,
# and dnf reads the rpm one as a Fedora or RHEL node would.
tests=(chromium vagrant vagrant-libvirt shellcheck
  btrfs-progs f2fs-tools exfatprogs dosfstools ntfs-3g nilfs-tools jfsutils udftools reiserfsprogs
  cryptsetup-bin bcache-tools lvm2 xorriso squashfs-tools
  containerd runc containernetworking-plugins busybox-static
  qemu-system-x86 qemu-utils debootstrap openssh-client qemu-user-static
  lintian rpmlint rpm groff-base gnupg debsigs debsig-verify apt-utils createrepo-c dnf)
pkgs=("${base[@]}")
if [ "$mode" = all ]; then
  pkgs+=("${tests[@]}")
fi
for pkg in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages ${need[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

command -v go >/dev/null || { echo "setup: Go is not installed (need go >= 1.26, as go.mod says)" >&2; exit 1; }
# The demo's build fetches the modules it compiles; the tests need them all.
if [ "$mode" = all ]; then
  go mod download
fi

# Salt from PyPI into the project's virtualenv, nothing global.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! cmp -s salt/requirements.txt .venv/.requirements.installed; then
  echo "setup: installing Salt into .venv (salt/requirements.txt)"
  .venv/bin/pip install -q --disable-pip-version-check -r salt/requirements.txt
  cp salt/requirements.txt .venv/.requirements.installed
fi

if [ "$mode" = demo ]; then
  exit 0
fi

# The other supported Salt lines, for the Salt matrix (make test-salt) and
# the per-line benchmarks: one virtualenv each, cached outside the repository.
for line in 3006 3007; do
  scripts/salt-venv.sh "$line" >/dev/null
done

# The Kubernetes control plane the Kubernetes tests and `make demo
# DEMO_ARGS=--kubernetes` run against: built from the Go module proxy once,
# cached outside the repository (scripts/kube-tools.sh).
scripts/kube-tools.sh >/dev/null

# The Debian guest the booted-machine tests boot under qemu: debootstrap
# once (~7 minutes), cached outside the repository (scripts/guest-image.sh).
scripts/guest-image.sh >/dev/null

# promtool checks the alert rules in deploy/monitoring (make test). Only the
# tool is taken out of Debian's prometheus package: installing the package
# would start a Prometheus server listening on every interface.
promdir="${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}/prometheus"
if ! command -v promtool >/dev/null && [ ! -x "$promdir/usr/bin/promtool" ]; then
  if [ "$(id -u)" -eq 0 ] && apt-cache show prometheus >/dev/null 2>&1; then
    echo "setup: extracting promtool from Debian's prometheus package into $promdir"
    tmp=$(mktemp -d)
    if (cd "$tmp" && apt-get download -qq prometheus >/dev/null 2>&1); then
      mkdir -p "$promdir"
      dpkg-deb -x "$tmp"/prometheus_*.deb "$promdir"
    else
      echo "setup: could not download the prometheus package; the alert rules will not be checked" >&2
    fi
    rm -rf "$tmp"
  fi
fi

# helm, built from the module proxy like the Kubernetes tools, for the
# chart's lint and rendering test (test/deploy); outside the repository.
helmdir="${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}/helm-v3.22.0"
if [ ! -x "$helmdir/helm" ]; then
  echo "setup: building helm v3.22.0 into $helmdir"
  mkdir -p "$helmdir"
  GOBIN="$helmdir" go install helm.sh/helm/v3/cmd/helm@v3.22.0
fi
