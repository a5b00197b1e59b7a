#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# torch is pinned to the 2.13.0 CPU build so that no install ever resolves a CUDA build.
#
# The suite runs in two parts, each given the same arguments ("$@"):
#   1. the tests that only compute (plans, schedules, files, refusals: not `serial`, tests/conftest.py)
#      on two pytest-xdist workers;
#   2. the `serial` tests, one at a time: gloo and lab tests, and whatever starts workers, times
#      heartbeats or reads CPU quotas, which a second busy worker beside them would slow or starve.
# The exit code is pytest's: the first part's failure if it failed, else the second's; 5 (no tests
# collected) only when neither part collected any. Arguments with a marker expression of their own
# (-m) run as one plain pytest, which would otherwise replace the parts' own -m.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/install-system-deps.sh ]; then bash scripts/install-system-deps.sh; fi
python3 -m pip install -q torch==2.13.0 -e '.[test]'

for arg in "$@"; do
    case "$arg" in -m|-m*) exec python3 -m pytest -q "$@" ;; esac
done
parallel=0
python3 -m pytest -q -n 2 -m "not serial" "$@" || parallel=$?
serial=0
python3 -m pytest -q -m serial "$@" || serial=$?
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
[ "$parallel" -eq 5 ] && parallel=0
[ "$serial" -eq 5 ] && serial=0
if [ "$parallel" -ne 0 ]; then exit "$parallel"; fi
exit "$serial"
