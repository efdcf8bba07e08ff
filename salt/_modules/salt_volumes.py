"""
Local persistent volumes, prepared on this minion by ``salt-volume-exec``.

:depends: the ``salt-volume-exec`` binary (state ``salt_volumes.installed``)
:configuration: minion config only, both optional (never pillar: a
    ``pillar=`` override must not choose the program run as root or where
    sparse files go):

    .. code-block:: yaml

        salt_volumes:
          exec_path: /usr/local/bin/salt-volume-exec   # default: found on PATH
          state_dir: /var/lib/salt-volumes             # default
          overcommit_ratio: 1.0   # default: sparse sizes may not exceed the backing filesystem
          freeze_limit: 10s       # default: the longest a snapshot may hold a mounted sparse volume's filesystem frozen

Volumes are declared in pillar under ``salt_volumes:volumes:<name>`` (with
``node`` set to the minion id); a run for one volume passes
``pillar={"salt_volumes": {"volume": <spec>}}``. While a volume is prepared
or removed, ``salt-volumes/<name>/progress`` events are fired with each step.
"""

import itertools
import json
import logging
import os
import subprocess
import threading

import salt.utils.path
import salt.utils.platform
from salt.exceptions import CommandExecutionError, SaltInvocationError

log = logging.getLogger(__name__)

__virtualname__ = "salt_volumes"
__func_alias__ = {"list_": "list"}

BINARY = "salt-volume-exec"
DEFAULT_STATE_DIR = "/var/lib/salt-volumes"
# Fields a listener needs to use the volume without asking again.
DEVICE_FIELDS = (
    "name",
    "uuid",
    "type",
    "mode",
    "fsType",
    "size",
    "devicePath",
    "deviceName",
    "persistentPath",
    "backingFile",
    "state",
    "inUse",
)


def __virtual__():
    if not salt.utils.platform.is_linux():
        return (False, "salt_volumes: local volumes need a Linux minion")
    return __virtualname__


def _opt(key, default=None):
    # Minion config only, never config.get: it falls back to pillar, and a
    # pillar= override is something the control plane's salt-api account may
    # send. A binary path or state dir taken from there would let that
    # account run any program, or write sparse files anywhere, as root.
    value = (__opts__.get("salt_volumes") or {}).get(key)
    return value if value not in (None, "") else default


# How long salt-volume-exec may run before it is stopped (seconds; minion
# config salt_volumes:exec_timeout). Every node operation converges when run
# again after being stopped at any point, so the bound only costs a re-run;
# without one a hung binary holds the minion's job, and the volume, forever.
# --wipe of a large raw disk is the long case: raise it for those nodes.
DEFAULT_EXEC_TIMEOUT = 3600
# After SIGTERM (the binary stops its own mkfs/lvm children on it), this long
# before SIGKILL.
DEFAULT_KILL_GRACE = 10


