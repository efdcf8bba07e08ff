{#- Turns on the salt_volumes beacon: the minion pushes its volumes' health,
    usage and capacity to the control plane (salt-volumes/node/<id>/health).
    Timings from the minion config, like the rest of the formula:
      salt_volumes:
        beacon_interval: 10     # seconds between checks
        beacon_heartbeat: 300   # seconds between events when nothing changes #}
{%- set conf = opts.get('salt_volumes') or {} %}

# The beacon runs the salt_volumes module: both must be on the minion.
# Only those two kinds are synced (sync_all would also sync states,
# grains, renderers, returners, ... of every environment).
salt_volumes beacon module:
  saltutil.sync_modules:
    - refresh: True

salt_volumes beacon code:
  saltutil.sync_beacons:
    - refresh: True
    - require:
      - saltutil: salt_volumes beacon module

salt_volumes beacon:
  beacon.present:
    - name: salt_volumes
    - save: True
    - interval: {{ conf.get('beacon_interval', 10) }}
    - heartbeat: {{ conf.get('beacon_heartbeat', 300) }}
    - require:
      - saltutil: salt_volumes beacon code
