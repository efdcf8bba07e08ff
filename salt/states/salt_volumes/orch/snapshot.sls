{#- salt-run state.orchestrate salt_volumes.orch.snapshot \
      pillar='{"salt_volumes": {"orch": {"volumes": "data-1,db-1", "snapshot": "before-upgrade"}}}'
    Takes the snapshot salt_volumes:orch:snapshot (taken once: a snapshot is
    a point in time) of each volume salt_volumes:orch:volumes names (a string
    of names separated by commas: volumes of pillar salt_volumes:volumes),
    or deletes the snapshot salt_volumes:orch:snapshot_absent names, on
    those volumes' nodes, in batches like deploy. Only the names typed count:
    the snapshots the nodes' own pillar lists are not part of the run. A
    volume pillar does not define fails the run before any node is touched. #}
{%- from 'salt_volumes/orch/map.jinja' import by_node, choose, batch_size, batch_error, volumes_error with context %}
{%- set raw = salt['pillar.get']('salt_volumes:orch:volumes') %}
{%- set names = (raw.split(',') | map('trim') | reject('equalto', '') | list) if raw is string else [] %}
{%- set take = salt['pillar.get']('salt_volumes:orch:snapshot') %}
{%- set take = take if take is string else '' %}
{%- set drop = salt['pillar.get']('salt_volumes:orch:snapshot_absent') %}
{%- set drop = drop if drop is string else '' %}
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
    - name: "pillar salt_volumes:orch:volumes: name the volumes (of salt_volumes:volumes) in one string, separated by commas, e.g. \"data-1,db-1\"; no snapshot was taken"
{%- elif (take and drop) or not (take or drop) %}
salt_volumes snapshot named:
  test.fail_without_changes:
    - name: "pillar salt_volumes:orch: give one snapshot name, as snapshot (to take) or snapshot_absent (to delete), not both; nothing was done"
{%- elif unknown %}
salt_volumes unknown volumes:
  test.fail_without_changes:
    - name: {{ ("pillar salt_volumes:orch:volumes: " ~ unknown | join(", ") ~ ": no such volume with a node in pillar salt_volumes:volumes; nothing was done") | json }}
{%- else %}
{%- set lists = {'snapshots': {}, 'snapshots_absent': {}} %}
{%- for name in names %}
{%-   if take %}{% do lists['snapshots'].update({name: [take]}) %}{% else %}{% do lists['snapshots_absent'].update({name: [drop]}) %}{% endif %}
{%- endfor %}
{%- for nodes in chosen | sort | batch(batch_size | int) %}
{%-   set vols = {} %}
{%-   for node in nodes %}{% do vols.update(chosen[node]) %}{% endfor %}
{{ ("salt_volumes snapshots on " ~ nodes | join(", ")) | json }}:
  salt.state:
    - tgt: {{ nodes | json }}
    - tgt_type: list
    - sls:
      - salt_volumes.snapshotted
    - pillar:
        salt_volumes:
          run: {{ {'volumes': vols, 'wipe': false, 'snapshots': lists['snapshots'], 'snapshots_absent': lists['snapshots_absent']} | json | json }}
    - expect_minions: True
{%- endfor %}
{%- endif %}
