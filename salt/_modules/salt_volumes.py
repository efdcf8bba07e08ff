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
Snapshot schedules are pillar ``salt_volumes:snapshot_schedules``, run by
the minion's Salt scheduler (``run_snapshot_schedule``, formula
``salt_volumes.scheduled``).
"""

import calendar
import contextlib
import fcntl
import fnmatch
import itertools
import json
import logging
import os
import re
import subprocess
import tempfile
import threading
import time
import uuid as _uuid

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


_KEYS_PILLAR = "salt_volumes:keys"


def _master_keys(names=None):
    """
    The keys of provider-master volumes, from pillar ``salt_volumes:keys``
    (volume name: base64 of 32 random bytes), those of ``names`` only when
    given. They reach the binary on a pipe of its own (``--keys-fd``):
    never an argument, a log line, a return or an event. A mistake in
    another volume's entry is logged and skipped, so that it
    never keeps a restore from the rest; one in an entry asked for by name
    is raised.
    """
    keys = _pillar_get(_KEYS_PILLAR, {}) or {}
    if not isinstance(keys, dict):
        msg = "pillar salt_volumes:keys must map volume names to base64 keys (openssl rand -base64 32), not a {}".format(
            type(keys).__name__
        )
        if names is not None:
            raise SaltInvocationError(msg)
        log.warning("salt_volumes: %s: no key handed over", msg)
        return {}
    out = {}
    for name, value in keys.items():
        if names is not None and name not in names:
            continue
        if not isinstance(value, str):
            msg = "pillar salt_volumes:keys:{}: give the key as a base64 string (openssl rand -base64 32), not a {}".format(
                name, type(value).__name__
            )
            if names is not None:
                raise SaltInvocationError(msg)
            log.warning("salt_volumes: %s: skipped", msg)
            continue
        # A renderer's output (gpg) may carry a newline or wrap.
        out[str(name)] = "".join(value.split())
    return out


def openable(names):
    """
    Which of the locked volumes ``names`` this minion may open now: those
    whose key its pillar holds (``salt_volumes:keys``), none while pillar
    ``salt_volumes:open_locked`` is false. Names only, never a key: the
    beacon asks it before running ``restore``.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.openable '[vault-1]'
    """
    if str(_pillar_get("salt_volumes:open_locked", True)).lower() in ("false", "no", "off", "0"):
        return []
    keys = _pillar_get(_KEYS_PILLAR, {}) or {}
    if not isinstance(keys, dict):
        return []  # restore names the mistake when run by hand
    return [n for n in names or [] if isinstance(keys.get(n), str)]


def _feed(fd, data):
    """Write data to the pipe fd, whole (a thread: it may pass 64 KiB), then close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the binary stopped early; its exit says why
    finally:
        os.close(fd)


