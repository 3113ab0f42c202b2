#!/usr/bin/env bash
# Set up and build the book: installs the pinned toolchain, checks that the package is in sync
# with the chapters, then builds the site STRICTLY from the recorded notebooks into _build/html
# (no chapter is executed). The API reference page (book/api) is generated during the build by
# tools/agentrl_sphinx.py. Usage: bash tools/build_book.sh [--no-install]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[[ "${1:-}" == "--no-install" ]] || bash tools/setup_env.sh
$PY tools/tangle.py --check
start=$(date +%s)
jupyter-book build . --builder html -W -n --keep-going --all
echo "build_book: site built strictly in $(( $(date +%s) - start )) s: _build/html/index.html"
# The line-length rule (88 characters of code and output, tests/test_line_length.py): a reminder
# here, not a build failure; `python tools/smoke.py _build/html` checks the rendered pages.
$PY tools/line_length.py --counts | tail -1 || true
