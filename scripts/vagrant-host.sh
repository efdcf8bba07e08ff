#!/usr/bin/env bash
# Makes this machine a libvirt host for the Vagrant cluster (make vagrant-up
# runs it): Vagrant, vagrant-libvirt, libvirt's daemon, dnsmasq (DHCP on
# libvirt's networks) and qemu from Debian's packages, then a running
# libvirtd. Where systemd runs, it starts the packaged units; where it does
# not (a container or microVM whose PID 1 is something else), it starts
# virtlogd and libvirtd itself, with qemu running as root and no security
# driver, since the box's kernel and initrd live in root's Vagrant home and
# no AppArmor or SELinux profile can be loaded there. Re-running converges.
set -euo pipefail

want=(vagrant vagrant-libvirt libvirt-daemon-system dnsmasq-base qemu-system-x86 qemu-utils rsync)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || { echo "vagrant-host: ${missing[*]} missing; run as root to install them" >&2; exit 1; }
  echo "vagrant-host: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if virsh -c qemu:///system version >/dev/null 2>&1; then
  exit 0
fi
if [ -d /run/systemd/system ]; then
  systemctl start libvirtd.service
else
  conf=/etc/libvirt/qemu.conf
  if ! grep -q '^# salt-volumes: no systemd' "$conf"; then
    printf '\n# salt-volumes: no systemd, no LSM on this host (scripts/vagrant-host.sh)\nuser = "root"\ngroup = "root"\nsecurity_driver = "none"\n' >>"$conf"
  fi
  pgrep -x virtlogd >/dev/null || virtlogd -d
  pgrep -x libvirtd >/dev/null || libvirtd -d
fi
for _ in $(seq 30); do
  virsh -c qemu:///system version >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "vagrant-host: libvirtd does not answer on qemu:///system" >&2
exit 1
