"""
Push this minion's volume health, usage and capacity to the salt-volumes
control plane, so that it never has to poll nodes.

Every ``interval`` seconds the beacon runs ``salt-volume-exec list`` (through
``salt_volumes.status``) and fires ``salt-volumes/node/<minion id>/health``
only when something the control plane shows changed: a volume appeared,
disappeared or changed state, device, use or mountpoints; its usage moved by
more than 1 % of its size (at least 1 MiB); the node's free space moved by
more than 1 % of the filesystem; a snapshot schedule's runs on a volume
began or stopped failing, or failed otherwise (each event carries every
schedule's last success, ``snapshotSchedules``). Otherwise it stays
quiet, except for a heartbeat every ``heartbeat`` seconds, by which the
control plane tells a silent node. When ``salt-volume-exec restore`` ran (at boot, by systemd,
outside Salt), it fires ``salt-volumes/node/<minion id>/restore`` once with
what was rebuilt and what failed.

Configuration (the ``salt_volumes.installed`` state writes it)::

    beacons:
      salt_volumes:
        - interval: 10      # seconds between checks (Salt's own option)
        - heartbeat: 300    # seconds between events when nothing changes

It also opens what only the master can: an encrypted volume whose key the
master keeps (``encryption: {provider: master}``) is left closed by the
boot's restore, and reported ``locked``; once the minion has its pillar
with the volume's key (``salt_volumes:keys:<name>``), the beacon runs
``salt_volumes.restore``, which opens it. At most once every
``_OPEN_RETRY`` seconds while it stays locked, and never when the pillar
says ``salt_volumes:open_locked: false`` (the operator opens it by hand).

The beacon returns no events to Salt's beacon machinery: the minion sends
those batched, and the master puts a batched event on its bus without the
authenticated minion id, so the control plane could not tell who sent it.
It fires each event itself, in the single-event envelope the master stamps
with the minion id it verified.
"""

import calendar
import logging
import re
import time

log = logging.getLogger(__name__)

__virtualname__ = "salt_volumes"

DEFAULT_INTERVAL = 10
DEFAULT_HEARTBEAT = 300
_STATE = "salt_volumes.beacon"
_MIB = 1 << 20

# What an event carries of each volume: enough for the API, the metrics and
# the usage chart, nothing the control plane does not use.
_VOLUME_FIELDS = (
    "name",
    "uuid",
    "type",
    "mode",
    "state",
    "size",
    "deviceName",
    "devicePath",
    "persistentPath",
    "backingFile",
    "inUse",
    "mountpoints",
    "allocated",
    "fsUsed",
    "fsFree",
    "error",
)
# Seconds between two tries at opening the same locked volumes (a wrong
# key in pillar fails each time; the restore event says so).
_OPEN_RETRY = 600
# Compared with a tolerance: they move with every write.
_USAGE_FIELDS = ("allocated", "fsUsed", "fsFree")


def __virtual__():
    return __virtualname__


def _config(config):
    # Salt hands beacon config over as a list of one-key dicts.
    merged = {}
    for item in config if isinstance(config, list) else [config]:
        if isinstance(item, dict):
            merged.update(item)
    return merged


def _number(cfg, key, default):
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError("{} must be a positive number of seconds, got {!r}".format(key, value))
    return value


def validate(config):
    if not isinstance(config, list):
        return False, "salt_volumes beacon: configuration must be a list, e.g. [{interval: 10}, {heartbeat: 300}]"
    cfg = _config(config)
    try:
        interval = _number(cfg, "interval", DEFAULT_INTERVAL)
        heartbeat = _number(cfg, "heartbeat", DEFAULT_HEARTBEAT)
    except ValueError as exc:
        return False, "salt_volumes beacon: {}".format(exc)
    if heartbeat < interval:
        return False, "salt_volumes beacon: heartbeat ({}) must be at least the interval ({})".format(heartbeat, interval)
    return True, "Valid beacon configuration"


def _volume(v):
    return {k: v[k] for k in _VOLUME_FIELDS if v.get(k) not in (None, "", [])}


def digest(doc):
    """The part of a status document the control plane uses."""
    return {
        "volumes": [_volume(v) for v in doc.get("volumes") or []],
        "capacity": doc.get("capacity"),
        "error": doc.get("error"),
        # Bounded by the module (64 entries, errors cut short).
        "snapshotSchedules": doc.get("snapshotSchedules") or [],
    }


# The times in an error: a snapshot's <schedule>-YYYYMMDDhhmmss, a UTC time.
_ERROR_TIMES = re.compile(r"(?<![0-9])[0-9]{14}(?![0-9])|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z?")


def _error_kind(error):
    """An error without its times: the same failure at each run is no news."""
    return _ERROR_TIMES.sub("<time>", str(error or ""))


def _schedule_outcomes(d):
    # A schedule's success moves its time at every run: that alone is no
    # news (a heartbeat carries it); a volume coming or going, a run
    # failing or recovering, or another error, is (the same error again,
    # naming the snapshot of this run, is not).
    return sorted(
        (str(s.get("schedule")), str(s.get("uuid")), bool(s.get("failing")), _error_kind(s.get("lastError")))
        for s in d.get("snapshotSchedules") or []
        if isinstance(s, dict)
    )


