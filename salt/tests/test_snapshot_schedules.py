"""Unit tests of the snapshot schedules (pillar salt_volumes:snapshot_schedules,
salt_volumes.run_snapshot_schedule): naming, validation messages, which
snapshots a run prunes (never one it did not take), idempotence and
convergence after a crash, and what the node's report carries. The run
against real Salt's scheduler is test/salt TestSnapshotScheduleOnTheMinionScheduler."""
import importlib.util
import json
import os
import stat
import sys
import textwrap

import pytest
from pillar_tree import lookup
from salt.exceptions import SaltInvocationError

HERE = os.path.dirname(os.path.abspath(__file__))
U1 = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
U2 = "9b2f4c1e-0c1d-4e5a-8f3b-1a2b3c4d5e6f"
T0 = 1767225600  # 2026-01-01T00:00:00Z


def load(kind):
    path = os.path.join(HERE, "..", "_" + kind, "salt_volumes.py")
    spec = importlib.util.spec_from_file_location("salt_volumes_sched_" + kind, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# A stand-in salt-volume-exec keeping its volumes and snapshots in a JSON
# file: list, snapshots, snapshot (taking again answers the one taken),
# snapshot-delete; FAIL names commands to fail (once each, or "kill-after-
# snapshot": take it, then die without an answer, as a killed run would).
FAKE = """
import os
node_path = os.path.join(os.path.dirname(sys.argv[0]), "node.json")
node = json.load(open(node_path))
cmd = [a for a in args if a in ("list", "last-restore", "snapshots", "snapshot", "snapshot-delete")][0]
name = args[args.index("--name") + 1] if "--name" in args else None
spec = json.loads(data) if data else None
node.setdefault("calls", []).append([cmd, name])
def save():
    json.dump(node, open(node_path, "w"))
fail = node.get("fail", [])
if cmd in fail:
    fail.remove(cmd)
    save()
    print(json.dumps({"error": {"code": "failed", "message": cmd + " failed on purpose"}}))
    sys.exit(1)
snaps = node["snaps"].setdefault(spec["uuid"], {}) if spec else None
if cmd == "list":
    print(json.dumps({"volumes": node["volumes"], "capacity": {}}))
elif cmd == "last-restore":
    print(json.dumps({"restore": None}))
elif cmd == "snapshots":
    print(json.dumps({"snapshots": sorted(snaps.values(), key=lambda s: s["name"])}))
elif cmd == "snapshot":
    if name not in snaps:
        snaps[name] = {"name": name, "volumeUUID": spec["uuid"], "phase": "taken", "method": "reflink"}
    save()
    if "kill-after-snapshot" in fail:
        fail.remove("kill-after-snapshot")
        save()
        sys.exit(137)
    print(json.dumps(snaps[name]))
elif cmd == "snapshot-delete":
    snaps.pop(name, None)
    print(json.dumps({"deleted": name, "volumeUUID": spec["uuid"]}))
save()
"""


@pytest.fixture
def mod(tmp_path, monkeypatch):
    m = load("modules")
    pillar = {"salt_volumes": {}}
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "salt-volume-exec"
    exe.write_text("#!{}\nimport sys, json\nargs = sys.argv[1:]\ndata = sys.stdin.read()\n{}\n".format(
        sys.executable, textwrap.dedent(FAKE)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    state_dir = tmp_path / "state"
    (state_dir / "volumes").mkdir(parents=True)
    node = {"volumes": [], "snaps": {}}

    def add_volume(name, uuid, state="prepared", in_pillar=True, kind="sparseLoopDevice"):
        # in_pillar: this minion's pillar defines it (else the control
        # plane or Kubernetes made it).
        node["volumes"].append({"name": name, "uuid": uuid, "state": state, "type": kind})
        spec = {"name": name, "uuid": uuid}
        spec[kind] = {"size": "32Mi"} if kind == "sparseLoopDevice" else {"devicePath": "/dev/vg0/" + name}
        (state_dir / "volumes" / (uuid + ".json")).write_text(json.dumps(
            {"version": 1, "phase": "prepared", "spec": spec}))
        if in_pillar:
            pillar["salt_volumes"].setdefault("volumes", {})[name] = dict(spec, node="node-1")

    def write_node():
        (bindir / "node.json").write_text(json.dumps(node))

    def read_node():
        return json.loads((bindir / "node.json").read_text())

    def pillar_get(key, default=None):
        return lookup(pillar, key, default)

    schedule_list = {}
    m.__salt__ = {"pillar.get": pillar_get, "event.send": lambda tag, data: None,
                  "schedule.list": lambda **kw: dict(schedule_list)}
    m.__opts__ = {"salt_volumes": {"exec_path": str(exe), "state_dir": str(state_dir)},
                  "cachedir": str(tmp_path / "cache")}
    m.__grains__ = {"id": "node-1"}
    m.__context__ = {}
    clock = [T0]
    monkeypatch.setattr(m.time, "time", lambda: clock[0])
    m.pillar, m.node, m.clock, m.schedule_list = pillar, node, clock, schedule_list
    m.add_volume, m.write_node, m.read_node = add_volume, write_node, read_node
    m.record = lambda: json.loads((tmp_path / "cache" / "salt_volumes" / "snapshot_schedules.json").read_text())
    return m


def names(node, uuid=U1):
    return sorted(node["snaps"].get(uuid, {}))


def apply(mod):
    """What the salt_volumes.scheduled formula does with the plan: schedule.present
    (stored as Salt stores it, job_kwargs as kwargs), schedule.absent, retired."""
    plan = mod.snapshot_schedule_plan()
    assert plan["error"] is None, plan["error"]
    for entry, item in plan["present"].items():
        stored = {k: v for k, v in item.items() if k not in ("job_args", "job_kwargs")}
        stored.update(args=item["job_args"], kwargs=item["job_kwargs"])
        mod.schedule_list[entry] = stored
    for entry in plan["absent"]:
        del mod.schedule_list[entry]
        mod.retire_snapshot_schedule(entry[len(plan["prefix"]):])
    return plan


def test_a_schedules_snapshot_is_named_after_it_and_the_utc_second(mod):
    assert mod.scheduled_snapshot_name("nightly", T0 + 3723) == "nightly-20260101010203"
    assert mod._stamp_of("nightly", "nightly-20260101010203") == T0 + 3723
    # Not this schedule's pattern: another schedule's, an operator's, a
    # schedule whose name begins with this one's.
    for other in ("nightly-before-upgrade", "nightly-2026010101020", "nightly-x20260101010203",
                  "hourly-20260101010203", "nightly-extra-20260101010203", "nightly-20261301000000"):
        assert mod._stamp_of("nightly", other) is None, other
    # The longest schedule name still makes a valid snapshot name (63).
    longest = "a" * 48
    assert len(mod.scheduled_snapshot_name(longest, T0)) == 63
    assert mod._check_schedule(longest, {"volumes": ["v"], "every": "1h", "keep": 1})


@pytest.mark.parametrize("name,conf,want", [
    ("Nightly", {"volumes": ["v"], "every": "1h", "keep": 1}, "'Nightly' is not a schedule name: use lower-case"),
    ("a" * 49, {"volumes": ["v"], "every": "1h", "keep": 1}, "at most 48 characters"),
    ("n", ["v"], "salt_volumes:snapshot_schedules:n: must be a mapping"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": 1, "kep": 2},
     "salt_volumes:snapshot_schedules:n: kep: unknown key: a schedule takes volumes, match, every, daily_at, keep, max_age, any_volume, raw_volumes"),
    ("n", {"every": "1h", "keep": 1}, "n: volumes: missing: give volumes"),
    ("n", {"volumes": ["v"], "match": "v*", "every": "1h", "keep": 1}, "n: volumes: give volumes or match, not both"),
    ("n", {"volumes": "data-1", "every": "1h", "keep": 1}, "n: volumes: 'data-1' is not a list of volume names: use e.g."),
    ("n", {"match": 3, "every": "1h", "keep": 1}, "n: match: 3 is not a pattern"),
    ("n", {"volumes": ["v"], "keep": 1}, "n: every: missing: give every (e.g. 1h) or daily_at"),
    ("n", {"volumes": ["v"], "every": "1x", "keep": 1}, "n: every: '1x' is not an interval: use a whole number and a unit, e.g. 30s"),
    ("n", {"volumes": ["v"], "every": 3600, "keep": 1}, "n: every: 3600 is not an interval"),
    ("n", {"volumes": ["v"], "every": "0s", "keep": 1}, "n: every: '0s' is not an interval"),
    ("n", {"volumes": ["v"], "every": "1h", "daily_at": "02:00", "keep": 1}, "n: every: give every or daily_at, not both"),
    ("n", {"volumes": ["v"], "daily_at": 120, "keep": 1}, "n: daily_at: 120 is not a time of day: use HH:MM on 24 hours, quoted"),
    ("n", {"volumes": ["v"], "daily_at": "24:00", "keep": 1}, "n: daily_at: '24:00' is not a time of day"),
    ("n", {"volumes": ["v"], "every": "1h"}, "n: keep: missing: give how many"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": 0}, "n: keep: 0: give how many of this schedule's snapshots to keep, a whole number of at least 1"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": True}, "n: keep: True: give how many"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": "24"}, "n: keep: '24': give how many"),
    ("n", {"volumes": ["v"], "every": "1h", "max_age": "a week"}, "n: max_age: 'a week' is not a duration: use a whole number and a unit, e.g. 12h or 7d"),
    # Bounds: keep, max_age against the interval and 10 years, a fast
    # schedule bounded by count.
    ("n", {"volumes": ["v"], "every": "1h", "keep": 10**9}, "n: keep: 1000000000: at most 1000 snapshots per volume: give a smaller keep"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": 1001}, "n: keep: 1001: at most 1000"),
    ("n", {"volumes": ["v"], "every": "1h", "max_age": "1001h"}, "n: max_age: '1001h': at most 1000 times the interval and at most 3650d, here 1000h: give a shorter max_age, or a longer every"),
    ("n", {"volumes": ["v"], "daily_at": "02:00", "max_age": "1001d"}, "n: max_age: '1001d': at most 1000 times the interval and at most 3650d, here 1000d"),
    ("n", {"volumes": ["v"], "every": "7d", "max_age": "3651d"}, "here 3650d"),
    ("n", {"volumes": ["v"], "every": "1s", "max_age": "10s"}, "n: keep: missing: every 1s is more often than once a minute: give keep too (at most 1000)"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": 1, "any_volume": "yes"}, "n: any_volume: 'yes': give true or false"),
    ("n", {"volumes": ["v"], "every": "1h", "keep": 1, "raw_volumes": 1}, "n: raw_volumes: 1: give true or false"),
])
def test_a_bad_schedule_is_refused_naming_the_field_and_the_fix(mod, name, conf, want):
    with pytest.raises(SaltInvocationError) as exc:
        mod._check_schedule(name, conf)
    assert want in str(exc.value)


def test_good_schedules_are_normalised(mod):
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {
        "nightly": {"volumes": ["data-1", "data-1"], "daily_at": "02:30", "keep": 7},
        "hourly": {"match": "db-*", "every": "1h", "keep": 24, "max_age": "2d"},
        "aged": {"match": ["a*", "b*"], "every": "90s", "max_age": "1d", "any_volume": True, "raw_volumes": False},
    }
    assert mod.snapshot_schedules() == {
        "aged": {"match": ["a*", "b*"], "every": 90, "max_age": 86400, "any_volume": True},
        "hourly": {"match": ["db-*"], "every": 3600, "keep": 24, "max_age": 2 * 86400},
        "nightly": {"volumes": ["data-1"], "daily_at": "02:30", "keep": 7},
    }


def test_the_plan_writes_one_salt_schedule_entry_each_and_removes_only_ours(mod):
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {
        "nightly": {"volumes": ["data-1"], "daily_at": "02:05", "keep": 7},
        "fast": {"match": "*", "every": "2s", "keep": 2},
    }
    mod.schedule_list.update({"salt-volumes-snapshot-fast": {}, "salt-volumes-snapshot-gone": {},
                              "operators-own-job": {}, "__mine_interval": {}})
    plan = mod.snapshot_schedule_plan()
    ids = {e: item["job_kwargs"].pop("schedule_id") for e, item in plan["present"].items()}
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids.values()) and len(set(ids.values())) == 2
    assert plan == {"error": None, "absent": ["salt-volumes-snapshot-gone"], "prefix": "salt-volumes-snapshot-", "present": {
        "salt-volumes-snapshot-fast": {"function": "salt_volumes.run_snapshot_schedule", "job_args": ["fast"],
                                       "job_kwargs": {"match": "*", "every": "2s", "keep": 2},
                                       "maxrunning": 1, "seconds": 2},
        "salt-volumes-snapshot-nightly": {"function": "salt_volumes.run_snapshot_schedule", "job_args": ["nightly"],
                                          "job_kwargs": {"volumes": ["data-1"], "daily_at": "02:05", "keep": 7},
                                          "maxrunning": 1, "cron": "5 2 * * *"},
    }}
    # Applied, then planned again (a field changed): each entry keeps its id.
    mod.schedule_list.clear()
    apply(mod)
    mod.pillar["salt_volumes"]["snapshot_schedules"]["fast"]["keep"] = 3
    again = mod.snapshot_schedule_plan()["present"]
    assert {e: i["kwargs"]["schedule_id"] for e, i in mod.schedule_list.items()} == {
        e: item["job_kwargs"]["schedule_id"] for e, item in again.items()}
    assert again["salt-volumes-snapshot-fast"]["job_kwargs"]["keep"] == 3


def test_a_bad_pillar_plans_nothing_at_all(mod):
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {
        "good": {"volumes": ["v"], "every": "1h", "keep": 1},
        "bad": {"volumes": ["v"], "every": "hourly", "keep": 1},
    }
    mod.schedule_list.update({"salt-volumes-snapshot-good": {}, "salt-volumes-snapshot-gone": {}})
    plan = mod.snapshot_schedule_plan()
    assert plan["present"] == {} and plan["absent"] == []
    assert plan["error"].startswith("salt_volumes:snapshot_schedules:bad: every: 'hourly' is not an interval")
    mod.pillar["salt_volumes"]["snapshot_schedules"] = ["not", "a", "mapping"]
    assert "must be a mapping of schedule names" in mod.snapshot_schedule_plan()["error"]


def snap(name, phase="taken", **kw):
    return dict(name=name, phase=phase, **kw)


def test_pruning_selects_only_this_schedules_own_snapshots(mod):
    at = lambda s: mod.scheduled_snapshot_name("nightly", T0 + s)
    current = at(300)
    owned = [at(0), at(100), at(200), current, "nightly-before-upgrade", at(50)]
    snaps = [snap(current), snap(at(200)), snap(at(100)), snap(at(0)),
             snap(at(150)),                                   # our pattern, not ours: an operator's
             snap("nightly-before-upgrade"),                  # ours by record, not by name: never
             snap("hourly-20260101000000"),                   # another schedule's
             snap("nightly-extra-" + at(0)[len("nightly-"):]),  # a schedule named nightly-extra
             snap(at(50), phase="taking")]                    # ours, left by a killed run
    assert mod._prune_selection("nightly", owned, snaps, 2, None, T0 + 300, current) == sorted([at(0), at(100), at(50)])
    # keep 1: only the one just taken stays.
    assert mod._prune_selection("nightly", owned, snaps, 1, None, T0 + 300, current) == sorted([at(0), at(100), at(200), at(50)])
    # max_age alone: older than 150 s goes; the one just taken always stays.
    assert mod._prune_selection("nightly", owned, snaps, None, 150, T0 + 300, current) == sorted([at(0), at(100), at(50)])
    assert mod._prune_selection("nightly", owned, [snap(current)], None, 1, T0 + 10**6, current) == []
    # A lost one (an overflowed LVM snapshot) does not count as kept.
    lost = [snap(current), snap(at(200), lost=True), snap(at(100))]
    assert mod._prune_selection("nightly", owned, lost, 2, None, T0 + 300, current) == [at(200)]


def schedule(mod, **conf):
    conf.setdefault("volumes", ["data-1"])
    conf.setdefault("every", "1h")
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {"nightly": conf}
    if conf.get("keep") != 0:
        apply(mod)


def test_a_run_takes_prunes_its_own_and_never_an_operators(mod):
    mod.add_volume("data-1", U1)
    mod.add_volume("data-2", U2)
    operators = {"nightly-20250101000000": snap("nightly-20250101000000"),  # our pattern, made by hand
                 "before-upgrade": snap("before-upgrade")}
    mod.node["snaps"][U1] = dict(operators)
    mod.write_node()
    schedule(mod, keep=2)
    taken = []
    for i in range(4):
        ret = mod.run_snapshot_schedule("nightly")
        assert ret["failed"] == 0, ret
        taken.append(ret["snapshot"])
        assert [v["volume"] for v in ret["volumes"]] == ["data-1"], "data-2 is not in the schedule"
        mod.clock[0] += 3600
    node = mod.read_node()
    assert names(node) == sorted(list(operators) + taken[-2:])
    assert names(node, U2) == []
    assert ret["volumes"][0]["pruned"] == [taken[1]]
    rec = mod.record()["schedules"]["nightly"][U1]
    assert rec["owned"] == taken[-2:]
    assert rec["lastSnapshot"] == taken[-1] and rec["lastSuccess"] == "2026-01-01T03:00:00Z"
    assert mod.__context__.get("retcode") is None


def test_a_selector_matches_this_minions_volume_names(mod):
    mod.add_volume("db-1", U1)
    mod.add_volume("web-1", U2)
    mod.write_node()
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {"db": {"match": "db-*", "every": "1h", "keep": 1},
                                                        "named": {"volumes": ["web-1", "elsewhere"], "every": "1h", "keep": 1}}
    apply(mod)
    ret = mod.run_snapshot_schedule("db")
    assert [v["volume"] for v in ret["volumes"]] == ["db-1"]
    ret = mod.run_snapshot_schedule("named")
    assert [v["volume"] for v in ret["volumes"]] == ["web-1"]
    assert ret["notOnThisMinion"] == ["elsewhere"]
    node = mod.read_node()
    assert names(node) == ["db-20260101000000"] and names(node, U2) == ["named-20260101000000"]


def test_twice_in_the_same_second_takes_one(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=5)
    first = mod.run_snapshot_schedule("nightly")
    second = mod.run_snapshot_schedule("nightly")
    assert first["volumes"][0]["new"] is True and second["volumes"][0]["new"] is False
    assert names(mod.read_node()) == ["nightly-20260101000000"]


def test_a_snapshot_of_that_name_taken_by_someone_else_is_left_and_reported(mod):
    mod.add_volume("data-1", U1)
    mod.node["snaps"][U1] = {"nightly-20260101000000": snap("nightly-20260101000000")}
    mod.write_node()
    schedule(mod, keep=1)
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["failed"] == 1 and mod.__context__["retcode"] == 1
    assert "a snapshot named nightly-20260101000000 that this schedule did not take is there already" in ret["volumes"][0]["error"]
    assert [c[0] for c in mod.read_node()["calls"]] == ["list", "snapshots"], "nothing taken or deleted"
    assert mod.record()["schedules"]["nightly"][U1]["owned"] == []
    # A second later it takes its own, and still never deletes that one.
    mod.clock[0] += 1
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["failed"] == 0
    assert names(mod.read_node()) == ["nightly-20260101000000", "nightly-20260101000001"]


def test_a_run_killed_between_take_and_prune_converges_on_the_next(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=1)
    mod.run_snapshot_schedule("nightly")
    # Killed once the snapshot is taken: no answer, nothing pruned.
    mod.node.update(mod.read_node())
    mod.node["fail"] = ["kill-after-snapshot"]
    mod.write_node()
    mod.clock[0] += 60
    ret = mod.run_snapshot_schedule("nightly")
    assert "without a JSON answer" in ret["volumes"][0]["error"]
    assert names(mod.read_node()) == ["nightly-20260101000000", "nightly-20260101000100"]
    status = mod.snapshot_schedule_status()
    assert status[0]["failing"] is True and status[0]["lastSuccess"] == "2026-01-01T00:00:00Z"
    # The next run knows the one it took as its own, and prunes it.
    mod.clock[0] += 60
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["failed"] == 0
    assert names(mod.read_node()) == ["nightly-20260101000200"]
    assert mod.snapshot_schedule_status()[0]["failing"] is False
    # Killed before the take, after its name was recorded: forgotten.
    with mod._schedule_state() as doc:
        doc["schedules"]["nightly"][U1]["owned"].append("nightly-20260101000250")
    mod.clock[0] += 60
    mod.run_snapshot_schedule("nightly")
    assert mod.record()["schedules"]["nightly"][U1]["owned"] == ["nightly-20260101000300"]


def test_a_failed_delete_is_reported_and_retried(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=1)
    mod.run_snapshot_schedule("nightly")
    mod.node.update(mod.read_node())
    mod.node["fail"] = ["snapshot-delete"]
    mod.write_node()
    mod.clock[0] += 60
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["volumes"][0]["error"] == ("schedule nightly, volume data-1: pruning nightly-20260101000000: "
                                          "snapshot-delete failed on purpose")
    row = mod.snapshot_schedule_status()[0]
    assert row["failing"] is True and row["lastSuccess"] == "2026-01-01T00:01:00Z"
    assert row["lastError"].endswith("snapshot-delete failed on purpose")
    mod.clock[0] += 60
    mod.run_snapshot_schedule("nightly")
    assert names(mod.read_node()) == ["nightly-20260101000200"]


def test_the_scheduler_passes_the_schedule_and_pillar_is_not_read(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    # What the pillar says now is not what the entry runs.
    schedule(mod, keep=0)
    for i in range(3):
        ret = mod.run_snapshot_schedule("nightly", volumes=["data-1"], every="1h", keep=2, schedule_id="0123456789abcdef")
        assert ret["failed"] == 0
        mod.clock[0] += 1
    assert names(mod.read_node()) == ["nightly-20260101000001", "nightly-20260101000002"]


def test_bad_input_changes_nothing(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=0)
    with pytest.raises(SaltInvocationError, match="nightly: keep: 0"):
        mod.run_snapshot_schedule("nightly")
    with pytest.raises(SaltInvocationError, match="nightly: every: '1 hour' is not an interval"):
        mod.run_snapshot_schedule("nightly", volumes=["data-1"], every="1 hour", keep=2)
    with pytest.raises(SaltInvocationError, match="no schedule 'other': add it there, or apply salt_volumes.scheduled"):
        mod.run_snapshot_schedule("other")
    assert "calls" not in mod.read_node(), "the binary never ran"


def test_status_reports_the_schedules_of_pillar_bounded(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=1)
    mod.run_snapshot_schedule("nightly")
    doc = mod.status()
    assert doc["snapshotSchedules"] == [{"schedule": "nightly", "volume": "data-1", "uuid": U1,
                                         "lastSuccess": "2026-01-01T00:00:00Z",
                                         "lastSnapshot": "nightly-20260101000000", "failing": False}]
    # Many volumes: at most 64 entries, errors cut short.
    with mod._schedule_state() as rec:
        for i in range(100):
            rec["schedules"]["nightly"]["00000000-0000-4000-8000-%012d" % i] = {
                "volume": "v%03d" % i, "owned": [], "failing": True, "lastError": "x" * 1000, "lastErrorAt": "t"}
    rows = mod.snapshot_schedule_status()
    assert len(rows) == 64 and all(len(r.get("lastError", "")) <= 300 for r in rows)
    # A retired schedule (its entry removed) is not reported; its record
    # goes (its snapshots released); a run that starts later reports it again.
    assert mod.snapshot_schedule_retired("nightly") is False
    assert mod.retire_snapshot_schedule("nightly") is True
    assert mod.retire_snapshot_schedule("nightly") is False
    assert mod.snapshot_schedule_retired("nightly") is True
    assert mod.status()["snapshotSchedules"] == []
    assert "nightly" not in mod.record()["schedules"]
    mod.clock[0] += 1
    mod.run_snapshot_schedule("nightly")
    assert mod.snapshot_schedule_retired("nightly") is False
    # That run forgot the volumes this node does not hold.
    assert [r["volume"] for r in mod.snapshot_schedule_status()] == ["data-1"]


def test_a_run_that_began_before_its_schedule_retired_does_not_report_it_again(mod, monkeypatch):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=1)
    real_run = mod._run

    def run(command, spec=None, extra_args=()):
        if command == "snapshot":
            mod.clock[0] += 5
            mod.retire_snapshot_schedule("nightly")  # the formula, meanwhile
        return real_run(command, spec, extra_args)

    monkeypatch.setattr(mod, "_run", run)
    assert mod.run_snapshot_schedule("nightly")["failed"] == 0
    assert mod.snapshot_schedule_retired("nightly") is True
    assert mod.snapshot_schedule_status() == []


def test_status_without_a_cachedir_or_with_a_broken_record_still_reports(mod, tmp_path):
    mod.write_node()
    del mod.__opts__["cachedir"]
    assert mod.status()["snapshotSchedules"] == []
    mod.__opts__["cachedir"] = str(tmp_path / "cache")
    os.makedirs(tmp_path / "cache" / "salt_volumes")
    (tmp_path / "cache" / "salt_volumes" / "snapshot_schedules.json").write_text("{torn")
    assert mod.status()["snapshotSchedules"] is None
    schedule(mod, keep=1)
    mod.add_volume("data-1", U1)
    mod.write_node()
    with pytest.raises(Exception, match="move it away to start over"):
        mod.run_snapshot_schedule("nightly")
    assert "snapshot" not in [c[0] for c in mod.read_node().get("calls", [])], "nothing taken"


def test_the_beacon_tells_a_failing_schedule_not_each_success(monkeypatch):
    b = load("beacons")
    fired = []
    row = {"schedule": "nightly", "volume": "data-1", "uuid": U1, "lastSuccess": "2026-01-01T00:00:00Z",
           "lastSnapshot": "nightly-20260101000000", "failing": False}
    doc = {"volumes": [], "capacity": {}, "snapshotSchedules": [row]}
    b.__salt__ = {"salt_volumes.status": lambda: json.loads(json.dumps(doc)),
                  "event.send": lambda tag, data: fired.append(data)}
    b.__grains__ = {"id": "node-1"}
    b.__context__ = {}
    clock = [1000.0]
    monkeypatch.setattr(b.time, "time", lambda: clock[0])
    cfg = [{"interval": 10}, {"heartbeat": 300}]
    b.beacon(cfg)
    assert fired[-1]["snapshotSchedules"] == [row]
    row["lastSuccess"], row["lastSnapshot"] = "2026-01-01T01:00:00Z", "nightly-20260101010000"
    clock[0] += 10
    b.beacon(cfg)
    assert len(fired) == 1, "a success alone waits for the heartbeat"
    row.update(failing=True, lastError="boom", lastErrorAt="t")
    clock[0] += 10
    b.beacon(cfg)
    assert len(fired) == 2 and fired[-1]["kind"] == "change" and fired[-1]["snapshotSchedules"][0]["failing"]
    clock[0] += 300
    b.beacon(cfg)
    assert fired[-1]["kind"] == "heartbeat"


def test_pillar_is_read_unmasked_on_salt_3008(mod):
    # Salt 3008's pillar.get masks every value outside a template unless
    # unmask=True; earlier lines take no unmask.
    plain = {"salt_volumes": {"volumes": {"data-1": {"uuid": U1, "node": "node-1"}},
                              "snapshot_schedules": {"n": {"volumes": ["data-1"], "every": "2s", "keep": 2}}}}

    def masking_get(key, default=None, unmask=False):
        cur = plain
        for part in key.split(":"):
            if not isinstance(cur, dict) or part not in cur:
                return default
            cur = cur[part]
        if unmask:
            return cur
        return json.loads(json.dumps(cur).replace('"' + U1 + '"', '"**********"').replace('"2s"', '"**********"'))

    mod.__salt__["pillar.get"] = masking_get
    assert mod._lookup("data-1")["uuid"] == U1
    assert mod.snapshot_schedules()["n"]["every"] == 2
    mod.__salt__["pillar.get"] = lambda key, default=None: masking_get(key, default, unmask=True)
    assert mod._lookup("data-1")["uuid"] == U1


def test_the_retired_state(tmp_path):
    st = load("states")
    retired = set()
    st.__opts__ = {"test": True}
    st.__salt__ = {"salt_volumes.snapshot_schedule_retired": lambda n: n in retired,
                   "salt_volumes.retire_snapshot_schedule": lambda n: retired.add(n) or True,
                   "salt_volumes.message": str}
    ret = st.snapshot_schedule_retired("nightly")
    assert ret["result"] is None and ret["changes"] == {"retired": "nightly"} and not retired
    st.__opts__["test"] = False
    ret = st.snapshot_schedule_retired("nightly")
    assert ret["result"] is True and ret["changes"] == {"retired": "nightly"} and retired == {"nightly"}
    ret = st.snapshot_schedule_retired("nightly")
    assert ret["result"] is True and ret["changes"] == {}


def test_the_fastest_bounded_schedules_are_allowed(mod):
    assert mod._check_schedule("n", {"volumes": ["v"], "every": "1s", "keep": 1000}) == {
        "volumes": ["v"], "every": 1, "keep": 1000}
    assert mod._check_schedule("n", {"volumes": ["v"], "every": "1h", "max_age": "1000h"})["max_age"] == 3600000
    assert mod._check_schedule("n", {"volumes": ["v"], "every": "7d", "max_age": "3650d"})["max_age"] == 3650 * 86400


U3 = "5c0a8b5e-6a53-4f0e-9a0b-6f1d2e3c4b5a"
U4 = "7e1c2d3f-4a5b-4c6d-8e7f-901a2b3c4d5e"


def test_by_default_a_schedule_takes_only_this_minions_pillar_volumes_and_no_raw_one(mod):
    mod.add_volume("data-1", U1)
    mod.add_volume("cp-1", U2, in_pillar=False)          # the control plane's, or Kubernetes'
    mod.add_volume("raw-1", U3, kind="rawBlockDevice")   # in pillar, on an operator's LV
    mod.add_volume("other-1", U4, in_pillar=False)
    # In pillar, but for another minion, or with another uuid: not this volume.
    mod.pillar["salt_volumes"]["volumes"]["other-1"] = {"uuid": U4, "node": "node-2", "sparseLoopDevice": {"size": "1Gi"}}
    mod.pillar["salt_volumes"]["volumes"]["cp-1"] = {"uuid": U1, "node": "node-1", "sparseLoopDevice": {"size": "1Gi"}}
    mod.write_node()
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {"all": {"match": "*", "every": "1h", "keep": 2}}
    apply(mod)
    ret = mod.run_snapshot_schedule("all")
    assert ret["failed"] == 0, ret
    assert [v["volume"] for v in ret["volumes"]] == ["data-1"]
    assert [(v["volume"], v["reason"].split(":")[0]) for v in ret["skipped"]] == [
        ("cp-1", "not a volume of this minion's pillar (salt_volumes"),
        ("other-1", "not a volume of this minion's pillar (salt_volumes"),
        ("raw-1", "a raw volume (rawBlockDevice)")]
    node = mod.read_node()
    assert names(node) == ["all-20260101000000"]
    assert names(node, U2) == names(node, U3) == names(node, U4) == []
    assert [r["volume"] for r in mod.snapshot_schedule_status()] == ["data-1"]

    # Named, not in pillar: refused on that volume, saying the key and what it costs.
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {"cp": {"volumes": ["cp-1", "data-1", "raw-1"], "every": "1h", "keep": 2}}
    apply(mod)
    ret = mod.run_snapshot_schedule("cp")
    assert ret["failed"] == 2 and mod.__context__["retcode"] == 1
    errors = {v["volume"]: v.get("error") for v in ret["volumes"]}
    assert errors["data-1"] is None
    assert errors["cp-1"] == (
        "schedule cp, volume cp-1: not taken: not a volume of this minion's pillar (salt_volumes:volumes, "
        "node node-1): a schedule takes only those; set any_volume: true in salt_volumes:snapshot_schedules:cp "
        "to take the volumes this node holds from elsewhere too (the control plane, Kubernetes), whose "
        "deletion through the control plane then waits until their scheduled snapshots are gone")
    assert errors["raw-1"].startswith("schedule cp, volume raw-1: not taken: a raw volume (rawBlockDevice): set "
                                      "raw_volumes: true in salt_volumes:snapshot_schedules:cp to take its snapshots")
    assert {r["volume"]: r["failing"] for r in mod.snapshot_schedule_status() if r["schedule"] == "cp"} == {
        "cp-1": True, "data-1": False, "raw-1": True}
    assert names(mod.read_node(), U2) == names(mod.read_node(), U3) == []

    # The opt-ins.
    mod.clock[0] += 1
    mod.pillar["salt_volumes"]["snapshot_schedules"] = {"cp": {"volumes": ["cp-1", "raw-1"], "every": "1h", "keep": 2,
                                                               "any_volume": True, "raw_volumes": True}}
    apply(mod)
    ret = mod.run_snapshot_schedule("cp")
    assert ret["failed"] == 0, ret
    assert names(mod.read_node(), U2) == names(mod.read_node(), U3) == ["cp-20260101000001"]


def test_a_schedule_whose_pruning_fails_stops_taking_at_keep_plus_3(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=1)
    mod.run_snapshot_schedule("nightly")
    mod.node.update(mod.read_node())
    mod.node["fail"] = ["snapshot-delete"] * 15
    mod.write_node()
    counts = []
    for i in range(6):
        mod.clock[0] += 60
        ret = mod.run_snapshot_schedule("nightly")
        assert ret["failed"] == 1
        counts.append(len(names(mod.read_node())))
    assert counts == [2, 3, 4, 4, 4, 4], "never more than keep + 3"
    assert mod.read_node()["fail"] == [], "each run tried every doomed one"
    # Every doomed one was tried, not only the first.
    assert ret["volumes"][0]["error"].startswith(
        "schedule nightly, volume data-1: not taken: it holds 4 of its own snapshots on this volume, keep (1) + 3 "
        "or more, as its pruning failed (pruning nightly-20260101000000: snapshot-delete failed on purpose (and 2 more failed)): "
        "it takes no more until they are fewer; fix that, or delete some by hand (salt_volumes.snapshot_delete)")
    # Deletes work again: it prunes, then takes.
    mod.clock[0] += 60
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["failed"] == 0, ret
    assert names(mod.read_node()) == ["nightly-20260101000700"]
    assert mod.snapshot_schedule_status()[0]["failing"] is False


def test_a_failed_delete_does_not_stop_the_other_deletes(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=3)
    for i in range(3):
        mod.run_snapshot_schedule("nightly")
        mod.clock[0] += 60
    mod.pillar["salt_volumes"]["snapshot_schedules"]["nightly"]["keep"] = 1
    apply(mod)
    mod.node.update(mod.read_node())
    mod.node["fail"] = ["snapshot-delete"]
    mod.write_node()
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["volumes"][0]["pruned"] == ["nightly-20260101000100", "nightly-20260101000200"]
    assert ret["volumes"][0]["error"] == ("schedule nightly, volume data-1: pruning nightly-20260101000000: "
                                          "snapshot-delete failed on purpose")
    assert names(mod.read_node()) == ["nightly-20260101000000", "nightly-20260101000300"]


def test_a_run_fired_as_its_entry_went_does_not_report_it_again(mod):
    # The scheduler fired the run (its fields and id in the call), then
    # the formula removed the entry and retired the schedule; the run read
    # its clock after that, in a later second (CI saw it on 2026-12-06).
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=1)
    entry = mod.schedule_list["salt-volumes-snapshot-nightly"]
    fired = dict(entry["kwargs"])

    def run(kwargs):
        return mod.run_snapshot_schedule(*entry["args"], **kwargs)

    del mod.pillar["salt_volumes"]["snapshot_schedules"]
    apply(mod)
    assert mod.snapshot_schedule_retired("nightly") is True
    mod.clock[0] += 1
    assert run(fired)["failed"] == 0
    assert mod.snapshot_schedule_retired("nightly") is True
    assert mod.snapshot_schedule_status() == []
    # Back in pillar: a new entry, a new id; its first run reports it.
    schedule(mod, keep=1)
    mod.clock[0] += 1
    again = mod.schedule_list["salt-volumes-snapshot-nightly"]["kwargs"]
    assert again["schedule_id"] != fired["schedule_id"]
    run(fired)
    assert mod.snapshot_schedule_retired("nightly") is True, "a run under the old id still does not"
    mod.clock[0] += 1
    run(again)
    assert mod.snapshot_schedule_retired("nightly") is False
    assert [r["volume"] for r in mod.snapshot_schedule_status()] == ["data-1"]


def test_a_new_schedule_of_a_retired_ones_name_owns_none_of_its_snapshots(mod):
    mod.add_volume("data-1", U1)
    mod.write_node()
    schedule(mod, keep=2)
    old = []
    for i in range(2):
        old.append(mod.run_snapshot_schedule("nightly")["snapshot"])
        mod.clock[0] += 60
    first_id = mod.schedule_list["salt-volumes-snapshot-nightly"]["kwargs"]["schedule_id"]
    # A field changed, the entry stays: the same schedule, still its own.
    schedule(mod, keep=3)
    assert mod.schedule_list["salt-volumes-snapshot-nightly"]["kwargs"]["schedule_id"] == first_id
    # Out of pillar (retired: released), then a new one of that name.
    del mod.pillar["salt_volumes"]["snapshot_schedules"]
    apply(mod)
    assert mod.record()["schedules"] == {}
    schedule(mod, keep=1)
    assert mod.schedule_list["salt-volumes-snapshot-nightly"]["kwargs"]["schedule_id"] != first_id
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["failed"] == 0 and ret["volumes"][0]["pruned"] == []
    new = [ret["snapshot"]]
    mod.clock[0] += 60
    ret = mod.run_snapshot_schedule("nightly")
    assert ret["volumes"][0]["pruned"] == new, "only its own"
    assert names(mod.read_node()) == sorted(old + [ret["snapshot"]])
    # Its entry replaced without a retirement (deleted by hand, applied
    # again): a new id, and the same holds.
    mod.schedule_list.clear()
    apply(mod)
    mod.clock[0] += 60
    ret2 = mod.run_snapshot_schedule("nightly")
    assert ret2["volumes"][0]["pruned"] == []
    assert names(mod.read_node()) == sorted(old + [ret["snapshot"], ret2["snapshot"]])
    # A run by hand needs the entry (its id).
    mod.schedule_list.clear()
    with pytest.raises(SaltInvocationError, match="salt-volumes-snapshot-nightly: no Salt schedule entry of that name, "
                       "with its id, on this minion: apply salt_volumes.scheduled first"):
        mod.run_snapshot_schedule("nightly")


def test_a_cut_report_keeps_the_failing_schedules(mod):
    mod.write_node()
    with mod._schedule_state() as rec:
        rec["schedules"]["nightly"] = {
            "00000000-0000-4000-8000-%012d" % i: {"volume": "v%03d" % i, "owned": [], "failing": i >= 97,
                                                  "lastError": "boom" if i >= 97 else None}
            for i in range(100)}
    rows = mod.snapshot_schedule_status()
    assert len(rows) == 64
    assert [r["volume"] for r in rows if r["failing"]] == ["v097", "v098", "v099"]
    assert [r["volume"] for r in rows][:3] == ["v000", "v001", "v002"], "in their order"


def test_the_beacon_tells_a_failure_once_not_at_each_run(monkeypatch):
    b = load("beacons")
    fired = []
    row = {"schedule": "nightly", "volume": "data-1", "uuid": U1, "lastSuccess": "2026-01-01T00:00:00Z",
           "lastSnapshot": "nightly-20260101000000", "failing": True,
           "lastError": "schedule nightly, volume data-1: snapshot nightly-20260101000100: no space left",
           "lastErrorAt": "2026-01-01T00:01:00Z"}
    doc = {"volumes": [], "capacity": {}, "snapshotSchedules": [row]}
    b.__salt__ = {"salt_volumes.status": lambda: json.loads(json.dumps(doc)),
                  "event.send": lambda tag, data: fired.append(data)}
    b.__grains__ = {"id": "node-1"}
    b.__context__ = {}
    clock = [1000.0]
    monkeypatch.setattr(b.time, "time", lambda: clock[0])
    cfg = [{"interval": 10}, {"heartbeat": 300}]
    b.beacon(cfg)
    assert len(fired) == 1
    # The next run fails the same way, naming its own snapshot.
    row.update(lastError="schedule nightly, volume data-1: snapshot nightly-20260101000200: no space left",
               lastErrorAt="2026-01-01T00:02:00Z")
    clock[0] += 10
    b.beacon(cfg)
    assert len(fired) == 1, "the same failure again is no news"
    row.update(lastError="schedule nightly, volume data-1: pruning nightly-20260101000000: in use")
    clock[0] += 10
    b.beacon(cfg)
    assert len(fired) == 2 and fired[-1]["kind"] == "change"
