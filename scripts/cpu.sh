#!/usr/bin/env bash
# scripts/cpu.sh LABEL COMMAND...: runs COMMAND, then prints the CPU time
# it and the children it waited for used (user and system, from bash's
# times) and its wall time, as "cpu LABEL: ...". make test runs each lane's
# parts through it, so that its log says where the two cores went (the
# 30-minute budget is CPU: three lanes share them).
set -u
label=$1
shift
t0=$(date +%s)
"$@"
rc=$?
secs() { awk -F'[ms]' '{printf "%.0f", $1 * 60 + $2}' <<<"$1"; }
# times in this shell itself: a subshell (a pipe, $(...)) has no children.
tmp=$(mktemp)
times >"$tmp"
read -r _ _ user sys < <(tr '\n' ' ' <"$tmp")
rm -f "$tmp"
echo "cpu $label: $(secs "$user") s user, $(secs "$sys") s system, $(($(date +%s) - t0)) s wall"
exit $rc
