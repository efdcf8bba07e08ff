{#- The single volume in pillar salt_volumes:volume when given, else every
    volume in salt_volumes:volumes whose node is this minion. #}
{%- set volumes = salt['salt_volumes.volumes']() %}
{%- if not volumes %}
salt_volumes nothing to prepare:
  test.succeed_without_changes:
    - name: No volume for {{ grains['id'] }} in pillar salt_volumes
{%- endif %}
{%- for name, spec in volumes | dictsort %}
{{ ("salt_volumes " ~ name) | json }}:
  salt_volumes.prepared:
    - name: {{ name | json }}
    - spec: {{ spec | json }}
{%- endfor %}
