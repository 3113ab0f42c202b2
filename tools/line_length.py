#!/usr/bin/env python3
"""The line-length rule: chapter code lines and printed output lines are at most 88 characters.

    python tools/line_length.py            # every offending line, then a count per chapter
    python tools/line_length.py --counts   # only the count per chapter

Why 88: the site's article column holds 90 characters of code at a 1280-px window
(``_static/agentrl.css``; ``tools/smoke.py`` measures it), so a chapter that keeps to 88 is
never cut off behind a scrollbar. Checked are the chapter sources ``book/*.md`` (every line of
every ``{code-cell}`` and of every plain fenced code block, i.e. everything the site shows in a
code box) and the recorded notebooks ``book/recorded/*.ipynb`` (every line of every output the
site shows as text: streams, ``text/plain`` results and tracebacks, ANSI colours removed).
Each offending line is named by chapter, cell, line and length. A wide character (CJK, emoji)
counts as two, a tab as up to 8.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tangle import fenced_blocks, split_front_matter  # noqa: E402

LIMIT = 88
ROOT = Path(__file__).resolve().parent.parent
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class LongLine:
    chapter: str        # "book/04-bugfix-gym.md" or "book/recorded/04-bugfix-gym.ipynb"
    where: str          # "code cell 12", "block at line 250", "output of code cell 7"
    line: int           # line in the file (sources) or in the output (records), 1-based
    length: int
    text: str

    def __str__(self) -> str:
        pos = "line" if self.chapter.endswith(".md") else "output line"
        return (f"{self.chapter}: {self.where}, {pos} {self.line}: {self.length} chars "
                f"(> {LIMIT}): {self.text[:60]!r}")


def width(line: str) -> int:
    """Display width in monospace columns: tabs to 8, East Asian wide/full characters as 2."""
    line = line.expandtabs(8)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def _is_code_fence(info: str) -> bool:
    """A fenced block shown as code: a {code-cell}, or a plain block (```python, ```bash, ```)."""
    if info.startswith("{"):
        return info.split("}")[0] + "}" in ("{code-cell}", "{code-block}", "{code}")
    return True


def source_lines(path: Path, root: Path = ROOT, limit: int = LIMIT) -> list[LongLine]:
    """Lines longer than ``limit`` in the code cells and code blocks of one chapter source."""
    rel = path.relative_to(root).as_posix()
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    out: list[LongLine] = []
    cell = 0
    _, start = split_front_matter(text)
    for i, j, fence, info in fenced_blocks(lines, start):
        is_cell = info.startswith("{code-cell}")
        if is_cell:
            cell += 1
        if _is_code_fence(info):
            body = list(range(i + 1, min(j, len(lines))))
            if body and lines[body[0]].strip() == "---":          # a cell's YAML options
                end = next((k for k in body[1:] if lines[k].strip() == "---"), body[0])
                body = [k for k in body if k > end]
            where = f"code cell {cell}" if is_cell else f"code block at line {i + 1}"
            for k in body:
                n = width(lines[k])
                if n > limit:
                    out.append(LongLine(rel, where, k + 1, n, lines[k]))
    return out


def _output_text(output: dict) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        text = output.get("text", "")
    elif kind in ("execute_result", "display_data"):
        data = output.get("data", {})
        if any(k.startswith("image/") or k == "text/html" for k in data):
            return ""                                # rendered as an image / HTML, not text
        text = data.get("text/plain", "")
    elif kind == "error":
        text = "\n".join(output.get("traceback", []))
    else:
        return ""
    text = "".join(text) if isinstance(text, list) else text
    return ANSI_RE.sub("", text)


def record_lines(path: Path, root: Path = ROOT, limit: int = LIMIT) -> list[LongLine]:
    """Lines longer than ``limit`` in the text outputs of one recorded notebook."""
    rel = path.relative_to(root).as_posix()
    nb = json.loads(path.read_text(encoding="utf-8"))
    out: list[LongLine] = []
    cell = 0
    for c in nb.get("cells", []):
        if c.get("cell_type") != "code":
            continue
        cell += 1
        for o, output in enumerate(c.get("outputs", []), 1):
            for k, line in enumerate(_output_text(output).split("\n"), 1):
                n = width(line)
                if n > limit:
                    out.append(LongLine(rel, f"output {o} of code cell {cell}", k, n, line))
    return out


def long_lines(root: Path = ROOT, limit: int = LIMIT) -> list[LongLine]:
    """Every line over the limit in the chapter sources and recorded notebooks of a book."""
    root = Path(root)
    out: list[LongLine] = []
    for path in sorted((root / "book").glob("*.md")):
        out += source_lines(path, root, limit)
    for path in sorted((root / "book" / "recorded").glob("*.ipynb")):
        out += record_lines(path, root, limit)
    return out


def counts(found: list[LongLine]) -> dict[str, int]:
    """Offending lines per chapter (source and record together), by chapter slug."""
    per: dict[str, int] = {}
    for f in found:
        slug = Path(f.chapter).stem
        per[slug] = per.get(slug, 0) + 1
    return dict(sorted(per.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--counts", action="store_true", help="only the count per chapter")
    args = ap.parse_args(argv)
    found = long_lines(args.root)
    if not args.counts:
        for f in found:
            print(f)
    src = counts([f for f in found if f.chapter.endswith(".md")])
    rec = counts([f for f in found if f.chapter.endswith(".ipynb")])
    for slug in sorted(set(src) | set(rec)):
        print(f"line_length: {slug}: {src.get(slug, 0)} code lines, {rec.get(slug, 0)} output "
              f"lines over {LIMIT} characters")
    print(f"line_length: {len(found)} lines over {LIMIT} characters")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
