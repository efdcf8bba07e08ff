{#- Snapshots a pillar-driven fleet keeps: salt_volumes:snapshots maps a
    volume of this minion (salt_volumes:volumes) to the names of its
    snapshots; each is taken once. A name under salt_volumes:snapshots_absent
    (same shape) is deleted. A run of salt_volumes.orch.snapshot passes its
    own volumes and names instead (salt_volumes:run), and only those count. #}
{%- set volumes = salt['salt_volumes.volumes']() %}
{%- set lists = salt['salt_volumes.snapshot_lists']() %}
{%- set wanted = lists['snapshots'] %}
{%- set unwanted = lists['snapshots_absent'] %}
salt_volumes snapshots:
  test.succeed_without_changes:
    - name: Snapshots of the volumes of {{ grains['id'] }} in pillar salt_volumes:snapshots
{%- for volume, spec in volumes | dictsort %}
{%- for snap in wanted.get(volume, []) %}
{{ ("salt_volumes snapshot " ~ volume ~ " " ~ snap) | json }}:
  salt_volumes.snapshot_present:
    - name: {{ snap | json }}
    - volume: {{ volume | json }}
    - spec: {{ spec | json }}
{%- endfor %}
{%- for snap in unwanted.get(volume, []) %}
{{ ("salt_volumes snapshot " ~ volume ~ " " ~ snap ~ " absent") | json }}:
  salt_volumes.snapshot_absent:
    - name: {{ snap | json }}
    - volume: {{ volume | json }}
    - spec: {{ spec | json }}
{%- endfor %}
{%- endfor %}
