{#- salt-run state.orchestrate salt_volumes.orch.snapshot \
      pillar='{"salt_volumes": {"snapshots": {"data-1": ["before-upgrade"]}}}'
    Runs salt_volumes.snapshotted on every node holding a volume named in
    salt_volumes:snapshots or salt_volumes:snapshots_absent (volumes of
    pillar salt_volumes:volumes), in batches like deploy: each snapshot is
    taken once, each one listed as absent deleted. A name pillar does not
    define fails the run before any node is touched. #}
{%- from 'salt_volumes/orch/map.jinja' import by_node, batch_size, batch_error with context %}
{%- set wanted = salt['pillar.get']('salt_volumes:snapshots', {}) %}
{%- set unwanted = salt['pillar.get']('salt_volumes:snapshots_absent', {}) %}
{%- set wanted = wanted if wanted is mapping else {} %}
{%- set unwanted = unwanted if unwanted is mapping else {} %}
{%- set chosen = {} %}
{%- set unknown = [] %}
{%- for name in (wanted.keys() | list) + (unwanted.keys() | list) %}
{%-   set found = [] %}
{%-   for node, vols in by_node | dictsort %}
{%-     if name in vols %}{% do chosen.setdefault(node, {}).update({name: vols[name]}) %}{% do found.append(node) %}{% endif %}
{%-   endfor %}
{%-   if not found and name not in unknown %}{% do unknown.append(name | string) %}{% endif %}
{%- endfor %}
{%- if batch_error %}
salt_volumes orchestrate settings:
  test.fail_without_changes:
    - name: {{ batch_error | json }}
{%- elif unknown %}
salt_volumes unknown volumes:
  test.fail_without_changes:
    - name: {{ ("pillar salt_volumes:snapshots: " ~ unknown | join(", ") ~ ": no such volume with a node in pillar salt_volumes:volumes; no snapshot was taken") | json }}
{%- elif not chosen %}
salt_volumes no snapshots:
  test.succeed_without_changes:
    - name: No volume named in pillar salt_volumes:snapshots or salt_volumes:snapshots_absent
{%- else %}
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
          run: {{ {'volumes': vols, 'wipe': false} | json | json }}
          snapshots: {{ wanted | json }}
          snapshots_absent: {{ unwanted | json }}
    - expect_minions: True
{%- endfor %}
{%- endif %}
