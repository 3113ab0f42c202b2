"""Sphinx extension of the Agent RL site: the generated API reference and the chapters' links to it.

Loaded by ``_config.yml`` (``sphinx: local_extensions: {agentrl_sphinx: tools/}``). Nothing here
is written by hand per name; everything is read, at build time, from the recorded chapters the
site is built from (``book/recorded/NN-slug.ipynb``, the same cells ``tools/tangle.py`` copies
into the package) and checked against the importable package ``agentrl``:

* **The API page.** ``book/api.md`` is a stub; when Sphinx reads it (``source-read``), its text is
  replaced by MyST markdown generated here: one section per module in book order, and in it every
  public name the module exports, as a ``py:function`` / ``py:class`` (with its public methods) /
  ``py:data`` entry with signature (from the saved code, annotations left out) and docstring,
  followed by a link to the chapter section whose ``#@save`` cell defines it
  ({numref}`Section %s <label>`, so the build is strict about it). A public name of the package
  that the page would not list, or a listed name the package does not export, is a build warning
  (and ``-W`` makes it an error).
* **Drafts.** A chapter source not yet in the toc is tangled into the package too; its module is
  listed (read from ``book/NN-slug.md``) with the note that its chapter is in preparation.
* **The chapters link back.** After reading a chapter (``doctree-read``), every ``#@save`` cell
  that defines public names gets a line under its code, "Saved to agentrl.gym: Task, make_tasks",
  each name a ``py:obj`` reference to its API entry (strict, like every reference).

Only books whose toc holds the page named by ``agentrl_api_docname`` (default ``book/api``) get
either; the test fixture book gets neither.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

PACKAGE = "agentrl"
LABEL_RE = re.compile(r"^\((?P<label>[^)\s]+)\)=\s*$")
FENCE_RE = re.compile(r"^(`{3,}|~{3,})")
RECORDED_RE = re.compile(r"^book/recorded/(\d\d)-[a-z0-9-]+$")
# tools/tangle.py's markers of exported cells: the chapter's module, or the module named
SAVE_RE = re.compile(r"^#@save(?:\s+(?P<module>[a-z_][a-z0-9_]*))?\s*$")


# ----------------------------------------------------------------------------- reading the book

@dataclass
class Entry:
    name: str
    kind: str                 # "function" | "class" | "data"
    signature: str            # "(split='all')" for functions and classes, "" for data
    doc: str
    section: str | None       # label of the ``##`` section holding the defining cell
    cell: int                 # 1-based index among the chapter's code cells
    methods: list["Entry"] = field(default_factory=list)
    decorators: list[str] = field(default_factory=list)


@dataclass
class Module:
    name: str                 # "gym"
    docname: str              # "book/recorded/04-bugfix-gym"
    label: str | None         # "ch-bugfix-gym"
    title: str
    entries: list[Entry] = field(default_factory=list)
    draft: str | None = None  # "book/10-slug.md" for a chapter not (yet) in the toc

    @property
    def qualname(self) -> str:
        return f"{PACKAGE}.{self.name}"


def saved_cell(source: str) -> tuple[str | None, str] | None:
    """A ``#@save`` or ``#@save <module>`` cell -> (the module it names, None for the
    chapter's; its code without the marker line); None for other cells (``#@demo`` cells
    too: their names are not exported, so the API page does not list them)."""
    lines = source.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    m = SAVE_RE.match(lines[first].strip()) if first is not None else None
    if m is None:
        return None
    return m.group("module"), "\n".join(lines[first + 1:])


def top_level_public(tree: ast.Module) -> list[tuple[str, ast.stmt]]:
    """Public top-level names a saved cell defines, with their statements (tangle's rule)."""
    out: list[tuple[str, ast.stmt]] = []

    def add(target, stmt):
        if isinstance(target, ast.Name):
            out.append((target.id, stmt))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for e in target.elts:
                add(e, stmt)
        elif isinstance(target, ast.Starred):
            add(target.value, stmt)

    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((stmt.name, stmt))
        elif isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                add(t, stmt)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            add(stmt.target, stmt)
    return [(n, s) for n, s in out if not n.startswith("_")]


def _arguments(args: ast.arguments, drop_first: bool = False) -> str:
    """Parameters as in the source, without annotations: ``(x, mask, dim=None)``."""
    clone = ast.arguments(
        posonlyargs=[ast.arg(a.arg) for a in args.posonlyargs],
        args=[ast.arg(a.arg) for a in args.args],
        vararg=ast.arg(args.vararg.arg) if args.vararg else None,
        kwonlyargs=[ast.arg(a.arg) for a in args.kwonlyargs],
        kw_defaults=args.kw_defaults, kwarg=ast.arg(args.kwarg.arg) if args.kwarg else None,
        defaults=args.defaults)
    if drop_first:
        if clone.posonlyargs:
            clone.posonlyargs = clone.posonlyargs[1:]
        elif clone.args:
            n_without_default = len(clone.args) - len(clone.defaults)
            clone.args = clone.args[1:]
            if n_without_default == 0:
                clone.defaults = clone.defaults[1:]
    return "(" + ast.unparse(clone) + ")"


def _decorator_names(node) -> list[str]:
    names = []
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.append(ast.unparse(d).split(".")[-1])
    return names


def _comment_above(lines: list[str], lineno: int) -> str:
    """The ``#`` comment lines right above line ``lineno`` (1-based) of a cell, joined."""
    out = []
    k = lineno - 2
    while (k >= 0 and lines[k].strip().startswith("#")
           and not SAVE_RE.match(lines[k].strip())):
        out.append(lines[k].strip().lstrip("#").strip())
        k -= 1
    return " ".join(reversed(out))


def _data_doc(stmt: ast.stmt, code_lines: list[str]) -> str:
    """A constant's documentation: the comment lines right above its assignment, if any."""
    return _comment_above(code_lines, stmt.lineno)


def _class_signature(node: ast.ClassDef) -> str:
    if "dataclass" in _decorator_names(node):
        fields = []
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                    and "ClassVar" not in ast.unparse(stmt.annotation):
                default = ""
                if stmt.value is not None:
                    v = stmt.value
                    if isinstance(v, ast.Call) and ast.unparse(v.func).endswith("field"):
                        kw = {k.arg: k.value for k in v.keywords}
                        if "default" in kw:
                            default = "=" + ast.unparse(kw["default"])
                        elif "default_factory" in kw:
                            default = "=" + ast.unparse(kw["default_factory"]) + "()"
                    else:
                        default = "=" + ast.unparse(v)
                fields.append(stmt.target.id + default)
        return "(" + ", ".join(fields) + ")"
    for stmt in node.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            return _arguments(stmt.args, drop_first=True)
    return ""


def entry_for(name: str, stmt: ast.stmt, code_lines: list[str], section: str | None,
              cell: int) -> Entry:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Entry(name, "function", _arguments(stmt.args), ast.get_docstring(stmt) or "",
                     section, cell, decorators=_decorator_names(stmt))
    if isinstance(stmt, ast.ClassDef):
        e = Entry(name, "class", _class_signature(stmt), ast.get_docstring(stmt) or "",
                  section, cell)
        for sub in stmt.body:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not sub.name.startswith("_"):
                decos = _decorator_names(sub)
                static = "staticmethod" in decos
                kind = "property" if "property" in decos else "method"
                sig = "" if kind == "property" else _arguments(sub.args, drop_first=not static)
                e.methods.append(Entry(sub.name, kind, sig, ast.get_docstring(sub) or "",
                                       section, cell, decorators=decos))
        return e
    return Entry(name, "data", "", _data_doc(stmt, code_lines), section, cell)


def read_chapter(path: Path, docname: str, draft: str | None = None) -> list[Module]:
    """The modules a chapter saves, each with every public name: its front matter's module
    first, then those its ``#@save <module>`` cells name, in order (none: it saves none).
    ``path`` is a recorded notebook, or for a draft (a chapter source not in the toc) its
    MyST source."""
    if path.suffix == ".md":
        import jupytext
        nb = json.loads(jupytext.writes(jupytext.read(path), fmt="ipynb"))
    else:
        nb = json.loads(path.read_text(encoding="utf-8"))
    module = (nb.get("metadata", {}).get("agentrl") or {}).get("module")
    if not module:
        return []
    mods = {str(module): Module(str(module), docname, None, path.stem, draft=draft)}
    pending_label = None
    section = None
    label = title = None
    seen: set[str] = set()
    code_index = 0
    for c in nb.get("cells", []):
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "markdown":
            in_fence = False
            for line in src.split("\n"):
                if FENCE_RE.match(line.strip()):
                    in_fence = not in_fence
                    continue
                if in_fence:
                    continue
                m = LABEL_RE.match(line.strip())
                if m:
                    pending_label = m.group("label")
                    continue
                if line.startswith("# ") and label is None:
                    label, title = pending_label, line[2:].strip()
                elif line.startswith("## "):
                    section = pending_label
                if line.strip():
                    pending_label = None
            continue
        if c["cell_type"] != "code":
            continue
        code_index += 1
        saved = saved_cell(src)
        if saved is None:
            continue
        target, code = saved[0] or str(module), saved[1]
        mod = mods.setdefault(target, Module(target, docname, None, path.stem, draft=draft))
        tree = ast.parse(code)
        lines = code.split("\n")
        for name, stmt in top_level_public(tree):
            if name in seen:
                continue
            seen.add(name)
            mod.entries.append(entry_for(name, stmt, lines, section, code_index))
    for mod in mods.values():
        mod.label, mod.title = label, title or mod.title
    return list(mods.values())


def toc_docnames(root: Path) -> list[str]:
    import yaml
    toc = yaml.safe_load((root / "_toc.yml").read_text()) or {}
    out = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                out.append(re.sub(r"\.(md|ipynb)$", "", str(node["file"])))
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key) or []:
                    walk(child)
    walk(toc)
    return out


