#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root), then runs it.
# torch is pinned to the 2.13.0 CPU build so that no install ever resolves a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/install-system-deps.sh ]; then bash scripts/install-system-deps.sh; fi
python3 -m pip install -q torch==2.13.0 -e '.[test]'
python3 -m pytest -q "$@"
