#!/usr/bin/env bash
# Builds the Vagrant box the cluster boots on this machine (make vagrant-box)
# from the booted tests' guest image (scripts/guest-image.sh) and adds it to
# Vagrant as salt-volumes/debian12 for the libvirt provider. The image gains
# what Vagrant and the cluster's provisioning need and cannot fetch from
# guests with no route out: rsync (synced folder), sudo and curl from
# Debian's packages, CherryPy for salt-api, units for salt-master and salt-api
# beside the minion's, and DHCP only on interfaces Vagrant did not configure.
# The image has no bootloader (an ext4 filesystem on the whole disk), so the
# box carries its kernel and initrd and its own Vagrantfile boots them; root
# logs in with the image's key. Cached outside the repository, keyed by this
# script and the image; re-running adds the box only when it changed.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${SV_BOX_NAME:-salt-volumes/debian12}
cache=${SALT_VOLUMES_CACHE:-/var/cache/salt-volumes}
vagrant=${VAGRANT:-vagrant}
image=$(scripts/guest-image.sh)
key=$(printf '%s\n' "$(cat scripts/vagrant-box.sh)" "$image" | sha256sum | cut -c1-12)
dir="$cache/vagrant-box-$key"
box="$dir/salt-volumes.box"

added() {
  # The box's own copy of its key says which build Vagrant holds.
  local home=${VAGRANT_HOME:-$HOME/.vagrant.d}
  grep -qx "$key" "$home/boxes/${name//\//-VAGRANTSLASH-}/0/libvirt/box-key" 2>/dev/null
}

if [ ! -f "$box" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "vagrant-box: building the box loop-mounts the image: run as root" >&2; exit 1; }
  tmp="$dir.tmp"
  mnt="$tmp/mnt"
  cleanup() {
    for m in dev/pts dev sys proc; do umount "$mnt/$m" 2>/dev/null || true; done
    umount "$mnt" 2>/dev/null || true
    rm -rf "$tmp"
  }
  trap cleanup EXIT
  cleanup
  mkdir -p "$mnt" "$tmp/box"
  echo "vagrant-box: building $name from $image (~20 s)" >&2
  qemu-img convert -O raw "$image/rootfs.qcow2" "$tmp/rootfs.raw"
  # mount -o loop sets autoclear: the loop device goes with the unmount.
  mount -o loop "$tmp/rootfs.raw" "$mnt"
  for m in proc sys dev dev/pts; do mount --bind "/$m" "$mnt/$m"; done

  # apt in the chroot resolves names as this host does; the image's own
  # resolv.conf (if any) goes back afterwards.
  # (A symlink too is moved, not written through.)
  if [ -e "$mnt/etc/resolv.conf" ] || [ -h "$mnt/etc/resolv.conf" ]; then mv "$mnt/etc/resolv.conf" "$tmp/resolv.conf"; fi
  cp /etc/resolv.conf "$mnt/etc/resolv.conf"
  export DEBIAN_FRONTEND=noninteractive
  if ! chroot "$mnt" apt-get update -qq >"$tmp/apt.log" 2>&1 ||
    ! chroot "$mnt" apt-get install -y -qq --no-install-recommends rsync sudo curl ca-certificates >>"$tmp/apt.log" 2>&1; then
    tail -n 30 "$tmp/apt.log" >&2
    exit 1
  fi
  chroot "$mnt" apt-get clean
  rm -rf "$mnt/var/lib/apt/lists/"*
  rm -f "$mnt/etc/resolv.conf"
  if [ -e "$tmp/resolv.conf" ] || [ -h "$tmp/resolv.conf" ]; then mv "$tmp/resolv.conf" "$mnt/etc/resolv.conf"; fi

  # salt-api's rest_cherrypy, at the version the project's test master uses.
  pip=(python3 -m pip)
  [ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
  cherrypy=$(grep -iE '^cherrypy==' salt/requirements.txt || echo CherryPy)
  if ! "${pip[@]}" wheel -q -w "$mnt/tmp/wheels" "$cherrypy" >"$tmp/pip.log" 2>&1 ||
    ! chroot "$mnt" /opt/salt/bin/pip install -q --disable-pip-version-check --no-index --find-links /tmp/wheels "$cherrypy" >>"$tmp/pip.log" 2>&1; then
    tail -n 30 "$tmp/pip.log" >&2
    exit 1
  fi
  rm -rf "$mnt/tmp/wheels"
  for b in salt salt-api salt-call salt-cp salt-key salt-master salt-minion salt-run; do
    ln -sfn "/opt/salt/bin/$b" "$mnt/usr/local/bin/$b"
  done
  # salt-master and salt-api run like the image's minion unit. Provisioning
  # enables what each machine runs, and the minion starts from whichever
  # file names its master (the image's unit waits for master.conf).
  unit="$mnt/etc/systemd/system/salt-minion.service"
  sed -i '/^ConditionPathExists=/d' "$unit"
  for svc in master api; do
    sed "s/minion/$svc/g" "$unit" >"$mnt/etc/systemd/system/salt-$svc.service"
  done
  rm -f "$mnt/etc/systemd/system/multi-user.target.wants/salt-minion.service"
  # networkd takes the first file that matches an interface: Vagrant's
  # 50-vagrant-<if>.network must come before the catch-all DHCP one.
  mv "$mnt/etc/systemd/network/10-wired.network" "$mnt/etc/systemd/network/99-dhcp.network"

  for m in dev/pts dev sys proc; do umount "$mnt/$m"; done
  umount "$mnt"
  b="$tmp/box"
  qemu-img convert -O qcow2 "$tmp/rootfs.raw" "$b/box.img"
  rm -f "$tmp/rootfs.raw"
  size=$(qemu-img info --output=json "$b/box.img" | python3 -c 'import json,sys; print(-(-json.load(sys.stdin)["virtual-size"] // 2**30))')
  printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %s}\n' "$size" >"$b/metadata.json"
  cp "$image/vmlinuz" "$image/initrd.img" "$image/id_ed25519" "$b/"
  echo "$key" >"$b/box-key"
  cat >"$b/Vagrantfile" <<'BOXFILE'
