#!/usr/bin/env bash
# Install the pinned toolchain and the agentrl package (editable) into the current Python.
# Usage: bash tools/setup_env.sh [--browser]   (--browser also installs Debian's chromium)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ "${1:-}" == "--browser" ]] && [[ ! -x /usr/bin/chromium ]]; then
  echo "setup: installing chromium (apt)"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q chromium
fi
echo "setup: pip install torch==2.13.0 (CPU build first), then the pinned toolchain"
$PY -m pip install -q torch==2.13.0
$PY -m pip install -q -r tools/requirements-pinned.txt -e ".[book,test,scale,trainers,hf]"
# the trainers whose own config code checks chapter 14's translations: their YAML and parser
# only, so without their GPU dependencies (pip lists those as unmet; nothing imports them)
$PY -m pip install -q --no-deps verl==0.8.0 openrlhf==0.11.2
