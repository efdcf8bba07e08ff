#!/usr/bin/env bash
# make vagrant-check: the Vagrant cluster from an empty libvirt, timed. Our
# three machines are destroyed, our box is removed from Vagrant and its
# uploaded image from libvirt's default pool, so that make vagrant-up builds
# and uploads it again as on a fresh host; then make vagrant-e2e and make
# vagrant-down. Each step's time is printed; the first failure stops the
# run (the machines are left up for a look: make vagrant-down).
set -euo pipefail
cd "$(dirname "$0")/.."
vagrant=${VAGRANT:-vagrant}
name=${SV_BOX:-salt-volumes/debian12}
virsh=(virsh -c qemu:///system)

step() {
  local what=$1 t0=$SECONDS
  shift
  echo "vagrant-check: $what" >&2
  "$@"
  echo "vagrant-check: $what took $((SECONDS - t0)) s" >&2
}

forget() {
  (cd vagrant && "$vagrant" destroy -f) || true
  if "$vagrant" box list 2>/dev/null | awk '{print $1}' | grep -qx "$name"; then
    "$vagrant" box remove --force --all "$name" >/dev/null
  fi
  if "${virsh[@]}" pool-info default >/dev/null 2>&1; then
    "${virsh[@]}" vol-list default | awk -v p="${name//\//-VAGRANTSLASH-}" 'index($1, p) == 1 {print $1}' |
      while read -r vol; do "${virsh[@]}" vol-delete --pool default "$vol" >/dev/null; done
  fi
}

start=$SECONDS
step "removing our machines, box and box image" forget
step "make vagrant-up" make --no-print-directory vagrant-up
step "make vagrant-e2e" make --no-print-directory vagrant-e2e
step "make vagrant-down" make --no-print-directory vagrant-down
echo "vagrant-check: passed in $((SECONDS - start)) s" >&2
