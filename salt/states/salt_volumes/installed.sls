{#- Installs salt-volume-exec, the tools it runs, the state dir and the
    boot-time restore unit. Put the binary at salt://salt_volumes/files/
    (make salt-files does it; the salt-volumes package ships it there).
    On a node with the salt-volume-exec package, the package owns the
    binary and the unit: this state only makes sure of the rest. #}
include:
  - salt_volumes.beacon

{#- From the minion config only, like the module: never from pillar. #}
{%- set conf = opts.get('salt_volumes') or {} %}
{%- set exec_path = conf.get('exec_path') or '/usr/local/bin/salt-volume-exec' %}
{%- set state_dir = conf.get('state_dir') or '/var/lib/salt-volumes' %}
{%- set packaged = salt['pkg.version']('salt-volume-exec') %}

salt_volumes packages:
  pkg.installed:
    - pkgs:
      - e2fsprogs
      - xfsprogs
      - util-linux

{%- if not packaged %}

salt_volumes binary:
  file.managed:
    - name: {{ exec_path }}
    - source: salt://salt_volumes/files/salt-volume-exec
    - mode: '0755'
    - makedirs: True
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

salt_volumes restore enabled:
  service.enabled:
    - name: salt-volumes-restore
    - onlyif: test -d /run/systemd/system
{%- if not packaged %}
    - require:
      - file: salt_volumes restore unit
      - file: salt_volumes binary
{%- endif %}
