#!/usr/bin/env bash
# Vagrant master: salt-master and salt-api from the official packages, the
# checkout's Salt tree, the control plane's salt-api account and
# salt-volumes serve as a systemd unit. Re-running it converges (make
# vagrant-e2e does, to install freshly built binaries).
set -euo pipefail
SALT_VERSION=${1:-3008}
SRC=/vagrant
# shellcheck source=salt-packages.sh
. "$SRC/vagrant/provision/salt-packages.sh"

for f in bin/salt-volumes bin/salt-volumes-e2e salt/states/salt_volumes/files/salt-volume-exec; do
  [ -x "$SRC/$f" ] || { echo "master: $f is missing: run make vagrant-up (it builds them) on the host" >&2; exit 1; }
done

install_salt "$SALT_VERSION" salt-master salt-api
# The onedir packages ship CherryPy for rest_cherrypy in most releases; add
# it when one does not.
"$(salt_python)" -c 'import cherrypy' 2>/dev/null || salt-pip install cherrypy

# The master's config for salt-volumes, as operators install it, with the
# checkout where /opt/salt-volumes would be.
install -d -m 0755 /etc/salt/master.d
sed "s#/opt/salt-volumes#$SRC#g" "$SRC/deploy/master.d/salt-volumes.conf" >/etc/salt/master.d/salt-volumes.conf
# Test cluster only: accept the minions' keys without salt-key.
echo 'auto_accept: True' >/etc/salt/master.d/vagrant.conf

# (A box with Salt from pip has no /etc/salt/master: awk's complaint is no answer.)
master_user=$({ awk '/^user:/ {print $2}' /etc/salt/master /etc/salt/master.d/*.conf 2>/dev/null || true; } | tail -n1)
master_user=${master_user:-root}

# Secrets: generated once, never printed.
install -d -m 0750 -o root -g "$master_user" /etc/salt-volumes
umask 077
[ -s /etc/salt-volumes/salt-api-password ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >/etc/salt-volumes/salt-api-password
[ -s /etc/salt-volumes/token ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >/etc/salt-volumes/token
printf 'salt-volumes:%s\n' "$(cat /etc/salt-volumes/salt-api-password)" >/etc/salt/api-users
chown "$master_user" /etc/salt/api-users
chmod 0600 /etc/salt/api-users
chgrp "$master_user" /etc/salt-volumes/salt-api-password /etc/salt-volumes/token
chmod 0640 /etc/salt-volumes/salt-api-password /etc/salt-volumes/token
umask 022

systemctl enable salt-master salt-api
systemctl restart salt-master salt-api
# The runner that answers for people's Salt ACLs when they log in to
# salt-volumes (docs/security.md, Logins).
salt-run --out=quiet saltutil.sync_runners || echo "salt-run saltutil.sync_runners failed: logins with a Salt identity will not work until it runs" >&2

# The control plane. It listens on all addresses inside the VM so the host
# reaches it through the forwarded port; the token guards every call, in
# clear on the VM's private network (insecure: true; a real master sets
# tls.certFile and tls.keyFile instead).
install -m 0755 "$SRC/bin/salt-volumes" /usr/local/bin/salt-volumes
install -m 0755 "$SRC/bin/salt-volumes-e2e" /usr/local/bin/salt-volumes-e2e
sed 's#^listen: .*#listen: 0.0.0.0:8080\ninsecure: true#' "$SRC/deploy/config.yaml" >/etc/salt-volumes/config.yaml
chgrp "$master_user" /etc/salt-volumes/config.yaml
chmod 0640 /etc/salt-volumes/config.yaml
install -m 0644 "$SRC/deploy/salt-volumes.service" /etc/systemd/system/salt-volumes.service
# serve runs as its own user, in the master's group only (the unit's
# comment says why); here the master's group is that of $master_user.
id salt-volumes >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin --user-group salt-volumes
master_group=$(id -gn "$master_user")
usermod -a -G "$master_group" salt-volumes
install -d /etc/systemd/system/salt-volumes.service.d
rm -f /etc/systemd/system/salt-volumes.service.d/user.conf
printf '[Service]\nSupplementaryGroups=\nSupplementaryGroups=%s\n' "$master_group" >/etc/systemd/system/salt-volumes.service.d/group.conf
systemctl daemon-reload
systemctl enable salt-volumes
systemctl restart salt-volumes

# The CLI for root on the master: vagrant ssh master, sudo -i, salt-volumes ls.
cat >/etc/profile.d/salt-volumes.sh <<'PROFILE'
export SALT_VOLUMES_URL=http://127.0.0.1:8080
export SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token
PROFILE

for _ in $(seq 60); do
  curl -fsS http://127.0.0.1:8080/readyz >/dev/null 2>&1 && break
  sleep 2
done
curl -fsS http://127.0.0.1:8080/readyz >/dev/null || { journalctl -u salt-volumes -n 50 --no-pager; exit 1; }
echo "master: salt-volumes serve is ready; UI on the host at http://127.0.0.1:<SV_UI_PORT, default 8080>/ (token: sudo cat /etc/salt-volumes/token)"
