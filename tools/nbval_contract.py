#!/usr/bin/env python3
"""nbval under the book's contract: run by tools/check.py, one process per group of notebooks.

    python tools/nbval_contract.py --modes MODES.json --report REPORT.json -- PYTEST_ARGS...

The contract (chapter 1, tools/AUTHORING.md "Other hardware"): on the CPU kind that recorded a
chapter every cell compares exactly; elsewhere a cell tagged ``trained`` (its outputs depend on
a trained model or on a sampled training run) must still run without error, but its outputs are
reported rather than compared, and every other cell compares exactly.

MODES.json maps a notebook's file name to ``"exact"`` or ``"contract"``. In ``contract`` mode a
``trained`` cell whose outputs differ is turned into a pass and noted as ``differs``; a cell
that raises, times out or is unmarked and differs fails as usual. REPORT.json receives one entry
per executed cell: notebook, cell number, marked, status (``held`` / ``differs`` / ``failed``),
the cell's first line and, for a difference, the first lines of nbval's diff.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest

TRAINED_TAG = "trained"
DIFFER_MESSAGE = "Cell outputs differ"       # nbval's NbCellError text for a comparison failure


def cell_tags(item) -> list[str]:
    """The tags of an nbval cell item ([] for anything else)."""
    cell = getattr(item, "cell", None)
    tags = cell.get("metadata", {}).get("tags", []) if cell is not None else []
    return list(tags) if isinstance(tags, list) else []


ANSI = re.compile(r"\x1b\[[0-9;]*m")
NBVAL_BOILERPLATE = ("mismatch ", "assert reference_output == test_output failed")


def diff_lines(traceback, n: int = 4) -> str:
    """The first n informative lines of nbval's comparison report (no colours, no headers)."""
    lines = [ANSI.sub("", line).rstrip() for line in str(traceback or "").splitlines()]
    keep = [line for line in lines if line.strip() and not line.strip().startswith(
        NBVAL_BOILERPLATE)]
    return "\n".join(line[:100] for line in keep[:n])


class Contract:
    """pytest plugin: applies the per-notebook mode and writes the per-cell report."""

    def __init__(self, modes: dict[str, str], report: Path):
        self.modes, self.report_path, self.cells = modes, report, []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        if rep.when != "call" or getattr(item, "cell", None) is None or rep.skipped:
            return
        notebook = Path(str(item.fspath)).name
        marked = TRAINED_TAG in cell_tags(item)
        exc = call.excinfo.value if call.excinfo is not None else None
        differs = exc is not None and str(exc) == DIFFER_MESSAGE
        status = "held" if rep.passed else ("differs" if differs else "failed")
        diff = diff_lines(getattr(exc, "inner_traceback", "")) if differs else ""
        if status == "differs" and marked and self.modes.get(notebook) == "contract":
            rep.outcome, rep.longrepr = "passed", None       # reported, not compared
        lines = str(item.cell.get("source", "")).strip().splitlines()
        self.cells.append({"notebook": notebook, "cell": item.cell_num, "marked": marked,
                           "status": status, "first_line": lines[0][:70] if lines else "",
                           "diff": diff})

    def pytest_sessionfinish(self, session):
        tmp = self.report_path.with_suffix(".part")
        tmp.write_text(json.dumps(self.cells, indent=1))
        tmp.replace(self.report_path)                    # whole or not at all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", type=Path, required=True)
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    modes = json.loads(args.modes.read_text())
    bad = sorted({m for m in modes.values()} - {"exact", "contract"})
    if bad:
        ap.error(f"unknown mode(s) {bad}; accepted: exact, contract")
    rest = [a for a in args.pytest_args if a != "--"]
    return int(pytest.main(rest, plugins=[Contract(modes, args.report)]))


if __name__ == "__main__":
    sys.exit(main())
