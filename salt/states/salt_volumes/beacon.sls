{#- Turns on the salt_volumes beacon: the minion pushes its volumes' health,
    usage and capacity to the control plane (salt-volumes/node/<id>/health).
    Timings from the minion config, like the rest of the formula:
      salt_volumes:
        beacon_interval: 10     # seconds between checks
        beacon_heartbeat: 300   # seconds between events when nothing changes #}
{%- set conf = opts.get('salt_volumes') or {} %}

# The beacon runs the salt_volumes execution module, and the formulas'
# next runs its state module: all three kinds must be on the minion, and
# nothing else (sync_all would sync every custom grain, pillar, returner
# and runner of every environment on each run). Not by extmod_whitelist:
# Salt then deletes the operator's other synced modules of those kinds.
{%- for kind in ['modules', 'states', 'beacons'] %}
salt_volumes beacon {{ kind }}:
  saltutil.sync_{{ kind }}:
    - refresh: True
{%- endfor %}

salt_volumes beacon:
  beacon.present:
    - name: salt_volumes
    - save: True
    - interval: {{ conf.get('beacon_interval', 10) }}
    - heartbeat: {{ conf.get('beacon_heartbeat', 300) }}
    - require:
      - saltutil: salt_volumes beacon modules
      - saltutil: salt_volumes beacon states
      - saltutil: salt_volumes beacon beacons
