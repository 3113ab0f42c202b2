"""Command line entry point: read finished runs and print what chapter 19's diagnose finds.

    python -m agentrl.diagnose runs/default-seed0
    python -m agentrl.diagnose runs/sweep/*-seed*

Each RUN_DIR is a folder written by ``python -m agentrl.train`` (its history.json and
config.json). Exit status: 0 when no run has a finding, 1 when one has, 2 when a folder is
not a run. The checks and their thresholds are ``agentrl.debugging`` (book chapter 19).
"""
import sys

from agentrl.debugging import diagnose_main

if __name__ == '__main__':
    sys.exit(diagnose_main())
