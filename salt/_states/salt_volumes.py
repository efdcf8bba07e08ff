"""
States for local persistent volumes (see the ``salt_volumes`` execution
module).

.. code-block:: yaml

    data-1:
      salt_volumes.prepared:
        - spec:
            uuid: 3f2504e0-4f89-41d3-9a0c-0305e82c3301
            node: node-1
            sparseLoopDevice: {size: 10Gi}

The return of ``prepared`` carries a ``volume`` key with the device info
(persistentPath, devicePath, deviceName, size, uuid, ...), so a listener on
the job return event needs no second call.
"""

import os
import time

from salt.exceptions import CommandExecutionError, SaltInvocationError

__virtualname__ = "salt_volumes"


def __virtual__():
    if "salt_volumes.prepare" in __salt__:
        return __virtualname__
    return (False, "salt_volumes execution module not loaded (saltutil.sync_all)")


def _ret(name):
    return {"name": name, "result": False, "changes": {}, "comment": ""}


def _checked(name, spec, ret):
    try:
        return __salt__["salt_volumes.check"](name=name, spec=spec)
    except (CommandExecutionError, SaltInvocationError) as exc:
        msg = __salt__["salt_volumes.message"](exc)
        ret["comment"] = msg if msg.startswith("volume ") else "volume {}: {}".format(name, msg)
        return None


def _info(name, spec, ret):
    try:
        return __salt__["salt_volumes.info"](spec=spec)
    except CommandExecutionError as exc:
        ret["comment"] = "volume {}: {}".format(name, __salt__["salt_volumes.message"](exc))
        return None


def prepared(name, spec=None):
    """
    Make sure the volume is prepared on this minion.

    name
        Volume name; the spec comes from pillar when ``spec`` is not given.
    spec
        The volume spec (uuid, node, mode, fsType, mkfsOptions,
        sparseLoopDevice, rawBlockDevice or lvmLogicalVolume).
    """
    ret = _ret(name)
    spec = _checked(name, spec, ret)
    if spec is None:
        return ret
    if __opts__["test"]:
        current = _info(name, spec, ret)
        if current is None:
            return ret
        ret["volume"] = __salt__["salt_volumes.device_info"](current)
        if current.get("state") == "prepared":
            ret["result"] = True
            ret["comment"] = "Volume {} is already prepared at {}".format(name, current.get("persistentPath"))
        else:
            ret["result"] = None
            ret["comment"] = "Volume {} would be prepared (now {})".format(name, current.get("state"))
            ret["changes"] = {"state": {"old": current.get("state"), "new": "prepared"}}
        return ret
    try:
        out = __salt__["salt_volumes.prepare"](spec=spec)
    except CommandExecutionError as exc:
        ret["comment"] = "volume {}: {}".format(name, __salt__["salt_volumes.message"](exc))
        return ret
    info = __salt__["salt_volumes.device_info"](out)
    ret["result"] = True
    ret["volume"] = info
    # The normalised spec lets a control plane adopt a volume prepared by
    # salt-call or orchestrate from the job return alone.
    ret["spec"] = spec
    if out.get("changed"):
        ret["changes"] = {"prepared": info}
        ret["comment"] = "Volume {} prepared at {}".format(name, info.get("persistentPath"))
    else:
        ret["comment"] = "Volume {} is already prepared at {}".format(name, info.get("persistentPath"))
    if out.get("warnings"):
        ret["warnings"] = out["warnings"]
    return ret


def absent(name, spec=None, wipe=False):
    """
    Make sure the volume is no longer prepared on this minion. Sparse volumes
    lose their loop device and file. Raw devices keep their data unless
    ``wipe`` is True, which erases only the signatures carrying the volume's
    UUID. Refused while the volume is mounted or in use.
    """
    ret = _ret(name)
    spec = _checked(name, spec, ret)
    if spec is None:
        return ret
    current = _info(name, spec, ret)
    if current is None:
        return ret
    if __opts__["test"]:
        if current.get("state") == "absent":
            ret["result"] = True
            ret["comment"] = "Volume {} is already absent".format(name)
        else:
            ret["result"] = None
            ret["comment"] = "Volume {} would be removed{}".format(name, " and wiped" if wipe else "")
            ret["changes"] = {"state": {"old": current.get("state"), "new": "absent"}}
        return ret
    try:
        out = __salt__["salt_volumes.unprepare"](spec=spec, wipe=wipe)
    except CommandExecutionError as exc:
        ret["comment"] = "volume {}: {}".format(name, __salt__["salt_volumes.message"](exc))
        return ret
    ret["result"] = True
    ret["volume"] = __salt__["salt_volumes.device_info"](out)
    if out.get("changed"):
        ret["changes"] = {"removed": {"old": current.get("state"), "new": "absent", "wiped": bool(wipe)}}
        ret["comment"] = "Volume {} removed".format(name)
    else:
        ret["comment"] = "Volume {} is already absent".format(name)
    if out.get("warnings"):
        ret["warnings"] = out["warnings"]
    return ret


