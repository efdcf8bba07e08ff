{#- Removes the volumes of the run (salt_volumes:run, as apply_volume and
    the orchestrate files pass them) or the single volume in pillar
    salt_volumes:volume when given, else every volume of this minion in
    salt_volumes:volumes. Raw devices keep their data unless the run asks
    for a wipe (or, without a run, pillar salt_volumes:wipe is true). #}
{%- set volumes = salt['salt_volumes.volumes']() %}
{%- set wipe = salt['salt_volumes.wipe_requested']() %}
{%- if not volumes %}
salt_volumes nothing to remove:
  test.succeed_without_changes:
    - name: No volume for {{ grains['id'] }} in pillar salt_volumes
{%- endif %}
{%- for name, spec in volumes | dictsort %}
{{ ("salt_volumes " ~ name ~ " absent") | json }}:
  salt_volumes.absent:
    - name: {{ name | json }}
    - spec: {{ spec | json }}
    - wipe: {{ wipe | json }}
{%- endfor %}