def _run(command, spec=None, extra_args=(), keys=None):
    """
    Run the binary with an argument list (never a shell), stream its step
    lines as progress events, and return its parsed JSON document. ``keys``
    (volume name: base64 key) go to it on a pipe, never in ``argv``.
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
    pass_fds = ()
    keys_r = keys_w = None
    if keys:
        keys_r, keys_w = os.pipe()
        argv += ["--keys-fd", str(keys_r)]
        pass_fds = (keys_r,)
    log.debug("salt_volumes: running %s", argv)
    try:
        proc = subprocess.Popen(  # pylint: disable=consider-using-with
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            pass_fds=pass_fds,
        )
    except OSError as exc:
        if keys_r is not None:
            os.close(keys_r)
            os.close(keys_w)
        raise CommandExecutionError("cannot run {}: {}".format(argv[0], exc))
    if keys_r is not None:
        os.close(keys_r)
        threading.Thread(target=_feed, args=(keys_w, json.dumps(keys).encode()), daemon=True).start()

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
            extra = {k: rec[k] for k in ("device", "link", "path") if k in rec}
            # A long step's bytes (a clone's copy, a wipe): whole numbers only.
            for k in ("done", "total"):
                if isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool):
                    extra[k] = rec[k]
            _fire_progress(rec.get("volume") or volume, rec.get("uuid") or uuid, rec.get("step"), extra)
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
    run = _run_doc()
    if run is not None and isinstance(run["volumes"].get(name), dict):
        return _with_uuid(dict(run["volumes"][name], name=name))
    single = _pillar_get("salt_volumes:volume")
    if isinstance(single, dict) and single.get("name") == name:
        return _with_uuid(dict(single))
    volumes = _pillar_get("salt_volumes:volumes", {}) or {}
    if name in volumes:
        spec = volumes[name]
        if not isinstance(spec, dict):
            raise SaltInvocationError(
                "volume {}: pillar salt_volumes:volumes:{} must be a mapping".format(name, name)
            )
        spec = dict(spec)
        spec.setdefault("name", name)
        return _with_uuid(spec)
    raise SaltInvocationError(
        "volume {}: not found in pillar salt_volumes:volume or salt_volumes:volumes".format(name)
    )


# A pillar volume may leave out its uuid: it is then derived from the node
# and the name, the same on every run and every master, so re-applying a
# pillar finds the volume it made. The namespace is itself derived from a
# name of ours, so anyone can recompute a volume's uuid by hand:
#   python3 -c 'import uuid; ns = uuid.uuid5(uuid.NAMESPACE_DNS, "salt-volumes.io");
#               print(uuid.uuid5(ns, "pillar/NODE/NAME"))'
_PILLAR_UUIDS = _uuid.uuid5(_uuid.NAMESPACE_DNS, "salt-volumes.io")


def pillar_uuid(node, name):
    """
    The uuid a pillar volume without one gets: derived from its node (the
    minion id) and its name, so it never changes while both stay. Renaming
    the volume or moving it to another node makes it another volume.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.pillar_uuid node-1 data-1
    """
    if not node or not name:
        raise SaltInvocationError("pillar_uuid: give the volume's node and name")
    return str(_uuid.uuid5(_PILLAR_UUIDS, "pillar/{}/{}".format(node, name)))


def _with_uuid(spec):
    """spec, with the uuid derived for it when it has none (pillar_uuid)."""
    if spec.get("uuid") in (None, "") and spec.get("node") and spec.get("name"):
        spec["uuid"] = pillar_uuid(spec["node"], spec["name"])
    return spec


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
    if spec.get("uuid") in (None, "") and vol:
        spec["uuid"] = pillar_uuid(node, vol)
    try:
        doc = _run("validate", spec)
    except CommandExecutionError as exc:
        raise SaltInvocationError("volume {}: {}".format(vol, message(exc)))
    normalised = doc["spec"]
    normalised["node"] = node
    return normalised


# The volumes of one run, as apply_volume and the orchestrate files pass
# them: pillar salt_volumes:run, a JSON string. Salt merges a command
# line's pillar into the minion's own, dict into dict, so volumes passed as
# salt_volumes:volumes would be joined by those the node's pillar defines
# (and a removal would remove them too), and a node pillar's wipe would
# apply to a removal that did not ask for it. A string is never merged: it
# replaces, so the run is exactly what the caller passed.
RUN_PILLAR = "salt_volumes:run"


def _run_doc():
    raw = _pillar_get(RUN_PILLAR)
    if raw is None:
        return None
    try:
        doc = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        doc = None
    vols = doc.get("volumes") if isinstance(doc, dict) else None
    if isinstance(vols, list):
        vols = {v.get("name") if isinstance(v, dict) else None: v for v in vols}
    bad = (
        not isinstance(vols, dict) or not vols or None in vols
        or (isinstance(doc.get("volumes"), list) and len(vols) != len(doc["volumes"]))
        or not isinstance(doc.get("wipe", False), bool)
    )
    lists = {}
    for key in ("snapshots", "snapshots_absent"):
        lists[key] = doc.get(key, {}) if isinstance(doc, dict) else None
        if not _snapshot_map(lists[key]):
            bad = True
    if bad:
        raise SaltInvocationError(
            'pillar {}: a JSON string {{"volumes": [specs, each with its own name], "wipe": false}}, '
            "as apply_volume and the orchestrate files pass it; it is not for a pillar file".format(RUN_PILLAR)
        )
    if _pillar_get("salt_volumes:volume") is not None:
        raise SaltInvocationError(
            "pillar {} and salt_volumes:volume are both set: a run passes only the first, so one of them "
            "comes from a pillar file; remove {} from the pillar files (it is reserved for a run's "
            "own volumes) and run again; nothing was done".format(RUN_PILLAR, RUN_PILLAR)
        )
    return dict(lists, volumes=vols, wipe=doc.get("wipe", False))


def _snapshot_map(value):
    """A map of volume name to a list of snapshot names (strings)."""
    return isinstance(value, dict) and all(
        isinstance(names, list) and all(isinstance(n, str) and n for n in names)
        for names in value.values()
    )


def snapshot_lists():
    """
    The snapshots ``salt_volumes.snapshotted`` keeps and deletes: those of
    the run (pillar ``salt_volumes:run``, from the orchestrate file) when
    given, else pillar ``salt_volumes:snapshots`` and
    ``salt_volumes:snapshots_absent``. Each maps a volume to a list of
    snapshot names; a single name given as a string is a list of one.
    """
    run = _run_doc()
    out = {}
    for key in ("snapshots", "snapshots_absent"):
        value = run[key] if run is not None else _pillar_get("salt_volumes:" + key, {})
        if value is None:
            value = {}
        if isinstance(value, dict):
            value = {vol: [names] if isinstance(names, str) else names for vol, names in value.items()}
        if not _snapshot_map(value):
            raise SaltInvocationError(
                "pillar salt_volumes:{}: map each volume to a list of snapshot names, "
                "e.g. {{data-1: [before-upgrade]}}".format(key)
            )
        out[key] = value
    return out


def wipe_requested():
    """
    Whether ``salt_volumes.unprepared`` zeroes raw volumes: the run's own
    choice when one was passed (``apply_volume``, the orchestrate files),
    else pillar ``salt_volumes:wipe``.
    """
    run = _run_doc()
    if run is not None:
        return run["wipe"]
    return _pillar_get("salt_volumes:wipe", False) is True


def volumes():
    """
    The volumes a formula run should act on: those of the run (pillar
    ``salt_volumes:run``, passed by ``apply_volume`` and the orchestrate
    files) when given, else the single volume in pillar
    ``salt_volumes:volume``, else every volume in ``salt_volumes:volumes``;
    of each list, those whose ``node`` is this minion. Entries with no
    ``node`` are included so that their state fails and says so.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.volumes
    """
    run = _run_doc()
    if run is not None:
        return {
            name: spec for name, spec in run["volumes"].items()
            if not isinstance(spec, dict) or spec.get("node") in (None, "", __grains__.get("id"))
        }
    single = _pillar_get("salt_volumes:volume")
    if single:
        if not isinstance(single, dict):
            return {"<salt_volumes:volume>": single}
        return {single.get("name") or "<unnamed>": dict(single)}
    out = {}
    for name, spec in (_pillar_get("salt_volumes:volumes", {}) or {}).items():
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
    names = [v["name"] for v in volumes]
    if len(set(names)) != len(names):
        raise SaltInvocationError(
            "volumes: {} named twice: give each volume once".format(
                ", ".join(sorted({n for n in names if names.count(n) > 1}))
            )
        )
    if not isinstance(wipe, bool):
        raise SaltInvocationError("wipe: {!r} is not true or false".format(wipe))
    if wipe and action != "unprepared":
        raise SaltInvocationError("wipe: only a removal (unprepared) wipes")
    run = json.dumps({"volumes": volumes, "wipe": wipe}, sort_keys=True)
    return __salt__["state.apply"](
        "salt_volumes." + action, pillar={"salt_volumes": {"run": run}}, saltenv="base"
    )


def apply_snapshot(action, volume, snapshot, size=None, owner=None):
    """
    Take, delete or restore one snapshot of a volume on this minion, with
    nothing else a caller can choose: the control plane's Salt account
    calls this (like ``apply_volume``) instead of ``snapshot``,
    ``snapshot_delete`` or ``snapshot_restore``, whose ``name`` would let it
    pick a volume by name alone.

    action
        ``taken``, ``deleted`` or ``restored`` (the volume put back to the
        snapshot in place: a sparse or LVM volume nothing uses; refused
        otherwise, with nothing changed; a thick LVM snapshot is used up,
        ``snapshotConsumed`` in the answer)
    volume
        the volume's spec (its name, uuid and kind: the snapshot is of the
        volume this minion prepared under that uuid)
    snapshot
        the snapshot's name
    size
        a thick LVM snapshot's copy-on-write space (``64Mi``; default a
        quarter of the LV); nothing else takes it
    owner
        the control plane's id of the snapshot (``taken``, ``deleted``): a
        snapshot of that name on the minion that was not taken with it (by
        Salt, or for another record) is refused, ``name_taken``, and left as
        it is; without it, any snapshot of that name is answered (Salt's own
        callers)

    Returns the snapshot's record (``taken``), what was deleted, or what
    was restored.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.apply_snapshot taken '{"name": "data-1", "uuid": "...", "sparseLoopDevice": {"size": "1Gi"}}' before-upgrade
    """
    if action not in ("taken", "deleted", "restored"):
        raise SaltInvocationError(
            "action: {!r} is not a snapshot action: use taken, deleted or restored".format(action)
        )
    if not isinstance(volume, dict) or not volume.get("name") or not volume.get("uuid"):
        raise SaltInvocationError("volume: give the volume's spec, with its name and uuid")
    if not isinstance(snapshot, str) or not snapshot:
        raise SaltInvocationError("snapshot: give the snapshot's name")
    if size is not None and (not isinstance(size, str) or not size):
        raise SaltInvocationError("size: give the copy-on-write space as a size such as 64Mi")
    if size is not None and action != "taken":
        raise SaltInvocationError("size: only a snapshot taken sets space aside")
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise SaltInvocationError("owner: give the control plane's id of the snapshot")
    if owner is not None and action == "restored":
        raise SaltInvocationError("owner: a restore takes none")
    mine = ["--owner", owner] if owner else []
    try:
        if action == "deleted":
            return _run("snapshot-delete", volume, ["--name", snapshot] + mine)
        if action == "restored":
            return _run("snapshot-restore", volume, ["--name", snapshot])
        return _run("snapshot", volume, ["--name", snapshot] + (["--size", size] if size else []) + mine)
    except CommandExecutionError as exc:
        if getattr(exc, "code", None) != "name_taken":
            raise
        # Said first, so that the control plane tells it from a failure.
        err = CommandExecutionError("name_taken: {}".format(exc))
        err.code, err.retcode, err.result = exc.code, getattr(exc, "retcode", 3), getattr(exc, "result", None)
        raise err


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
    keys = None
    if (spec.get("encryption") or {}).get("provider") == "master":
        keys = _master_keys([spec.get("name")])
    _fire_progress(spec.get("name"), spec.get("uuid"), "started", {"action": "prepare"})
    try:
        out = _run("prepare", spec, keys=keys)
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


def snapshot_restore(name=None, spec=None, snapshot_name=None):
    """
    Put a volume on this minion back to one of its snapshots in place:
    same UUID, same persistent path. Only while nothing uses the volume: a
    mount in any namespace, a holder or a process with it open is refused
    (``in_use``), naming it, with nothing changed. A sparse volume keeps
    its loop device where it is free, and the snapshot stays. An LVM
    volume's snapshot is merged into its LV by LVM (``lvconvert --merge``):
    a thin snapshot stays (under its name), a thick one is used up, and the
    answer says so (``snapshotConsumed: true``; clone it first to keep a
    copy); an overflowed thick snapshot is refused (``snapshot_invalid``).
    Raw volumes are refused (``restore_unsupported``). A run stopped at any
    point is rolled back or finished by the next one.

    This is an action, not a state: there is no formula that restores,
    since a state run again would restore again, throwing away whatever
    was written since.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot_restore data-1 snapshot_name=before-upgrade
    """
    if not snapshot_name:
        raise SaltInvocationError("give snapshot_name: the snapshot to restore the volume to")
    return _run("snapshot-restore", _spec(name, spec), ["--name", str(snapshot_name)])


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
    sparse capacity, the report of the last restore, and the outcome of
    each snapshot schedule per volume (``snapshotSchedules``, see
    ``snapshot_schedule_status``). The beacon sends this to the control
    plane.

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
    doc["snapshotSchedules"] = _schedule_report_or_none()
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
        "intact": (report or {}).get("intact", 0),
        "failed": (report or {}).get("failed", 0),
        "locked": (report or {}).get("locked", 0),
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
    state alone, and report the outcome to the control plane. Encrypted
    volumes whose key the master keeps (provider master) are opened with
    the keys of this minion's pillar (``salt_volumes:keys``); the boot's
    own restore, without Salt, leaves them Locked. Returns the binary's
    report; raises if a volume could not be restored.

    CLI Example:

    .. code-block:: bash

        salt '*' salt_volumes.restore
    """
    try:
        report = _run("restore", keys=_master_keys())
    except CommandExecutionError as exc:
        fire_restore(getattr(exc, "result", None))
        raise
    fire_restore(report)
    return report


