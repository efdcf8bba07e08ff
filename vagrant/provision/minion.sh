#!/usr/bin/env bash
# Vagrant minion: salt-minion from the official packages, pointed at the
# master; then salt_volumes.installed (binary, mkfs tools, restore unit) and
# a grain naming the two blank spare disks for the end-to-end scenario.
set -euo pipefail
SALT_VERSION=${1:-3008}
MASTER=$2
ID=$3
# shellcheck source=salt-packages.sh
. /vagrant/vagrant/provision/salt-packages.sh

install_salt "$SALT_VERSION" salt-minion
install -d -m 0755 /etc/salt/minion.d
printf 'master: %s\nid: %s\n' "$MASTER" "$ID" >/etc/salt/minion.d/salt-volumes.conf
echo "$ID" >/etc/salt/minion_id
systemctl enable salt-minion
systemctl restart salt-minion

# The master accepts the key on its own (auto_accept, test cluster only).
for _ in $(seq 60); do
  salt-call --out=quiet test.ping 2>/dev/null && break
  sleep 2
done
salt-call saltutil.sync_all
salt-call state.apply salt_volumes.installed

# Spare disks: whole disks other than the boot disk with no partition and
# no signature. Recorded once; later runs keep the grain even when the
# disks hold volumes.
# The grain's disks, one line; empty when unset. (Salt 3008 has no
# newline_values_only outputter any more: read its JSON.)
disks_grain() {
  salt-call --out=json grains.get salt_volumes_e2e:disks |
    python3 -c 'import json, sys; v = json.load(sys.stdin)["local"]; print(" ".join(v) if v else "")'
}
if [ -z "$(disks_grain)" ]; then
  boot=$(lsblk -no PKNAME "$(findmnt -no SOURCE /)")
  spare=()
  while read -r name type; do
    if [ "$type" != disk ] || [ "$name" = "$boot" ]; then continue; fi
    [ "$(lsblk -no NAME "/dev/$name" | wc -l)" -eq 1 ] || continue
    blkid -p "/dev/$name" >/dev/null 2>&1 && continue
    spare+=("/dev/$name")
  done < <(lsblk -dno NAME,TYPE)
  if [ "${#spare[@]}" -ne 2 ]; then
    echo "minion: expected 2 blank spare disks, found ${#spare[@]}: ${spare[*]:-none}" >&2
    lsblk >&2
    exit 1
  fi
  salt-call grains.set salt_volumes_e2e:disks "[\"${spare[0]}\",\"${spare[1]}\"]" force=True
fi
disks=$(disks_grain)
[ -n "$disks" ] || { echo "minion $ID: the grain salt_volumes_e2e:disks was not set" >&2; exit 1; }
echo "minion $ID: ready, spare disks $disks"
