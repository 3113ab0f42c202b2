#!/usr/bin/env python3
"""Record chapters: execute ``book/NN-slug.md`` in a fresh kernel and write
``book/recorded/NN-slug.ipynb`` (committed; the site and nbval use it).

Usage::

    python tools/record.py book/04-bugfix-gym.md [more chapters...]
    python tools/record.py --all                  # every chapter listed in _toc.yml
    python tools/record.py --out /tmp/rec book/04-bugfix-gym.md   # a scratch record elsewhere
    python tools/record.py --prose-only book/04-bugfix-gym.md
        # only the markdown (or a cell's `trained` tag) changed: copy the new prose and
        # tags, keep the recorded outputs (refuses if any code cell differs from the record)

Steps: run the tangler (fail if it fails), convert the chapter with jupytext, execute it with
nbclient in a fresh kernel started exactly as nbval starts it (see tools/bookenv.py: this
Python, cwd ``book/recorded``, fixed threads and hash seed, PYTHONPATH = repo root), then write
the notebook with stable cell ids, no timestamps, and ``metadata.agentrl_record`` = torch
version, thread count and CPU capability seen inside the kernel, Python version.  Re-recording
an unchanged chapter on the same machine gives an identical file.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bookenv  # noqa: E402
import tangle  # noqa: E402

PROBE_MARK = "# agentrl-record-probe"
PROBE = PROBE_MARK + bookenv.PROBE_CODE   # torch, threads, CPU vendor/model/capability, MKL_CBWR
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime")


def recorded_path(root: Path, md: Path) -> Path:
    return root / "book" / "recorded" / (md.stem + ".ipynb")


def source_notebook(md: Path) -> nbformat.NotebookNode:
    """The chapter as an unexecuted notebook, with stable cell ids and no jupytext metadata."""
    nb = jupytext.read(md, fmt="md:myst")
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata.pop("jupytext", None)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


PROSE_CELL_METADATA = ("mystnb",)   # figure captions and names: prose, not code (--prose-only may change them)
CHECK_ONLY_TAGS = ("trained",)      # tags that change how a cell is checked, not what it runs
                                    # (--prose-only may add or remove them: tools/check.py)


def _cell_key(cell, ignore=()) -> tuple:
    meta = {k: v for k, v in cell.get("metadata", {}).items()
            if k not in VOLATILE_CELL_METADATA and k not in ignore}
    if "tags" in ignore and "tags" in cell.get("metadata", {}):
        tags = [t for t in cell.metadata["tags"] if t not in CHECK_ONLY_TAGS]
        if tags:
            meta["tags"] = tags
    return (cell.cell_type, cell.source, json.dumps(meta, sort_keys=True))


def stale_report(md: Path, ipynb: Path, code_only: bool = False) -> str | None:
    """None when the record matches the chapter source, else a message naming the first
    differing cell. With ``code_only`` only code cells are compared."""
    if not ipynb.exists():
        return f"{md.name}: no recorded notebook {ipynb.name} (run tools/record.py {md.name})"
    src = source_notebook(md).cells
    rec = nbformat.read(ipynb, as_version=4).cells
    if code_only:
        src = [c for c in src if c.cell_type == "code"]
        rec = [c for c in rec if c.cell_type == "code"]
    what = "code cell" if code_only else "cell"
    for i in range(max(len(src), len(rec))):
        a = src[i] if i < len(src) else None
        b = rec[i] if i < len(rec) else None
        ignore = PROSE_CELL_METADATA + ("tags",) if code_only else ()
        if a is None or b is None or _cell_key(a, ignore) != _cell_key(b, ignore):
            if a is None or b is None:
                detail = ("the record has extra cells from here" if a is None
                          else "the record ends before this cell")
            elif a.cell_type != b.cell_type:
                detail = f"chapter has a {a.cell_type} cell, record a {b.cell_type} cell"
            elif a.source != b.source:
                la, lb = a.source.split("\n"), b.source.split("\n")
                k = next((k for k in range(max(len(la), len(lb)))
                          if (la[k] if k < len(la) else None) != (lb[k] if k < len(lb) else None)))
                detail = (f"line {k + 1}: chapter {la[k] if k < len(la) else '(none)'!r}, "
                          f"record {lb[k] if k < len(lb) else '(none)'!r}")
            else:
                detail = "cell options (metadata) differ"
            return (f"{md.name}: stale record {ipynb.name}: {what} {i} differs ({detail}); "
                    f"re-run `python tools/record.py book/{md.name}`")
    return None


def _kernel_manager():
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager
    from jupyter_client import KernelManager
    return KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME,
                         kernel_spec_manager=NbvalKernelspecManager())


def execute(root: Path, nb: nbformat.NotebookNode) -> dict:
    """Execute ``nb`` in place (fresh kernel, the check's settings); return the probe's info."""
    from nbclient import NotebookClient
    workdir = root / "book" / "recorded"
    workdir.mkdir(parents=True, exist_ok=True)
    probe = nbformat.v4.new_code_cell(PROBE)
    nb.cells.append(probe)
    try:
        client = NotebookClient(nb, km=_kernel_manager(), timeout=bookenv.CELL_TIMEOUT,
                                startup_timeout=120, record_timing=False, allow_errors=False,
                                resources={"metadata": {"path": str(workdir)}})
        # kernel stderr (ZMQ/TCP notices) is discarded, as nbval does; errors still surface
        client.execute(env=bookenv.kernel_env(root), cwd=str(workdir),
                       stderr=subprocess.DEVNULL)
    finally:
        nb.cells.remove(probe)
    text = "".join(o.get("text", "") for o in probe.outputs if o.get("name") == "stdout")
    return json.loads(text.strip().splitlines()[-1])


def coalesce_streams(outputs: list) -> list:
    """Consecutive stream outputs of one name as one: how the kernel chunked a cell's prints
    (by time) is not part of its output, so a re-record writes the same file."""
    merged: list = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged
                and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == out.get("name")):
            merged[-1]["text"] = "".join(merged[-1]["text"]) + "".join(out["text"])
        else:
            merged.append(out)
    return merged


def finish(nb: nbformat.NotebookNode, info: dict, rel: str) -> nbformat.NotebookNode:
    for cell in nb.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    nb.metadata.pop("jupytext", None)
    nb.metadata["agentrl_record"] = dict(info, chapter=rel)
    nbformat.validate(nb)
    return nb


def record(root: Path, md: Path, out_dir: Path | None = None) -> float:
    t0 = time.perf_counter()
    rel = md.relative_to(root).as_posix()
    nb = source_notebook(md)
    info = execute(root, nb)
    out = recorded_path(root, md) if out_dir is None else out_dir / (md.stem + ".ipynb")
    nbformat.write(finish(nb, info, rel), out)
    return time.perf_counter() - t0


TIMINGS = "timings.json"   # beside the records: seconds each chapter took to record (check.py --jobs)


def save_timing(out: Path, seconds: float) -> None:
    """Remember how long a chapter took to record, for balancing parallel checks."""
    path = out.parent / TIMINGS
    timings = json.loads(path.read_text()) if path.exists() else {}
    timings[out.name] = round(seconds)
    path.write_text(json.dumps(dict(sorted(timings.items())), indent=1) + "\n")


def record_prose(root: Path, md: Path) -> None:
    out = recorded_path(root, md)
    problem = stale_report(md, out, code_only=True)
    if problem:
        raise SystemExit(f"record --prose-only: code changed, re-record fully: {problem}")
    old = nbformat.read(out, as_version=4)
    nb = source_notebook(md)
    old_code = iter(c for c in old.cells if c.cell_type == "code")
    for cell in nb.cells:
        if cell.cell_type == "code":
            prev = next(old_code)
            cell.outputs, cell.execution_count = prev.outputs, prev.execution_count
    nb.metadata = old.metadata
    nbformat.validate(nb)
    nbformat.write(nb, out)


def resolve_chapters(root: Path, names: list[str], all_: bool) -> list[Path]:
    if all_:
        return [root / rel for rel in tangle.toc_chapters(root)]
    out = []
    for name in names:
        p = Path(name)
        cands = [p, root / p, root / "book" / p.name]
        hit = next((c for c in cands if c.exists() and c.suffix == ".md"), None)
        if hit is None or not tangle.CHAPTER_RE.match(hit.name):
            raise SystemExit(f"record: {name} is not a chapter source book/NN-slug.md")
        out.append(hit.resolve())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Execute chapters and write book/recorded/*.ipynb")
    ap.add_argument("chapters", nargs="*", help="chapter sources, e.g. book/04-bugfix-gym.md")
    ap.add_argument("--all", action="store_true", help="every chapter in _toc.yml")
    ap.add_argument("--prose-only", action="store_true",
                    help="keep recorded outputs, update prose and `trained` tags (code cells must "
                         "be unchanged)")
    ap.add_argument("--root", type=Path, default=bookenv.REPO,
                    help="book root (default: this repo)")
    ap.add_argument("--out", type=Path, default=None,
                    help="write the records into this directory instead of book/recorded "
                         "(a scratch record: e.g. to compare runs under other kernels)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if not args.chapters and not args.all:
        ap.error("name chapters to record, or --all")
    chapters = resolve_chapters(root, args.chapters, args.all)
    out_dir = args.out.resolve() if args.out else None
    if out_dir is not None and args.prose_only:
        ap.error("--out records fresh outputs; it cannot be combined with --prose-only")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    if tangle.tangle(root) != 0:
        print("record: the tangler failed; nothing recorded", file=sys.stderr)
        return 2
    total = 0.0
    for md in chapters:
        rel = md.relative_to(root).as_posix()
        if args.prose_only:
            record_prose(root, md)
            print(f"record: {rel}: prose updated, outputs kept")
            continue
        print(f"record: {rel} ...", flush=True)
        try:
            dt = record(root, md, out_dir)
        except Exception as e:  # CellExecutionError, timeouts, kernel death
            print(f"record: {rel} FAILED, record not written:\n{e}", file=sys.stderr)
            return 1
        total += dt
        out = recorded_path(root, md) if out_dir is None else out_dir / (md.stem + ".ipynb")
        if out_dir is None:
            save_timing(out, dt)
        print(f"record: {rel} -> {out} in {dt:.1f} s", flush=True)
    if len(chapters) > 1 and not args.prose_only:
        print(f"record: {len(chapters)} chapters in {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
