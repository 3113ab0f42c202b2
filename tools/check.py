#!/usr/bin/env python3
"""Re-run recorded notebooks with nbval under the book's contract and report per chapter.

    python tools/check.py                         # every book/recorded/*.ipynb
    python tools/check.py book/recorded/04-bugfix-gym.ipynb
    python tools/check.py --root tests/fixtures/... # another book
    python tools/check.py --mode exact            # force a mode (also AGENTRL_CHECK_MODE=exact)
    python tools/check.py --other-kernels --jobs 2  # as on another CPU kind: check the marking

The contract (tools/AUTHORING.md, "Other hardware"): on the CPU kind that recorded a chapter
every cell compares exactly (mode ``exact``). Elsewhere (mode ``contract``) a cell tagged
``trained`` (its outputs depend on a trained model or a sampled training run) must run without
error while its outputs are reported rather than compared; every other cell compares exactly.
With ``--mode auto`` (the default) each record's metadata (``agentrl_record``: CPU vendor,
model and capability, ``MKL_CBWR``, torch version, threads; see tools/bookenv.py) is compared
with this machine's, probed with the kernel's own environment, and the mode follows.

``--other-kernels`` runs the kernels with other summation orders on this machine (as on another
CPU kind) in contract mode, and fails unless every unmarked cell holds: it checks the marking.

Runs ``pytest --nbval --nbval-current-env`` (through tools/nbval_contract.py) with the
sanitizer file tools/nbval_sanitize.cfg and the kernel settings of tools/bookenv.py (the ones
tools/record.py records with). The kernels of one run share the base agents they clone
(tools/base_cache.py). With no recorded notebooks it says so and exits 0.
Extra arguments after ``--`` go to pytest.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import base_cache  # noqa: E402
import bookenv  # noqa: E402

MODES = ("auto", "exact", "contract")
OTHER_KERNELS = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--root", type=Path, default=bookenv.REPO)
    ap.add_argument("--jobs", type=int, default=1,
                    help="run this many nbval processes at once (notebooks balanced by the "
                         "recording times in book/recorded/timings.json)")
    ap.add_argument("--mode", default=os.environ.get("AGENTRL_CHECK_MODE", "auto"),
                    help="exact: compare every cell; contract: report, not compare, the "
                         "outputs of cells tagged 'trained'; auto (default): exact where this "
                         "machine is the record's CPU kind (env AGENTRL_CHECK_MODE)")
    ap.add_argument("--other-kernels", action="store_true",
                    help="run the kernels with " + " ".join(f"{k}={v}" for k, v in
                                                             OTHER_KERNELS.items())
                         + " (other summation orders, as on another CPU kind) in contract "
                           "mode; fail unless every cell not tagged 'trained' holds")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.mode not in MODES:
        ap.error(f"--mode {args.mode!r} (or AGENTRL_CHECK_MODE) is not one of {', '.join(MODES)}")
    if args.other_kernels and args.mode == "exact":
        ap.error("--other-kernels checks the marking in contract mode; --mode exact contradicts it")
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    root = args.root.resolve()
    nbs = args.notebooks or sorted((root / "book" / "recorded").glob("*.ipynb"))
    if not nbs:
        print("check: no recorded notebooks in book/recorded; nbval step skipped")
        return 0
    extra = [a for a in args.pytest_args if a != "--"]
    env_extra = OTHER_KERNELS if args.other_kernels else {}
    mode = "contract" if args.other_kernels else args.mode
    modes = decide_modes(nbs, mode, root, env_extra)
    if args.other_kernels:
        print("check --other-kernels: " + " ".join(f"{k}={v}" for k, v in OTHER_KERNELS.items()))
    with tempfile.TemporaryDirectory() as tmp:
        # the kernels of this run share their base agents (tools/base_cache.py)
        kernels = {**env_extra, **base_cache.kernel_env(Path(tmp))}
        code = run(nbval_command(root, extra, nbs), nbs, args.jobs, root, modes, Path(tmp),
                   kernels)
        cells = [c for f in sorted(Path(tmp).glob("report*.json"))
                 for c in json.loads(f.read_text())]
    bad = print_report(nbs, modes, cells)
    if args.other_kernels:
        if not cells:
            print("check --other-kernels: no cells were run (see pytest's output above)")
            return 2
        print("check --other-kernels: " + ("every unmarked cell holds" if not bad else
              f"{bad} cells fail: unmarked cells that differ, or cells that raise"))
        return 1 if bad else 0
    return code


def machine(root: Path, env_extra: dict) -> dict:
    """This machine as a chapter kernel sees it (bookenv.PROBE_CODE, the kernel's environment)."""
    env = bookenv.kernel_env(root, {**os.environ, **env_extra})
    out = subprocess.run([sys.executable, "-c", bookenv.PROBE_CODE], env=env, cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def decide_modes(nbs, mode: str, root: Path, env_extra: dict) -> dict[str, str]:
    """Notebook file name -> 'exact' or 'contract'; prints which and why, once per record kind."""
    if mode != "auto":
        print(f"check: mode {mode} for every record (forced)")
        return {Path(nb).name: mode for nb in nbs}
    here = machine(root, env_extra)
    modes, seen = {}, {}
    for nb in nbs:
        meta = json.loads(Path(nb).read_text()).get("metadata", {}).get("agentrl_record", {})
        why = bookenv.kind_mismatch(meta, here)
        modes[Path(nb).name] = "contract" if why else "exact"
        seen.setdefault(tuple(why), []).append(Path(nb).name)
    for why, names in seen.items():
        what = "exact (this machine is the recording CPU kind)" if not why else (
            "contract (another CPU kind or kernel setting: " + "; ".join(why) + ")")
        print(f"check: {len(names)} record(s): mode {what}")
    return modes


def nbval_command(root, extra, nbs):
    """The pytest --nbval command line over the given notebooks (run by nbval_contract.py)."""
    return [sys.executable, str(bookenv.REPO / "tools" / "nbval_contract.py"), "--",
            "--nbval", "--nbval-current-env",
            "--nbval-sanitize-with", str(bookenv.REPO / "tools" / "nbval_sanitize.cfg"),
            "--nbval-cell-timeout", str(bookenv.CELL_TIMEOUT),
            "-p", "no:cacheprovider", "--rootdir", str(root), "-q", *extra,
            *[str(p) for p in nbs]]


def with_reports(cmd, modes_path: Path, report: Path):
    """cmd with nbval_contract.py's --modes and --report inserted before its '--'."""
    i = cmd.index("--")
    return cmd[:i] + ["--modes", str(modes_path), "--report", str(report)] + cmd[i:]


def run(cmd, nbs, jobs, root, modes, tmp: Path, env_extra=None):
    """nbval in one process, or in `jobs` balanced processes -> worst exit code."""
    modes_path = tmp / "modes.json"
    modes_path.write_text(json.dumps(modes))
    if jobs <= 1 or len(nbs) == 1:
        cmd = with_reports(cmd, modes_path, tmp / "report0.json")
        print("check: " + " ".join(cmd[1:]), flush=True)
        return subprocess.call(cmd, cwd=root, env=bookenv.kernel_env(
            root, {**os.environ, **(env_extra or {})}))
    return run_parallel(cmd, nbs, jobs, root, modes_path, tmp, env_extra)


def print_report(nbs, modes, cells) -> int:
    """Per chapter: cells held, marked ('trained') cells held exactly, differences -> failures."""
    print(f"\n{'chapter':38s} {'mode':>8s} {'cells':>5s} {'held':>5s} {'marked':>6s} "
          f"{'m.held':>6s} {'m.diff':>6s} {'failed':>6s}")
    total, failing, notes = [0] * 6, 0, []
    for nb in nbs:
        name = Path(nb).name
        mine = [c for c in cells if c["notebook"] == name]
        marked = [c for c in mine if c["marked"]]
        reported = [c for c in marked if c["status"] == "differs" and modes[name] == "contract"]
        failed = [c for c in mine if c["status"] != "held" and c not in reported]
        row = [len(mine), sum(c["status"] == "held" for c in mine), len(marked),
               sum(c["status"] == "held" for c in marked), len(reported), len(failed)]
        total = [a + b for a, b in zip(total, row)]
        failing += len(failed)
        print(f"{name:38s} {modes[name]:>8s} " + " ".join(f"{x:{w}d}" for x, w in
                                                       zip(row, (5, 5, 6, 6, 6, 6))))
        for c in reported:
            notes.append(f"  {name} cell {c['cell']} (trained; outputs reported, not compared): "
                         f"{c['first_line']}" + "".join(f"\n      {line}" for line in
                                                       c["diff"].splitlines()[:4]))
        for c in failed:
            why = ("outputs differ and the cell is not tagged 'trained'" if
                   c["status"] == "differs" and not c["marked"] else
                   "outputs differ (exact mode)" if c["status"] == "differs" else
                   "raised, timed out or failed to run")
            notes.append(f"  {name} cell {c['cell']} FAILED ({why}): {c['first_line']}")
    print(f"{'all':38s} {'':>8s} " + " ".join(f"{x:{w}d}" for x, w in
                                             zip(total, (5, 5, 6, 6, 6, 6))))
    print("(m.held: cells tagged 'trained' that held exactly; m.diff: their outputs differ, "
          "reported as the contract allows)")
    if notes:
        print("\n".join(notes))
    return failing


def balanced_groups(nbs, jobs, timings):
    """Split notebooks into `jobs` groups of similar total recording time (longest first)."""
    groups = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for nb in sorted(nbs, key=lambda p: -timings.get(Path(p).name, 60)):
        i = load.index(min(load))
        groups[i].append(nb)
        load[i] += timings.get(Path(nb).name, 60)
    return [g for g in groups if g]


def run_parallel(cmd, nbs, jobs, root, modes_path, tmp, env_extra=None):
    """One pytest process per group at once; print each one's output in turn -> worst exit code."""
    path = Path(nbs[0]).parent / "timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    base = cmd[:-len(nbs)]
    procs = []
    env = bookenv.kernel_env(root, {**os.environ, **(env_extra or {})})
    for i, group in enumerate(balanced_groups([str(p) for p in nbs], jobs, timings)):
        full = with_reports(base, modes_path, tmp / f"report{i}.json") + group
        print("check: " + " ".join(full[1:]), flush=True)
        procs.append(subprocess.Popen(full, cwd=root, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    codes = []
    for proc in procs:
        out, _ = proc.communicate()
        print(out, flush=True)
        codes.append(proc.returncode)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
