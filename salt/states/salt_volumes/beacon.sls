{#- Turns on the salt_volumes beacon: the minion pushes its volumes' health,
    usage and capacity to the control plane (salt-volumes/node/<id>/health).
    Timings from the minion config, like the rest of the formula:
      salt_volumes:
        beacon_interval: 10     # seconds between checks
        beacon_heartbeat: 300   # seconds between events when nothing changes #}
{%- set conf = opts.get('salt_volumes') or {} %}

# The beacon runs the salt_volumes module: both must be on the minion.
salt_volumes beacon module:
  saltutil.sync_all:
    - refresh: True

salt_volumes beacon:
  beacon.present:
    - name: salt_volumes
    - save: True
    - interval: {{ conf.get('beacon_interval', 10) }}
    - heartbeat: {{ conf.get('beacon_heartbeat', 300) }}
    - require:
      - saltutil: salt_volumes beacon module
