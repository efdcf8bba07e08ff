{#- Snapshot schedules, run by this minion's own Salt scheduler: one Salt
    schedule entry (salt-volumes-snapshot-<name>) per schedule in pillar
    salt_volumes:snapshot_schedules, calling
    salt_volumes.run_snapshot_schedule <name>; the entries of schedules that
    left pillar are removed, and those schedules no longer reported (their
    snapshots stay, released: never pruned). By default a schedule takes
    only the volumes of this minion's pillar, no raw one (any_volume: true,
    raw_volumes: true to widen it: see docs/operations.md). A bad schedule fails this state, naming the
    field, and nothing is changed. Needs the modules on the minion
    (saltutil.sync_all, or salt_volumes.installed first).
      salt_volumes:
        snapshot_schedules:
          nightly:
            volumes: [data-1]   # or match: 'db-*'
            every: 1h           # or daily_at: '02:00'
            keep: 24            # and/or max_age: 7d #}
{%- set plan = salt['salt_volumes.snapshot_schedule_plan']() %}
{%- if plan.error %}
salt_volumes snapshot schedules:
  test.fail_without_changes:
    - name: salt_volumes snapshot schedules
    - comment: {{ plan.error | json }}
{%- else %}
salt_volumes snapshot schedules:
  test.succeed_without_changes:
    - name: Snapshot schedules of {{ grains['id'] }} in pillar salt_volumes:snapshot_schedules
{%- for entry, item in plan.present | dictsort %}
{{ ("salt_volumes schedule " ~ entry) | json }}:
  schedule.present:
    - name: {{ entry | json }}
{%- for key, value in item | dictsort %}
    - {{ key }}: {{ value | json }}
{%- endfor %}
{%- endfor %}
{%- for entry in plan.absent %}
{{ ("salt_volumes schedule " ~ entry ~ " absent") | json }}:
  schedule.absent:
    - name: {{ entry | json }}
{{ ("salt_volumes schedule " ~ entry ~ " retired") | json }}:
  salt_volumes.snapshot_schedule_retired:
    - name: {{ entry[plan.prefix | length:] | json }}
    - require:
      - schedule: {{ ("salt_volumes schedule " ~ entry ~ " absent") | json }}
{%- endfor %}
{%- endif %}
