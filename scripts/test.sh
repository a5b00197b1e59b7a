#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# torch is pinned to the 2.13.0 CPU build so that no install ever resolves a CUDA build.
#
# The suite runs in three parts, each pytest given the same arguments ("$@"); the markers are set
# in tests/conftest.py:
#   1. the tests that only compute (plans, schedules, files, refusals: not `serial`) on two
#      pytest-xdist workers;
#   2. the `serial` tests (gloo and lab tests, and whatever starts workers, times heartbeats or
#      reads CPU quotas) in two streams side by side, each one test at a time, so that no two of
#      them compete for the machine: the side stream (`side`: the lab tier, whose hosts run under
#      CPU quotas of 0.2-1 core and so left most of the machine idle for ~6 minutes, tests/docs,
#      the README's lines as written, which evens the two streams out) and the rest. The side
#      stream's output is kept in a file and printed after the rest's, so the two do not interleave;
#   3. the `alone` tests, which read CPU quotas or compare speeds under them, with nothing beside them.
# The exit code is pytest's: the first failing part's (in the order above; the rest before the side
# stream); 5 (no tests collected) only when no part collected any. Arguments with a marker
# expression of their own (-m) run as one plain pytest, which would otherwise replace the parts' -m.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/install-system-deps.sh ]; then bash scripts/install-system-deps.sh; fi
python3 -m pip install -q torch==2.13.0 -e '.[test]'

for arg in "$@"; do
    case "$arg" in -m|-m*) exec python3 -m pytest -q "$@" ;; esac
done

parallel=0
python3 -m pytest -q -n 2 -m "not serial" "$@" || parallel=$?

side_log=$(mktemp)
trap 'rm -f "$side_log"' EXIT
# `trap - INT`: a script's background job ignores Ctrl-C unless told otherwise, and the side stream
# needs it to take its labs down.
(trap - INT; exec python3 -m pytest -q -m "serial and side and not alone" "$@" >"$side_log" 2>&1) &
side_pid=$!
rest=0
python3 -m pytest -q -m "serial and not side and not alone" "$@" || rest=$?
side=0
wait "$side_pid" || side=$?
echo "--- side stream (the lab tier and tests/docs, run beside the tests above) ---"
cat "$side_log"

alone=0
python3 -m pytest -q -m alone "$@" || alone=$?

# Each part's code: 0 passed, 5 collected nothing, anything else failed (the first failure wins).
codes=("$parallel" "$rest" "$side" "$alone")
for code in "${codes[@]}"; do
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
done
for code in "${codes[@]}"; do
    if [ "$code" -eq 0 ]; then exit 0; fi
done
exit 5
