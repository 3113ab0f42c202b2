#!/usr/bin/env python3
"""Re-run recorded notebooks with nbval and compare every output.

    python tools/check.py                         # every book/recorded/*.ipynb
    python tools/check.py book/recorded/04-bugfix-gym.ipynb
    python tools/check.py --root tests/fixtures/... # another book
    python tools/check.py --other-kernels --jobs 2  # as on another CPU: per chapter, cells that hold

Runs ``pytest --nbval --nbval-current-env`` with the sanitizer file tools/nbval_sanitize.cfg
and the kernel settings of tools/bookenv.py (the ones tools/record.py records with). With no
recorded notebooks it says so and exits 0 (the unit tests still run elsewhere).
Extra arguments after ``--`` go to pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
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
    ap.add_argument("--other-kernels", action="store_true",
                    help="run the kernels with " + " ".join(f"{k}={v}" for k, v in
                                                             OTHER_KERNELS.items())
                         + " (other summation orders, as on another CPU kind) and print, per "
                           "chapter, how many cells hold; exit 0 (a report, not a check)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    root = args.root.resolve()
    nbs = args.notebooks or sorted((root / "book" / "recorded").glob("*.ipynb"))
    if not nbs:
        print("check: no recorded notebooks in book/recorded; nbval step skipped")
        return 0
    extra = [a for a in args.pytest_args if a != "--"]
    if args.other_kernels:
        return other_kernels_report(nbs, args.jobs, root, extra)
    cmd = nbval_command(root, extra, nbs)
    return run(cmd, nbs, args.jobs, root)


def nbval_command(root, extra, nbs):
    """The pytest --nbval command line over the given notebooks."""
    return [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
            "--nbval-sanitize-with", str(bookenv.REPO / "tools" / "nbval_sanitize.cfg"),
            "--nbval-cell-timeout", str(bookenv.CELL_TIMEOUT),
            "-p", "no:cacheprovider", "--rootdir", str(root), "-q", *extra,
            *[str(p) for p in nbs]]


def run(cmd, nbs, jobs, root, env_extra=None, junit_dir=None):
    """nbval in one process, or in `jobs` balanced processes -> worst exit code."""
    if jobs <= 1 or len(nbs) == 1:
        if junit_dir is not None:
            cmd = cmd[:-len(nbs)] + [f"--junitxml={junit_dir / 'group0.xml'}"] + cmd[-len(nbs):]
        print("check: " + " ".join(cmd[1:]), flush=True)
        return subprocess.call(cmd, cwd=root, env=bookenv.kernel_env(
            root, {**os.environ, **(env_extra or {})}))
    return run_parallel(cmd, nbs, jobs, root, env_extra, junit_dir)


OTHER_KERNELS = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}


def other_kernels_report(nbs, jobs, root, extra) -> int:
    """Re-check the records under other kernels; print cells that hold per chapter."""
    with tempfile.TemporaryDirectory() as tmp:
        junit_dir = Path(tmp)
        run(nbval_command(root, extra, nbs), nbs, jobs, root, OTHER_KERNELS, junit_dir)
        counts = junit_counts(sorted(junit_dir.glob("*.xml")))
    print(f"\ncheck --other-kernels ({' '.join(f'{k}={v}' for k, v in OTHER_KERNELS.items())}):")
    print(f"{'chapter':40s} {'cells':>5s} {'hold':>5s} {'differ':>6s}")
    total = [0, 0, 0]
    for nb in nbs:
        name = Path(nb).name
        c = counts.get(name, [0, 0, 0])
        print(f"{name:40s} {c[0]:5d} {c[1]:5d} {c[2]:6d}")
        total = [a + b for a, b in zip(total, c)]
    print(f"{'all':40s} {total[0]:5d} {total[1]:5d} {total[2]:6d}")
    if total[0] == 0:
        print("check --other-kernels: no cells were run (see pytest's output above)")
        return 2
    return 0


def junit_counts(paths) -> dict[str, list[int]]:
    """notebook file name -> [cells, passed, failed] from pytest junit XML reports."""
    counts: dict[str, list[int]] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            m = re.search(r"([A-Za-z0-9_-]+\.ipynb)", case.get("classname", "") + " " +
                          case.get("file", "") + " " + case.get("name", ""))
            if not m or case.find("skipped") is not None:
                continue
            c = counts.setdefault(m.group(1), [0, 0, 0])
            failed = case.find("failure") is not None or case.find("error") is not None
            c[0] += 1
            c[2 if failed else 1] += 1
    return counts


def balanced_groups(nbs, jobs, timings):
    """Split notebooks into `jobs` groups of similar total recording time (longest first)."""
    groups = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for nb in sorted(nbs, key=lambda p: -timings.get(Path(p).name, 60)):
        i = load.index(min(load))
        groups[i].append(nb)
        load[i] += timings.get(Path(nb).name, 60)
    return [g for g in groups if g]


def run_parallel(cmd, nbs, jobs, root, env_extra=None, junit_dir=None):
    """One pytest process per group at once; print each one's output in turn -> worst exit code."""
    path = Path(nbs[0]).parent / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    base = cmd[:-len(nbs)]
    procs = []
    env = bookenv.kernel_env(root, {**os.environ, **(env_extra or {})})
    for i, group in enumerate(balanced_groups([str(p) for p in nbs], jobs, timings)):
        junit = [] if junit_dir is None else [f"--junitxml={junit_dir / f'group{i}.xml'}"]
        print("check: " + " ".join(base[1:] + junit + group), flush=True)
        procs.append(subprocess.Popen(base + junit + group, cwd=root, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    codes = []
    for proc in procs:
        out, _ = proc.communicate()
        print(out, flush=True)
        codes.append(proc.returncode)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