unprepared = absent


def restored(name):
    """
    Re-attach this minion's sparse volumes and recreate their links (what a
    boot takes away). ``name`` is only the state's label.
    """
    ret = _ret(name)
    if __opts__["test"]:
        vols = __salt__["salt_volumes.list"]()
        todo = [v.get("name") for v in vols if v.get("state") in ("detached", "locked")]
        ret["result"] = None if todo else True
        ret["comment"] = "Would restore {}".format(", ".join(todo)) if todo else "Nothing to restore"
        if todo:
            ret["changes"] = {"restored": todo}
        return ret
    try:
        rep = __salt__["salt_volumes.restore"]()
    except CommandExecutionError as exc:
        ret["comment"] = __salt__["salt_volumes.message"](exc)
        rep = getattr(exc, "result", None) or {}
        failed = [v.get("name") or v.get("uuid") for v in rep.get("volumes", []) if v.get("error")]
        if failed:
            ret["comment"] = "Could not restore: {}".format(", ".join(str(f) for f in failed))
        return ret
    changed = [v.get("name") for v in rep.get("volumes", []) if v.get("changed")]
    ret["result"] = True
    if changed:
        ret["changes"] = {"restored": changed}
    orphans = [o.get("backingFile") or o.get("uuid") for o in rep.get("orphans", [])]
    ret["comment"] = "Restored {} volume(s){}".format(
        len(changed), "; orphans left alone: " + ", ".join(orphans) if orphans else ""
    )
    return ret


def _snapshot_of(name, volume, spec, ret):
    """The volume's spec and its snapshot ``name`` on this minion, if any."""
    spec = _checked(volume, spec, ret)
    if spec is None:
        return None, None
    try:
        snaps = __salt__["salt_volumes.snapshots"](spec=spec)
    except CommandExecutionError as exc:
        ret["comment"] = "volume {}: {}".format(volume, __salt__["salt_volumes.message"](exc))
        return None, None
    for snap in snaps or []:
        if snap.get("name") == name:
            return spec, snap
    return spec, {}


def snapshot_present(name, volume, spec=None, size=None):
    """
    Make sure the volume has snapshot ``name`` on this minion: taken once,
    then left as it is (a snapshot is a point in time: a later run does not
    take it again). Sparse and LVM volumes; a mounted filesystem is frozen
    meanwhile. ``size``: a thick LVM snapshot's copy-on-write space.

    .. code-block:: yaml

        before-upgrade:
          salt_volumes.snapshot_present:
            - volume: data-1

    name
        The snapshot's name (lower-case letters, digits, '-' and '.').
    volume
        The volume's name; its spec comes from pillar when ``spec`` is not
        given.
    """
    ret = _ret(name)
    spec, snap = _snapshot_of(name, volume, spec, ret)
    if spec is None:
        return ret
    if snap.get("phase") == "taken":
        ret["snapshot"] = snap
        if snap.get("lost"):
            # Its data is gone (an overflowed thick snapshot, an LV someone
            # removed): taking it again would put a later instant under
            # the name of the one asked for.
            ret["result"] = False
            ret["comment"] = ("Snapshot {} of volume {} is lost: {}; remove it (salt_volumes.snapshot_absent) "
                              "before a snapshot of that name can be taken again").format(name, volume, snap.get("warning"))
            return ret
        ret["result"] = True
        ret["comment"] = "Snapshot {} of volume {} was taken at {}".format(name, volume, snap.get("takenAt"))
        if snap.get("warning"):
            ret["warnings"] = [snap["warning"]]
        return ret
    if __opts__["test"]:
        ret["result"] = None
        ret["comment"] = "Snapshot {} of volume {} would be taken".format(name, volume)
        ret["changes"] = {"snapshot": {"old": None, "new": name}}
        return ret
    try:
        out = __salt__["salt_volumes.snapshot"](spec=spec, snapshot_name=name, size=size)
    except CommandExecutionError as exc:
        ret["comment"] = "volume {}: snapshot {}: {}".format(volume, name, __salt__["salt_volumes.message"](exc))
        return ret
    ret["result"] = True
    ret["snapshot"] = out
    ret["changes"] = {"taken": {k: out.get(k) for k in ("name", "method", "frozen", "size", "allocated", "takenAt")}}
    ret["comment"] = "Snapshot {} of volume {} taken ({})".format(name, volume, out.get("method"))
    return ret