def read_book(root: Path) -> list[Module]:
    """Every module the book's recorded chapters save, in toc order, then the modules of draft
    chapters (sources in book/ not yet in the toc, which tools/tangle.py tangles too)."""
    mods = []
    toc = toc_docnames(root)
    for doc in toc:
        if RECORDED_RE.match(doc) and (root / (doc + ".ipynb")).exists():
            mods += read_chapter(root / (doc + ".ipynb"), doc)
    listed = {d.replace("book/recorded/", "book/") + ".md" for d in toc}
    for src in sorted((root / "book").glob("[0-9][0-9]-*.md")):
        rel = f"book/{src.name}"
        if rel not in listed:
            mods += read_chapter(src, "", draft=rel)
    return mods


def package_names(root: Path) -> dict[str, list[str]]:
    """Each generated module's ``__all__``, read from the package files of the book at ``root``
    (``agentrl/__init__.py`` and the modules it star-imports), without importing them."""
    pkg = root / PACKAGE
    init = (pkg / "__init__.py").read_text(encoding="utf-8")
    out = {}
    for mod in re.findall(r"^from \.(\w+) import \*", init, re.M):
        tree = ast.parse((pkg / f"{mod}.py").read_text(encoding="utf-8"))
        names: list[str] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
                names = list(ast.literal_eval(stmt.value))
        out[mod] = names
    return out


