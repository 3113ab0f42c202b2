#!/usr/bin/env python3
"""Re-run recorded notebooks with nbval and compare every output.

    python tools/check.py                         # every book/recorded/*.ipynb
    python tools/check.py book/recorded/04-bugfix-gym.ipynb
    python tools/check.py --root tests/fixtures/... # another book

Runs ``pytest --nbval --nbval-current-env`` with the sanitizer file tools/nbval_sanitize.cfg
and the kernel settings of tools/bookenv.py (the ones tools/record.py records with). With no
recorded notebooks it says so and exits 0 (the unit tests still run elsewhere).
Extra arguments after ``--`` go to pytest.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bookenv  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, default=bookenv.REPO)
    ap.add_argument("--jobs", type=int, default=1,
                    help="run this many nbval processes at once (notebooks balanced by the "
                         "recording times in book/recorded/timings.json)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    root = args.root.resolve()
    nbs = args.notebooks or sorted((root / "book" / "recorded").glob("*.ipynb"))
    if not nbs:
        print("check: no recorded notebooks in book/recorded; nbval step skipped")
        return 0
    extra = [a for a in args.pytest_args if a != "--"]
    cmd = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(bookenv.REPO / "tools" / "nbval_sanitize.cfg"),
           "--nbval-cell-timeout", str(bookenv.CELL_TIMEOUT),
           "-p", "no:cacheprovider", "--rootdir", str(root), "-q", *extra,
           *[str(p) for p in nbs]]
    if args.jobs <= 1 or len(nbs) == 1:
        print("check: " + " ".join(cmd[1:]), flush=True)
        return subprocess.call(cmd, cwd=root, env=bookenv.kernel_env(root))
    return run_parallel(cmd, nbs, args.jobs, root)


def balanced_groups(nbs, jobs, timings):
    """Split notebooks into `jobs` groups of similar total recording time (longest first)."""
    groups = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for nb in sorted(nbs, key=lambda p: -timings.get(Path(p).name, 60)):
        i = load.index(min(load))
        groups[i].append(nb)
        load[i] += timings.get(Path(nb).name, 60)
    return [g for g in groups if g]


def run_parallel(cmd, nbs, jobs, root):
    """One pytest process per group at once; print each one's output in turn -> worst exit code."""
    path = Path(nbs[0]).parent / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    base = cmd[:-len(nbs)]
    procs = []
    for group in balanced_groups([str(p) for p in nbs], jobs, timings):
        print("check: " + " ".join(base[1:] + group), flush=True)
        procs.append(subprocess.Popen(base + group, cwd=root, env=bookenv.kernel_env(root),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    codes = []
    for proc in procs:
        out, _ = proc.communicate()
        print(out, flush=True)
        codes.append(proc.returncode)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
