#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# torch is pinned to the 2.13.0 CPU build so that no install ever resolves a CUDA build.
#
# The suite runs in three parts, each pytest given the same arguments ("$@"); the markers and
# groups are set in tests/conftest.py:
#   1. the tests that only compute (plans, schedules, files, refusals: not `serial`) on two
#      pytest-xdist workers;
#   2. the `serial` tests (gloo and lab tests, and whatever starts workers, times heartbeats or
#      reads CPU quotas) on SERIAL_STREAMS pytest-xdist workers, each one test at a time: a worker
#      takes a whole file (its module fixtures are made once), and every lab test runs on the one
#      worker that takes the lab group, so no two labs are up at once. These tests mostly wait
#      (on workers starting, heartbeats, quota'd lab hosts): two streams of them kept the 2-core
#      machine of 2026-11-27 less than half busy;
#   3. the `alone` tests, which read CPU quotas or compare speeds under them, with nothing beside them.
# The exit code is pytest's: the first failing part's; 5 (no tests collected) only when no part
# collected any. Arguments with a marker expression of their own (-m) run as one plain pytest,
# which would otherwise replace the parts' -m.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/install-system-deps.sh ]; then bash scripts/install-system-deps.sh; fi
python3 -m pip install -q torch==2.13.0 -e '.[test]'

for arg in "$@"; do
    case "$arg" in -m|-m*) exec python3 -m pytest -q "$@" ;; esac
done

SERIAL_STREAMS=4

parallel=0
python3 -m pytest -q -n 2 -m "not serial" "$@" || parallel=$?

serial=0
python3 -m pytest -q -n "$SERIAL_STREAMS" --dist loadgroup -m "serial and not alone" "$@" || serial=$?

alone=0
python3 -m pytest -q -m alone "$@" || alone=$?

# Each part's code: 0 passed, 5 collected nothing, anything else failed (the first failure wins).
codes=("$parallel" "$serial" "$alone")
for code in "${codes[@]}"; do
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
done
for code in "${codes[@]}"; do
    if [ "$code" -eq 0 ]; then exit 0; fi
done
exit 5