def _seconds(key, default):
    raw = _opt(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = 0
    if value <= 0:
        raise CommandExecutionError(
            "salt_volumes:{} is {!r} in the minion config: give a number of "
            "seconds above 0 (default {})".format(key, raw, default)
        )
    return value


def _stop(proc, grace, expired):
    expired.set()
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()


def _binary():
    path = _opt("exec_path") or salt.utils.path.which(BINARY)
    if not path:
        raise CommandExecutionError(
            "{} not found on PATH: apply salt_volumes.installed or set "
            "salt_volumes:exec_path".format(BINARY)
        )
    if not os.access(path, os.X_OK):
        raise CommandExecutionError("{} is not executable".format(path))
    return path


def _masterless():
    return bool(__opts__.get("local")) or __opts__.get("master_type") == "disable"


# Numbers the progress events of this process (a job): Salt 3006's minion
# forwards events to the master concurrently, so they may arrive out of
# order; "seq" puts them back in it.
_PROGRESS_SEQ = itertools.count(1)


def _fire_progress(volume, uuid, step, extra=None):
    # Masterless runs have no event bus to listen on; firing there only
    # waits for a connect timeout per event.
    if not volume or _masterless():
        return
    data = {
        "step": step,
        "uuid": uuid,
        "volume": volume,
        "node": __grains__.get("id"),
        "seq": next(_PROGRESS_SEQ),
    }
    if extra:
        data.update(extra)
    try:
        __salt__["event.send"]("salt-volumes/{}/progress".format(volume), data)
    except Exception as exc:  # pylint: disable=broad-except
        # Progress is a courtesy; the job return carries the outcome.
        log.debug("salt_volumes: could not fire progress event: %s", exc)


def _run(command, spec=None, extra_args=()):
    """
    Run the binary with an argument list (never a shell), stream its step
    lines as progress events, and return its parsed JSON document.
    """
    argv = [_binary(), "--state-dir", _opt("state_dir", DEFAULT_STATE_DIR)]
    ratio = _opt("overcommit_ratio")
    if ratio is not None:
        argv += ["--overcommit-ratio", str(ratio)]
    argv.append(command)
    if spec is not None:
        argv += ["--spec", "-"]
    argv += list(extra_args)
    limit = _opt("freeze_limit")
    if command == "snapshot" and limit is not None and "--freeze-limit" not in argv:
        # The minion's own bound, for the control plane's snapshots too
        # (apply_snapshot takes fixed arguments).
        argv += ["--freeze-limit", str(limit)]
    volume = (spec or {}).get("name")
    uuid = (spec or {}).get("uuid")
    timeout = _seconds("exec_timeout", DEFAULT_EXEC_TIMEOUT)
    grace = _seconds("exec_kill_grace", DEFAULT_KILL_GRACE)
    log.debug("salt_volumes: running %s", argv)
    try:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
        )
    except OSError as exc:
        raise CommandExecutionError("cannot run {}: {}".format(argv[0], exc))

    expired = threading.Event()
    watchdog = threading.Timer(timeout, _stop, args=(proc, grace, expired))
    watchdog.daemon = True
    watchdog.start()
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    try:
        proc.stdin.write(json.dumps(spec).encode() if spec is not None else b"")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    stderr_tail = []
    for raw in proc.stderr:
        line = raw.decode("utf-8", "replace").strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            stderr_tail.append(line)
            continue
        if rec.get("msg") == "step" and command in ("prepare", "unprepare", "restore"):
            _fire_progress(rec.get("volume") or volume, rec.get("uuid") or uuid, rec.get("step"),
                           {k: rec[k] for k in ("device", "link", "path") if k in rec})
        elif rec.get("level") in ("WARN", "ERROR"):
            stderr_tail.append(rec.get("error") or rec.get("msg") or line)
    retcode = proc.wait()
    watchdog.cancel()
    reader.join()
    if expired.is_set():
        raise CommandExecutionError(
            "{} {} did not finish within {:g} s (salt_volumes:exec_timeout): it "
            "was stopped; running the state again carries on from where it "
            "stopped".format(BINARY, command, timeout)
        )
    stdout = (out[0] if out else b"").decode("utf-8", "replace")
    try:
        doc = json.loads(stdout)
    except ValueError:
        raise CommandExecutionError(
            "{} {} exited {} without a JSON answer: {}".format(
                BINARY, command, retcode, (stdout or " ".join(stderr_tail))[:2000]
            )
        )
    # A failure is an exit code or an error envelope ({"error": {"code",
    # "message"}}); a volume's own "error" string (info of a volume whose
    # device is gone: state "missing") is a report, not a failure.
    err = doc.get("error") if isinstance(doc, dict) else None
    if retcode != 0 or isinstance(err, dict):
        if isinstance(err, str):
            err = {"message": err}
        elif not isinstance(err, dict):
            err = {}
        exc = CommandExecutionError(
            err.get("message") or "{} {} failed with exit {}".format(BINARY, command, retcode)
        )
        # Attributes, not info=: Salt would append info to the message.
        exc.code, exc.retcode, exc.result = err.get("code", "failed"), retcode, doc
        raise exc
    return doc


def _lookup(name):
    single = __salt__["pillar.get"]("salt_volumes:volume")
    if isinstance(single, dict) and single.get("name") == name:
        return dict(single)
    volumes = __salt__["pillar.get"]("salt_volumes:volumes", {}) or {}
    if name in volumes:
        spec = volumes[name]
        if not isinstance(spec, dict):
            raise SaltInvocationError(
                "volume {}: pillar salt_volumes:volumes:{} must be a mapping".format(name, name)
            )
        spec = dict(spec)
        spec.setdefault("name", name)
        return spec
    raise SaltInvocationError(
        "volume {}: not found in pillar salt_volumes:volume or salt_volumes:volumes".format(name)
    )


