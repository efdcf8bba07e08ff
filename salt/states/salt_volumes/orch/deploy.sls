{#- salt-run state.orchestrate salt_volumes.orch.deploy
    Applies every node's volumes from pillar salt_volumes:volumes, in
    batches of salt_volumes:orch:batch nodes (default 1: node by node), and
    fails naming the node (and the volume, in its state comment) when one
    fails. A failed batch does not stop the next: each node's run is
    independent and idempotent, so run it again once the node is fixed. #}
{%- from 'salt_volumes/orch/map.jinja' import by_node, batch_size, batch_error, volumes_error with context %}
{%- if batch_error or volumes_error %}
salt_volumes orchestrate settings:
  test.fail_without_changes:
    - name: {{ (batch_error or volumes_error) | json }}
{%- elif not by_node %}
salt_volumes no volumes:
  test.succeed_without_changes:
    - name: No volume with a node in pillar salt_volumes:volumes
{%- else %}
{%- for nodes in by_node | sort | batch(batch_size | int) %}
{%-   set vols = {} %}
{%-   for node in nodes %}{% do vols.update(by_node[node]) %}{% endfor %}
{{ ("salt_volumes on " ~ nodes | join(", ")) | json }}:
  salt.state:
    - tgt: {{ nodes | json }}
    - tgt_type: list
    - sls:
      - salt_volumes.prepared
    - pillar:
        salt_volumes:
          run: {{ {'volumes': vols, 'wipe': false} | json | json }}
    - expect_minions: True
{%- endfor %}
{%- endif %}
