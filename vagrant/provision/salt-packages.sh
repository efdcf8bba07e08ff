# Sourced by master.sh and minion.sh: installs Salt packages from the Salt
# Project's official Debian repository, pinned to one major release, unless
# the box carries Salt already (salt-volumes/debian12, make vagrant-box: a
# pip install in /opt/salt, units for each daemon, no route to any
# repository).
# Usage: install_salt <major|latest> <package>...

# The Python that runs Salt: the box's, or the official onedir packages'.
salt_python() {
  if box_has_salt; then echo /opt/salt/bin/python3; else echo /opt/saltstack/salt/bin/python3; fi
}

box_has_salt() {
  [ -x /opt/salt/bin/salt-call ]
}

install_salt() {
  local version=$1
  shift
  if box_has_salt; then
    echo "Salt from the box: $(/opt/salt/bin/salt-call --version) (SV_SALT_VERSION=$version not used)"
    return 0
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! dpkg-query -W -f='${Status}' "$@" 2>/dev/null | grep -q "install ok installed"; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends curl gnupg ca-certificates >/dev/null
    install -d -m 0755 /etc/apt/keyrings
    curl -fsSL https://packages.broadcom.com/artifactory/api/security/keypair/SaltProjectKey/public |
      gpg --dearmor --yes -o /etc/apt/keyrings/salt-archive-keyring.pgp
    cat >/etc/apt/sources.list.d/salt.sources <<SOURCES
Types: deb
URIs: https://packages.broadcom.com/artifactory/saltproject-deb
Suites: stable
Components: main
Signed-By: /etc/apt/keyrings/salt-archive-keyring.pgp
SOURCES
    if [ "$version" != latest ]; then
      printf 'Package: salt-*\nPin: version %s.*\nPin-Priority: 1001\n' "$version" >/etc/apt/preferences.d/salt-pin-1001
    fi
    apt-get update -qq
    apt-get install -y -qq "$@" >/dev/null
  fi
  dpkg-query -W "$@"
}
