"""Unit tests for the branches real Salt runs cannot reach: a missing or
broken binary, failing event buses, pillar selection edge cases, test mode.
The real-Salt tests live in test/salt (Go)."""
import importlib.util
import json
import os
import stat
import sys
import textwrap
import time

import pytest
from pillar_tree import lookup
from salt.exceptions import CommandExecutionError, SaltInvocationError

HERE = os.path.dirname(os.path.abspath(__file__))


def load(kind):
    path = os.path.join(HERE, "..", "_" + kind, "salt_volumes.py")
    spec = importlib.util.spec_from_file_location("salt_volumes_" + kind, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_binary(tmp_path, body):
    """A stand-in salt-volume-exec whose behaviour the test scripts."""
    p = tmp_path / "salt-volume-exec"
    p.write_text("#!{}\nimport sys, json\nargs = sys.argv[1:]\ndata = sys.stdin.read()\n{}\n".format(
        sys.executable, textwrap.dedent(body)))
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


@pytest.fixture
def mod(tmp_path):
    m = load("modules")
    events = []
    pillar = {}
    # Pillar-backed like Salt's config.get, which the module must not use for
    # its own settings.
    config = {}
    opts = {"state_dir": str(tmp_path / "state")}

    def pillar_get(key, default=None):
        return lookup(pillar, key, default)

    m.__salt__ = {
        "config.get": lambda k, d=None: config.get(k, d),
        "pillar.get": pillar_get,
        "event.send": lambda tag, data: events.append((tag, data)),
    }
    m.__opts__ = {"salt_volumes": opts}
    m.__grains__ = {"id": "node-1"}
    m.events, m.pillar, m.config, m.opts = events, pillar, config, opts
    return m


SPEC = {"name": "v1", "uuid": "3f2504e0-4f89-41d3-9a0c-0305e82c3301", "node": "node-1",
        "sparseLoopDevice": {"size": "1Gi"}}


def test_missing_binary_says_how_to_install(mod, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(CommandExecutionError, match="salt_volumes.installed"):
        mod.prepare(spec=SPEC)


def test_binary_error_is_raised_with_its_message_and_code(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        print(json.dumps({"error": {"code": "in_use", "message": "volume v1: /dev/loop3 is mounted on /mnt"}}))
        sys.exit(3)
    """)
    with pytest.raises(CommandExecutionError) as exc:
        mod.unprepare(spec=SPEC)
    assert str(exc.value) == "volume v1: /dev/loop3 is mounted on /mnt"
    assert exc.value.code == "in_use" and exc.value.retcode == 3
    assert [d["step"] for _, d in mod.events] == ["started", "failed"]


def test_info_of_a_volume_whose_device_is_gone_is_a_report(mod, tmp_path):
    # What salt-volume-exec info answers (exit 0) for a raw volume whose
    # disk was pulled: the state says so; deleting it must go on from here.
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        print(json.dumps({"name": "v1", "state": "missing", "size": 0,
                          "error": "no device on this node carries the volume 3f2504e0"}))
    """)
    doc = mod.info(spec=SPEC)
    assert doc["state"] == "missing"
    assert doc["error"].startswith("no device on this node")


def test_a_failing_exit_with_an_error_string_keeps_its_message(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        print(json.dumps({"error": "the state directory is unreadable"}))
        sys.exit(1)
    """)
    with pytest.raises(CommandExecutionError, match="the state directory is unreadable") as exc:
        mod.info(spec=SPEC)
    assert exc.value.code == "failed" and exc.value.retcode == 1


def test_garbage_output_is_an_error(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        print("segfault-ish noise")
        sys.exit(139)
    """)
    with pytest.raises(CommandExecutionError, match="without a JSON answer"):
        mod.info(spec=SPEC)


def test_argv_stdin_and_progress_events(mod, tmp_path):
    log = tmp_path / "argv.json"
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        open({log!r}, "w").write(json.dumps({{"args": args, "stdin": data}}))
        for step in ("recorded", "formatted"):
            sys.stderr.write(json.dumps({{"msg": "step", "step": step, "volume": "v1", "uuid": "u"}}) + "\\n")
        sys.stderr.write("not json\\n")
        print(json.dumps({{"name": "v1", "changed": True, "devicePath": "/dev/loop0"}}))
    """.format(log=str(log)))
    out = mod.prepare(spec=SPEC)
    assert out["devicePath"] == "/dev/loop0"
    seen = json.loads(log.read_text())
    assert seen["args"] == ["--state-dir", str(tmp_path / "state"), "prepare", "--spec", "-"]
    assert json.loads(seen["stdin"]) == SPEC
    assert [(t, d["step"]) for t, d in mod.events] == [
        ("salt-volumes/v1/progress", "started"),
        ("salt-volumes/v1/progress", "recorded"),
        ("salt-volumes/v1/progress", "formatted"),
        ("salt-volumes/v1/progress", "done"),
    ]
    assert all(d["node"] == "node-1" for _, d in mod.events)


def test_a_long_steps_bytes_travel_with_its_progress_events(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        for done in (0, 64, 128):
            sys.stderr.write(json.dumps({"msg": "step", "step": "copying", "volume": "v1", "uuid": "u",
                                         "done": done, "total": 128, "snapshot": "s1"}) + "\\n")
        # Not numbers: never passed on.
        sys.stderr.write(json.dumps({"msg": "step", "step": "zeroing", "volume": "v1", "uuid": "u",
                                     "done": "50%", "total": True}) + "\\n")
        print(json.dumps({"name": "v1", "changed": True}))
    """)
    mod.prepare(spec=SPEC)
    copying = [d for _, d in mod.events if d["step"] == "copying"]
    assert [(d["done"], d["total"]) for d in copying] == [(0, 128), (64, 128), (128, 128)]
    assert "snapshot" not in copying[0]
    zeroing = [d for _, d in mod.events if d["step"] == "zeroing"]
    assert len(zeroing) == 1 and "done" not in zeroing[0] and "total" not in zeroing[0]


def test_no_events_masterless_and_a_broken_bus_is_not_fatal(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, 'print(json.dumps({"changed": False}))')
    mod.__opts__["local"] = True
    mod.prepare(spec=SPEC)
    assert mod.events == []
    mod.__opts__["local"] = False

    def broken(tag, data):
        raise RuntimeError("bus down")

    mod.__salt__["event.send"] = broken
    assert mod.prepare(spec=SPEC) == {"changed": False}


def test_lookup_and_selection(mod):
    mod.pillar["salt_volumes"] = {"volumes": {
        "mine": {"uuid": "a", "node": "node-1"},
        "theirs": {"uuid": "b", "node": "node-2"},
        "unassigned": {"uuid": "c"},
        "broken": "not a mapping",
    }}
    assert sorted(mod.volumes()) == ["broken", "mine", "unassigned"]
    assert mod._spec("mine")["name"] == "mine"
    with pytest.raises(SaltInvocationError, match="must be a mapping"):
        mod._spec("broken")
    with pytest.raises(SaltInvocationError, match="not found in pillar"):
        mod._spec("nope")
    mod.pillar["salt_volumes"]["volume"] = dict(SPEC)
    assert list(mod.volumes()) == ["v1"], "a single volume overrides the list"
    assert mod._spec("v1")["uuid"] == SPEC["uuid"]


def test_check_names_the_node_field(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, 'print(json.dumps({"spec": json.loads(data)}))')
    with pytest.raises(SaltInvocationError, match="volume v1: node: the volume is for 'node-2'"):
        mod.check(spec=dict(SPEC, node="node-2"))
    with pytest.raises(SaltInvocationError, match="volume x: name: the spec says 'v1'"):
        mod.check(name="x", spec=SPEC)
    assert mod.check(spec=SPEC)["node"] == "node-1"


# The same vector is pinned in Go (internal/spec), which must agree.
DERIVED = "f71a9971-2168-50f5-8c80-2052a56a21d3"


def test_a_pillar_volume_without_uuid_gets_one_derived_from_node_and_name(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, 'print(json.dumps({"spec": json.loads(data)}))')
    assert mod.pillar_uuid("node-1", "data-1") == DERIVED
    spec = {"node": "node-1", "sparseLoopDevice": {"size": "1Gi"}}
    assert mod.check(name="data-1", spec=dict(spec))["uuid"] == DERIVED
    assert mod.check(name="data-1", spec=dict(spec, uuid=""))["uuid"] == DERIVED
    assert mod.check(name="data-2", spec=dict(spec))["uuid"] != DERIVED, "another name, another volume"
    given = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
    assert mod.check(name="data-1", spec=dict(spec, uuid=given))["uuid"] == given, "a uuid given is kept"
    # Schedules match the volumes this node holds by the same uuid.
    mod.pillar["salt_volumes"] = {"volumes": {"data-1": dict(spec), "other": dict(spec, node="node-2")}}
    assert mod._pillar_volumes() == {"data-1": DERIVED}
    with pytest.raises(SaltInvocationError, match="node and name"):
        mod.pillar_uuid("", "data-1")


@pytest.fixture
def state():
    s = load("states")
    s.__opts__ = {"test": False}
    calls = []

    def record(name, result=None, exc=None):
        def fn(*args, **kwargs):
            calls.append(name)
            if exc:
                raise exc
            return result
        return fn

    s.__salt__ = {
        "salt_volumes.prepare": record("prepare", {"changed": True, "devicePath": "/dev/loop0",
                                                   "persistentPath": "/dev/disk/by-uuid/u", "warnings": ["thin"]}),
        "salt_volumes.unprepare": record("unprepare", {"changed": False}),
        "salt_volumes.check": lambda name=None, spec=None: dict(SPEC),
        "salt_volumes.info": record("info", {"state": "absent"}),
        "salt_volumes.device_info": lambda r: {k: r[k] for k in ("devicePath", "persistentPath", "state") if k in r},
        "salt_volumes.message": str,
        "salt_volumes.list": lambda: [{"name": "v1", "state": "detached"}],
        "salt_volumes.restore": record("restore", {"volumes": [{"name": "v1", "changed": True}], "orphans": []}),
    }
    s.calls, s.record = calls, record
    return s


def test_snapshot_present_says_a_lost_snapshot_is_not_there(state):
    state.__salt__["salt_volumes.snapshot"] = state.record("snapshot", {"name": "s1"})
    lost = {"name": "s1", "phase": "taken", "lost": True, "warning": "overflowed: its copy-on-write space filled up"}
    state.__salt__["salt_volumes.snapshots"] = lambda spec=None: [lost]
    ret = state.snapshot_present("s1", "v1")
    assert ret["result"] is False
    assert "is lost: overflowed" in ret["comment"] and "snapshot_absent" in ret["comment"]
    assert "snapshot" not in state.calls, "a later instant is not taken under its name"
    # Filling up but whole: there, with the warning.
    filling = {"name": "s1", "phase": "taken", "warning": "thin pool vg0/pool is filling (metadata over 80%)"}
    state.__salt__["salt_volumes.snapshots"] = lambda spec=None: [filling]
    ret = state.snapshot_present("s1", "v1")
    assert ret["result"] is True and ret["warnings"] == [filling["warning"]]


def test_prepared_test_mode_touches_nothing(state):
    state.__opts__["test"] = True
    ret = state.prepared("v1")
    assert ret["result"] is None and ret["changes"]["state"] == {"old": "absent", "new": "prepared"}
    assert "prepare" not in state.calls
    state.__salt__["salt_volumes.info"] = state.record("info", {"state": "prepared", "persistentPath": "/p"})
    ret = state.prepared("v1")
    assert ret["result"] is True and ret["changes"] == {}


def test_prepared_reports_device_info_and_warnings(state):
    ret = state.prepared("v1")
    assert ret["result"] is True
    assert ret["volume"]["persistentPath"] == "/dev/disk/by-uuid/u"
    assert ret["changes"]["prepared"]["devicePath"] == "/dev/loop0"
    assert ret["warnings"] == ["thin"]


def test_failures_name_the_volume(state):
    state.__salt__["salt_volumes.check"] = state.record("check", exc=SaltInvocationError("volume v1: uuid: bad"))
    ret = state.prepared("v1")
    assert ret == {"name": "v1", "result": False, "changes": {}, "comment": "volume v1: uuid: bad"}
    state.__salt__["salt_volumes.check"] = lambda name=None, spec=None: dict(SPEC)
    state.__salt__["salt_volumes.prepare"] = state.record("prepare", exc=CommandExecutionError("mkfs failed"))
    ret = state.prepared("v1")
    assert ret["result"] is False and ret["comment"] == "volume v1: mkfs failed"


def test_absent_test_mode_and_no_change(state):
    state.__salt__["salt_volumes.info"] = state.record("info", {"state": "prepared"})
    state.__opts__["test"] = True
    ret = state.absent("v1", wipe=True)
    assert ret["result"] is None and "wiped" in ret["comment"]
    assert "unprepare" not in state.calls
    state.__opts__["test"] = False
    ret = state.absent("v1")
    assert ret["result"] is True and ret["changes"] == {}
    assert state.unprepared is state.absent


def test_restored_reports_failures(state):
    ret = state.restored("boot")
    assert ret["result"] is True and ret["changes"] == {"restored": ["v1"]}
    exc = CommandExecutionError("restore failed")
    exc.result = {"volumes": [{"name": "gone", "error": "file is gone"}]}
    state.__salt__["salt_volumes.restore"] = state.record("restore", exc=exc)
    ret = state.restored("boot")
    assert ret["result"] is False and ret["comment"] == "Could not restore: gone"
    state.__opts__["test"] = True
    ret = state.restored("boot")
    assert ret["result"] is None and ret["changes"] == {"restored": ["v1"]}


def test_settings_never_come_from_pillar(mod, tmp_path):
    """A pillar= override (which the control plane's salt-api account may
    send) must not choose the program run as root nor the state dir."""
    mod.opts["exec_path"] = fake_binary(tmp_path, 'print(json.dumps({"argv": args}))')
    evil = tmp_path / "evil"
    evil.write_text("#!/bin/sh\ntouch {}\n".format(tmp_path / "pwned"))
    evil.chmod(0o755)
    mod.pillar["salt_volumes"] = {"exec_path": str(evil), "state_dir": "/etc"}
    mod.config["salt_volumes:exec_path"] = str(evil)
    mod.config["salt_volumes:state_dir"] = "/etc"
    out = mod.prepare(spec=SPEC)
    assert out["argv"][:2] == ["--state-dir", str(tmp_path / "state")]
    assert not (tmp_path / "pwned").exists()


# The master engine: its normal life (start, restart after a kill, stop with
# the master) is TestMasterEngine on a real master; these are its error paths.

class _Stop(Exception):
    pass


def test_engine_runs_the_packaged_binary_unless_told_otherwise(monkeypatch, tmp_path):
    eng = load("engines")
    packaged, source = tmp_path / "usr-bin-salt-volumes", tmp_path / "usr-local-bin-salt-volumes"
    monkeypatch.setattr(eng, "_BINARIES", (str(packaged), str(source)))
    # Neither there: the source install's path, which the backoff then
    # reports as missing.
    assert eng._default_binary() == str(source)
    source.write_text("#!/bin/sh\n")
    source.chmod(0o755)
    assert eng._default_binary() == str(source)
    packaged.write_text("#!/bin/sh\n")
    assert eng._default_binary() == str(source), "not executable: not taken"
    packaged.chmod(0o755)
    assert eng._default_binary() == str(packaged), "the package's first"


def test_engine_refuses_a_relative_binary(caplog):
    eng = load("engines")
    eng.start(binary="salt-volumes")
    assert "absolute path" in caplog.text


def test_engine_backs_off_while_the_binary_is_missing(monkeypatch, caplog, tmp_path):
    eng = load("engines")
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        if len(sleeps) == 5:
            raise _Stop()

    monkeypatch.setattr(eng.time, "sleep", sleep)
    with pytest.raises(_Stop):
        eng.start(binary=str(tmp_path / "missing"), max_backoff=4)
    assert sleeps == [1, 2, 4, 4, 4]
    assert "cannot start" in caplog.text


def test_engine_stops_serve_when_it_is_stopped(monkeypatch, tmp_path):
    eng = load("engines")
    serve = fake_binary(tmp_path, """
        import time
        time.sleep(60)
    """)
    procs = []

    class Popen(eng.subprocess.Popen):
        def wait(self, timeout=None):
            if not procs:
                procs.append(self)
                # The master stops the engine while serve runs: Salt's
                # process wrapper turns SIGTERM into SystemExit.
                raise SystemExit(0)
            return super().wait(timeout)

    monkeypatch.setattr(eng.subprocess, "Popen", Popen)
    with pytest.raises(SystemExit):
        eng.start(binary=serve)
    assert procs[0].poll() is not None, "serve was stopped with the engine"
    assert procs[0].returncode == -15, "by SIGTERM"


def test_overcommit_ratio_from_minion_config_and_restore_event(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        print(json.dumps({"id": "r1", "at": "2026-01-01T00:00:00Z", "restored": 1, "intact": 2, "failed": 1,
                          "volumes": [{"name": "v1", "uuid": "u1", "state": "prepared"},
                                      {"name": "v2", "uuid": "u2", "state": "missing", "error": "gone"}],
                          "orphans": [], "argv": args}))
        sys.exit(1)
    """)
    mod.opts["overcommit_ratio"] = 1.5
    with pytest.raises(CommandExecutionError) as exc:
        mod.restore()
    assert exc.value.result["argv"][:4] == ["--state-dir", mod.opts["state_dir"], "--overcommit-ratio", "1.5"]
    # Reported even though a volume failed: that is what the operator needs.
    (tag, data), = [e for e in mod.events if e[0].endswith("/restore")]
    assert tag == "salt-volumes/node/node-1/restore"
    assert data["id"] == "r1" and data["restored"] == 1 and data["failed"] == 1 and data["intact"] == 2
    assert data["volumes"][1] == {"name": "v2", "uuid": "u2", "state": "missing", "error": "gone"}


@pytest.fixture
def beacon(monkeypatch):
    b = load("beacons")
    fired = []
    doc = {"volumes": [{"name": "v1", "uuid": "u1", "state": "prepared", "size": 1 << 30,
                        "allocated": 10 << 20, "deviceName": "loop3", "changed": False, "warnings": []}],
           "capacity": {"path": "/var/lib/salt-volumes/sparse", "size": 100 << 30, "free": 50 << 30,
                        "committed": 1 << 30, "overcommitRatio": 1.0},
           "lastRestore": None}
    # The module's own functions over a fake pillar, as the minion's loader
    # gives them to the beacon.
    m = load("modules")
    pillar = {}
    m.__salt__ = {"pillar.get": lambda key, default=None, **_: lookup(pillar, key, default)}
    b.__salt__ = {"salt_volumes.status": lambda: json.loads(json.dumps(doc)),
                  "salt_volumes.restore_summary": m.restore_summary,
                  "salt_volumes.openable": m.openable,
                  "event.send": lambda tag, data: fired.append((tag, data))}
    b.__grains__ = {"id": "node-1"}
    b.__context__ = {}
    clock = [1000.0]
    monkeypatch.setattr(b.time, "time", lambda: clock[0])
    b.fired, b.doc, b.clock, b.pillar = fired, doc, clock, pillar
    return b


def test_beacon_validate_names_the_option():
    b = load("beacons")
    assert b.validate([{"interval": 10}, {"heartbeat": 300}])[0] is True
    ok, msg = b.validate([{"heartbeat": -1}])
    assert not ok and "heartbeat" in msg
    ok, msg = b.validate([{"interval": 60}, {"heartbeat": 30}])
    assert not ok and "at least the interval" in msg
    assert b.validate({"heartbeat": 1})[0] is False


def test_beacon_fires_on_change_and_heartbeat_only(beacon):
    cfg = [{"interval": 10}, {"heartbeat": 300}]
    assert beacon.beacon(cfg) == []
    tags = lambda: [(t, d["kind"]) for t, d in beacon.fired]
    assert tags() == [("salt-volumes/node/node-1/health", "start")]
    assert beacon.fired[0][1]["volumes"][0] == {"name": "v1", "uuid": "u1", "state": "prepared", "size": 1 << 30,
                                                "allocated": 10 << 20, "deviceName": "loop3"}
    # Idle, and usage moving less than 1 % of the size: nothing.
    beacon.clock[0] += 10
    beacon.doc["volumes"][0]["allocated"] += 1 << 20
    beacon.doc["capacity"]["free"] -= 100 << 20
    beacon.beacon(cfg)
    assert len(beacon.fired) == 1
    # Health changes fire at once.
    beacon.clock[0] += 10
    beacon.doc["volumes"][0]["state"] = "detached"
    beacon.beacon(cfg)
    assert tags()[-1] == ("salt-volumes/node/node-1/health", "change")
    # Usage moving past 1 % fires.
    beacon.clock[0] += 10
    beacon.doc["volumes"][0]["allocated"] += 20 << 20
    beacon.beacon(cfg)
    assert len(beacon.fired) == 3
    # Quiet until the heartbeat is due.
    beacon.clock[0] += 290
    beacon.beacon(cfg)
    assert len(beacon.fired) == 3
    beacon.clock[0] += 10
    beacon.beacon(cfg)
    assert tags()[-1] == ("salt-volumes/node/node-1/health", "heartbeat")


def test_beacon_tells_disks_and_volume_groups_that_change(beacon):
    cfg = [{"interval": 10}, {"heartbeat": 300}]
    beacon.doc["capacity"]["vgs"] = [{"name": "vg0", "size": 100 << 30, "free": 50 << 30}]
    beacon.doc["capacity"]["disks"] = [{"path": "/dev/sdb", "size": 1 << 40}]
    beacon.beacon(cfg)
    assert len(beacon.fired) == 1
    assert beacon.fired[0][1]["capacity"]["disks"] == [{"path": "/dev/sdb", "size": 1 << 40}]
    # A volume group's free space moving under 1 %: nothing.
    beacon.clock[0] += 10
    beacon.doc["capacity"]["vgs"][0]["free"] -= 100 << 20
    beacon.beacon(cfg)
    assert len(beacon.fired) == 1
    # Past 1 %, a disk taken, a volume group added: each is news.
    for change in (lambda c: c["vgs"][0].update(free=10 << 30),
                   lambda c: c.update(disks=[]),
                   lambda c: c["vgs"].append({"name": "vg1", "size": 1 << 30, "free": 1 << 30})):
        beacon.clock[0] += 10
        change(beacon.doc["capacity"])
        n = len(beacon.fired)
        beacon.beacon(cfg)
        assert len(beacon.fired) == n + 1
        assert beacon.fired[-1][1]["kind"] == "change"


def test_beacon_retries_a_failed_send_and_reports_errors(beacon):
    def broken(tag, data):
        raise RuntimeError("master unreachable")
    send = beacon.__salt__["event.send"]
    beacon.__salt__["event.send"] = broken
    beacon.beacon([{"interval": 10}])
    beacon.__salt__["event.send"] = send
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    assert [d["kind"] for _, d in beacon.fired] == ["start"]

    def failing():
        raise CommandExecutionError("state dir unreadable")
    beacon.__salt__["salt_volumes.status"] = failing
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    assert beacon.fired[-1][1]["error"] == "state dir unreadable"


def test_beacon_reports_a_restore_of_this_boot_once(beacon, monkeypatch):
    monkeypatch.setattr(beacon, "_boot_time", lambda: 1_700_000_000)
    beacon.doc["lastRestore"] = {"id": "old", "at": "2023-01-01T00:00:00.5Z", "restored": 2, "failed": 0, "volumes": []}
    beacon.beacon([{"interval": 10}])
    assert not [t for t, _ in beacon.fired if t.endswith("/restore")], "a restore from an earlier boot was told then"
    beacon.doc["lastRestore"] = {"id": "new", "at": "2026-11-23T07:10:36.552128438Z", "restored": 2, "failed": 0,
                                 "volumes": [{"name": "v1", "uuid": "u1", "state": "prepared", "size": 5}]}
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    restores = [d for t, d in beacon.fired if t == "salt-volumes/node/node-1/restore"]
    assert len(restores) == 1
    assert restores[0]["id"] == "new" and restores[0]["volumes"] == [{"name": "v1", "uuid": "u1", "state": "prepared"}]


def test_beacon_tells_a_restore_by_its_boot_id(beacon, monkeypatch):
    # The boot's run may start before the clock is set: its time says an
    # earlier boot, its boot id this one.
    monkeypatch.setattr(beacon, "_boot_time", lambda: 1_700_000_000)
    monkeypatch.setattr(beacon, "_boot_id", lambda: "b2")
    beacon.doc["lastRestore"] = {"id": "old", "at": "2026-11-23T07:10:36Z", "boot": "b1", "restored": 2, "failed": 0, "volumes": []}
    beacon.beacon([{"interval": 10}])
    assert not [t for t, _ in beacon.fired if t.endswith("/restore")], "a restore of the boot before, though its time is later"
    beacon.doc["lastRestore"] = {"id": "new", "at": "2020-01-01T00:00:00Z", "boot": "b2", "restored": 1, "failed": 0, "volumes": []}
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    assert [d["id"] for t, d in beacon.fired if t.endswith("/restore")] == ["new"]
    # Without a boot id of its own to compare, the beacon goes by the time.
    monkeypatch.setattr(beacon, "_boot_id", lambda: "")
    beacon.doc["lastRestore"] = {"id": "newer", "at": "2026-11-23T07:11:00Z", "boot": "b2", "restored": 1, "failed": 0, "volumes": []}
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    assert [d["id"] for t, d in beacon.fired if t.endswith("/restore")] == ["new", "newer"]


def test_a_hung_binary_is_killed_after_the_timeout_and_reported(mod, tmp_path):
    # A binary that never answers must not hold the minion's job forever:
    # salt_volumes:exec_timeout (seconds) bounds it; SIGTERM first (the
    # binary stops its own children on it), then SIGKILL.
    pid_file = tmp_path / "pid"
    mod.opts["exec_path"] = fake_binary(tmp_path, """
        import os, signal, time
        open({!r}, "w").write(str(os.getpid()))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # even one that ignores SIGTERM
        time.sleep(120)
    """.format(str(pid_file)))
    mod.opts["exec_timeout"] = 1
    mod.opts["exec_kill_grace"] = 1
    start = time.monotonic()
    with pytest.raises(CommandExecutionError, match=r"did not finish within 1 s \(salt_volumes:exec_timeout\)"):
        mod.prepare(spec=SPEC)
    assert time.monotonic() - start < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert [d["step"] for _, d in mod.events] == ["started", "failed"]


def test_exec_timeout_must_be_a_positive_number(mod, tmp_path):
    mod.opts["exec_path"] = fake_binary(tmp_path, "print('{}')")
    mod.opts["exec_timeout"] = "soon"
    with pytest.raises(CommandExecutionError, match="salt_volumes:exec_timeout"):
        mod.prepare(spec=SPEC)


def test_apply_volume_runs_our_formula_from_base_and_nothing_else(mod):
    calls = []
    mod.__salt__["state.apply"] = lambda *a, **kw: calls.append((a, kw)) or {"ok": True}
    spec2 = dict(SPEC, name="v2")
    assert mod.apply_volume("prepared", [SPEC]) == {"ok": True}
    mod.apply_volume("unprepared", [SPEC, spec2], wipe=True)
    assert [(a, kw["saltenv"], list(kw["pillar"]["salt_volumes"])) for a, kw in calls] == [
        (("salt_volumes.prepared",), "base", ["run"]),
        (("salt_volumes.unprepared",), "base", ["run"]),
    ], "only the run's key: a string Salt cannot merge with the node's own pillar"
    runs = [kw["pillar"]["salt_volumes"]["run"] for _, kw in calls]
    assert all(isinstance(r, str) for r in runs)
    assert json.loads(runs[0]) == {"volumes": [SPEC], "wipe": False}
    assert json.loads(runs[1]) == {"volumes": [SPEC, spec2], "wipe": True}


def test_a_run_is_only_its_own_volumes_and_wipe(mod):
    # The node's own pillar has a volume and asks for wipes; a run (what
    # apply_volume passes, merged in by Salt) acts on its volumes only, with
    # its own wipe.
    mod.pillar["salt_volumes"] = {
        "volumes": {"pillar-vol": dict(SPEC, name="pillar-vol")}, "wipe": True,
        "run": json.dumps({"volumes": [SPEC, dict(SPEC, name="elsewhere", node="node-2")], "wipe": False}),
    }
    assert list(mod.volumes()) == ["v1"]
    assert mod.wipe_requested() is False
    assert mod._lookup("v1")["uuid"] == SPEC["uuid"]
    del mod.pillar["salt_volumes"]["run"]
    assert list(mod.volumes()) == ["pillar-vol"]
    assert mod.wipe_requested() is True
    for bad in ({"volumes": {}}, "not json", json.dumps({"volumes": [{"uuid": "x"}]}),
                json.dumps({"volumes": [SPEC], "wipe": "yes"})):
        mod.pillar["salt_volumes"]["run"] = bad
        with pytest.raises(SaltInvocationError, match="pillar salt_volumes:run"):
            mod.volumes()
    for bad in (json.dumps({"volumes": [SPEC, SPEC]}), json.dumps({"volumes": [SPEC], "snapshots": {"v1": "x"}})):
        mod.pillar["salt_volumes"]["run"] = bad
        with pytest.raises(SaltInvocationError, match="pillar salt_volumes:run"):
            mod.volumes()
    # A run left in a pillar file would beat a volume given on the command
    # line: refused, naming the key to remove.
    mod.pillar["salt_volumes"]["run"] = json.dumps({"volumes": [SPEC], "wipe": True})
    mod.pillar["salt_volumes"]["volume"] = dict(SPEC, name="d2")
    with pytest.raises(SaltInvocationError, match="remove salt_volumes:run from the pillar files"):
        mod.volumes()


def test_snapshot_lists_come_from_the_run_when_there_is_one(mod):
    mod.pillar["salt_volumes"] = {"snapshots_absent": {"v1": "nightly"}, "snapshots": {"v1": ["a"]}}
    assert mod.snapshot_lists() == {"snapshots": {"v1": ["a"]}, "snapshots_absent": {"v1": ["nightly"]}}, \
        "a single name is a list of one, not its letters"
    mod.pillar["salt_volumes"]["run"] = json.dumps({"volumes": [SPEC], "snapshots": {"v1": ["pre"]}})
    assert mod.snapshot_lists() == {"snapshots": {"v1": ["pre"]}, "snapshots_absent": {}}
    del mod.pillar["salt_volumes"]["run"]
    mod.pillar["salt_volumes"]["snapshots"] = {"v1": [1]}
    with pytest.raises(SaltInvocationError, match="salt_volumes:snapshots: map each volume"):
        mod.snapshot_lists()


def test_by_name_functions_find_a_pillar_volume_without_uuid(mod):
    mod.pillar["salt_volumes"] = {"volumes": {"data-1": {"node": "node-1", "sparseLoopDevice": {"size": "1Gi"}}}}
    assert mod._spec("data-1")["uuid"] == DERIVED


def test_apply_volume_refuses_a_name_twice(mod):
    mod.__salt__["state.apply"] = lambda *a, **kw: pytest.fail("ran")
    with pytest.raises(SaltInvocationError, match="v1 named twice"):
        mod.apply_volume("unprepared", [SPEC, dict(SPEC)])


@pytest.mark.parametrize("args,kwargs,field", [
    (("installed", [SPEC]), {}, "action"),
    (("../../etc/passwd", [SPEC]), {}, "action"),
    (("prepared", []), {}, "volumes"),
    (("prepared", ["data-1"]), {}, "volumes"),
    (("prepared", [{"uuid": "x"}]), {}, "volumes"),
    (("unprepared", [SPEC]), {"wipe": "yes"}, "wipe"),
    (("prepared", [SPEC]), {"wipe": True}, "wipe"),
])
def test_apply_volume_refuses_anything_else_before_running(mod, args, kwargs, field):
    mod.__salt__["state.apply"] = lambda *a, **kw: pytest.fail("nothing may run")
    with pytest.raises(SaltInvocationError, match="^" + field + ":"):
        mod.apply_volume(*args, **kwargs)


def test_apply_volume_takes_no_other_keyword(mod):
    # What Salt does with a keyword the function does not name: refused
    # before the call (its loader matches arguments to the signature).
    import inspect
    params = inspect.signature(mod.apply_volume).parameters
    assert list(params) == ["action", "volumes", "wipe"]
    assert not any(p.kind == p.VAR_KEYWORD for p in params.values())


def test_beacon_fires_when_snapshots_come_or_grow(beacon):
    cfg = [{"interval": 10}, {"heartbeat": 300}]
    beacon.beacon(cfg)
    assert len(beacon.fired) == 1
    beacon.clock[0] += 10
    beacon.doc["capacity"].update(snapshots=1, snapshotBytes=10 << 20)
    beacon.beacon(cfg)
    assert beacon.fired[-1][1]["kind"] == "change"
    assert beacon.fired[-1][1]["capacity"]["snapshots"] == 1
    # A few bytes more: quiet; past 1 % of the filesystem: news.
    beacon.clock[0] += 10
    beacon.doc["capacity"]["snapshotBytes"] += 1 << 20
    beacon.beacon(cfg)
    assert len(beacon.fired) == 2
    beacon.clock[0] += 10
    beacon.doc["capacity"]["snapshotBytes"] += beacon.doc["capacity"]["size"] // 50
    beacon.beacon(cfg)
    assert len(beacon.fired) == 3
    # An LVM snapshot's warning is news at once, and again when it moves
    # up a step; the same warning is not.
    warn = "snapshot nightly of db: its copy-on-write space is over {}% full"
    for step, fired in ((80, 4), (80, 4), (90, 5)):
        beacon.clock[0] += 10
        beacon.doc["capacity"]["snapshotWarnings"] = [warn.format(step)]
        beacon.beacon(cfg)
        assert len(beacon.fired) == fired, step


@pytest.mark.parametrize("args,field", [
    (("taken-later", SPEC, "s1"), "action"),
    (("taken", "data-1", "s1"), "volume"),
    (("taken", {"name": "v1"}, "s1"), "volume"),
    (("deleted", SPEC, ""), "snapshot"),
    (("deleted", SPEC, ["s1"]), "snapshot"),
    (("taken", SPEC, "s1", 64), "size"),
    (("restored", SPEC, "s1", "64Mi"), "size"),
    (("restored", {"name": "v1", "sparseLoopDevice": {"size": "1Gi"}}, "s1"), "volume"),
])
def test_apply_snapshot_refuses_anything_else_before_running(mod, args, field, monkeypatch):
    monkeypatch.setattr(mod, "_run", lambda *a, **kw: pytest.fail("nothing may run"))
    with pytest.raises(SaltInvocationError, match="^" + field + ":"):
        mod.apply_snapshot(*args)


def test_apply_snapshot_runs_the_binary_with_the_volume_and_the_name(mod, monkeypatch):
    calls = []
    monkeypatch.setattr(mod, "_run", lambda *a: calls.append(a) or {"name": a[2][1]})
    assert mod.apply_snapshot("taken", SPEC, "s1") == {"name": "s1"}
    mod.apply_snapshot("deleted", SPEC, "s1")
    mod.apply_snapshot("taken", SPEC, "s2", size="64Mi")
    assert calls == [
        ("snapshot", SPEC, ["--name", "s1"]),
        ("snapshot-delete", SPEC, ["--name", "s1"]),
        ("snapshot", SPEC, ["--name", "s2", "--size", "64Mi"]),
    ]


def test_apply_snapshot_passes_the_owner_and_says_name_taken_first(mod, monkeypatch):
    calls = []

    def run(*a):
        calls.append(a)
        if len(calls) == 3:
            exc = CommandExecutionError("snapshot s1 of data-1 is on this node already, taken through Salt")
            exc.code, exc.retcode = "name_taken", 3
            raise exc
        return {"name": a[2][1]}

    monkeypatch.setattr(mod, "_run", run)
    mod.apply_snapshot("taken", SPEC, "s1", owner="sv-1")
    mod.apply_snapshot("deleted", SPEC, "s1", owner="sv-1")
    with pytest.raises(CommandExecutionError, match="^name_taken: snapshot s1 .* through Salt") as exc:
        mod.apply_snapshot("taken", SPEC, "s1", size="64Mi", owner="sv-2")
    assert exc.value.code == "name_taken" and exc.value.retcode == 3
    assert calls == [
        ("snapshot", SPEC, ["--name", "s1", "--owner", "sv-1"]),
        ("snapshot-delete", SPEC, ["--name", "s1", "--owner", "sv-1"]),
        ("snapshot", SPEC, ["--name", "s1", "--size", "64Mi", "--owner", "sv-2"]),
    ]
    for bad in ("", 5):
        with pytest.raises(SaltInvocationError, match="^owner:"):
            mod.apply_snapshot("taken", SPEC, "s1", owner=bad)
    with pytest.raises(SaltInvocationError, match="^owner:"):
        mod.apply_snapshot("restored", SPEC, "s1", owner="sv-1")


def test_apply_snapshot_restored_runs_snapshot_restore_and_passes_a_refusal_on(mod, monkeypatch):
    calls = []

    def run(*a):
        calls.append(a)
        if len(calls) > 1:
            exc = CommandExecutionError("volume data-1: /dev/loop3 mounted on /mnt/x (in_use)")
            exc.code, exc.retcode = "in_use", 3
            raise exc
        return {"snapshot": a[2][1], "sameDevice": True}

    monkeypatch.setattr(mod, "_run", run)
    assert mod.apply_snapshot("restored", SPEC, "s1") == {"snapshot": "s1", "sameDevice": True}
    with pytest.raises(CommandExecutionError, match="mounted on /mnt/x") as exc:
        mod.apply_snapshot("restored", SPEC, "s1")
    assert exc.value.code == "in_use"
    assert calls == [("snapshot-restore", SPEC, ["--name", "s1"])] * 2


def test_restore_answers_pass_through_as_the_binary_gave_them(mod, monkeypatch):
    # An LVM volume's restore: a thick snapshot used up (snapshotConsumed),
    # its warning; a thin one kept. The control plane reads these fields.
    thick = {"snapshot": "s1", "method": "lvm-thick", "sameDevice": True, "took": "2.1s",
             "snapshotConsumed": True, "warnings": ["snapshot s1 was a thick LVM snapshot: it merged into the volume and is gone"],
             "volume": {"uuid": SPEC["uuid"], "persistentPath": "/dev/disk/by-uuid/" + SPEC["uuid"]}}
    thin = dict(thick, method="lvm-thin", snapshotConsumed=False, warnings=None)
    answers = [thick, thin, thick]
    monkeypatch.setattr(mod, "_run", lambda *a: answers.pop(0))
    assert mod.apply_snapshot("restored", SPEC, "s1") == thick
    assert mod.apply_snapshot("restored", SPEC, "s1") == thin
    assert mod.snapshot_restore(spec=SPEC, snapshot_name="s1") == thick


def test_snapshot_restore_names_the_snapshot(mod, monkeypatch):
    calls = []
    monkeypatch.setattr(mod, "_run", lambda *a: calls.append(a) or {})
    with pytest.raises(SaltInvocationError, match="snapshot_name"):
        mod.snapshot_restore(spec=SPEC)
    assert calls == []
    mod.snapshot_restore(spec=SPEC, snapshot_name="before")
    assert calls == [("snapshot-restore", SPEC, ["--name", "before"])]


OLD_UNIT = """[Unit]
Description=Restore salt-volumes local volumes
[Service]
Type=oneshot
ExecStart=/usr/local/bin/salt-volume-exec --state-dir /var/lib/salt-volumes restore
"""


@pytest.fixture
def retire(tmp_path, monkeypatch):
    """The state module, its source-install paths under tmp_path, a node with
    the package and systemd, and a log of the service calls."""
    st = load("states")
    calls = []
    enabled = {"salt-volumes-restore": True}
    monkeypatch.setattr(st, "SOURCE_BINARY", str(tmp_path / "salt-volume-exec"))
    monkeypatch.setattr(st, "SOURCE_UNIT", str(tmp_path / "salt-volumes-restore.service"))
    monkeypatch.setattr(st, "PACKAGE_BINARY", "/usr/bin/salt-volume-exec")
    (tmp_path / "systemd").mkdir()
    monkeypatch.setattr(st, "SYSTEMD_RUNNING", str(tmp_path / "systemd"))
    st.__salt__ = {
        "pkg.version": lambda name: "0.4.0",
        "service.enabled": lambda name: enabled[name],
        "service.disable": lambda name: calls.append(("disable", name)),
        "service.enable": lambda name: calls.append(("enable", name)),
        "service.systemctl_reload": lambda: calls.append(("reload",)),
        "salt_volumes.message": str,
    }
    st.__opts__ = {"test": False}
    st.calls = calls
    return st


def ours_binary(path):
    path.write_bytes(b"\x7fELF" + b"\0" * 64 + b"path\tgithub.com/salt-volumes/salt-volumes/cmd/salt-volume-exec\n")


def test_source_install_retired_moves_our_binary_and_unit_aside(retire, tmp_path):
    b, u = tmp_path / "salt-volume-exec", tmp_path / "salt-volumes-restore.service"
    ours_binary(b)
    u.write_text(OLD_UNIT)
    # A .retired from an earlier retirement is kept, not overwritten.
    (tmp_path / "salt-volume-exec.retired").write_text("earlier")
    retire.__opts__["test"] = True
    ret = retire.source_install_retired("src")
    assert ret["result"] is None and b.is_file() and not b.is_symlink() and u.exists() and retire.calls == []
    retire.__opts__["test"] = False
    ret = retire.source_install_retired("src")
    assert ret["result"] is True, ret
    moved = ret["changes"]["retired"]
    assert moved[str(u)] == str(u) + ".retired"
    assert moved[str(b)].startswith(str(b) + ".retired.")
    assert (tmp_path / "salt-volume-exec.retired").read_text() == "earlier"
    assert os.path.isfile(moved[str(b)]) and os.path.isfile(moved[str(u)]) and not u.exists()
    # The binary's path now leads to the package's binary.
    assert os.readlink(b) == "/usr/bin/salt-volume-exec"
    # The old unit's enablement is moved to the package's unit.
    assert retire.calls == [("reload",), ("disable", "salt-volumes-restore"), ("enable", "salt-volumes-restore")]
    again = retire.source_install_retired("src")
    assert again["result"] is True and again["changes"] == {}, again


def test_source_install_retired_leaves_what_is_not_ours(retire, tmp_path):
    b, u = tmp_path / "salt-volume-exec", tmp_path / "salt-volumes-restore.service"
    b.write_bytes(b"\x7fELF somebody else's program")
    # The restore unit with another state dir: the admin's, since the
    # package's unit restores /var/lib/salt-volumes only.
    u.write_text(OLD_UNIT.replace("/var/lib/salt-volumes", "/srv/sv"))
    ret = retire.source_install_retired("src")
    assert ret["result"] is True and ret["changes"] == {}
    assert "not a salt-volume-exec build" in ret["comment"] and "another command or state dir" in ret["comment"]
    assert b.exists() and u.exists() and retire.calls == []
    b.unlink()
    b.symlink_to("/opt/elsewhere/salt-volume-exec")
    ret = retire.source_install_retired("src")
    assert ret["changes"] == {} and "links to /opt/elsewhere" in ret["comment"]


def test_source_install_retired_without_systemd_or_package(retire, tmp_path):
    u = tmp_path / "salt-volumes-restore.service"
    u.write_text(OLD_UNIT)
    (tmp_path / "systemd").rmdir()
    ret = retire.source_install_retired("src")
    assert ret["result"] is True and ret["changes"] == {} and "systemd is not running" in ret["comment"] and u.exists()
    (tmp_path / "systemd").mkdir()
    retire.__salt__["pkg.version"] = lambda name: ""
    ret = retire.source_install_retired("src")
    assert ret["result"] is True and ret["changes"] == {} and "no salt-volume-exec package" in ret["comment"]
    assert u.exists()


KEY_BINARY = """
    import os
    seen = {{"args": args}}
    if "--keys-fd" in args:
        fd = int(args[args.index("--keys-fd") + 1])
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
        seen["keys"] = json.loads(b"".join(chunks))
    open({log!r}, "w").write(json.dumps(seen))
    print(json.dumps({{"name": "vault", "changed": True, "devicePath": "/dev/dm-0", "id": "r1", "volumes": []}}))
"""


def test_master_keys_go_on_a_pipe_and_nowhere_else(mod, tmp_path):
    log = tmp_path / "seen.json"
    mod.opts["exec_path"] = fake_binary(tmp_path, KEY_BINARY.format(log=str(log)))
    key = "q0p9ZsXf3dJd2n0sYbH9Kq1mVtR8wLcE4uNfGhIjKlM="
    other = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    # As a gpg renderer may leave it: a trailing newline.
    mod.pillar["salt_volumes"] = {"keys": {"vault": key + "\n", "other": other}}
    spec = dict(SPEC, name="vault", encryption={"provider": "master"})
    out = mod.prepare(spec=spec)
    seen = json.loads(log.read_text())
    fd = seen["args"][seen["args"].index("--keys-fd") + 1]
    assert seen["args"] == ["--state-dir", mod.opts["state_dir"], "prepare", "--spec", "-", "--keys-fd", fd]
    assert int(fd) > 2
    assert seen["keys"] == {"vault": key}, "this volume's key only, whole"
    everything = json.dumps([out, mod.events, seen["args"]])
    assert key[:12] not in everything and other[:12] not in everything

    # restore hands over every key of the minion's pillar: the binary opens
    # the provider-master volumes it has.
    mod.restore()
    seen = json.loads(log.read_text())
    assert seen["keys"] == {"vault": key, "other": other}
    assert key[:12] not in json.dumps(mod.events)

    # A keyfile volume gets no keys; nor does anything when pillar has none.
    mod.prepare(spec=dict(SPEC, encryption={"provider": "keyfile"}))
    assert "--keys-fd" not in json.loads(log.read_text())["args"]
    mod.pillar["salt_volumes"] = {}
    mod.restore()
    assert "--keys-fd" not in json.loads(log.read_text())["args"]
    mod.prepare(spec=spec)
    assert "--keys-fd" not in json.loads(log.read_text())["args"], "no key: the binary says key_needed"


def test_master_keys_more_than_a_pipe_holds_all_arrive(mod, tmp_path):
    log = tmp_path / "seen.json"
    mod.opts["exec_path"] = fake_binary(tmp_path, KEY_BINARY.format(log=str(log)))
    keys = {"vol-{:05d}".format(i): "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=" for i in range(3000)}
    mod.pillar["salt_volumes"] = {"keys": keys}
    mod.restore()
    assert json.loads(log.read_text())["keys"] == keys


@pytest.mark.parametrize("keys, says", [
    (["x"], "pillar salt_volumes:keys must map volume names to base64 keys"),
    ({"vault": 42}, "pillar salt_volumes:keys:vault: give the key as a base64 string"),
])
def test_master_keys_of_the_wrong_shape_are_named(mod, tmp_path, keys, says):
    mod.opts["exec_path"] = fake_binary(tmp_path, "raise SystemExit('must not run')")
    mod.pillar["salt_volumes"] = {"keys": keys}
    with pytest.raises(SaltInvocationError) as exc:
        mod.prepare(spec=dict(SPEC, name="vault", encryption={"provider": "master"}))
    assert says in str(exc.value)
    assert "42" not in str(exc.value)


def test_a_bad_key_entry_of_another_volume_never_stops_a_restore(mod, tmp_path):
    log = tmp_path / "seen.json"
    mod.opts["exec_path"] = fake_binary(tmp_path, KEY_BINARY.format(log=str(log)))
    key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    mod.pillar["salt_volumes"] = {"keys": {"vault": key, "elsewhere": None, "odd": 42}}
    mod.restore()
    assert json.loads(log.read_text())["keys"] == {"vault": key}, "the others skipped"
    mod.pillar["salt_volumes"] = {"keys": ["x"]}
    mod.restore()
    assert "--keys-fd" not in json.loads(log.read_text())["args"], "keys of the wrong shape: none, and the restore still runs"


def test_beacon_tells_the_boots_restore_before_opening_and_survives_a_failing_open(beacon, monkeypatch):
    monkeypatch.setattr(beacon, "_boot_time", lambda: 1_700_000_000)
    beacon.doc["volumes"][0]["state"] = "locked"
    beacon.doc["lastRestore"] = {"id": "boot", "at": "2026-11-23T07:10:36Z", "restored": 0, "failed": 1, "locked": 1,
                                 "volumes": [{"name": "v1", "uuid": "u1", "state": "locked"}]}
    calls = []

    def restore():
        calls.append(1)
        # A restore replaces the node's report; it tells its own.
        beacon.doc["lastRestore"] = {"id": "beacon", "at": "2026-11-23T07:11:00Z", "restored": 0, "failed": 1,
                                     "volumes": []}
        exc = CommandExecutionError("No key available with this passphrase")
        exc.result = beacon.doc["lastRestore"]
        raise exc
    beacon.pillar["salt_volumes"] = {"keys": {"v1": "k"}}
    beacon.__salt__["salt_volumes.restore"] = restore
    beacon.beacon([{"interval": 10}])
    restores = [d for t, d in beacon.fired if t.endswith("/restore")]
    assert [r["id"] for r in restores] == ["boot"], "the boot's report told, before the beacon's own restore replaced it"
    assert restores[0]["failed"] == 1 and restores[0]["locked"] == 1
    assert calls == [1]
    beacon.clock[0] += 10
    beacon.beacon([{"interval": 10}])
    assert calls == [1], "not again at the next interval"
    assert [d["id"] for t, d in beacon.fired if t.endswith("/restore")] == ["boot"], "the beacon's restore told by salt_volumes.restore itself"


def test_beacon_opens_locked_volumes_whose_key_the_pillar_holds(beacon):
    cfg = [{"interval": 10}, {"heartbeat": 300}]
    pillar = beacon.pillar
    pillar["salt_volumes"] = {}
    runs = []
    vol = beacon.doc["volumes"][0]
    vol["state"] = "locked"

    def restore():
        runs.append(beacon.clock[0])
        vol["state"] = pillar["salt_volumes"].get("opens", "locked")
        return {"id": "r{}".format(len(runs)), "volumes": []}

    beacon.__salt__["salt_volumes.restore"] = restore

    beacon.beacon(cfg)
    assert runs == [], "no key in pillar: nothing to open with"
    pillar["salt_volumes"]["keys"] = {"other": "k"}
    beacon.clock[0] += 10
    beacon.beacon(cfg)
    assert runs == [], "another volume's key"

    # The key, but a wrong one: tried once, then again only after a while.
    pillar["salt_volumes"]["keys"] = {"v1": "k"}
    beacon.clock[0] += 10
    beacon.beacon(cfg)
    assert len(runs) == 1
    for _ in range(5):
        beacon.clock[0] += 10
        beacon.beacon(cfg)
    assert len(runs) == 1, "a failing open is not retried at every interval"
    beacon.clock[0] += beacon._OPEN_RETRY
    beacon.beacon(cfg)
    assert len(runs) == 2

    # The operator holds it: nothing runs, however long.
    for held in (False, "false", "no"):
        pillar["salt_volumes"]["open_locked"] = held
        beacon.clock[0] += beacon._OPEN_RETRY
        beacon.beacon(cfg)
        assert len(runs) == 2, held

    # Released, and the key right: opened, and the event that follows the
    # run says prepared.
    del pillar["salt_volumes"]["open_locked"]
    pillar["salt_volumes"]["opens"] = "prepared"
    beacon.clock[0] += beacon._OPEN_RETRY
    beacon.beacon(cfg)
    assert len(runs) == 3
    assert beacon.fired[-1][1]["volumes"][0]["state"] == "prepared"
    beacon.clock[0] += beacon._OPEN_RETRY
    beacon.beacon(cfg)
    assert len(runs) == 3, "nothing locked, nothing run"
