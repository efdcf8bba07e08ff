"""
Run the salt-volumes control plane (``salt-volumes serve``) as a Salt master
engine: the master starts it, restarts it when it dies (with backoff), and
stops it when the master stops.

Master configuration::

    engines:
      - salt_volumes:
          config: /etc/salt-volumes/config.yaml
          # binary: /usr/bin/salt-volumes    # default: the package's, else /usr/local/bin's
          # max_backoff: 60

Put this file where the master finds engines: ``salt-run
saltutil.sync_engines`` copies ``_engines`` from the file roots, or list the
directory in ``engines_dirs``; then restart the master.
"""

import ctypes
import logging
import os
import signal
import subprocess
import time

log = logging.getLogger(__name__)

__virtualname__ = "salt_volumes"

# A serve that ran this long without dying is healthy: backoff starts over.
_HEALTHY_AFTER = 60

_PR_SET_PDEATHSIG = 1

# Resolved here, not between fork and exec, where only async-signal-safe
# work belongs: dlopen(NULL) gives the C library the interpreter uses.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def __virtual__():
    return __virtualname__


def _die_with_parent():
    # Runs in the child between fork and exec: if the engine process is
    # killed outright (SIGKILL, OOM), the kernel stops serve too, so a
    # master restart never leaves two control planes behind.
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _stop(proc, grace=15):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        log.warning("salt-volumes serve did not stop within %ss of SIGTERM; killing it", grace)
        proc.kill()
        proc.wait()


# Where salt-volumes is, when the engine's config names no binary: the
# package's, then a source install's (the install guide's).
_BINARIES = ("/usr/bin/salt-volumes", "/usr/local/bin/salt-volumes")


def _default_binary():
    for path in _BINARIES:
        if os.access(path, os.X_OK):
            return path
    return _BINARIES[-1]


def start(config="/etc/salt-volumes/config.yaml", binary=None, min_backoff=1, max_backoff=60):
    """
    Keep ``binary serve --config config`` running for as long as the master.
    """
    if binary is None:
        binary = _default_binary()
    if not os.path.isabs(binary):
        log.error("salt_volumes engine: binary must be an absolute path, not %r", binary)
        return
    backoff = min_backoff
    proc = None
    try:
        while True:
            started = time.monotonic()
            try:
                proc = subprocess.Popen(
                    [binary, "serve", "--config", config],
                    preexec_fn=_die_with_parent,
                    stdin=subprocess.DEVNULL,
                )
            except OSError as exc:
                log.error("salt_volumes engine: cannot start %s: %s", binary, exc)
                rc = None
            else:
                log.info("salt_volumes engine: started salt-volumes serve (pid %s, config %s)", proc.pid, config)
                rc = proc.wait()
                proc = None
            if time.monotonic() - started >= _HEALTHY_AFTER:
                backoff = min_backoff
            log.warning("salt_volumes engine: salt-volumes serve exited (%s); starting it again in %ss", rc, backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
    finally:
        # The master is stopping this engine (SIGTERM turns into SystemExit
        # in Salt's process wrapper): serve goes with it.
        _stop(proc)