# ----------------------------------------------------------------------------- the API page

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_ESCAPE = re.compile(r"([\\`*_{}\[\]()#+\-.!<>|$~&:=\"'])")


def md_text(text: str) -> str:
    """Plain text for MyST: code spans kept, every other markdown character escaped."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_ESCAPE.sub(r"\\\1", text[pos:m.start()]))
        out.append("`" + m.group(2).strip("`") + "`")
        pos = m.end()
    out.append(_ESCAPE.sub(r"\\\1", text[pos:]))
    return "".join(out)


def md_doc(doc: str) -> str:
    """A docstring as paragraphs of escaped text (blank lines separate paragraphs)."""
    paras = [" ".join(ln.strip() for ln in p.split("\n")) for p in re.split(r"\n\s*\n", doc)]
    return "\n\n".join(md_text(p) for p in paras if p.strip())


def where(mod: Module, e: Entry) -> str:
    if mod.draft:
        return (f"Saved by code cell {e.cell} of `{mod.draft}`, a chapter in preparation "
                f"(not yet on this site).")
    if e.section:
        return (f"Saved by code cell {e.cell} of "
                f"{{numref}}`Section {{number}}, {{name}} <{e.section}>`.")
    return f"Saved by code cell {e.cell} of {{numref}}`Chapter %s <{mod.label}>`."


def api_markdown(mods: list[Module], heading: str) -> str:
    n_names = sum(len(m.entries) for m in mods)
    out = [f"(api-reference)=\n# {heading}\n",
           f"This page is generated when the site is built, from the `#@save` cells of the "
           f"recorded chapters, which are exactly the code of the package "
           f"(`tools/agentrl_sphinx.py` builds it; nothing on it is written by hand). "
           f"`import agentrl as arl` gives all {n_names} public names of its {len(mods)} "
           f"modules as `arl.<name>`; each is also `agentrl.<module>.<name>`. Every entry "
           f"links to the section of the chapter that saves it, and every saving cell in a "
           f"chapter links back here.\n"]
    out.append("| module | chapter | names |\n|---|---|---|")
    for m in mods:
        chapter = (f"`{m.draft}` (in preparation)" if m.draft else
                   f"{{numref}}`Chapter {{number}}, {{name}} <{m.label}>`")
        out.append(f"| {{ref}}`{m.qualname} <api-module-{m.name}>` | {chapter} | "
                   f"{len(m.entries)} |")
    out.append("")
    for m in mods:
        out.append(f"(api-module-{m.name})=\n## {md_text(m.qualname)}\n")
        out.append(f"```{{py:module}} {m.qualname}\n```\n")
        by = (f"`{m.draft}`, a chapter in preparation" if m.draft else
              f"{{numref}}`Chapter {{number}}, {{name}} <{m.label}>`")
        out.append(f"Saved by {by}, in book order: "
                   + ", ".join(f"{{py:obj}}`~{m.qualname}.{e.name}`" for e in m.entries) + ".\n")
        for e in m.entries:
            directive = {"function": "py:function", "class": "py:class", "data": "py:data"}[e.kind]
            body = [f":module: {m.qualname}", ""]
            if e.doc:
                body.append(md_doc(e.doc))
                body.append("")
            body.append(where(m, e))
            for meth in e.methods:
                mdir = "py:property" if meth.kind == "property" else (
                    "py:staticmethod" if "staticmethod" in meth.decorators else
                    "py:classmethod" if "classmethod" in meth.decorators else "py:method")
                body.append("")
                body.append(f"````{{{mdir}}} {meth.name}{meth.signature}")
                if meth.doc:
                    body.append("")
                    body.append(md_doc(meth.doc))
                body.append("````")
            fence = "`````"
            out.append(f"{fence}{{{directive}}} {e.name}{e.signature}\n" + "\n".join(body)
                       + f"\n{fence}\n")
    return "\n".join(out)


def check_against_package(mods: list[Module], root: Path) -> list[str]:
    """Differences between the names the page lists and the package's public names."""
    try:
        pkg = package_names(root)
    except (OSError, SyntaxError, ValueError) as exc:
        return [f"cannot read the package {PACKAGE}/ to check the API page against it: {exc!r}"]
    problems = []
    listed = {m.name: [e.name for e in m.entries] for m in mods}
    for mod in sorted(set(pkg) | set(listed)):
        want, have = pkg.get(mod), listed.get(mod)
        if want is None:
            problems.append(f"the chapters save module {PACKAGE}.{mod}, which the package "
                            f"does not import (run tools/tangle.py)")
        elif have is None:
            problems.append(f"{PACKAGE}.{mod} is in the package but no chapter saves it "
                            f"(run tools/tangle.py)")
        else:
            missing = [n for n in want if n not in have]
            extra = [n for n in have if n not in want]
            if missing:
                problems.append(f"public names of {PACKAGE}.{mod} missing from the API page "
                                f"(stale record or package?): {missing}")
            if extra:
                problems.append(f"the recorded chapter saves names {PACKAGE}.{mod} does not "
                                f"export (re-tangle or re-record): {extra}")
    return problems


