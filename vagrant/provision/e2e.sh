#!/usr/bin/env bash
# Runs on the master (make vagrant-e2e): installs what make built since the
# last provisioning, on the master and on every minion, then plays the
# end-to-end scenario on the given nodes.
set -euo pipefail
SRC=/vagrant
install -m 0755 "$SRC/bin/salt-volumes-e2e" /usr/local/bin/salt-volumes-e2e
if ! cmp -s "$SRC/bin/salt-volumes" /usr/local/bin/salt-volumes; then
  install -m 0755 "$SRC/bin/salt-volumes" /usr/local/bin/salt-volumes
  systemctl restart salt-volumes
fi
# Minions busy right after provisioning answer after Salt's default 5 s.
salt --timeout=600 --out=txt '*' saltutil.sync_all >/dev/null
salt --timeout=600 --state-output=terse '*' state.apply salt_volumes.installed

export SALT_VOLUMES_URL=http://127.0.0.1:8080 SALT_VOLUMES_TOKEN_FILE=/etc/salt-volumes/token
for _ in $(seq 30); do
  curl -fsS "$SALT_VOLUMES_URL/readyz" >/dev/null 2>&1 && break
  sleep 1
done
args=()
for n in "$@"; do args+=(--node "$n"); done
salt-volumes nodes
exec salt-volumes-e2e "${args[@]}"
