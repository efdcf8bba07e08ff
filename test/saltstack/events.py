"""Print every master event as a JSON line, using Salt's own subscriber.

usage: python events.py CONFIG_DIR
"""
import json
import sys

import salt.config
import salt.utils.event


def main():
    opts = salt.config.client_config(sys.argv[1] + "/master")
    bus = salt.utils.event.get_master_event(opts, opts["sock_dir"], listen=True)
    bus.connect_pub(timeout=30)
    print(json.dumps({"tag": "__ready__", "data": {}}), flush=True)
    while True:
        ev = bus.get_event(full=True, wait=1, auto_reconnect=True)
        if ev:
            print(json.dumps(ev, default=str), flush=True)


if __name__ == "__main__":
    main()
