"""Write and read a master event bus stream with Salt's own code.

write N PATH [MIX [NODES]]: N events as the master publishes them (frame {head,
body}, body = SaltEvent.pack(tag, data)). MIX "ours" (default): per volume,
five progress events then a state.apply job return carrying device info.
"returns": only state.apply job returns. "mixed": what a busy master
carries, about 90 % of it not ours: auth, job publications, returns of
test.ping, cmd.run and grains.items, other tools' beacons, minion pings,
around the volumes' progress events and returns.
flood CONFDIR RATE SECONDS NAMES MINION: fire RATE job returns a second for
SECONDS onto the live master bus of the master configured in CONFDIR, as
the master fires a return a minion sent under a jid of its choosing: each
names NAMES made-up salt_volumes states. Prints the number fired.
read PATH: decode the stream the way Salt's PubClient and SaltEvent do and
print the number of events and the seconds spent decoding.

FRAMING (environment, default "plain") is how the master under test lays
frames on its event socket: "plain" (3007 and 3008: the tcp transport's
maps back to back) or "prefixed" (3006.26 and later: the ipc transport's
4-byte big-endian length before each map). Both write and read follow it,
reading the way that line's own subscriber does.
"""
import os
import struct
import sys
import time

import salt.payload
import salt.transport.frame
import salt.utils.event
import salt.utils.msgpack

STEPS = ["recorded", "file-created", "formatted", "attached", "linked"]


NODES = 1000


def events(n):
    i = 0
    while True:
        name = "vol-%06d" % i
        uuid = "3f2504e0-4f89-41d3-9a0c-%012d" % i
        minion = "node-%05d" % (i % NODES)
        jid = "2026112200%010d" % i
        for step in STEPS:
            yield "salt-volumes/%s/progress" % name, {
                "cmd": "_minion_event", "id": minion, "tag": "salt-volumes/%s/progress" % name,
                "data": {"step": step, "uuid": uuid, "volume": name, "node": minion, "_stamp": "2026-11-22T00:00:00.000000"},
            }
        device = {"name": name, "uuid": uuid, "type": "sparseLoopDevice", "mode": "Filesystem", "fsType": "ext4",
                  "size": 1073741824, "devicePath": "/dev/loop3", "deviceName": "loop3",
                  "persistentPath": "/dev/disk/by-uuid/" + uuid, "state": "prepared", "inUse": False}
        key = "salt_volumes_|-salt_volumes %s_|-%s_|-prepared" % (name, name)
        yield "salt/job/%s/ret/%s" % (jid, minion), {
            "cmd": "_return", "id": minion, "jid": jid, "fun": "state.apply", "retcode": 0, "success": True,
            "fun_args": ["salt_volumes.prepared", {"pillar": {"salt_volumes": {"volume": {"name": name, "uuid": uuid}}}}],
            "return": {key: {"result": True, "comment": "Volume %s prepared" % name, "name": name,
                             "changes": {"prepared": device}, "volume": device, "__run_num__": 0,
                             "start_time": "00:00:00.000000", "duration": 12.3, "__id__": "salt_volumes " + name}},
            "_stamp": "2026-11-22T00:00:00.000000",
        }
        i += 1


def returns_only(n):
    for tag, data in events(n * 6):
        if tag.startswith("salt/job/"):
            yield tag, data