def _moved(old, new, size):
    return abs((old or 0) - (new or 0)) >= max(_MIB, (size or 0) // 100)


def changed(old, new):
    """Whether new differs from old in anything worth an event."""
    if old is None or old.get("error") != new.get("error"):
        return True
    if _schedule_outcomes(old) != _schedule_outcomes(new):
        return True
    before = {v.get("uuid"): v for v in old["volumes"]}
    after = {v.get("uuid"): v for v in new["volumes"]}
    if before.keys() != after.keys():
        return True
    for u, v in after.items():
        w = before[u]
        for k in _VOLUME_FIELDS:
            if k in _USAGE_FIELDS:
                if _moved(w.get(k), v.get(k), v.get("size")):
                    return True
            elif w.get(k) != v.get(k):
                return True
    oc, nc = old.get("capacity") or {}, new.get("capacity") or {}
    for k in ("path", "size", "committed", "overcommitRatio", "snapshots", "snapshotWarnings"):
        if oc.get(k) != nc.get(k):
            return True
    # Disks offered for raw volumes, and the volume groups, by name: one
    # that appears or goes is news; a group's free space when it moves.
    if [d.get("path") for d in oc.get("disks") or []] != [d.get("path") for d in nc.get("disks") or []]:
        return True
    ovg = {v.get("name"): v for v in oc.get("vgs") or []}
    nvg = {v.get("name"): v for v in nc.get("vgs") or []}
    if ovg.keys() != nvg.keys():
        return True
    for name, v in nvg.items():
        if _moved(ovg[name].get("free"), v.get("free"), v.get("size")):
            return True
    return _moved(oc.get("free"), nc.get("free"), nc.get("size")) or _moved(
        oc.get("snapshotBytes"), nc.get("snapshotBytes"), nc.get("size")
    )


def _boot_time():
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def since_boot(report):
    """Whether a restore report is from this boot (older ones were told)."""
    # The boot id, where the report has it: the boot's run may start before
    # the clock is set, and a time behind the boot's would hide it.
    boot, current = report.get("boot"), _boot_id()
    if boot and current:
        return boot == current
    try:
        at = calendar.timegm(time.strptime((report.get("at") or "")[:19], "%Y-%m-%dT%H:%M:%S"))
        return at >= _boot_time()
    except (ValueError, OSError):
        return False


def _fire(kind, payload):
    tag = "salt-volumes/node/{}/{}".format(__grains__.get("id"), kind)
    try:
        __salt__["event.send"](tag, payload)
        return True
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("salt_volumes beacon: could not fire %s: %s", tag, exc)
        return False


def open_locked(doc, state, now):
    """
    Run salt_volumes.restore when a volume is locked and this minion's
    pillar holds its key: the master-held keys reach the node only so.
    Returns whether it ran.
    """
    locked = sorted(v.get("name") for v in doc.get("volumes") or [] if v.get("state") == "locked" and v.get("name"))
    if not locked:
        return False
    openable = __salt__["salt_volumes.openable"](locked)
    if not openable or (state.get("opened") == openable and now - state.get("openedAt", 0) < _OPEN_RETRY):
        return False
    state["opened"], state["openedAt"] = openable, now
    try:
        report = __salt__["salt_volumes.restore"]()
    except Exception as exc:  # pylint: disable=broad-except
        # Its restore event tells the control plane what failed.
        log.warning("salt_volumes beacon: opening %s failed: %s", ", ".join(openable), exc)
        report = getattr(exc, "result", None)
    if isinstance(report, dict) and report.get("id"):
        state["restore"] = report["id"]  # told by salt_volumes.restore itself
    return True


def beacon(config):
    cfg = _config(config)
    interval = cfg.get("interval", DEFAULT_INTERVAL)
    heartbeat = cfg.get("heartbeat", DEFAULT_HEARTBEAT)
    now = time.time()
    try:
        doc = __salt__["salt_volumes.status"]()
    except Exception as exc:  # pylint: disable=broad-except
        # A node that cannot list its volumes is news too.
        doc = {"volumes": [], "error": str(exc)}
    state = __context__.setdefault(_STATE, {"digest": None, "sent": 0, "restore": None})
    # The boot's restore report first: opening a locked volume below runs
    # a restore of its own, whose report replaces it on the node.
    _tell_restore(doc, state)
    if open_locked(doc, state, now):
        try:
            doc = __salt__["salt_volumes.status"]()
        except Exception as exc:  # pylint: disable=broad-except
            doc = {"volumes": [], "error": str(exc)}

    d = digest(doc)
    if state["digest"] is None:
        kind = "start"
    elif changed(state["digest"], d):
        kind = "change"
    elif now - state["sent"] >= heartbeat:
        kind = "heartbeat"
    else:
        kind = None
    if kind:
        payload = dict(d, kind=kind, interval=interval, heartbeat=heartbeat)
        # Remember only what was delivered, so that a failed send is retried
        # at the next interval.
        if _fire("health", payload):
            state["digest"], state["sent"] = d, now

    _tell_restore(doc, state)
    return []


def _tell_restore(doc, state):
    """Fire the node's last restore report once, if it is from this boot."""
    report = doc.get("lastRestore")
    if report and report.get("id") and report["id"] != state["restore"] and since_boot(report):
        if _fire("restore", __salt__["salt_volumes.restore_summary"](report)):
            state["restore"] = report["id"]
