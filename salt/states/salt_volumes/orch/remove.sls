{#- salt-run state.orchestrate salt_volumes.orch.remove \
      pillar='{"salt_volumes": {"orch": {"remove": ["data-1", "db-1"]}}}'
    Removes the volumes named in salt_volumes:orch:remove (volumes of pillar
    salt_volumes:volumes) from their nodes with salt_volumes.unprepared, in
    batches like deploy. Raw devices keep their data unless salt_volumes:wipe
    is true. Only named volumes: there is no "all", and a name pillar does not
    define fails the run before any node is touched. A volume in use, or with
    snapshots, is refused by its node, named. #}
{%- from 'salt_volumes/orch/map.jinja' import by_node, batch_size, batch_error with context %}
{%- set names = salt['pillar.get']('salt_volumes:orch:remove', []) %}
{%- set names = [names] if names is string else names %}
{%- set wipe = salt['pillar.get']('salt_volumes:wipe', False) %}
{%- set chosen = {} %}
{%- set unknown = [] %}
{%- for name in (names if names is iterable and names is not mapping else []) %}
{%-   set found = [] %}
{%-   for node, vols in by_node | dictsort %}
{%-     if name in vols %}{% do chosen.setdefault(node, {}).update({name: vols[name]}) %}{% do found.append(node) %}{% endif %}
{%-   endfor %}
{%-   if not found %}{% do unknown.append(name | string) %}{% endif %}
{%- endfor %}
{%- if batch_error %}
salt_volumes orchestrate settings:
  test.fail_without_changes:
    - name: {{ batch_error | json }}
{%- elif names is not iterable or names is mapping or not names %}
salt_volumes nothing named:
  test.fail_without_changes:
    - name: "pillar salt_volumes:orch:remove: list the names of the volumes to remove (volumes of salt_volumes:volumes); nothing was removed"
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
          run: {{ {'volumes': vols, 'wipe': (wipe is sameas true)} | json | json }}
    - expect_minions: True
{%- endfor %}
{%- endif %}
