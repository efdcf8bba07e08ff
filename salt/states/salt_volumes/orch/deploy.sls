{#- salt-run state.orchestrate salt_volumes.orch.deploy
    Applies every node's volumes from pillar salt_volumes:volumes, node by
    node, and fails naming the node (and the volume, in its state comment)
    when one fails. #}
{%- set volumes = salt['pillar.get']('salt_volumes:volumes', {}) %}
{%- set by_node = {} %}
{%- for name, spec in volumes | dictsort %}
{%-   set node = spec.get('node') if spec is mapping else None %}
{%-   if node %}{% do by_node.setdefault(node, {}).update({name: spec}) %}{% endif %}
{%- endfor %}
{%- if not by_node %}
salt_volumes no volumes:
  test.succeed_without_changes:
    - name: No volume with a node in pillar salt_volumes:volumes
{%- endif %}
{%- for node, vols in by_node | dictsort %}
{{ ("salt_volumes on " ~ node) | json }}:
  salt.state:
    - tgt: {{ node | json }}
    - sls:
      - salt_volumes.prepared
    - pillar:
        salt_volumes:
          volumes: {{ vols | json }}
    - expect_minions: True
{%- endfor %}
