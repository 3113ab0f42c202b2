#!/usr/bin/env python3
"""Tangle the book's ``#@save`` cells into the ``agentrl`` package.

Usage::

    python tools/tangle.py            # write agentrl/<module>.py and agentrl/__init__.py
    python tools/tangle.py --check    # exit 1, naming drifted/missing/extra files, if out of sync
    python tools/tangle.py --root DIR # run on another book (e.g. the test fixture)

Book order.  The chapters are the ``book/NN-slug.md`` sources.  ``_toc.yml`` gives the book
order of the published chapters (an entry ``book/recorded/NN-slug`` maps to the source
``book/NN-slug.md``).  Chapter sources that exist in ``book/`` but are not (yet) listed in the
toc are drafts: they are tangled too, placed by their number ``NN`` (a chapter must be tangled
before it can be recorded, and it is recorded before it is added to the toc).  The toc must
list chapters in increasing ``NN`` order.

A cell is saved when its first code line is a marker:

* ``#@save``: the cell goes to the chapter's module, named in its front matter
  (``agentrl: {module: gym}``); its public names are exported as ``arl.X``.
* ``#@save <module>``: the cell goes to ``agentrl/<module>.py`` instead, a second module of the
  same chapter (chapter 14 keeps its trainer translations in ``translations``); ``<module>`` is
  a lowercase identifier that no other chapter uses.
* ``#@demo``: the cell goes to the chapter's module, but its names stay out of ``__all__``:
  demonstration code the chapter, its tests and benchmarks call as
  ``agentrl.<module>.X``, not part of ``arl``.

Every generated module starts with a header naming its chapter; ``agentrl/__init__.py`` (also
generated) star-imports the modules in book order (within a chapter: its front-matter module,
then the others in the order their first cell appears), so saved code may use ``arl.X`` at
import time for names of modules imported before its own.  Files in ``agentrl/`` without the
generated header are hand-written and never touched.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

GENERATED_MARK = "# Generated from "
HEADER = (GENERATED_MARK + "{src} by tools/tangle.py. "
          "Do not edit: edit the chapter and re-run the tangler.\n")
CHAPTER_RE = re.compile(r"^(\d\d)-[a-z0-9][a-z0-9-]*\.md$")
FENCE_RE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
CODE_CELL_RE = re.compile(r"^\{code-cell\}")
MODULE_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
MARKER_RE = re.compile(r"^#@(?P<kind>save|demo)(?:\s+(?P<module>.*?))?\s*$")
PACKAGE = "agentrl"


class TangleError(Exception):
    """A problem in the chapters that stops the tangler; the message names chapter and cell."""


@dataclass
class Cell:
    index: int          # 1-based index among the chapter's code cells
    line: int           # 1-based line of the first code line in the chapter file
    code: str           # code without the option block (and without the marker line)
    saved: bool
    marker: str = ""    # the marker line as written: "#@save", "#@save translations", "#@demo"
    target: str | None = None   # module named by "#@save <module>"; None: the chapter's
    exported: bool = True       # False for "#@demo" cells


@dataclass
class Chapter:
    path: Path          # absolute path of book/NN-slug.md
    rel: str            # "book/NN-slug.md"
    number: int
    in_toc: bool
    module: str | None = None
    cells: list[Cell] = field(default_factory=list)
    exports: dict[str, list[str]] = field(default_factory=dict)   # module -> __all__

    @property
    def saved(self) -> list[Cell]:
        return [c for c in self.cells if c.saved]

    def module_of(self, cell: Cell) -> str | None:
        """The module a saved cell goes to."""
        return cell.target or self.module

    @property
    def modules(self) -> list[str]:
        """The modules this chapter generates: its own, then the others by first cell."""
        names = [self.module] if self.module else []
        for cell in self.saved:
            if self.module_of(cell) not in names:
                names.append(self.module_of(cell))
        return names


# ----------------------------------------------------------------------------- reading

def toc_chapters(root: Path) -> list[str]:
    """The chapter sources listed in ``_toc.yml``, in order, as ``book/NN-slug.md`` paths."""
    toc_path = root / "_toc.yml"
    if not toc_path.exists():
        return []
    toc = yaml.safe_load(toc_path.read_text()) or {}
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key, []) or []:
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(toc)
    out = []
    for f in files:
        f = re.sub(r"\.(ipynb|md)$", "", f)
        m = re.match(r"^book/recorded/(\d\d-[a-z0-9-]+)$", f)
        if m:
            out.append(f"book/{m.group(1)}.md")
    return out


def toc_part(root: Path, caption: str) -> list[str]:
    """The chapter sources of the ``_toc.yml`` part with this caption ("Chapters",
    "Appendix"), in order, as ``book/NN-slug.md`` paths; [] when there is no such part."""
    toc_path = root / "_toc.yml"
    if not toc_path.exists():
        return []
    toc = yaml.safe_load(toc_path.read_text()) or {}
    wanted = set()
    for part in toc.get("parts", []) or []:
        if part.get("caption") == caption:
            for entry in part.get("chapters", []) or []:
                f = re.sub(r"\.(ipynb|md)$", "", str(entry.get("file", "")))
                m = re.match(r"^book/recorded/(\d\d-[a-z0-9-]+)$", f)
                if m:
                    wanted.add(f"book/{m.group(1)}.md")
    return [rel for rel in toc_chapters(root) if rel in wanted]


def split_front_matter(text: str) -> tuple[dict, int]:
    """Return (front matter dict, number of lines it takes)."""
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return {}, 0
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            meta = yaml.safe_load("\n".join(lines[1:i])) or {}
            return meta, i + 1
    return {}, 0


def fenced_blocks(lines: list[str], start: int = 0):
    """Yield (i, j, fence, info) per top-level fenced block: lines[i] opens it, lines[j] closes it
    (j == len(lines) when it is never closed); info is the text after the fence, stripped."""
    i = start
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        close = re.compile("^" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        yield i, j, fence, info
        i = j + 1


def parse_cells(text: str, rel: str) -> tuple[dict, list[Cell]]:
    """Parse a MyST notebook: front matter and ``{code-cell}`` cells with their line numbers."""
    meta, start = split_front_matter(text)
    lines = text.split("\n")
    cells: list[Cell] = []
    for i, j, fence, info in fenced_blocks(lines, start):
        if j >= len(lines):
            raise TangleError(f"{rel}:{i + 1}: fence {fence!r} is never closed")
        if CODE_CELL_RE.match(info):
            body = lines[i + 1:j]
            k = 0
            if body and body[0].strip() == "---":          # YAML option block
                k = 1
                while k < len(body) and body[k].strip() != "---":
                    k += 1
                k += 1
            else:
                while k < len(body) and re.match(r"^:[\w-]+:", body[k]):  # :key: value options
                    k += 1
            code_lines = body[k:]
            first = next((n for n, ln in enumerate(code_lines) if ln.strip()), None)
            marker = MARKER_RE.match(code_lines[first].strip()) if first is not None else None
            cell = Cell(index=len(cells) + 1, line=i + 2 + k, code="", saved=bool(marker))
            if marker:                          # the marker's line, then the code's
                cell.line += first
                cell.marker = code_lines[first].strip()
                cell.target = _marker_target(marker, rel, cell)
                cell.exported = marker.group("kind") == "save"
                code_lines = code_lines[first + 1:]
                cell.line += 1
            cell.code = "\n".join(code_lines).strip("\n")
            cells.append(cell)
    return meta, cells


def _marker_target(marker: re.Match, rel: str, cell: Cell) -> str | None:
    """The module a "#@save <module>" marker names (None: the chapter's); a bad name, or a
    module on "#@demo", is a TangleError naming the chapter and the cell."""
    module = marker.group("module")
    if module is None:
        return None
    where = f"{rel}: code cell {cell.index} (line {cell.line})"
    if marker.group("kind") == "demo":
        raise TangleError(f"{where}: '#@demo {module}' names a module, but #@demo cells go to "
                          f"the chapter's own module; write '#@demo' alone")
    if not MODULE_RE.match(module) or module == "__init__":
        raise TangleError(f"{where}: '#@save {module}' names module {module!r}, which is not a "
                          f"valid module name: expected lowercase letters, digits and "
                          f"underscores, not starting with a digit (e.g. '#@save translations')")
    return module


def discover(root: Path) -> list[Chapter]:
    """All chapters in book order: toc chapters in toc order, drafts placed by number."""
    listed = toc_chapters(root)
    for rel in listed:
        if not (root / rel).exists():
            raise TangleError(f"_toc.yml lists {rel[:-3].replace('book/', 'book/recorded/')}, "
                              f"but its source {rel} does not exist")
    numbers = [int(Path(r).name[:2]) for r in listed]
    if numbers != sorted(numbers) or len(set(numbers)) != len(numbers):
        raise TangleError(f"_toc.yml lists chapters out of number order: {listed}")
    found = sorted(p for p in (root / "book").glob("*.md") if CHAPTER_RE.match(p.name))
    by_number: dict[int, Path] = {}
    for p in found:
        n = int(p.name[:2])
        if n in by_number:
            raise TangleError(f"two chapter sources share number {n:02d}: "
                              f"book/{by_number[n].name} and book/{p.name}")
        by_number[n] = p
    chapters = []
    for n in sorted(by_number):
        p = by_number[n]
        rel = f"book/{p.name}"
        ch = Chapter(path=p, rel=rel, number=n, in_toc=rel in listed)
        meta, ch.cells = parse_cells(p.read_text(encoding="utf-8"), rel)
        module = ((meta.get("agentrl") or {}).get("module")
                  if isinstance(meta.get("agentrl"), dict) else None)
        if module is not None:
            module = str(module)
            if not MODULE_RE.match(module) or module == "__init__":
                raise TangleError(f"{rel}: front matter agentrl.module {module!r} is not a valid "
                                  f"module name (lowercase letters, digits, underscores)")
        ch.module = module
        untargeted = [c for c in ch.saved if c.target is None]
        if untargeted and not module:
            c = untargeted[0]
            raise TangleError(f"{rel}: code cell {c.index} (line {c.line}) is {c.marker} but "
                              f"the front matter has no 'agentrl: module: <name>'")
        chapters.append(ch)
    return chapters


# ----------------------------------------------------------------------------- analysis

def _top_level_names(tree: ast.Module) -> list[str]:
    names: list[str] = []

    def add_target(t):
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                add_target(e)
        elif isinstance(t, ast.Starred):
            add_target(t.value)

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                add_target(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            add_target(node.target)
    return names


class _ImportTimeUses(ast.NodeVisitor):
    """Collect ``arl.X`` / ``from agentrl import X`` uses, split into import-time and run-time.

    Import time is everything executed when the module is imported: module-level statements,
    class bodies, decorators, default arguments and annotations; function and lambda bodies
    run later.
    """

    def __init__(self, aliases: set[str]):
        self.aliases = aliases
        self.uses: list[tuple[str, int, bool]] = []   # (name, lineno, at_import_time)
        self.depth = 0                                 # >0 inside a function body

    def visit_Import(self, node):
        for a in node.names:
            if a.name == PACKAGE:
                self.aliases.add(a.asname or a.name)

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        if node.level == 0 and mod.startswith(PACKAGE + "."):   # from agentrl.sub import y
            self.uses.append((mod.split(".")[1], node.lineno, self.depth == 0))
        elif node.level == 0 and mod == PACKAGE:
            for a in node.names:
                if a.name != "*":
                    self.uses.append((a.name, node.lineno, self.depth == 0))

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.aliases:
            self.uses.append((node.attr, node.lineno, self.depth == 0))
        self.generic_visit(node)

    def _function(self, node):
        for d in node.decorator_list:
            self.visit(d)
        self.visit(node.args)                     # defaults and annotations run at def time
        if getattr(node, "returns", None) is not None:
            self.visit(node.returns)
        self.depth += 1
        for stmt in node.body:
            self.visit(stmt)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_arg(self, node):
        if node.annotation is not None:
            self.visit(node.annotation)

    def visit_arguments(self, node):
        for d in list(node.defaults) + [d for d in node.kw_defaults if d is not None]:
            self.visit(d)
        for a in node.posonlyargs + node.args + node.kwonlyargs:
            self.visit(a)
        if node.vararg:
            self.visit(node.vararg)
        if node.kwarg:
            self.visit(node.kwarg)

    def visit_Lambda(self, node):
        self.visit(node.args)
        self.depth += 1
        self.visit(node.body)
        self.depth -= 1


def _register_modules(chapters: list[Chapter]) -> dict[str, Chapter]:
    """Module name -> the chapter that generates it, in __init__'s import order; a module
    named by two chapters is a TangleError."""
    modules: dict[str, Chapter] = {}
    for ch in chapters:
        for module in ch.modules:
            other = modules.get(module)
            if other is not None:
                raise TangleError(f"{ch.rel} and {other.rel} both save module '{module}' (in "
                                  f"their front matter or on a '#@save {module}' line); a "
                                  f"module belongs to one chapter")
            modules[module] = ch
    return modules


def analyse(chapters: list[Chapter], hand_written: frozenset = frozenset()) -> list[str]:
    """Parse saved cells, compute exports, and check cross-chapter rules; hand_written: the
    package's hand-written modules, which saved cells may import.

    Raises TangleError on the first hard error; returns a list of warnings.
    """
    warnings: list[str] = []
    owner: dict[str, tuple[Chapter, str, Cell]] = {}     # name -> (chapter, module, cell)
    modules = _register_modules(chapters)
    trees: dict[int, list[tuple[Cell, ast.Module]]] = {}
    for ch in chapters:
        parsed = []
        ch.exports = {module: [] for module in ch.modules}
        for cell in ch.saved:
            try:
                tree = ast.parse(cell.code, filename=ch.rel)
            except SyntaxError as e:
                line = cell.line + (e.lineno or 1) - 1
                raise TangleError(f"{ch.rel}: saved code cell {cell.index} (line {line}) does "
                                  f"not parse: {e.msg}") from None
            parsed.append((cell, tree))
            module = ch.module_of(cell)
            for name in _top_level_names(tree):
                if name.startswith("_"):
                    continue
                if name in owner and owner[name][:2] != (ch, module):
                    och, omodule, ocell = owner[name]
                    raise TangleError(
                        f"{ch.rel}: saved code cell {cell.index} (line {cell.line}) defines "
                        f"public name '{name}', already saved by {och.rel} (code cell "
                        f"{ocell.index}, line {ocell.line}, module {omodule}); a public name "
                        f"may be saved by only one chapter and module (rename it, or prefix a "
                        f"helper with '_')")
                if name not in owner:
                    owner[name] = (ch, module, cell)
                if cell.exported and name not in ch.exports[module]:
                    ch.exports[module].append(name)
        trees[id(ch)] = parsed

    position = {module: i for i, module in enumerate(modules)}
    for ch in chapters:
        aliases = {"arl"}
        for cell, tree in trees[id(ch)]:
            v = _ImportTimeUses(aliases)
            for stmt in tree.body:
                v.visit(stmt)
            for name, lineno, at_import in v.uses:
                if (name.startswith("__") and name.endswith("__")) or name in hand_written:
                    continue
                where = f"{ch.rel}: saved code cell {cell.index} (line {cell.line + lineno - 1})"
                problem = _use_problem(name, at_import, ch.module_of(cell), owner, modules,
                                       position)
                if problem is None:
                    continue
                message, fatal = problem
                if fatal:
                    raise TangleError(f"{where} uses arl.{name}{message}")
                warnings.append(f"warning: {where} uses arl.{name}{message}")
    return warnings


def _use_problem(name: str, at_import: bool, module: str, owner: dict, modules: dict,
                 position: dict) -> tuple[str, bool] | None:
    """What is wrong with a saved cell of `module` using arl.<name> (at import time or at
    run time) -> (the rest of the message, whether it is an error), or None."""
    if name in modules:                              # agentrl.<module> itself
        definer, cell = name, None
    elif name in owner:
        definer, cell = owner[name][1], owner[name][2]
    elif at_import:
        return f", but no chapter saves a name '{name}' (needed at import time)", True
    else:
        return f", but no chapter saves a name '{name}'", False
    if cell is not None and not cell.exported:
        return (f", but '{name}' is #@demo code of {modules[definer].rel}, not exported: "
                f"use {PACKAGE}.{definer}.{name}"), True
    if not at_import:
        return None
    if definer == module:
        return (f" at import time, but '{name}' is saved by this same chapter (module "
                f"{module}): refer to it directly as '{name}'"), True
    if position[definer] < position[module]:
        return None
    if modules[definer] is modules[module]:
        return (f" at import time, but '{name}' is saved into {PACKAGE}/{definer}.py, which "
                f"{PACKAGE}/__init__.py imports after {module}"), True
    return (f" at import time, but '{name}' is saved only by the later chapter "
            f"{modules[definer].rel}"), True


# ----------------------------------------------------------------------------- output

def _format_all(names: list[str]) -> str:
    if not names:
        return "__all__ = []\n"
    return "__all__ = [\n" + "".join(f"    {n!r},\n" for n in names) + "]\n"


def render_module(ch: Chapter, module: str) -> str:
    """The text of agentrl/<module>.py: the header, __all__, the chapter's cells for it."""
    parts = [HEADER.format(src=ch.rel), _format_all(ch.exports.get(module, []))]
    for cell in ch.saved:
        if ch.module_of(cell) != module:
            continue
        code = "\n".join(line.rstrip() for line in cell.code.split("\n")).strip("\n")
        if code:
            parts.append(code + "\n")
    return "\n\n".join(parts)


def project_version(root: Path) -> str:
    pp = root / "pyproject.toml"
    if pp.exists():
        import tomllib
        return str(tomllib.loads(pp.read_text()).get("project", {}).get("version", "0.0.0"))
    return "0.0.0"


def render_init(chapters: list[Chapter], version: str) -> str:
    lines = [HEADER.format(src="the chapters of book/ (in _toc.yml order)"),
             '"""agentrl: the library of the book *Agent RL*, tangled from its chapters.\n\n'
             "Every public name saved by a chapter is available as ``arl.<name>`` after\n"
             "``import agentrl as arl``.\n"
             '"""\n',
             f"__version__ = {version!r}\n"]
    imports = "".join(f"from .{module} import *  # {ch.rel}\n"
                      for ch in chapters for module in ch.modules)
    if imports:
        lines.append(imports)
    return "\n".join(lines)


def is_generated(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().startswith(GENERATED_MARK)
    except (OSError, UnicodeDecodeError):
        return False


def plan(root: Path) -> tuple[dict[Path, str], list[Path], list[str]]:
    """Return (files to write, generated files to delete, warnings)."""
    chapters = discover(root)
    pkg = root / PACKAGE
    hand_written = frozenset(p.stem for p in pkg.glob("*.py")
                             if p.stem != "__init__" and not is_generated(p))
    warnings = analyse(chapters, hand_written)
    want: dict[Path, str] = {}
    for ch in chapters:
        for module in ch.modules:
            target = pkg / f"{module}.py"
            if target.exists() and not is_generated(target):
                raise TangleError(f"{ch.rel} names module '{module}', but {PACKAGE}/"
                                  f"{module}.py is hand-written (no generated header); "
                                  f"rename one of them")
            want[target] = render_module(ch, module)
    init = pkg / "__init__.py"
    if init.exists() and not is_generated(init):
        raise TangleError(f"{PACKAGE}/__init__.py is hand-written; it must be generated by "
                          f"tools/tangle.py (move its code into a chapter or a separate module)")
    want[init] = render_init(chapters, project_version(root))
    stale = sorted(p for p in pkg.glob("*.py") if p not in want and is_generated(p))
    return want, stale, warnings


def tangle(root: Path, check: bool = False, quiet: bool = False) -> int:
    """Run the tangler on the book at ``root``. Returns a process exit code."""
    root = root.resolve()
    try:
        want, stale, warnings = plan(root)
    except TangleError as e:
        print(f"tangle: error: {e}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"tangle: {w}", file=sys.stderr)
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731
    if check:
        problems = []
        for path, text in want.items():
            if not path.exists():
                problems.append(f"missing: {rel(path)}")
            elif path.read_text(encoding="utf-8") != text:
                problems.append(f"drifted: {rel(path)}")
        problems += [f"extra: {rel(p)} (its chapter is gone)" for p in stale]
        if problems:
            print("tangle --check: the package differs from what the chapters produce:",
                  file=sys.stderr)
            for p in problems:
                print("  " + p, file=sys.stderr)
            print("run `python tools/tangle.py` and commit the result", file=sys.stderr)
            return 1
        if not quiet:
            print(f"tangle --check: {len(want)} generated files in sync")
        return 0
    (root / PACKAGE).mkdir(exist_ok=True)
    changed = []
    for path, text in want.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(f"wrote {rel(path)}")
    for p in stale:
        p.unlink()
        changed.append(f"deleted {rel(p)} (its chapter is gone)")
    if not quiet:
        for c in changed:
            print("tangle: " + c)
        print(f"tangle: {len(want)} generated files, {len(changed)} changed")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 naming drifted/missing/extra generated files")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="book root holding _toc.yml, book/ and agentrl/ (default: this repo)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    return tangle(args.root, check=args.check, quiet=args.quiet)


if __name__ == "__main__":
    sys.exit(main())
