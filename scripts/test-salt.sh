#!/usr/bin/env bash
# The Salt matrix, one line at a time: every Salt-facing suite against the
# newest installable release of a Salt line (3006, 3007, 3008), from a
# virtualenv cached outside the repository (scripts/salt-venv.sh). What
# does not touch Salt (the node binary, the store, Kubernetes, the booted
# guests, the UI) runs once, in make test, on the pinned release.
#
# The small suites run beside the control plane's tests: the machine has
# two cores and both sets mostly wait on Salt.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

line=${1:?usage: scripts/test-salt.sh 3006|3007|3008}
venv=$(scripts/salt-venv.sh "$line")
export SALT_VOLUMES_SALT_VENV=$venv
release=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("salt"))')
echo "test-salt: Salt $release ($venv)"
start=$SECONDS

# The modules, beacon and engine under this line's Python.
"$venv/bin/python" -m pytest -q -p no:cacheprovider salt/tests

# serve against this line's master: creates and deletes over the job, the
# master engine, forged events, node health from the beacon, a node
# forgotten, the demo's smoke run, people's logins, snapshots and clones
# through apply_snapshot; on a line older than the pinned one, its
# master upgraded to the pinned release under a running serve.
plane='^(TestEndToEnd|TestMasterEngine|TestForgedEventsChangeNothing|TestNodeHealth|TestNodeForget|TestDemo|TestSaltUpgradeUnderServe|TestServeAsItsOwnUser|TestPeopleLogInWithSalt|TestSnapshotsThroughTheControlPlane)$'
pinned=$(sed -n 's/^salt==//p' salt/requirements.txt)
if [ "$release" != "$pinned" ]; then
  export SALT_VOLUMES_UPGRADE_TO=$PWD/.venv
fi
mkdir -p test-results
log=test-results/test-salt-$line-controlplane.log
"$GO" test -count=1 -v -timeout 30m -run "$plane" ./test/controlplane/ > "$log" 2>&1 &
pid=$!
"$GO" test -count=1 -timeout 20m ./test/salt/ ./test/saltapi/ ./test/saltreq/ ./test/events/ || { kill "$pid" 2>/dev/null; wait "$pid" || true; exit 1; }
if ! wait "$pid"; then
  cat "$log"
  echo "test-salt: Salt $release: the control plane's tests FAILED" >&2
  exit 1
fi
# The figures the tests log (the upgrade's reconnect and token times), and
# the summary.
grep -E '^(--- |ok )|upgrade_test\.go' "$log" || true
echo "test-salt: Salt $release passed in $((SECONDS - start)) s"
