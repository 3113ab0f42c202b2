"""Command line entry point: read finished runs, or the logs of real trainers, and print
what chapter 19's diagnose finds.

    python -m agentrl.diagnose runs/default-seed0
    python -m agentrl.diagnose runs/sweep/*-seed*
    python -m agentrl.diagnose out/trainer_state.json           # TRL
    python -m agentrl.diagnose metrics.jsonl --trainer verl     # verl's file logger
    python -m agentrl.diagnose history.csv --trainer openrlhf   # a wandb export

A RUN_DIR is a folder written by ``python -m agentrl.train`` (its history.json and
config.json). A LOG is a TRL trainer_state.json (or its folder), JSON lines, a CSV with
a column per metric, or verl's or OpenRLHF's console output; ``--trainer`` (trl, verl,
openrlhf) names the trainer when its metric names do not tell. On a log only the checks
whose statistics the trainer logs run; the others are listed with what they lack.
Exit status: 0 when nothing has a finding, 1 when something has, 2 when a path is not a
run or a readable log, or no check can run on it. The checks and their thresholds are
``agentrl.debugging`` (book chapter 19); the trainers' metric names are mapped in
``agentrl.trainer_logs``.
"""
import sys

from agentrl.trainer_logs import diagnose_main

if __name__ == '__main__':
    sys.exit(diagnose_main())