def snapshot_absent(name, volume, spec=None):
    """
    Make sure the volume has no snapshot ``name`` on this minion.

    name
        The snapshot's name.
    volume
        The volume's name; its spec comes from pillar when ``spec`` is not
        given.
    """
    ret = _ret(name)
    spec, snap = _snapshot_of(name, volume, spec, ret)
    if spec is None:
        return ret
    if not snap:
        ret["result"] = True
        ret["comment"] = "Volume {} has no snapshot {}".format(volume, name)
        return ret
    if __opts__["test"]:
        ret["result"] = None
        ret["comment"] = "Snapshot {} of volume {} would be deleted".format(name, volume)
        ret["changes"] = {"snapshot": {"old": name, "new": None}}
        return ret
    try:
        __salt__["salt_volumes.snapshot_delete"](spec=spec, snapshot_name=name)
    except CommandExecutionError as exc:
        ret["comment"] = "volume {}: snapshot {}: {}".format(volume, name, __salt__["salt_volumes.message"](exc))
        return ret
    ret["result"] = True
    ret["changes"] = {"deleted": name}
    ret["comment"] = "Snapshot {} of volume {} deleted".format(name, volume)
    return ret


def snapshot_schedule_retired(name):
    """
    Make sure snapshot schedule ``name`` is no longer reported in the
    node's report (``snapshotSchedules``): the ``salt_volumes.scheduled``
    formula uses it once the schedule's Salt schedule entry is removed. The
    snapshots it took stay, released: its record of them goes, so no
    schedule prunes them, not even a later one of the same name.

    .. code-block:: yaml

        nightly:
          salt_volumes.snapshot_schedule_retired
    """
    ret = _ret(name)
    try:
        if __salt__["salt_volumes.snapshot_schedule_retired"](name):
            ret["result"] = True
            ret["comment"] = "Snapshot schedule {} is retired".format(name)
            return ret
        if __opts__["test"]:
            ret["result"] = None
            ret["comment"] = "Snapshot schedule {} would be retired".format(name)
            ret["changes"] = {"retired": name}
            return ret
        __salt__["salt_volumes.retire_snapshot_schedule"](name)
    except (CommandExecutionError, SaltInvocationError) as exc:
        ret["comment"] = "snapshot schedule {}: {}".format(name, __salt__["salt_volumes.message"](exc))
        return ret
    ret["result"] = True
    ret["changes"] = {"retired": name}
    ret["comment"] = "Snapshot schedule {} retired: no longer reported; its snapshots stay, released".format(name)
    return ret


# What a source install of the node leaves (0.3.0's docs: make install,
# or salt_volumes.installed on a node without the package).
SOURCE_BINARY = "/usr/local/bin/salt-volume-exec"
SOURCE_UNIT = "/etc/systemd/system/salt-volumes-restore.service"
PACKAGE_BINARY = "/usr/bin/salt-volume-exec"
SYSTEMD_RUNNING = "/run/systemd/system"
_BUILD_PATH = b"github.com/salt-volumes/salt-volumes/cmd/salt-volume-exec"
# The restore unit as 0.3.0 wrote it with the default paths; one with
# another binary or state dir is the admin's (the package's unit restores
# /var/lib/salt-volumes only).
_UNIT_LINES = (
    "Description=Restore salt-volumes local volumes",
    "ExecStart=/usr/local/bin/salt-volume-exec --state-dir /var/lib/salt-volumes restore",
)


def _source_binary_ours(path):
    # Go writes the main package's path into every binary's build info,
    # stripped or not: a file without it is somebody else's.
    try:
        with open(path, "rb") as f:
            return _BUILD_PATH in f.read()
    except OSError:
        return False


