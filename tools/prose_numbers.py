#!/usr/bin/env python3
"""Find decimals in a chapter's prose that are neither glued from the record nor declared.

    python tools/prose_numbers.py                 # every chapter source book/NN-*.md
    python tools/prose_numbers.py book/09-grpo.md

A number the prose quotes from a computed output must be pasted from the recorded notebook:
``{glue:text}`name``` in the markdown, ``glue(name=f"{x:.3f}")`` (``agentrl.prose``) in a code
cell. Numbers that are definitions (a clip of 0.2, a discount of 0.99) stay literal and are
declared in the chapter's front matter::

    agentrl:
      module: ppo
      literals: ["0.2", "0.99"]     # decimals that are definitions, not results

The check reads the markdown only (code cells are code), including math and admonitions, and
skips roles, labels, links and version strings (``2.13.0``). Exit 1 and one line per offending
decimal (file:line: number | context) when any is found.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tangle import split_front_matter  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CHAPTER_RE = re.compile(r"^\d\d-[a-z0-9-]+\.md$")
FENCE_RE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
ROLE_RE = re.compile(r"\{[a-z:]+\}`[^`]*`")                 # {glue:text}`x`, {numref}`...`
SKIP_RE = re.compile(r"https?://\S+|\([a-z0-9-]+\)=|\]\([^)]*\)"   # links, labels, targets
                     r"|agentrl\.exercises check \d+\.\d+")   # an exercise's check command
NUMBER_RE = re.compile(r"(?<![\w.])\d*\.?\d+(?:\.\d+)*")


def prose_lines(text: str):
    """Yield (line number, text) of the markdown lines outside code cells and code fences."""
    _, start = split_front_matter(text)
    lines = text.split("\n")
    open_directives: list[str] = []          # fences of directives whose body is prose
    i = start
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if m:
            fence, info = m.group("fence"), m.group("info").strip()
            if not info and open_directives and fence.startswith(open_directives[-1]):
                open_directives.pop()         # the close of a {note}, {admonition} ...
            elif info.startswith("{") and not info.startswith("{code-cell"):
                open_directives.append(fence)
            else:                             # a code cell or a code listing: skip its body
                close = re.compile("^" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
                i += 1
                while i < len(lines) and not close.match(lines[i]):
                    i += 1
            i += 1
            continue
        if not re.match(r"^\s*:[\w-]+:", lines[i]):         # directive options (:class: ...)
            yield i + 1, lines[i]
        i += 1


def bare_decimals(text: str, literals: set[str]) -> list[tuple[int, str, str]]:
    """[(line, number, line text)] for every decimal in the prose not glued or declared."""
    found = []
    for n, line in prose_lines(text):
        clean = SKIP_RE.sub(" ", ROLE_RE.sub(" ", line))
        for m in NUMBER_RE.finditer(clean):
            tok = m.group(0)
            if "." not in tok or tok.count(".") > 1 or tok in literals:
                continue                      # integers, version strings, declared constants
            found.append((n, tok, line.strip()))
    return found


def chapter_literals(text: str) -> set[str]:
    """The decimals a chapter declares as definitions (front matter agentrl.literals)."""
    meta, _ = split_front_matter(text)
    lit = (meta.get("agentrl") or {}).get("literals", []) if isinstance(
        meta.get("agentrl"), dict) else []
    if not isinstance(lit, list):
        raise ValueError(f"agentrl.literals must be a list of strings, got {lit!r}")
    return {str(x) for x in lit}


def check(paths: list[Path]) -> list[str]:
    """One message per bare decimal in the given chapter sources."""
    out = []
    for p in paths:
        text = p.read_text()
        for n, tok, line in bare_decimals(text, chapter_literals(text)):
            out.append(f"{p.relative_to(REPO) if p.is_relative_to(REPO) else p}:{n}: "
                       f"{tok} | {line[:100]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("chapters", nargs="*", type=Path)
    args = ap.parse_args(argv)
    paths = [p.resolve() for p in args.chapters] or sorted(
        p for p in (REPO / "book").glob("*.md") if CHAPTER_RE.match(p.name))
    msgs = check(paths)
    for m in msgs:
        print(m)
    print(f"prose_numbers: {len(msgs)} bare decimal(s) in {len(paths)} chapter(s)",
          file=sys.stderr)
    return 1 if msgs else 0


if __name__ == "__main__":
    sys.exit(main())