def _spec(name=None, spec=None):
    if spec is None:
        if not name:
            raise SaltInvocationError("give a volume name (from pillar) or spec")
        spec = _lookup(name)
    if not isinstance(spec, dict):
        raise SaltInvocationError("spec must be a mapping, got {}".format(type(spec).__name__))
    return spec


def message(exc):
    """
    The text of an error, for state comments.
    """
    return str(exc)


def device_info(result):
    """
    The device fields of a ``salt-volume-exec`` answer.
    """
    return {k: result[k] for k in DEVICE_FIELDS if k in result}


def check(name=None, spec=None):
    """
    Validate a volume for this minion without touching anything: the spec
    (by the binary's own rules) and its ``node``. Returns the normalised spec;
    raises with the volume and field named.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.check data-1
    """
    spec = dict(_spec(name, spec))
    if name and not spec.get("name"):
        spec["name"] = name  # pillar keys name their volume
    vol = spec.get("name") or name
    if name and spec["name"] != name:
        raise SaltInvocationError(
            "volume {}: name: the spec says {!r}; the pillar key and name must agree".format(
                name, spec["name"]
            )
        )
    node = spec.get("node")
    if not node:
        raise SaltInvocationError(
            "volume {}: node: missing; set node to the minion id that holds the volume".format(vol)
        )
    if node != __grains__.get("id"):
        raise SaltInvocationError(
            "volume {}: node: the volume is for {!r}, this minion is {!r}".format(
                vol, node, __grains__.get("id")
            )
        )
    try:
        doc = _run("validate", spec)
    except CommandExecutionError as exc:
        raise SaltInvocationError("volume {}: {}".format(vol, message(exc)))
    normalised = doc["spec"]
    normalised["node"] = node
    return normalised


def volumes():
    """
    The volumes a formula run should act on: the single volume in pillar
    ``salt_volumes:volume`` when given, else every volume in
    ``salt_volumes:volumes`` whose ``node`` is this minion. Entries with no
    ``node`` are included so that their state fails and says so.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.volumes
    """
    single = __salt__["pillar.get"]("salt_volumes:volume")
    if single:
        if not isinstance(single, dict):
            return {"<salt_volumes:volume>": single}
        return {single.get("name") or "<unnamed>": dict(single)}
    out = {}
    for name, spec in (__salt__["pillar.get"]("salt_volumes:volumes", {}) or {}).items():
        if not isinstance(spec, dict) or spec.get("node") in (None, "", __grains__.get("id")):
            out[name] = spec
    return out


def apply_volume(action, volumes, wipe=False):
    """
    Run the ``salt_volumes.prepared`` or ``salt_volumes.unprepared`` formula
    for the given volumes, from the ``base`` environment, with nothing else
    a caller can choose. This (and ``saltutil.sync_all`` pinned to ``base``)
    is all the control plane's Salt account may call: Salt's ACL checks only
    the keyword arguments an entry names, so an account allowed
    ``state.apply`` could also pass ``localconfig=`` (a minion config any
    local user can write) or ``saltenv=`` (another branch's code). This
    function takes no other keyword argument, and Salt refuses a call that
    passes one before anything runs.

    action
        ``prepared`` or ``unprepared``
    volumes
        the volume specs of the run: one, or the batch the control plane
        queued for this minion
    wipe
        with ``unprepared``: zero raw volumes before forgetting them

    Returns what ``state.apply`` returns, and its exit code.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.apply_volume prepared '[{"name": "data-1", "uuid": "...", "sparseLoopDevice": {"size": "1Gi"}}]'
    """
    if action not in ("prepared", "unprepared"):
        raise SaltInvocationError(
            "action: {!r} is not a formula of ours: use prepared or unprepared".format(action)
        )
    if isinstance(volumes, dict):
        volumes = [volumes]
    if (
        not isinstance(volumes, list)
        or not volumes
        or not all(isinstance(v, dict) and v.get("name") for v in volumes)
    ):
        raise SaltInvocationError(
            "volumes: give a list of volume specs, each with its name"
        )
    if not isinstance(wipe, bool):
        raise SaltInvocationError("wipe: {!r} is not true or false".format(wipe))
    if wipe and action != "unprepared":
        raise SaltInvocationError("wipe: only a removal (unprepared) wipes")
    if len(volumes) == 1:
        pillar = {"volume": volumes[0]}
    else:
        pillar = {"volumes": {v["name"]: v for v in volumes}}
    if wipe:
        pillar["wipe"] = True
    return __salt__["state.apply"](
        "salt_volumes." + action, pillar={"salt_volumes": pillar}, saltenv="base"
    )