# salt-volumes/debian12, built by scripts/vagrant-box.sh: Debian 12 with
# udev, LVM, Salt in /opt/salt. No bootloader: libvirt boots the kernel
# and initrd shipped in this box; qemu's software emulation, since this
# box is made for hosts whose KVM guests cannot use.
Vagrant.configure("2") do |config|
  config.ssh.username = "root"
  config.ssh.private_key_path = File.join(__dir__, "id_ed25519")
  config.vm.boot_timeout = 600
  config.vm.provider :libvirt do |lv|
    lv.driver = "qemu"
    lv.cpu_mode = "custom"
    lv.cpu_model = "Westmere"
    lv.kernel = File.join(__dir__, "vmlinuz")
    lv.initrd = File.join(__dir__, "initrd.img")
    lv.cmd_line = "root=/dev/vda rw console=ttyS0 quiet"
    lv.graphics_type = "none"
    lv.video_type = "none"
  end
end
BOXFILE
  tar -cf "$b.tar" -C "$b" .
  mv "$b.tar" "$tmp/salt-volumes.box"
  rm -rf "$b" "$mnt"
  rm -f "$tmp/apt.log" "$tmp/pip.log"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  trap - EXIT
  # Earlier builds are superseded: ~1 GB each.
  find "$cache" -maxdepth 1 -name 'vagrant-box-*' ! -name "vagrant-box-$key" ! -name '*.tmp' -exec rm -rf {} +
fi

if ! added; then
  "$vagrant" box add --force --name "$name" --provider libvirt "$box" >&2
  # A box image vagrant-libvirt already uploaded to its storage pool under
  # this name is stale now. A fresh libvirt has no pool yet (vagrant-libvirt
  # makes it at the first vagrant up): then there is nothing to drop, and
  # listing it would fail the script under pipefail.
  if virsh -c qemu:///system pool-info default >/dev/null 2>&1; then
    virsh -c qemu:///system vol-list default | awk '$1 ~ /^salt-volumes-VAGRANTSLASH-debian12/ {print $1}' |
      while read -r vol; do virsh -c qemu:///system vol-delete --pool default "$vol" >/dev/null || true; done
  fi
fi
echo "$name"
