{#- salt-run state.orchestrate salt_volumes.orch.remove \
      pillar='{"salt_volumes": {"orch": {"remove": "data-1,db-1"}}}'
    Removes the volumes salt_volumes:orch:remove names (a string of names
    separated by commas: volumes of pillar salt_volumes:volumes) from their
    nodes with salt_volumes.unprepared, in batches like deploy. Raw devices
    keep their data unless salt_volumes:orch:wipe is true (the nodes' own
    salt_volumes:wipe does not count). Only named volumes: there is no
    "all", and a name pillar does not define fails the run before any node
    is touched. A volume in use, or with snapshots, is refused by its node,
    named. #}
{%- from 'salt_volumes/orch/map.jinja' import by_node, choose, batch_size, batch_error, volumes_error with context %}
{%- set raw = salt['pillar.get']('salt_volumes:orch:remove') %}
{%- set names = (raw.split(',') | map('trim') | reject('equalto', '') | list) if raw is string else [] %}
{%- set wipe = salt['pillar.get']('salt_volumes:orch:wipe', False) %}
{%- set chosen = {} %}
{%- set unknown = [] %}
{{- choose(raw, chosen, unknown) }}
{%- if batch_error or volumes_error %}
salt_volumes orchestrate settings:
  test.fail_without_changes:
    - name: {{ (batch_error or volumes_error) | json }}
{%- elif raw is not string or not names %}
salt_volumes nothing named:
  test.fail_without_changes:
    - name: "pillar salt_volumes:orch:remove: name the volumes to remove (of salt_volumes:volumes) in one string, separated by commas, e.g. \"data-1,db-1\"; nothing was removed"
{%- elif wipe is not sameas true and wipe is not sameas false %}
salt_volumes wipe setting:
  test.fail_without_changes:
    - name: {{ ("pillar salt_volumes:orch:wipe: " ~ (wipe | string) ~ " is not true or false; nothing was removed") | json }}
{%- elif unknown %}
salt_volumes unknown volumes:
  test.fail_without_changes:
    - name: {{ ("pillar salt_volumes:orch:remove: " ~ unknown | join(", ") ~ ": no such volume with a node in pillar salt_volumes:volumes; nothing was removed") | json }}
{%- else %}
{%- for nodes in chosen | sort | batch(batch_size | int) %}
{%-   set vols = {} %}
{%-   for node in nodes %}{% do vols.update(chosen[node]) %}{% endfor %}
{{ ("salt_volumes removed on " ~ nodes | join(", ")) | json }}:
  salt.state:
    - tgt: {{ nodes | json }}
    - tgt_type: list
    - sls:
      - salt_volumes.unprepared
    - pillar:
        salt_volumes:
          run: {{ {'volumes': vols, 'wipe': wipe} | json | json }}
    - expect_minions: True
{%- endfor %}
{%- endif %}
