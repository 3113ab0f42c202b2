#!/usr/bin/env bash
# Set up and run every test and check of the book (what CI runs, via .ci/run):
#   1. install chromium (apt) and the pinned toolchain + agentrl (pip)
#   2. tangle --check      the committed agentrl/ matches the chapters
#   3. pytest tests        unit/property tests of the library and the tools, stale-record test,
#                          strict site builds (fixture book and this book) + Chromium smoke test
#                          (two worker processes, pytest-xdist; files whose module fixtures
#                          are costly, the built sites and the CLI run, are xdist groups that
#                          one worker runs whole; the slowest 15 tests listed)
#   4. nbval               re-run every recorded chapter under the contract (tools/check.py):
#                          on the CPU kind that recorded a chapter every output compares; on
#                          another kind, cells tagged `trained` run and their outputs are
#                          reported, every other cell compares (AGENTRL_CHECK_MODE forces a mode)
# Usage: bash tools/test_all.sh [--no-install]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${1:-}" != "--no-install" ]]; then
  bash tools/setup_env.sh --browser || { echo "test_all: setup failed"; exit 1; }
fi
fail=0
step() {  # step NAME CMD...: run, time, remember failure
  local name=$1; shift
  echo; echo "=== $name: $*"
  local t0=$(date +%s)
  "$@"; local rc=$?
  echo "=== $name: exit $rc in $(( $(date +%s) - t0 )) s"
  [[ $rc -eq 0 ]] || fail=1
}
step tangle-check $PY tools/tangle.py --check
step pytest $PY -m pytest tests -p no:cacheprovider -n 2 --dist loadgroup --durations=15
step nbval $PY tools/check.py --jobs 2
echo
if [[ $fail -ne 0 ]]; then echo "test_all: FAILED"; exit 1; fi
echo "test_all: all checks passed"
