#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# torch is pinned to the 2.13.0 CPU build so that no install ever resolves a CUDA build.
#
# The suite runs in three parts, each pytest given the same arguments ("$@"); the markers and
# groups are set in tests/conftest.py:
#   1. the tests that only compute (plans, schedules, files, refusals: not `serial`) on two
#      pytest-xdist workers, at the lowest CPU priority (nice 19) *while* part 2 runs: its tests leave
#      about a quarter of the two cores idle (waiting on timeouts, links and quota-capped lab hosts),
#      which part 1 takes, and a nice-19 process gets ~1.5 % of a core against a normal one (a lab
#      host's cgroup alike), so part 2's timing is kept. Its output is printed when part 2 ends;
#   2. the `serial` tests (gloo and lab tests, and whatever starts workers, times heartbeats or
#      reads CPU quotas) on two pytest-xdist workers, each one test at a time, so that no more than
#      two of them compete for the machine (four were slower in all on the 2-core machine of
#      2026-11-27: their workers' start-ups collided). `--dist loadgroup` hands a worker a whole file
#      (its module fixtures are made once) or the lab group (every lab test: no two labs up at once),
#      and the next when it is done, instead of fixed shares (two fixed streams, the lab tier and
#      tests/docs beside the rest, ended up to 160 s apart as their tests' times moved);
#   3. the `alone` tests, which read CPU quotas or compare speeds under them, with nothing beside them.
# The exit code is pytest's: the first failing part's; 5 (no tests collected) only when no part
# collected any. Arguments with a marker expression of their own (-m) run as one plain pytest,
# which would otherwise replace the parts' -m.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/install-system-deps.sh ]; then bash scripts/install-system-deps.sh; fi
python3 -m pip install -q torch==2.13.0 -e '.[test]'
# Bytecode is written (into this checkout's __pycache__ folders, git-ignored) even where the
# environment says not to: pytest's assertion rewriting of the test modules is then done once,
# not in every pytest process (~8.5 s of each process's collection on the 2-core machine of
# 2026-11-27), and hppctl is not compiled again by each of the hundreds of processes the suite starts.
unset PYTHONDONTWRITEBYTECODE

for arg in "$@"; do
    case "$arg" in -m|-m*) exec python3 -m pytest -q "$@" ;; esac
done

compute_log=$(mktemp)
# Job control for this one start: the part gets its own process group, and SIGINT at its default (a
# background job of a script without it ignores SIGINT, and so would every process its tests start).
set -m
nice -n 19 python3 -m pytest -q -n 2 -m "not serial" "$@" >"$compute_log" 2>&1 &
compute=$!
set +m
trap 'kill -- -"$compute" 2>/dev/null || true; rm -f "$compute_log"' EXIT
trap 'exit 130' INT  # Ctrl-C: part 2 stops, then this script, and the trap above ends part 1

serial=0
python3 -m pytest -q -n 2 --dist loadgroup -m "serial and not alone" "$@" || serial=$?

parallel=0
wait "$compute" || parallel=$?
cat "$compute_log"

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
