#!/usr/bin/env bash
# Builds the Debian guest the booted-machine tests boot under qemu
# (test/guest): bookworm with systemd, udev, LVM (thin pools too), mdadm, cryptsetup, the filesystems'
# tools, sshd, and Salt (salt/requirements.txt's version, from PyPI, in
# /opt/salt: the minion started once configured; the master and salt-api,
# with CherryPy, for the package tests), as an ext4 qcow2 image plus its
# kernel and initrd, and an ssh key for root. Cached outside the
# repository, keyed by this script and the Salt version; prints the
# directory. The first build takes 3-7 minutes and ~1 GB.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}
salt=$(grep -E '^salt==' salt/requirements.txt)
cherrypy=$(grep -iE '^cherrypy==' salt/requirements.txt)
key=$(printf '%s\n' "$(cat scripts/guest-image.sh)" "$salt" | sha256sum | cut -c1-12)
dir="$cache/guest-$key"
if [ -f "$dir/rootfs.qcow2" ] && [ -f "$dir/vmlinuz" ] && [ -f "$dir/initrd.img" ] && [ -f "$dir/id_ed25519" ]; then
  echo "$dir"
  exit 0
fi
for t in debootstrap qemu-img qemu-system-x86_64 ssh-keygen mkfs.ext4; do
  command -v "$t" >/dev/null || { echo "guest-image: $t is missing: make setup installs qemu-system-x86, qemu-utils and debootstrap" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "guest-image: debootstrap needs root" >&2; exit 1; }

packages=systemd-sysv,udev,dbus,linux-image-amd64,kmod,lvm2,cryptsetup-bin,thin-provisioning-tools,mdadm,e2fsprogs,xfsprogs,util-linux,iproute2,openssh-server,python3,python3-venv
mirror=${SALT_VOLUMES_DEBIAN_MIRROR:-http://deb.debian.org/debian}
tmp="$dir.tmp"
root="$tmp/root"
cleanup() {
  # debootstrap mounts /proc and /sys in the chroot; a failed run may leave them.
  for m in proc sys dev/pts dev; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
cleanup
mkdir -p "$tmp"
echo "guest-image: debootstrap bookworm into $root (~7 minutes)" >&2
if ! debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1; then
  tail -n 30 "$tmp/debootstrap.log" >&2
  exit 1
fi

echo guest >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 guest\n' >"$root/etc/hosts"
printf '/dev/vda / ext4 defaults 0 1\n' >"$root/etc/fstab"
# DHCP on the user-mode network qemu gives (10.0.2.15; the host is 10.0.2.2).
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en*\n\n[Network]\nDHCP=yes\n' >"$root/etc/systemd/network/10-wired.network"
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
# root logs in with the image's key only.
ssh-keygen -q -t ed25519 -N '' -C salt-volumes-guest -f "$tmp/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$tmp/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
printf 'PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n' >"$root/etc/ssh/sshd_config.d/guest.conf"
# Salt's minion as a pip install would give it (Debian 12 carries no Salt);
# it starts once the test has written /etc/salt/minion.d/master.conf.
# The wheels come through this machine's pip (its index, proxy and
# certificates, and its compiler for the two sdists: salt, timelib), the
# project's .venv's when setup made it; the guest's Python is the same 3.11.
pip=(python3 -m pip)
[ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
chroot "$root" python3 -m venv /opt/salt
if ! "${pip[@]}" wheel -q -w "$root/tmp/wheels" "$salt" "$cherrypy" >"$tmp/pip.log" 2>&1 ||
  ! chroot "$root" /opt/salt/bin/pip install -q --disable-pip-version-check --no-index --find-links /tmp/wheels "$salt" "$cherrypy" >>"$tmp/pip.log" 2>&1; then
  tail -n 30 "$tmp/pip.log" >&2
  exit 1
fi
rm -rf "$root/tmp/wheels"
mkdir -p "$root/etc/salt/minion.d"
cat >"$root/etc/systemd/system/salt-minion.service" <<'UNIT'
[Unit]
Description=Salt minion
After=network-online.target
Wants=network-online.target
ConditionPathExists=/etc/salt/minion.d/master.conf

[Service]
ExecStart=/opt/salt/bin/salt-minion
KillMode=process
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT
chroot "$root" systemctl enable salt-minion.service >/dev/null 2>&1
# Each boot is fresh: no id shared between the guests booted from the image.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

kernels=("$root"/boot/vmlinuz-*)
initrds=("$root"/boot/initrd.img-*)
cp "${kernels[-1]}" "$tmp/vmlinuz"
cp "${initrds[-1]}" "$tmp/initrd.img"
truncate -s 4G "$tmp/rootfs.raw"
mkfs.ext4 -q -L guest-root -d "$root" "$tmp/rootfs.raw"
qemu-img convert -O qcow2 "$tmp/rootfs.raw" "$tmp/rootfs.qcow2"
rm -f "$tmp/rootfs.raw" "$tmp/debootstrap.log" "$tmp/pip.log"
rm -rf "$root"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