# ----------------------------------------------------------------------------- Sphinx hooks

def _book(app) -> list[Module]:
    if not hasattr(app, "_agentrl_modules"):
        app._agentrl_modules = read_book(Path(app.srcdir))
    return app._agentrl_modules


def _enabled(app) -> bool:
    return app.config.agentrl_api_docname in app.env.found_docs


def on_source_read(app, docname, source):
    if docname != app.config.agentrl_api_docname:
        return
    mods = _book(app)
    m = re.search(r"^# (.+)$", source[0], re.M)
    source[0] = api_markdown(mods, m.group(1).strip() if m else "API reference")
    for problem in check_against_package(mods, Path(app.srcdir)):
        logger.warning(f"agentrl API page: {problem}", location=docname)


def on_env_get_outdated(app, env, added, changed, removed):
    """The API page depends on every chapter: read it again whenever the book is read."""
    doc = app.config.agentrl_api_docname
    return [doc] if doc in env.found_docs and doc not in added | changed else []


def on_doctree_read(app, doctree):
    docname = app.env.docname
    if not _enabled(app) or not RECORDED_RE.match(docname):
        return
    mods = {m.name: m for m in _book(app) if m.docname == docname and not m.draft}
    if not mods:
        return
    own = next(iter(mods))                     # the chapter's front-matter module
    for cell in list(doctree.findall(nodes.container)):
        if cell.get("nb_element") != "cell_code":
            continue
        src = next((c for c in cell.findall(nodes.literal_block)), None)
        if src is None:
            continue
        saved = saved_cell(src.astext())
        if saved is None or mods.get(saved[0] or own) is None:
            continue
        mod, code = mods[saved[0] or own], saved[1]
        owned = {e.name for e in mod.entries}
        try:
            names = [n for n, _ in top_level_public(ast.parse(code)) if n in owned]
        except SyntaxError:
            continue
        names = list(dict.fromkeys(names))
        if not names:
            continue
        para = nodes.paragraph(classes=["agentrl-saved"])
        para += nodes.Text("Saved to ")
        para += _xref(app, docname, "py", "mod", mod.qualname, mod.qualname)
        para += nodes.Text(": ")
        for i, name in enumerate(names):
            if i:
                para += nodes.Text(", ")
            para += _xref(app, docname, "py", "obj", f"{mod.qualname}.{name}", f"arl.{name}")
        inputs = [c for c in cell.children if isinstance(c, nodes.container)
                  and c.get("nb_element") == "cell_code_source"]
        pos = cell.index(inputs[0]) + 1 if inputs else len(cell.children)
        cell.insert(pos, para)


def _xref(app, docname, domain, reftype, target, text):
    ref = addnodes.pending_xref("", refdomain=domain, reftype=reftype, reftarget=target,
                                refexplicit=True, refwarn=True, refdoc=docname)
    ref["py:module"] = None
    ref["py:class"] = None
    ref += nodes.literal(text, text, classes=["xref", "py", f"py-{reftype}"])
    return ref


def setup(app):
    app.add_config_value("agentrl_api_docname", "book/api", "env")
    app.connect("source-read", on_source_read)
    app.connect("env-get-outdated", on_env_get_outdated)
    app.connect("doctree-read", on_doctree_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