def grains(i):
    g = {"id": "node-%04d" % i, "os": "Debian", "osrelease": "12", "kernelrelease": "6.1.0-28-amd64",
         "cpu_model": "Intel(R) Xeon(R) CPU", "num_cpus": 2, "mem_total": 24000, "fqdn": "node-%04d.example" % i,
         "ipv4": ["127.0.0.1", "10.0.%d.%d" % (i // 250, i % 250)], "saltversion": "3008.3",
         "pythonpath": ["/usr/lib/python3/dist-packages"] * 4}
    for k in range(40):
        g["custom_%02d" % k] = {"value": "x" * 20, "list": [k, k + 1, k + 2]}
    return g


def unrelated(i):
    jid = "2026112300%010d" % i
    minion = "node-%04d" % (i % 1000)
    stamp = "2026-11-23T00:00:00.000000"
    pub = "-----BEGIN PUBLIC KEY-----\n" + "A" * 392 + "\n-----END PUBLIC KEY-----"
    k = i % 9
    if k == 0:
        return "salt/auth", {"result": True, "act": "accept", "id": minion, "pub": pub, "_stamp": stamp}
    if k == 1:
        return "salt/job/%s/new" % jid, {"jid": jid, "tgt": "*", "tgt_type": "glob", "fun": "test.ping", "arg": [],
                                          "minions": [minion], "missing": [], "user": "root", "_stamp": stamp}
    if k == 2:
        return "salt/job/%s/ret/%s" % (jid, minion), {"cmd": "_return", "id": minion, "fun": "test.ping", "fun_args": [],
                                                       "jid": jid, "return": True, "retcode": 0, "success": True, "_stamp": stamp}
    if k == 3:
        return "salt/job/%s/ret/%s" % (jid, minion), {"cmd": "_return", "id": minion, "fun": "cmd.run", "fun_args": ["uptime"],
                                                       "jid": jid, "return": " 10:00:00 up 3 days,  1 user,  load average: 0.00", "retcode": 0, "success": True, "_stamp": stamp}
    if k == 4:
        return "salt/job/%s/ret/%s" % (jid, minion), {"cmd": "_return", "id": minion, "fun": "grains.items", "fun_args": [],
                                                       "jid": jid, "return": grains(i), "retcode": 0, "success": True, "_stamp": stamp}
    if k == 5:
        return "salt/beacon/%s/diskusage/" % minion, {"id": minion, "/": "63%", "/var": "41%", "_stamp": stamp}
    if k == 6:
        return "minion_ping", {"minion": minion, "_stamp": stamp}
    if k == 7:
        return "salt/minion/%s/start" % minion, {"cmd": "_minion_event", "id": minion, "tag": "salt/minion/%s/start" % minion,
                                                 "data": "Minion %s started at Mon Nov 23 10:00:00 2026" % minion, "_stamp": stamp}
    return "salt/job/%s/ret/%s" % (jid, minion), {"cmd": "_return", "id": minion, "fun": "pkg.list_upgrades", "fun_args": [],
                                                   "jid": jid, "return": {"pkg-%d" % p: "1.%d-1" % p for p in range(30)},
                                                   "retcode": 0, "success": True, "_stamp": stamp}


def mixed(n):
    ours = events(n)
    i = 0
    while True:
        # One of ours for every nine of others.
        yield next(ours)
        for _ in range(9):
            yield unrelated(i)
            i += 1


def pack(tag, data):
    # SaltEvent.pack where the line has it (3007+); 3006 builds the same
    # bytes inline in fire_event.
    if hasattr(salt.utils.event.SaltEvent, "pack"):
        return salt.utils.event.SaltEvent.pack(tag, data)
    return tag.encode() + salt.utils.event.TAGEND.encode() + salt.payload.dumps(data, use_bin_type=True)


def write(n, path, mix="ours"):
    gen = {"ours": events, "returns": returns_only, "mixed": mixed}[mix](n)
    with open(path, "wb") as f:
        for count, (tag, data) in enumerate(gen):
            if count == n:
                break
            body = pack(tag, data)
            if FRAMING == "prefixed":
                f.write(salt.transport.frame.frame_msg_ipc(body, raw_body=True))
            else:
                f.write(salt.transport.frame.frame_msg(body))


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    if FRAMING == "prefixed":
        return read_prefixed(raw)
    start = time.perf_counter()
    unpacker = salt.utils.msgpack.Unpacker()
    n = 0
    for off in range(0, len(raw), 65536):
        unpacker.feed(raw[off:off + 65536])
        for framed in unpacker:
            framed = salt.transport.frame.decode_embedded_strs(framed)
            tag, data = salt.utils.event.SaltEvent.unpack(framed["body"])
            n += 1
    print(n, time.perf_counter() - start)


def read_prefixed(raw):
    # As 3006's IPCMessageSubscriber: a length, then exactly that many
    # bytes unpacked whole, then the event inside the body.
    start = time.perf_counter()
    n = off = 0
    while off < len(raw):
        (length,) = struct.unpack(">I", raw[off:off + 4])
        framed = salt.utils.msgpack.unpackb(raw[off + 4:off + 4 + length], raw=False)
        off += 4 + length
        tag, data = salt.utils.event.SaltEvent.unpack(framed["body"])
        n += 1
    print(n, time.perf_counter() - start)


def flood(conf_dir, rate, seconds, names, minion, kind="returns"):
    """Fire forged job returns (kind "returns") or events of the same size
    under a tag no one listens for (kind "noise": the bus's own cost)."""
    import random

    import salt.config

    opts = salt.config.master_config(os.path.join(conf_dir, "master"))
    bus = salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=False)
    fired, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        jid = "2026%016d" % random.randrange(10**16)
        ret = {}
        for _ in range(names):
            name = "forged-%08x" % random.randrange(1 << 32)
            ret["salt_volumes_|-salt_volumes %s_|-%s_|-prepared" % (name, name)] = {
                "result": True, "comment": "", "name": name, "changes": {}, "__run_num__": 0}
        tag = "salt/job/%s/ret/%s" % (jid, minion)
        if kind == "noise":
            tag = "bench/noise/%s/%s" % (jid, minion)
        bus.fire_event({"cmd": "_return", "id": minion, "jid": jid, "fun": "state.apply",
                        "retcode": 0, "success": True, "return": ret}, tag)
        fired += 1
        # Paced against the clock, not by sleeping a fixed time per event.
        ahead = start + fired / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    bus.destroy()
    print(fired, time.monotonic() - start)


FRAMING = os.environ.get("FRAMING", "plain")

if __name__ == "__main__":
    if sys.argv[1] == "write":
        if len(sys.argv) > 5:
            NODES = int(sys.argv[5])
        write(int(sys.argv[2]), sys.argv[3], *sys.argv[4:5])
    elif sys.argv[1] == "flood":
        flood(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6], *sys.argv[7:8])
    else:
        read(sys.argv[2])
