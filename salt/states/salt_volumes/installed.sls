{#- Installs salt-volume-exec, the tools it runs, the state dir and the
    boot-time restore unit. Put the binary at salt://salt_volumes/files/
    (make salt-files does it; the salt-volumes package ships it there):
    salt-volume-exec.<arch> (amd64, arm64: Go's names) for each
    architecture of the fleet, picked by the minion's osarch grain; a
    plain salt-volume-exec only where the master has none of those (one
    architecture, a source install).
    On a node with the salt-volume-exec package, the package owns the
    binary and the unit: this state only makes sure of the rest. #}
include:
  - salt_volumes.beacon

{#- From the minion config only, like the module: never from pillar. #}
{%- set conf = opts.get('salt_volumes') or {} %}
{%- set exec_path = conf.get('exec_path') or '/usr/local/bin/salt-volume-exec' %}
{%- set state_dir = conf.get('state_dir') or '/var/lib/salt-volumes' %}
{%- set packaged = salt['pkg.version']('salt-volume-exec') %}
{#- Debian and RPM name architectures differently; Go as amd64, arm64. #}
{%- set goarch = {'x86_64': 'amd64', 'amd64': 'amd64', 'aarch64': 'arm64', 'arm64': 'arm64', 'armhf': 'arm', 'armv7l': 'arm',
                   'i386': '386', 'i686': '386', 'ppc64el': 'ppc64le', 'ppc64le': 'ppc64le', 's390x': 's390x', 'riscv64': 'riscv64'}.get(grains['osarch'], grains['osarch']) %}
{%- set offered = salt['cp.list_master'](saltenv=saltenv, prefix='salt_volumes/files/salt-volume-exec') %}
{%- set ns = namespace(per_arch=[]) %}
{%- for f in offered if f.startswith('salt_volumes/files/salt-volume-exec.') %}
{%- set ns.per_arch = ns.per_arch + [f] %}
{%- endfor %}
{%- set per_arch = ns.per_arch %}
{%- set own = 'salt_volumes/files/salt-volume-exec.' ~ goarch %}

salt_volumes packages:
  pkg.installed:
    - pkgs:
      - e2fsprogs
      - xfsprogs
      - util-linux

{%- if not packaged and per_arch and own not in per_arch %}

salt_volumes binary:
  test.fail_without_changes:
    - comment: >-
        no salt-volume-exec for this minion's architecture ({{ grains['osarch'] }},
        Go's {{ goarch }}) on the master, which has {{ per_arch | map('replace', 'salt_volumes/files/', '') | join(', ') }}:
        build one (CGO_ENABLED=0 GOARCH={{ goarch }} go build ./cmd/salt-volume-exec)
        and put it at salt://{{ own }}
{%- elif not packaged %}

salt_volumes binary:
  file.managed:
    - name: {{ exec_path }}
    - source: salt://{{ own if own in per_arch else 'salt_volumes/files/salt-volume-exec' }}
    - mode: '0755'
    - makedirs: True
{%- endif %}

{%- if packaged %}

{#- A source install's binary and unit (0.3.0's way) would shadow the
    package's: moved aside when they are ours. #}
salt_volumes source install retired:
  salt_volumes.source_install_retired:
    - name: salt-volume-exec source install
{%- endif %}

salt_volumes state dir:
  file.directory:
    - name: {{ state_dir }}
    - mode: '0700'
    - makedirs: True
{%- if not packaged %}

salt_volumes restore unit:
  file.managed:
    - name: /etc/systemd/system/salt-volumes-restore.service
    - source: salt://salt_volumes/files/salt-volumes-restore.service
    - template: jinja
    - context:
        exec_path: {{ exec_path }}
        state_dir: {{ state_dir }}
    - mode: '0644'

{%- endif %}

{#- The package enables its unit at its first install and leaves one the
    admin disabled so: only a source install's is enabled here. #}
{%- if not packaged %}

salt_volumes restore enabled:
  service.enabled:
    - name: salt-volumes-restore
    - onlyif: test -d /run/systemd/system
    - require:
      - file: salt_volumes restore unit
      - {{ 'test' if per_arch and own not in per_arch else 'file' }}: salt_volumes binary
{%- endif %}