# Snapshot schedules. An operator declares them in pillar
# (salt_volumes:snapshot_schedules); the salt_volumes.scheduled formula
# turns each into an entry of the minion's own Salt scheduler, which calls
# run_snapshot_schedule. Which snapshots a schedule took is recorded in the
# minion's cachedir (salt_volumes/snapshot_schedules.json), under the id
# of its Salt schedule entry: a schedule prunes only those, never a
# snapshot someone else took, whatever its name, nor one an earlier
# schedule of its name took. By default it takes only the volumes of the
# minion's pillar, never a raw one (any_volume, raw_volumes).

SCHEDULE_ENTRY_PREFIX = "salt-volumes-snapshot-"
_SCHEDULES_PILLAR = "salt_volumes:snapshot_schedules"
_SCHEDULE_KEYS = ("volumes", "match", "every", "daily_at", "keep", "max_age", "any_volume", "raw_volumes")
# Bounds: keep at most this many per volume; max_age at most this many
# intervals and never more than 10 years; below a minute, keep is needed.
_MAX_KEEP = 1000
_MAX_AGE_INTERVALS = 1000
_MAX_AGE_CAP = 3650 * 86400
_FAST_EVERY = 60
# A run takes nothing more while the schedule already holds this many past
# its bound on a volume (its pruning failed): it only tries to prune.
_OVER_KEEP = 3
_SCHEDULE_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# A schedule's snapshot is <schedule>-<UTC YYYYMMDDhhmmss>, and a snapshot
# name is at most 63 characters.
_STAMP_FORMAT = "%Y%m%d%H%M%S"
_STAMP_RE = re.compile(r"[0-9]{14}")
_MAX_SCHEDULE_NAME = 63 - 1 - 14
_SCHEDULE_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
_DURATION_RE = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DAILY_AT_RE = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SCHEDULE_STATE = "snapshot_schedules.json"
_SCHEDULE_STATE_VERSION = 1
# What the node's report carries of the schedules: at most this many
# (schedule, volume) outcomes, each error cut to this many characters.
_SCHEDULE_REPORT_LIMIT = 64
_SCHEDULE_ERROR_LIMIT = 300