def _source_unit_ours(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = {line.rstrip("\n") for line in f}
    except OSError:
        return False
    return all(want in lines for want in _UNIT_LINES)


def _retire(path):
    """Move path aside to path.retired (a dated name if that is taken),
    never into a directory nor over a file; return the new name."""
    to = path + ".retired"
    if os.path.lexists(to):
        to = "{}.retired.{}".format(path, time.strftime("%Y%m%d%H%M%S"))
    if os.path.lexists(to):
        raise OSError("{} exists".format(to))
    os.rename(path, to)
    return to


def source_install_retired(name):
    """
    On a node with the ``salt-volume-exec`` package, retire what a source
    install left, as the package's own scripts do:
    ``/usr/local/bin/salt-volume-exec`` (first in PATH, so the execution
    module would go on running it) is moved to ``<path>.retired`` and its
    path made a link to ``/usr/bin/salt-volume-exec``, so that a minion
    config naming it runs the package's binary;
    ``/etc/systemd/system/salt-volumes-restore.service`` (which overrides the
    package's unit) is moved aside, its enablement moved to the package's
    unit. Only what is ours: the binary by the module path Go builds into
    it, the unit as 0.3.0 wrote it with the default paths; anything else is
    left and named. Nothing is deleted. Without the package, nothing is
    done: the source install is the node's install. ``salt_volumes.installed``
    runs it.

    .. code-block:: yaml

        salt-volume-exec source install:
          salt_volumes.source_install_retired
    """
    ret = _ret(name)
    if not __salt__["pkg.version"]("salt-volume-exec"):
        ret["result"] = True
        ret["comment"] = "no salt-volume-exec package here: a source install is this node's install"
        return ret
    todo, left = [], []
    if os.path.islink(SOURCE_BINARY):
        if os.readlink(SOURCE_BINARY) != PACKAGE_BINARY:
            left.append("{} links to {}".format(SOURCE_BINARY, os.readlink(SOURCE_BINARY)))
    elif os.path.isfile(SOURCE_BINARY):
        if _source_binary_ours(SOURCE_BINARY):
            todo.append(SOURCE_BINARY)
        else:
            left.append("{} is not a salt-volume-exec build".format(SOURCE_BINARY))
    if os.path.islink(SOURCE_UNIT) or (os.path.lexists(SOURCE_UNIT) and not os.path.isfile(SOURCE_UNIT)):
        left.append("{} is not a plain file".format(SOURCE_UNIT))
    elif os.path.isfile(SOURCE_UNIT):
        if not _source_unit_ours(SOURCE_UNIT):
            left.append("{} is not the restore unit 0.3.0 wrote (another command or state dir)".format(SOURCE_UNIT))
        elif not os.path.isdir(SYSTEMD_RUNNING):
            left.append("{}: systemd is not running here to move its enablement".format(SOURCE_UNIT))
        else:
            todo.append(SOURCE_UNIT)
    note = " (left: {})".format("; ".join(left)) if left else ""
    if not todo:
        ret["result"] = True
        ret["comment"] = "Nothing of a source install to retire" + note
        return ret
    if __opts__["test"]:
        ret["result"] = None
        ret["changes"] = {"retired": todo}
        ret["comment"] = "Would move aside what a source install left: {}{}".format(", ".join(todo), note)
        return ret
    retired = {}
    try:
        if SOURCE_BINARY in todo:
            retired[SOURCE_BINARY] = _retire(SOURCE_BINARY)
            os.symlink(PACKAGE_BINARY, SOURCE_BINARY)
        if SOURCE_UNIT in todo:
            # Moved first: a failure here leaves the unit as it was. Its
            # links are then those of a unit file that is gone, replaced by
            # the package's (reenable) when it was enabled.
            enabled = __salt__["service.enabled"]("salt-volumes-restore")
            retired[SOURCE_UNIT] = _retire(SOURCE_UNIT)
            __salt__["service.systemctl_reload"]()
            if enabled:
                __salt__["service.disable"]("salt-volumes-restore")
                __salt__["service.enable"]("salt-volumes-restore")
    except (OSError, CommandExecutionError) as exc:
        ret["changes"] = {"retired": retired} if retired else {}
        ret["comment"] = "retiring a source install: {}".format(exc)
        return ret
    ret["result"] = True
    ret["changes"] = {"retired": retired}
    ret["comment"] = "Moved aside what a source install left, the package's files run from now on: {}{}".format(
        ", ".join(todo), note
    )
    return ret
