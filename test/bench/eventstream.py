"""Write and read a master event bus stream with Salt's own code.

write N PATH: N events as the master publishes them (frame {head, body},
body = SaltEvent.pack(tag, data)): per volume, five progress events then a
state.apply job return carrying device info.
read PATH: decode the stream the way Salt's PubClient and SaltEvent do and
print the number of events and the seconds spent decoding.
"""
import sys
import time

import salt.payload
import salt.transport.frame
import salt.utils.event
import salt.utils.msgpack

STEPS = ["recorded", "file-created", "formatted", "attached", "linked"]


def events(n):
    i = 0
    while True:
        name = "vol-%05d" % i
        uuid = "3f2504e0-4f89-41d3-9a0c-%012d" % i
        minion = "node-%04d" % (i % 1000)
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


def write(n, path):
    with open(path, "wb") as f:
        for count, (tag, data) in enumerate(events(n)):
            if count == n:
                break
            f.write(salt.transport.frame.frame_msg(salt.utils.event.SaltEvent.pack(tag, data)))


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
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


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(int(sys.argv[2]), sys.argv[3])
    else:
        read(sys.argv[2])