def _pillar_get(key, default=None):
    """
    pillar.get as it is: Salt 3008 masks what it answers outside a
    template (every value '**********') unless given unmask=True, which
    earlier lines do not take.
    """
    try:
        return __salt__["pillar.get"](key, default, unmask=True)
    except TypeError:
        return __salt__["pillar.get"](key, default)


def _schedule_error(name, field, msg):
    where = "{}:{}".format(_SCHEDULES_PILLAR, name)
    if field:
        where += ": " + field
    return SaltInvocationError("{}: {}".format(where, msg))


def _duration(value):
    """Seconds of a duration written as 30s, 15m, 1h or 7d; None otherwise."""
    if isinstance(value, str):
        m = _DURATION_RE.fullmatch(value.strip())
        if m:
            return int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return None


def _fmt_duration(seconds):
    for unit in ("d", "h", "m"):
        if seconds % _UNIT_SECONDS[unit] == 0:
            return "{}{}".format(seconds // _UNIT_SECONDS[unit], unit)
    return "{}s".format(seconds)


def _check_schedule(name, conf):
    """One schedule from pillar, normalised; raises naming the field and the fix."""
    if (
        not isinstance(name, str)
        or len(name) > _MAX_SCHEDULE_NAME
        or not _SCHEDULE_NAME_RE.fullmatch(name)
    ):
        raise SaltInvocationError(
            "{}: {!r} is not a schedule name: use lower-case letters, digits, '-' and '.', "
            "at most {} characters, starting and ending with a letter or digit (it begins the "
            "name of every snapshot the schedule takes)".format(_SCHEDULES_PILLAR, name, _MAX_SCHEDULE_NAME)
        )
    if not isinstance(conf, dict):
        raise _schedule_error(
            name, None, "must be a mapping, e.g. {volumes: [data-1], every: 1h, keep: 24}"
        )
    unknown = sorted(str(k) for k in conf if k not in _SCHEDULE_KEYS)
    if unknown:
        raise _schedule_error(
            name, unknown[0], "unknown key: a schedule takes {}".format(", ".join(_SCHEDULE_KEYS))
        )
    out = {}
    if "volumes" in conf and "match" in conf:
        raise _schedule_error(name, "volumes", "give volumes or match, not both")
    if "volumes" in conf:
        vols = conf["volumes"]
        if not isinstance(vols, list) or not vols or not all(isinstance(v, str) and v for v in vols):
            raise _schedule_error(
                name, "volumes", "{!r} is not a list of volume names: use e.g. [data-1, data-2]".format(vols)
            )
        out["volumes"] = sorted(set(vols))
    elif "match" in conf:
        pats = conf["match"]
        if isinstance(pats, str):
            pats = [pats]
        if not isinstance(pats, list) or not pats or not all(isinstance(p, str) and p for p in pats):
            raise _schedule_error(
                name, "match", "{!r} is not a pattern: use a shell pattern on the names of this "
                "minion's volumes, e.g. 'db-*', or a list of them".format(conf["match"])
            )
        out["match"] = list(pats)
    else:
        raise _schedule_error(
            name, "volumes", "missing: give volumes (a list of volume names) or match (a pattern such as 'db-*')"
        )
    if "every" in conf and "daily_at" in conf:
        raise _schedule_error(name, "every", "give every or daily_at, not both")
    if "every" in conf:
        every = _duration(conf["every"])
        if every is None:
            raise _schedule_error(
                name, "every", "{!r} is not an interval: use a whole number and a unit, e.g. 30s, 15m, "
                "1h or 1d".format(conf["every"])
            )
        out["every"] = every
    elif "daily_at" in conf:
        at = conf["daily_at"]
        if not isinstance(at, str) or not _DAILY_AT_RE.fullmatch(at):
            raise _schedule_error(
                name, "daily_at", "{!r} is not a time of day: use HH:MM on 24 hours, quoted (YAML reads "
                "02:00 unquoted as a number), e.g. '02:00'".format(at)
            )
        out["daily_at"] = at
    else:
        raise _schedule_error(name, "every", "missing: give every (e.g. 1h) or daily_at (e.g. '02:00')")
    if "keep" not in conf and "max_age" not in conf:
        raise _schedule_error(
            name, "keep", "missing: give how many of this schedule's snapshots to keep (1 or more), "
            "max_age (e.g. 7d), or both"
        )
    if "keep" in conf:
        keep = conf["keep"]
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise _schedule_error(
                name, "keep", "{!r}: give how many of this schedule's snapshots to keep, a whole number "
                "of at least 1".format(keep)
            )
        if keep > _MAX_KEEP:
            raise _schedule_error(
                name, "keep", "{}: at most {} snapshots per volume: give a smaller keep (for a longer "
                "history, a longer every)".format(keep, _MAX_KEEP)
            )
        out["keep"] = keep
    interval = out.get("every", 86400)
    if "max_age" in conf:
        age = _duration(conf["max_age"])
        if age is None:
            raise _schedule_error(
                name, "max_age", "{!r} is not a duration: use a whole number and a unit, e.g. 12h or "
                "7d".format(conf["max_age"])
            )
        cap = min(_MAX_AGE_INTERVALS * interval, _MAX_AGE_CAP)
        if age > cap:
            raise _schedule_error(
                name, "max_age", "{!r}: at most {} times the interval and at most 3650d, here {}: give "
                "a shorter max_age, or a longer every".format(conf["max_age"], _MAX_AGE_INTERVALS, _fmt_duration(cap))
            )
        out["max_age"] = age
    if interval < _FAST_EVERY and "keep" not in out:
        raise _schedule_error(
            name, "keep", "missing: every {} is more often than once a minute: give keep too (at most {}), "
            "so that a count bounds how many snapshots it holds".format(conf["every"], _MAX_KEEP)
        )
    for key in ("any_volume", "raw_volumes"):
        if key in conf:
            if not isinstance(conf[key], bool):
                raise _schedule_error(name, key, "{!r}: give true or false".format(conf[key]))
            if conf[key]:
                out[key] = True
    return out


def _schedule_bound(conf):
    """How many of its snapshots a schedule holds on a volume at most, pruning aside."""
    if "keep" in conf:
        return conf["keep"]
    return conf["max_age"] // conf.get("every", 86400) + 1


def _schedules_pillar():
    raw = _pillar_get(_SCHEDULES_PILLAR, {})
    if raw in (None, ""):
        return {}
    if not isinstance(raw, dict):
        raise SaltInvocationError(
            "{}: must be a mapping of schedule names to schedules, e.g. "
            "{{nightly: {{volumes: [data-1], every: 1h, keep: 24}}}}".format(_SCHEDULES_PILLAR)
        )
    return raw


def snapshot_schedules():
    """
    The snapshot schedules in pillar ``salt_volumes:snapshot_schedules``,
    checked and normalised (intervals and ages in seconds). Raises on the
    first bad one, naming the schedule, the field and the fix.

    .. code-block:: yaml

        salt_volumes:
          snapshot_schedules:
            nightly:               # begins the name of each snapshot it takes
              volumes: [data-1]    # or match: 'db-*' (this minion's volumes)
              every: 1h            # or daily_at: '02:00' (the minion's local time)
              keep: 24             # and/or max_age: 7d

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot_schedules
    """
    raw = _schedules_pillar()
    return {name: _check_schedule(name, raw[name]) for name in sorted(raw, key=str)}


def _have_croniter():
    try:
        import croniter  # noqa: F401 pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return False
    return True


def snapshot_schedule_plan():
    """
    What the ``salt_volumes.scheduled`` formula applies: the Salt schedule
    entry of each snapshot schedule in pillar (``present``: entry name to
    ``schedule.present`` arguments, each calling ``run_snapshot_schedule``
    with the schedule as pillar gives it), the entries of ours whose
    schedule left pillar (``absent``), or, when the pillar is wrong, only
    ``error`` (the formula then fails with it and changes nothing).

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot_schedule_plan
    """
    try:
        schedules = snapshot_schedules()
    except SaltInvocationError as exc:
        return {"error": str(exc), "present": {}, "absent": []}
    raw = _schedules_pillar()
    current = __salt__["schedule.list"](show_all=True, return_yaml=False)
    current = current if isinstance(current, dict) else {}
    present = {}
    for name, conf in schedules.items():
        # The entry carries the schedule itself: a scheduled job may see
        # the minion's pillar as it was one refresh earlier. And an id made
        # when the entry is made (kept while it stays): the snapshots a
        # schedule owns are those taken under its id, so a schedule of the
        # same name later owns none of an earlier one's.
        kwargs = dict(raw[name])
        kwargs["schedule_id"] = _entry_schedule_id(current.get(SCHEDULE_ENTRY_PREFIX + name)) or os.urandom(8).hex()
        item = {"function": "salt_volumes.run_snapshot_schedule", "job_args": [name],
                "job_kwargs": kwargs, "maxrunning": 1}
        if "every" in conf:
            item["seconds"] = conf["every"]
        else:
            hour, minute = conf["daily_at"].split(":")
            item["cron"] = "{} {} * * *".format(int(minute), int(hour))
        present[SCHEDULE_ENTRY_PREFIX + name] = item
    if any("cron" in item for item in present.values()) and not _have_croniter():
        return {
            "error": "{}: daily_at needs the croniter Python package in the minion's Salt (Salt's "
            "scheduler runs cron times with it): install it there, or use every: 1d".format(_SCHEDULES_PILLAR),
            "present": {},
            "absent": [],
        }
    absent = sorted(
        n for n in current
        if isinstance(n, str) and n.startswith(SCHEDULE_ENTRY_PREFIX) and n not in present
    )
    return {"error": None, "present": present, "absent": absent, "prefix": SCHEDULE_ENTRY_PREFIX}


def _entry_schedule_id(entry):
    """The schedule id in a Salt schedule entry of ours (schedule.list), or None."""
    if not isinstance(entry, dict):
        return None
    for key in ("kwargs", "job_kwargs"):
        kw = entry.get(key)
        if isinstance(kw, dict) and isinstance(kw.get("schedule_id"), str) and _SCHEDULE_ID_RE.fullmatch(kw["schedule_id"]):
            return kw["schedule_id"]
    return None


def _schedule_dir(create=True):
    cachedir = __opts__.get("cachedir")
    if not cachedir:
        raise CommandExecutionError(
            "the minion config has no cachedir: snapshot schedules record there which snapshots they took"
        )
    path = os.path.join(cachedir, "salt_volumes")
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _flock(path, blocking=True):
    """An exclusive lock on path (an open fd), or None if busy and not blocking."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _load_schedule_state(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {"version": _SCHEDULE_STATE_VERSION, "schedules": {}, "retired": {}}
    except (OSError, ValueError) as exc:
        raise CommandExecutionError(
            "{} is unreadable ({}): it records which snapshots the schedules took; move it away to "
            "start over (the snapshots it named are then kept, never pruned)".format(path, exc)
        )
    if (
        not isinstance(doc, dict)
        or doc.get("version") != _SCHEDULE_STATE_VERSION
        or not isinstance(doc.get("schedules"), dict)
        or not isinstance(doc.setdefault("retired", {}), dict)
    ):
        raise CommandExecutionError(
            "{} is not a version {} record of snapshot schedules: move it away to start over (the "
            "snapshots it named are then kept, never pruned)".format(path, _SCHEDULE_STATE_VERSION)
        )
    return doc


def _save_schedule_state(path, doc):
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + _SCHEDULE_STATE + ".", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, sort_keys=True, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


@contextlib.contextmanager
def _schedule_state():
    """The schedules' record, read and written back atomically under a lock."""
    folder = _schedule_dir()
    fd = _flock(os.path.join(folder, _SCHEDULE_STATE + ".lock"))
    try:
        path = os.path.join(folder, _SCHEDULE_STATE)
        doc = _load_schedule_state(path)
        yield doc
        _save_schedule_state(path, doc)
    finally:
        os.close(fd)


def _schedule_entry(doc, schedule, uuid, volume, owner):
    vols = doc["schedules"].setdefault(schedule, {})
    entry = vols.get(uuid)
    if not isinstance(entry, dict) or entry.get("owner") != owner:
        # Recorded under another id (an earlier schedule of that name):
        # what it took is released, owned by nobody, never pruned.
        entry = vols[uuid] = {"owner": owner}
    entry["volume"] = volume
    entry.setdefault("owned", [])
    return entry


def _utc(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def scheduled_snapshot_name(schedule, at):
    """
    The name of the snapshot schedule ``schedule`` takes at ``at`` (seconds
    since the epoch): ``<schedule>-<UTC YYYYMMDDhhmmss>``.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.scheduled_snapshot_name nightly 1767225600
    """
    return "{}-{}".format(schedule, time.strftime(_STAMP_FORMAT, time.gmtime(float(at))))


def _stamp_of(schedule, snapshot):
    """When a snapshot named after schedule was taken (epoch seconds), or None."""
    prefix = schedule + "-"
    if not isinstance(snapshot, str) or not snapshot.startswith(prefix):
        return None
    stamp = snapshot[len(prefix):]
    if not _STAMP_RE.fullmatch(stamp):
        return None
    try:
        return calendar.timegm(time.strptime(stamp, _STAMP_FORMAT))
    except ValueError:
        return None


def _prune_selection(schedule, owned, snaps, keep, max_age, now, current):
    """
    The snapshots a run of schedule deletes after taking current: of those
    it took (named in owned AND named after it), those past the newest keep
    (current counts as one) or older than max_age, and any of them left
    unfinished or lost. current is never among them, nor anything else.
    With current None (nothing taken), by count alone: max_age None.
    """
    owned = set(owned)
    ours = []
    for snap in snaps:
        name = snap.get("name")
        if name == current or name not in owned:
            continue
        at = _stamp_of(schedule, name)
        if at is not None:
            ours.append((at, name, snap))
    ours.sort(key=lambda t: (t[0], t[1]), reverse=True)
    doomed, kept = [], (0 if current is None else 1)
    for at, name, snap in ours:
        if snap.get("phase") != "taken" or snap.get("lost"):
            doomed.append(name)
        elif (keep is not None and kept >= keep) or (max_age is not None and now - at > max_age):
            doomed.append(name)
        else:
            kept += 1
    return sorted(doomed)


def _node_spec(uuid):
    """
    The spec this node prepared volume uuid with, from its own record: a
    volume the control plane made is in no pillar.
    """
    if not isinstance(uuid, str) or not _UUID_RE.fullmatch(uuid):
        raise CommandExecutionError("{!r} is not a volume uuid".format(uuid))
    path = os.path.join(_opt("state_dir", DEFAULT_STATE_DIR), "volumes", uuid + ".json")
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError) as exc:
        raise CommandExecutionError("the node's record of volume {} is unreadable: {}".format(uuid, exc))
    spec = rec.get("spec") if isinstance(rec, dict) else None
    if not isinstance(spec, dict) or spec.get("uuid") != uuid:
        raise CommandExecutionError("the node's record of volume {} ({}) holds no spec of it".format(uuid, path))
    return spec


def _pillar_volumes():
    """
    The volumes this minion's pillar defines for it (salt_volumes:volumes,
    and salt_volumes:volume, with node this minion): name to the uuid
    pillar gives them, or the one derived for them (pillar_uuid).
    """
    me = __grains__.get("id")
    specs = _pillar_get("salt_volumes:volumes", {}) or {}
    items = list(specs.items()) if isinstance(specs, dict) else []
    single = _pillar_get("salt_volumes:volume")
    if isinstance(single, dict) and single.get("name"):
        items.append((single["name"], single))
    out = {}
    for key, spec in items:
        if isinstance(spec, dict) and spec.get("node") == me:
            name = spec.get("name") or key
            out[name] = spec.get("uuid") or pillar_uuid(me, name)
    return out


def _not_in_pillar(schedule):
    return (
        "not a volume of this minion's pillar (salt_volumes:volumes, node {}): a schedule takes only "
        "those; set any_volume: true in {}:{} to take the volumes this node holds from elsewhere too "
        "(the control plane, Kubernetes), whose deletion through the control plane then waits until "
        "their scheduled snapshots are gone".format(__grains__.get("id"), _SCHEDULES_PILLAR, schedule)
    )


def _raw_refusal(schedule):
    return (
        "a raw volume (rawBlockDevice): set raw_volumes: true in {}:{} to take its snapshots (LVM "
        "snapshots of the operator's LV: each thick one sets aside a quarter of the LV in its VG; on a "
        "disk or partition there is nothing to take one with)".format(_SCHEDULES_PILLAR, schedule)
    )


def _delete_own(schedule, uuid, volume, owner, spec, doomed):
    """Delete doomed snapshots of ours, each even if another fails: (deleted, [(stage, error)])."""
    deleted, errors = [], []
    try:
        for name in doomed:
            try:
                _run("snapshot-delete", spec, ["--name", name])
                deleted.append(name)
            except (CommandExecutionError, OSError) as exc:
                errors.append(("pruning " + name, message(exc)))
    finally:
        if deleted:
            with _schedule_state() as doc:
                entry = _schedule_entry(doc, schedule, uuid, volume, owner)
                entry["owned"] = sorted(n for n in entry["owned"] if n not in deleted)
    return deleted, errors


def _first_error(errors):
    stage, msg = errors[0]
    if len(errors) > 1:
        msg += " (and {} more failed)".format(len(errors) - 1)
    return stage, msg


def _run_schedule_on(schedule, conf, vol, snap, now, owner):
    """Take snap of one volume for schedule, then prune; records the outcome."""
    uuid, volume = vol["uuid"], vol["name"]
    out = {"volume": volume, "uuid": uuid}
    stage = "snapshot " + snap
    try:
        if vol.get("refused"):
            stage = "not taken"
            raise CommandExecutionError(vol["refused"])
        spec = _node_spec(uuid)
        if "rawBlockDevice" in spec and not conf.get("raw_volumes"):
            stage = "not taken"
            raise CommandExecutionError(_raw_refusal(schedule))
        before = {s.get("name"): s for s in _run("snapshots", spec).get("snapshots") or []}
        bound = _schedule_bound(conf)

        def claim(doc):
            entry = _schedule_entry(doc, schedule, uuid, volume, owner)
            # Names of ours the node no longer has (deleted by hand) are
            # forgotten.
            mine = {n for n in entry["owned"] if n in before}
            entry["owned"] = sorted(mine)
            if len([n for n in mine if _stamp_of(schedule, n) is not None]) >= bound + _OVER_KEEP:
                return mine, False
            if snap in before and snap not in mine:
                raise CommandExecutionError(
                    "a snapshot named {} that this schedule did not take is there already: not taken, "
                    "nothing pruned".format(snap)
                )
            # Recorded before it is taken: a run killed in between leaves a
            # name the next run forgets if the node does not have it, and
            # prunes as its own if it does.
            mine.add(snap)
            entry["owned"] = sorted(mine)
            return mine, True

        with _schedule_state() as doc:
            owned, claimed = claim(doc)
        if not claimed:
            # Its pruning failed run after run: it holds keep + a few. It
            # takes no more, but tries again to prune, by count alone.
            doomed = _prune_selection(schedule, owned, before.values(), bound, None, now, None)
            deleted, errors = _delete_own(schedule, uuid, volume, owner, spec, doomed)
            for name in deleted:
                before.pop(name, None)
            with _schedule_state() as doc:
                owned, claimed = claim(doc)
            if not claimed:
                stage = "not taken"
                raise CommandExecutionError(
                    "it holds {} of its own snapshots on this volume, keep ({}) + {} or more, as its pruning "
                    "failed{}: it takes no more until they are fewer; fix that, or delete some by hand "
                    "(salt_volumes.snapshot_delete)".format(
                        len([n for n in owned if _stamp_of(schedule, n) is not None]), bound, _OVER_KEEP,
                        " ({}: {})".format(*_first_error(errors)) if errors else "")
                )
        taken = _run("snapshot", spec, ["--name", snap])
        out["snapshot"], out["new"] = snap, snap not in before
        with _schedule_state() as doc:
            entry = _schedule_entry(doc, schedule, uuid, volume, owner)
            entry["lastSuccess"], entry["lastSnapshot"] = _utc(now), snap
        stage = "pruning"
        snaps = dict(before)
        snaps[snap] = taken
        doomed = _prune_selection(schedule, owned, snaps.values(), conf.get("keep"), conf.get("max_age"), now, snap)
        deleted, errors = _delete_own(schedule, uuid, volume, owner, spec, doomed)
        out["pruned"] = deleted
        if errors:
            stage, msg = _first_error(errors)
            raise CommandExecutionError(msg)
        with _schedule_state() as doc:
            _schedule_entry(doc, schedule, uuid, volume, owner)["failing"] = False
    except (CommandExecutionError, SaltInvocationError, OSError) as exc:
        out["error"] = "schedule {}, volume {}: {}: {}".format(schedule, volume, stage, message(exc))
        log.warning("salt_volumes: %s", out["error"])
        try:
            with _schedule_state() as doc:
                entry = _schedule_entry(doc, schedule, uuid, volume, owner)
                entry["failing"] = True
                entry["lastError"] = out["error"][:_SCHEDULE_ERROR_LIMIT]
                entry["lastErrorAt"] = _utc(now)
        except (CommandExecutionError, OSError) as exc2:
            log.warning("salt_volumes: could not record the error of schedule %s: %s", schedule, exc2)
    return out


def run_snapshot_schedule(name, volumes=None, match=None, every=None, daily_at=None, keep=None, max_age=None,
                          any_volume=None, raw_volumes=None, schedule_id=None):
    """
    Run snapshot schedule ``name`` once: Salt's scheduler calls this, with
    the schedule's fields as the ``salt_volumes.scheduled`` formula wrote
    them into its entry; called by hand with the name alone, the schedule
    is read from pillar ``salt_volumes:snapshot_schedules``. Take
    snapshot ``<name>-<UTC YYYYMMDDhhmmss>`` of each volume of this minion
    the schedule names or matches, among the volumes of this minion's
    pillar (``salt_volumes:volumes``) unless ``any_volume`` is true, and
    never a raw volume unless ``raw_volumes`` is true, then delete this
    schedule's own older snapshots past ``keep`` or older than
    ``max_age``. Only snapshots this function took for this schedule
    (recorded in the minion's cachedir, before each is taken, under the id
    of its Salt schedule entry, ``schedule_id``: by hand, read from the
    entry) are ever deleted, and only after a snapshot was
    taken in this run; the one just taken is always kept. A run in the same
    second as the last one takes nothing more; a run while another of the
    same schedule is going does nothing; on a volume where it holds keep
    + 3 of its own (its pruning failed), a run takes no more. The outcome per volume (last
    success, last error) is kept for the node's report (``status``). A
    failure of one volume does not stop the others and fails the job.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.run_snapshot_schedule nightly
        salt node-1 salt_volumes.run_snapshot_schedule nightly volumes='[data-1]' every=1h keep=24
    """
    given = {k: v for k, v in (("volumes", volumes), ("match", match), ("every", every),
                                ("daily_at", daily_at), ("keep", keep), ("max_age", max_age),
                                ("any_volume", any_volume), ("raw_volumes", raw_volumes)) if v is not None}
    if given:
        conf = _check_schedule(name, given)
    else:
        raw = _schedules_pillar()
        if name not in raw:
            raise SaltInvocationError(
                "{}: no schedule {!r}: add it there, or apply salt_volumes.scheduled to remove its Salt "
                "schedule entry ({}{})".format(_SCHEDULES_PILLAR, name, SCHEDULE_ENTRY_PREFIX, name)
            )
        conf = _check_schedule(name, raw[name])
    if schedule_id is None:
        current = __salt__["schedule.list"](show_all=True, return_yaml=False)
        schedule_id = _entry_schedule_id((current if isinstance(current, dict) else {}).get(SCHEDULE_ENTRY_PREFIX + name))
        if schedule_id is None:
            raise SaltInvocationError(
                "{}{}: no Salt schedule entry of that name, with its id, on this minion: apply "
                "salt_volumes.scheduled first (a schedule owns only the snapshots taken under its "
                "entry's id)".format(SCHEDULE_ENTRY_PREFIX, name)
            )
    elif not isinstance(schedule_id, str) or not _SCHEDULE_ID_RE.fullmatch(schedule_id):
        raise SaltInvocationError(
            "schedule_id: {!r} is not a schedule id: leave it out (it is read from the Salt schedule "
            "entry {}{})".format(schedule_id, SCHEDULE_ENTRY_PREFIX, name)
        )
    now = int(time.time())
    snap = scheduled_snapshot_name(name, now)
    busy = _flock(os.path.join(_schedule_dir(), "schedule-{}.lock".format(name)), blocking=False)
    if busy is None:
        return {"schedule": name, "skipped": "another run of schedule {} is going on this minion".format(name)}
    try:
        held = [
            v for v in list_()
            if v.get("name") and v.get("uuid") and v.get("state") != "orphan"
        ]
        pillar_vols = None if conf.get("any_volume") else _pillar_volumes()

        def refusal(v):
            if pillar_vols is not None:
                want = pillar_vols.get(v["name"], False)
                if want is False or (want and want != v["uuid"]):
                    return _not_in_pillar(name)
            if v.get("type") == "rawBlockDevice" and not conf.get("raw_volumes"):
                return _raw_refusal(name)
            return None

        skipped = []
        if "volumes" in conf:
            # Named: one refused fails, saying why.
            chosen = [dict(v, refused=refusal(v)) for v in held if v["name"] in conf["volumes"]]
        else:
            chosen = []
            for v in held:
                if any(fnmatch.fnmatchcase(v["name"], p) for p in conf["match"]):
                    why = refusal(v)
                    if why:
                        skipped.append({"volume": v["name"], "uuid": v["uuid"], "reason": why})
                    else:
                        chosen.append(v)
        # A volume gone from this node took its snapshots with it (a volume
        # with snapshots is not removed): forget it. So is what an earlier
        # schedule of this name (another id) recorded: released.
        here = {v["uuid"] for v in held}
        with _schedule_state() as doc:
            mine = doc["schedules"].get(name) or {}
            for uuid in [u for u in mine if u not in here or not isinstance(mine[u], dict)
                         or mine[u].get("owner") != schedule_id]:
                del mine[uuid]
            # Retired: reported again only if scheduled again, its entry
            # back under this run's id. A run the scheduler fired just
            # before the entry went may reach here after the retirement
            # (its clock read late, in the same second): it leaves it. The
            # formula removes the entry before it retires, so under this
            # lock the entry read is current.
            if name in doc["retired"] and doc["retired"][name] < now and _scheduled_under(name, schedule_id):
                del doc["retired"][name]
        results = [_run_schedule_on(name, conf, v, snap, now, schedule_id) for v in sorted(chosen, key=lambda v: v["name"])]
    finally:
        os.close(busy)
    failed = [r["error"] for r in results if r.get("error")]
    if failed:
        __context__["retcode"] = 1
    ret = {"schedule": name, "snapshot": snap, "volumes": results, "failed": len(failed)}
    if skipped:
        ret["skipped"] = sorted(skipped, key=lambda v: v["volume"])
    if "volumes" in conf:
        missing = sorted(set(conf["volumes"]) - {v["name"] for v in chosen})
        if missing:
            ret["notOnThisMinion"] = missing
    return ret


def _scheduled_under(name, schedule_id):
    """Whether this minion's Salt schedule holds schedule ``name``'s entry under ``schedule_id``."""
    current = __salt__["schedule.list"](show_all=True, return_yaml=False)
    if not isinstance(current, dict):
        return False
    return _entry_schedule_id(current.get(SCHEDULE_ENTRY_PREFIX + name)) == schedule_id


def snapshot_schedule_status():
    """
    The outcome of each snapshot schedule on each of its volumes on this
    minion (but for schedules retired by ``retire_snapshot_schedule``, as
    the ``salt_volumes.scheduled`` formula does when a schedule leaves
    pillar): ``schedule``, ``volume``, ``uuid``, ``lastSuccess`` and
    ``lastSnapshot`` (the last snapshot taken, UTC), ``failing`` (the last
    run failed) with ``lastError`` and ``lastErrorAt``. At most 64 entries
    (when cut, the failing ones first), errors cut to 300 characters; ``status`` (and so the beacon) carries
    it as ``snapshotSchedules``.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot_schedule_status
    """
    path = os.path.join(_schedule_dir(create=False), _SCHEDULE_STATE)
    doc = _load_schedule_state(path)
    rows = []
    for schedule in sorted(doc["schedules"]):
        if schedule in doc["retired"]:
            continue
        vols = doc["schedules"][schedule]
        if not isinstance(vols, dict):
            continue
        for uuid in sorted(vols, key=lambda u: (str(vols[u].get("volume")), u)):
            entry = vols[uuid]
            row = {
                "schedule": schedule,
                "volume": entry.get("volume"),
                "uuid": uuid,
                "lastSuccess": entry.get("lastSuccess"),
                "lastSnapshot": entry.get("lastSnapshot"),
                "failing": bool(entry.get("failing")),
            }
            if entry.get("lastError"):
                row["lastError"] = str(entry["lastError"])[:_SCHEDULE_ERROR_LIMIT]
                row["lastErrorAt"] = entry.get("lastErrorAt")
            rows.append(row)
    if len(rows) > _SCHEDULE_REPORT_LIMIT:
        # Cut: the failing ones first, in their order.
        first = sorted(range(len(rows)), key=lambda i: (not rows[i]["failing"], i))[:_SCHEDULE_REPORT_LIMIT]
        rows = [rows[i] for i in sorted(first)]
    return rows


def _schedule_report_or_none():
    """snapshot_schedule_status for status: a problem with it is logged, never fails the report."""
    if not __opts__.get("cachedir"):
        return []
    try:
        return snapshot_schedule_status()
    except Exception as exc:  # pylint: disable=broad-except
        log.warning("salt_volumes: snapshot schedules' outcome unreadable: %s", exc)
        return None


def retire_snapshot_schedule(name):
    """
    Stop reporting snapshot schedule ``name`` (its Salt schedule entry was
    removed: the ``salt_volumes.scheduled`` formula calls this, through the
    ``salt_volumes.snapshot_schedule_retired`` state, when a schedule
    leaves pillar). Its snapshots stay on the node, released: its record
    of them goes, so no schedule ever prunes them (one of the same name
    later owns only what it takes, under its own entry's id). A run under
    an entry added again reports it again; a run the scheduler fired as
    the entry went does not. Returns whether it was reported until now.

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.retire_snapshot_schedule nightly
    """
    if not isinstance(name, str) or not name:
        raise SaltInvocationError("name: give the schedule's name")
    with _schedule_state() as doc:
        was = name not in doc["retired"]
        if was:
            doc["retired"][name] = time.time()
        doc["schedules"].pop(name, None)
    return was


def snapshot_schedule_retired(name):
    """
    Whether snapshot schedule ``name`` is retired (see
    ``retire_snapshot_schedule``).

    CLI Example:

    .. code-block:: bash

        salt node-1 salt_volumes.snapshot_schedule_retired nightly
    """
    path = os.path.join(_schedule_dir(create=False), _SCHEDULE_STATE)
    return name in _load_schedule_state(path)["retired"]