def apply_snapshot(action, volume, snapshot, size=None):
    """
    Take or delete one snapshot of a volume on this minion, with nothing
    else a caller can choose: the control plane's Salt account calls this
    (like ``apply_volume``) instead of ``snapshot``/``snapshot_delete``,
    whose ``name`` would let it pick a volume by name alone.

    action
        ``taken`` or ``deleted``
    volume
        the volume's spec (its name, uuid and kind: the snapshot is of the
        volume this minion prepared under that uuid)
    snapshot
        the snapshot's name
    size
        a thick LVM snapshot's copy-on-write space (``64Mi``; default a
        quarter of the LV); nothing else takes it

    Returns the snapshot's record (``taken``) or what was deleted.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.apply_snapshot taken '{"name": "data-1", "uuid": "...", "sparseLoopDevice": {"size": "1Gi"}}' before-upgrade
    """
    if action not in ("taken", "deleted"):
        raise SaltInvocationError(
            "action: {!r} is not a snapshot action: use taken or deleted".format(action)
        )
    if not isinstance(volume, dict) or not volume.get("name") or not volume.get("uuid"):
        raise SaltInvocationError("volume: give the volume's spec, with its name and uuid")
    if not isinstance(snapshot, str) or not snapshot:
        raise SaltInvocationError("snapshot: give the snapshot's name")
    if size is not None and (not isinstance(size, str) or not size):
        raise SaltInvocationError("size: give the copy-on-write space as a size such as 64Mi")
    if action == "deleted":
        return _run("snapshot-delete", volume, ["--name", snapshot])
    return _run("snapshot", volume, ["--name", snapshot] + (["--size", size] if size else []))


def prepare(name=None, spec=None):
    """
    Prepare a volume on this minion (idempotent). Returns the device info,
    with ``changed``.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.prepare data-1
        salt node-1 salt_volumes.prepare spec='{"name": "d", "uuid": "...", "node": "node-1", "sparseLoopDevice": {"size": "1Gi"}}'
    """
    spec = _spec(name, spec)
    _fire_progress(spec.get("name"), spec.get("uuid"), "started", {"action": "prepare"})
    try:
        out = _run("prepare", spec)
    except CommandExecutionError as exc:
        _fire_progress(spec.get("name"), spec.get("uuid"), "failed", {"action": "prepare", "message": str(exc)})
        raise
    _fire_progress(spec.get("name"), spec.get("uuid"), "done", {"action": "prepare"})
    return out


def unprepare(name=None, spec=None, wipe=False):
    """
    Remove a volume from this minion. Sparse volumes lose their loop device
    and file; raw volumes keep their data unless ``wipe=True``; an LVM
    volume's logical volume is kept unless ``wipe=True``, which erases and
    removes it.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.unprepare data-1
    """
    spec = _spec(name, spec)
    _fire_progress(spec.get("name"), spec.get("uuid"), "started", {"action": "unprepare"})
    try:
        out = _run("unprepare", spec, ["--wipe"] if wipe else [])
    except CommandExecutionError as exc:
        _fire_progress(spec.get("name"), spec.get("uuid"), "failed", {"action": "unprepare", "message": str(exc)})
        raise
    _fire_progress(spec.get("name"), spec.get("uuid"), "done", {"action": "unprepare"})
    return out


def snapshot(name=None, snapshot_name=None, spec=None, size=None, freeze_limit=None):
    """
    Take a point-in-time snapshot of a volume on this minion (idempotent:
    taking it again answers the snapshot taken). A sparse volume's file is
    copied (a reflink where the state dir's filesystem shares extents, else
    a sparse copy); a mounted filesystem is frozen only for the reflink or
    the copy's last pass, never longer than ``freeze_limit`` (default the
    minion config's ``salt_volumes:freeze_limit``, else 10s), and a copy
    that would need longer is refused before anything is frozen. An LVM
    volume gets an LVM snapshot: thin for a thin LV, else thick with
    ``size`` of copy-on-write space (default a quarter of the LV).

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot data-1 snapshot_name=before-upgrade
        salt node-1 salt_volumes.snapshot data-1 snapshot_name=before-upgrade freeze_limit=2s
        salt node-1 salt_volumes.snapshot db-lv snapshot_name=nightly size=2Gi
    """
    if not snapshot_name:
        raise SaltInvocationError("give snapshot_name: the snapshot's name (lower-case letters, digits, '-' and '.')")
    args = ["--name", str(snapshot_name)]
    if size:
        args += ["--size", str(size)]
    if freeze_limit:
        args += ["--freeze-limit", str(freeze_limit)]
    return _run("snapshot", _spec(name, spec), args)


def snapshot_delete(name=None, snapshot_name=None, spec=None):
    """
    Delete a volume's snapshot on this minion (done already is fine).

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot_delete data-1 snapshot_name=before-upgrade
    """
    if not snapshot_name:
        raise SaltInvocationError("give snapshot_name: the snapshot to delete")
    return _run("snapshot-delete", _spec(name, spec), ["--name", str(snapshot_name)])


def snapshots(name=None, spec=None):
    """
    List the snapshots on this minion: a volume's, or all of them.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshots
        salt node-1 salt_volumes.snapshots data-1
    """
    if name is None and spec is None:
        return _run("snapshots")["snapshots"]
    return _run("snapshots", _spec(name, spec))["snapshots"]


def info(name=None, spec=None):
    """
    Report a volume's state on this minion without changing anything.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.info data-1
    """
    return _run("info", _spec(name, spec))


def is_prepared(name=None, spec=None):
    """
    True if the volume is prepared on this minion.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.is_prepared data-1
    """
    return info(name, spec).get("state") == "prepared"


def list_():
    """
    Every volume this minion knows, plus orphans.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.list
    """
    return _run("list").get("volumes", [])


def status():
    """
    Every volume this minion knows, with its health and usage (allocated
    bytes of sparse files, filesystem used/free when mounted), the node's
    sparse capacity, and the report of the last restore. The beacon sends
    this to the control plane.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.status
    """
    doc = _run("list")
    try:
        doc["lastRestore"] = _run("last-restore").get("restore")
    except CommandExecutionError as exc:
        log.warning("salt_volumes: last restore report unreadable: %s", exc)
        doc["lastRestore"] = None
    return doc


def restore_summary(report):
    """
    What the control plane needs of a restore report: per volume its name,
    uuid, state and error, and the counts. Used by restore and the beacon.
    """
    vols = [
        {k: v.get(k) for k in ("name", "uuid", "state", "deviceName", "error") if v.get(k) not in (None, "")}
        for v in (report or {}).get("volumes") or []
    ]
    return {
        "id": (report or {}).get("id"),
        "at": (report or {}).get("at"),
        "restored": (report or {}).get("restored", 0),
        "failed": (report or {}).get("failed", 0),
        "volumes": vols,
        "orphans": [o.get("uuid") for o in (report or {}).get("orphans") or []],
    }


def fire_restore(report):
    """
    Tell the control plane what a restore rebuilt and what failed
    (``salt-volumes/node/<id>/restore``). Salt's single-event envelope
    carries the minion id the master authenticated.
    """
    if _masterless() or not report or not report.get("id"):
        return False
    try:
        __salt__["event.send"]("salt-volumes/node/{}/restore".format(__grains__.get("id")), restore_summary(report))
        return True
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("salt_volumes: could not fire the restore event: %s", exc)
        return False


def restore():
    """
    Re-attach sparse volumes and recreate links after a boot, from the node
    state alone, and report the outcome to the control plane. Returns the
    binary's report; raises if a volume could not be restored.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.restore
    """
    try:
        report = _run("restore")
    except CommandExecutionError as exc:
        fire_restore(getattr(exc, "result", None))
        raise
    fire_restore(report)
    return report
