"""The tangler on the fixture book: order, headers, exports, check, errors, hand-written files."""
from __future__ import annotations

import keyword
import os
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
from hypothesis import given, settings, strategies as st

import tangle
from conftest import run_tool


def tangle_ok(root: Path, *args: str) -> subprocess.CompletedProcess:
    r = run_tool("tangle.py", "--root", str(root), *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def tangle_err(root: Path, *args: str) -> str:
    r = run_tool("tangle.py", "--root", str(root), *args)
    assert r.returncode != 0, "tangle should have failed:\n" + r.stdout
    return r.stderr


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_modules_headers_exports_and_book_order(book):
    tangle_ok(book)
    pkg = book / "agentrl"
    assert sorted(p.name for p in pkg.glob("*.py")) == ["__init__.py", "alpha.py", "beta.py"]
    alpha = (pkg / "alpha.py").read_text()
    assert alpha.startswith("# Generated from book/02-alpha.md by tools/tangle.py. Do not edit")
    assert "#@save" not in alpha
    assert "__all__ = [\n    'SCALE',\n    'double',\n]" in alpha      # no _private, no imports
    assert "def _private_helper" in alpha
    assert "print(" not in alpha                                  # unsaved cells stay out
    beta = (pkg / "beta.py").read_text()
    assert "__all__ = [\n    'Scaler',\n]" in beta
    init = (pkg / "__init__.py").read_text()
    assert init.startswith("# Generated from ")
    assert init.index("from .alpha import *") < init.index("from .beta import *")
    assert "__version__" in init


def test_package_imports_and_later_chapters_use_earlier_names(book):
    tangle_ok(book)
    code = "import agentrl as arl; print(arl.Scaler()(2), arl.SCALE, arl.double(4), arl.__version__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=book, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(book)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == ["12", "3", "8"]


def test_idempotent_and_deterministic(book, tmp_path):
    tangle_ok(book)
    first = {p.name: p.read_bytes() for p in (book / "agentrl").glob("*.py")}
    r = tangle_ok(book)
    assert "0 changed" in r.stdout
    assert first == {p.name: p.read_bytes() for p in (book / "agentrl").glob("*.py")}


def test_check_passes_in_sync_and_names_drifted_missing_extra(book):
    assert "missing: agentrl/alpha.py" in tangle_err(book, "--check")
    tangle_ok(book)
    tangle_ok(book, "--check")
    pkg = book / "agentrl"
    (pkg / "alpha.py").write_text((pkg / "alpha.py").read_text() + "\nx = 1\n")
    (pkg / "beta.py").unlink()
    (pkg / "gone.py").write_text(tangle.HEADER.format(src="book/09-gone.md") + "y = 2\n")
    err = tangle_err(book, "--check")
    assert "drifted: agentrl/alpha.py" in err
    assert "missing: agentrl/beta.py" in err
    assert "extra: agentrl/gone.py" in err
    edit(book / "book" / "02-alpha.md", "return 2 * x", "return x + x")   # chapter edit
    tangle_ok(book)
    tangle_ok(book, "--check")
    assert "return x + x" in (pkg / "alpha.py").read_text()
    assert not (pkg / "gone.py").exists()


def test_hand_written_modules_are_never_touched(book):
    pkg = book / "agentrl"
    pkg.mkdir()
    cli = pkg / "cli.py"
    cli.write_text("# a hand-written CLI\nprint('hi')\n")
    tangle_ok(book)
    tangle_ok(book, "--check")
    assert cli.read_text() == "# a hand-written CLI\nprint('hi')\n"
    cli.write_text("# a hand-written CLI, changed\n")
    tangle_ok(book, "--check")                    # hand-written files are not part of the sync


def test_hand_written_module_clashing_with_chapter_module_is_an_error(book):
    (book / "agentrl").mkdir()
    (book / "agentrl" / "alpha.py").write_text("VALUE = 1\n")
    err = tangle_err(book)
    assert "book/02-alpha.md" in err and "hand-written" in err
    assert (book / "agentrl" / "alpha.py").read_text() == "VALUE = 1\n"


def test_removed_chapter_deletes_its_generated_module(book):
    tangle_ok(book)
    (book / "book" / "03-beta.md").unlink()
    edit(book / "_toc.yml", "  - file: book/recorded/03-beta\n", "")
    tangle_ok(book)
    assert not (book / "agentrl" / "beta.py").exists()
    assert "beta" not in (book / "agentrl" / "__init__.py").read_text()


def test_draft_chapter_not_in_toc_is_tangled_in_number_order(book):
    edit(book / "_toc.yml", "  - file: book/recorded/03-beta\n", "")
    tangle_ok(book)
    init = (book / "agentrl" / "__init__.py").read_text()
    assert init.index("from .alpha import *") < init.index("from .beta import *")


def test_toc_out_of_number_order_is_an_error(book):
    toc = book / "_toc.yml"
    text = toc.read_text()
    text = text.replace("  - file: book/recorded/02-alpha\n  - file: book/recorded/03-beta\n",
                        "  - file: book/recorded/03-beta\n  - file: book/recorded/02-alpha\n")
    toc.write_text(text)
    assert "out of number order" in tangle_err(book)


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().split("\n"), 1) if needle in ln)


def test_error_saved_cell_does_not_parse(book):
    ch = book / "book" / "02-alpha.md"
    edit(ch, "    return 2 * x\n", "    return 2 * x)\n")
    err = tangle_err(book)
    line = _line_of(ch, "return 2 * x)")
    assert f"book/02-alpha.md: saved code cell 2 (line {line}) does not parse" in err
    assert not (book / "agentrl" / "alpha.py").exists()           # nothing written on error


def test_error_public_name_saved_by_two_chapters(book):
    ch = book / "book" / "03-beta.md"
    edit(ch, "class Scaler:", "def double(x):\n    return x\n\n\nclass Scaler:")
    err = tangle_err(book)
    assert "book/03-beta.md: saved code cell 2" in err
    assert "'double'" in err and "already saved by book/02-alpha.md" in err


def test_private_names_may_repeat_across_chapters(book):
    edit(book / "book" / "03-beta.md", "class Scaler:", "def _private_helper():\n    return 1\n\n\nclass Scaler:")
    tangle_ok(book)


@pytest.mark.parametrize("snippet, what", [
    ("DEFAULT = arl.Scaler", "module level"),
    ("@arl.Scaler\ndef f():\n    pass", "decorator"),
    ("class Sub(arl.Scaler):\n    pass", "class base"),
    ("def f(s=arl.Scaler):\n    return s", "default argument"),
    ("class K:\n    attr = arl.Scaler", "class body"),
    ("from agentrl import Scaler", "from-import"),
])
def test_error_import_time_use_of_later_chapter_name(book, snippet, what):
    ch = book / "book" / "02-alpha.md"
    edit(ch, "SCALE = 3\n", "SCALE = 3\nimport agentrl as arl\n" + snippet + "\n")
    err = tangle_err(book)
    needle = next(ln for ln in snippet.split("\n") if "Scaler" in ln)
    line = _line_of(ch, needle)
    assert f"book/02-alpha.md: saved code cell 2 (line {line}) uses arl.Scaler at import time" in err, what
    assert "later chapter book/03-beta.md" in err


def test_run_time_use_of_later_chapter_name_is_fine(book):
    ch = book / "book" / "02-alpha.md"
    edit(ch, "SCALE = 3\n", "SCALE = 3\nimport agentrl as arl\n\n\ndef make():\n"
                            "    return arl.Scaler()\n")
    tangle_ok(book)


def test_error_import_time_use_of_same_chapter_name(book):
    ch = book / "book" / "03-beta.md"
    edit(ch, "\nclass Scaler:", "\nclass Scaler:")
    text = ch.read_text() + ""
    text = text.replace("        return arl.double(x) * self.k\n```",
                        "        return arl.double(x) * self.k\n\n\nDEFAULT = arl.Scaler()\n```")
    ch.write_text(text)
    err = tangle_err(book)
    assert "uses arl.Scaler at import time" in err and "same chapter" in err


def test_error_import_time_use_of_unknown_name_and_warning_at_run_time(book):
    ch = book / "book" / "03-beta.md"
    edit(ch, "class Scaler:", "def later():\n    return arl.nowhere\n\n\nclass Scaler:")
    r = tangle_ok(book)
    assert "uses arl.nowhere, but no chapter saves a name 'nowhere'" in r.stderr
    edit(ch, "class Scaler:", "X = arl.nowhere_either\n\n\nclass Scaler:")
    assert "no chapter saves a name 'nowhere_either' (needed at import time)" in tangle_err(book)


def test_error_saved_cell_without_module_in_front_matter(book):
    edit(book / "book" / "03-beta.md", "agentrl:\n  module: beta\n", "")
    assert "book/03-beta.md: code cell 2" in tangle_err(book)


def test_cell_parser_agrees_with_jupytext(book):
    for md in sorted((book / "book").glob("0*.md")):
        _, cells = tangle.parse_cells(md.read_text(), md.name)
        nb = jupytext.read(md)
        expected = [c.source for c in nb.cells if c.cell_type == "code"]
        got = [(c.marker + "\n" + c.code) if c.saved else c.code for c in cells]
        assert got == expected, md.name


def test_cell_parser_agrees_with_jupytext_on_every_marker(book):
    ch = add_cells(book, GAMMA_CELL, DEMO_CELL)
    _, cells = tangle.parse_cells(ch.read_text(), ch.name)
    assert [(c.marker, c.target, c.exported) for c in cells if c.saved] == [
        ("#@save", None, True), ("#@save gamma", "gamma", True), ("#@demo", None, False)]
    expected = [c.source for c in jupytext.read(ch).cells if c.cell_type == "code"]
    assert [(c.marker + "\n" + c.code) if c.saved else c.code for c in cells] == expected


def test_options_blocks_are_skipped_and_save_after_options_is_seen(book):
    ch = book / "book" / "02-alpha.md"
    edit(ch, "```{code-cell} ipython3\n#@save\nSCALE = 3",
         "```{code-cell} ipython3\n---\ntags: [hide-input]\n---\n#@save\nSCALE = 3")
    tangle_ok(book)
    assert "tags" not in (book / "agentrl" / "alpha.py").read_text()
    assert "SCALE = 3" in (book / "agentrl" / "alpha.py").read_text()


GAMMA_CELL = ('```{code-cell} ipython3\n#@save gamma\nimport agentrl as arl\n\n\n'
              'def triple(x):\n    """Three times x."""\n    return 3 * x\n\n\n'
              'def scaled(x):\n    return arl.Scaler()(x)\n```\n')
DEMO_CELL = ('```{code-cell} ipython3\n#@demo\ndef show_off(x):\n'
             '    """A demonstration helper."""\n    return f"x = {x}"\n```\n')


def add_cells(book: Path, *cells: str) -> Path:
    """Append cells to chapter 3 (module beta), before its exercises."""
    ch = book / "book" / "03-beta.md"
    edit(ch, "(sec-beta-exercises)=", "\n".join(cells) + "\n(sec-beta-exercises)=")
    return ch


def test_save_with_a_module_name_writes_a_second_module_of_the_chapter(book):
    add_cells(book, GAMMA_CELL)
    tangle_ok(book)
    pkg = book / "agentrl"
    gamma = (pkg / "gamma.py").read_text()
    assert gamma.startswith("# Generated from book/03-beta.md by tools/tangle.py. Do not edit")
    assert "__all__ = [\n    'triple',\n    'scaled',\n]" in gamma
    assert "#@save" not in gamma and "class Scaler" not in gamma
    assert "def triple" not in (pkg / "beta.py").read_text()
    init = (pkg / "__init__.py").read_text()
    assert (init.index("from .alpha import *") < init.index("from .beta import *")
            < init.index("from .gamma import *  # book/03-beta.md"))
    code = "import agentrl as arl; print(arl.triple(2), arl.scaled(1), arl.gamma.triple(1))"
    out = subprocess.run([sys.executable, "-c", code], cwd=book, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(book)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["6", "6", "3"]
    tangle_ok(book, "--check")
    edit(book / "book" / "03-beta.md", GAMMA_CELL, "")
    tangle_ok(book)
    assert not (pkg / "gamma.py").exists()
    assert "gamma" not in (pkg / "__init__.py").read_text()


@pytest.mark.parametrize("name", ["Bad-Name", "2fast", "two words", "__init__"])
def test_error_save_names_an_invalid_module(book, name):
    ch = add_cells(book, GAMMA_CELL.replace("#@save gamma", f"#@save {name}"))
    err = tangle_err(book)
    line = _line_of(ch, f"#@save {name}")
    assert f"book/03-beta.md: code cell 5 (line {line}): '#@save {name}'" in err
    assert f"not a valid module name" in err and "'#@save translations'" in err
    assert not (book / "agentrl").exists()                        # nothing written on error


def test_error_save_names_another_chapters_module(book):
    add_cells(book, GAMMA_CELL.replace("#@save gamma", "#@save alpha"))
    err = tangle_err(book)
    assert "book/03-beta.md and book/02-alpha.md both save module 'alpha'" in err


def test_error_save_names_a_hand_written_module(book):
    (book / "agentrl").mkdir()
    (book / "agentrl" / "gamma.py").write_text("VALUE = 1\n")
    add_cells(book, GAMMA_CELL)
    err = tangle_err(book)
    assert "names module 'gamma'" in err and "hand-written" in err


def test_import_time_use_across_a_chapters_modules_follows_the_import_order(book):
    ch = add_cells(book, GAMMA_CELL.replace("def scaled", "DEFAULT = arl.Scaler\n\n\ndef scaled"))
    tangle_ok(book)                                # beta is imported before gamma
    text = ch.read_text().replace("        return arl.double(x) * self.k\n```",
                                  "        return arl.double(x) * self.k\n\n\n"
                                  "TRIPLE = arl.triple\n```")
    ch.write_text(text)
    err = tangle_err(book)
    assert "uses arl.triple at import time, but 'triple' is saved into agentrl/gamma.py" in err


def test_demo_cells_are_saved_but_not_exported(book):
    add_cells(book, DEMO_CELL)
    tangle_ok(book)
    beta = (book / "agentrl" / "beta.py").read_text()
    assert "def show_off" in beta and "'show_off'" not in beta
    assert "__all__ = [\n    'Scaler',\n]" in beta
    code = ("import agentrl as arl; from agentrl.beta import show_off; "
            "print(show_off(2), hasattr(arl, 'show_off'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=book, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(book)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["x", "=", "2", "False"]


def test_error_demo_names_used_through_arl_or_given_a_module(book):
    add_cells(book, DEMO_CELL, GAMMA_CELL.replace("return 3 * x", "return arl.show_off(x)"))
    err = tangle_err(book)
    assert "uses arl.show_off, but 'show_off' is #@demo code of book/03-beta.md" in err
    assert "use agentrl.beta.show_off" in err
    edit(book / "book" / "03-beta.md", "arl.show_off(x)", "3 * x")
    edit(book / "book" / "03-beta.md", "#@demo\n", "#@demo gamma\n")
    assert "'#@demo gamma' names a module" in tangle_err(book)


def test_the_sites_api_reader_files_names_under_the_module_tangle_writes(book):
    """tools/agentrl_sphinx.py lists each exported name under the module its cell goes to."""
    import agentrl_sphinx
    add_cells(book, GAMMA_CELL, DEMO_CELL)
    tangle_ok(book)
    mods = [m for ch in ("02-alpha", "03-beta")
            for m in agentrl_sphinx.read_chapter(book / "book" / f"{ch}.md", "", ch)]
    assert {m.name: [e.name for e in m.entries] for m in mods} == {
        "alpha": ["SCALE", "double"], "beta": ["Scaler"], "gamma": ["triple", "scaled"]}
    assert {m.title for m in mods if m.name != "alpha"} == {"Beta"}
    assert agentrl_sphinx.check_against_package(mods, book) == []


def test_error_public_name_saved_in_two_modules_of_one_chapter(book):
    add_cells(book, GAMMA_CELL.replace("def triple", "def Scaler"))
    err = tangle_err(book)
    assert "defines public name 'Scaler', already saved by book/03-beta.md" in err
    assert "module beta" in err


def test_repo_package_is_in_sync(repo):
    """The committed agentrl/ matches the chapters (same as `python tools/tangle.py --check`)."""
    r = run_tool("tangle.py", "--check")
    assert r.returncode == 0, r.stderr


# identifiers, not keywords ('or', 'if', 'in' would make the generated chapter a syntax error)
NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)), min_size=1, max_size=4, unique=True)


@settings(max_examples=15, deadline=None)
@given(a=NAMES, b=NAMES)
def test_exports_property(tmp_path_factory, a, b):
    """Any two chapters' public names: exported in order, duplicates across chapters rejected."""
    root = tmp_path_factory.mktemp("prop")
    (root / "book").mkdir()
    fm = "---\nagentrl:\n  module: {m}\n---\n\n# T\n\n"
    for n, (mod, names) in enumerate([("ma", a), ("mb", b)], 1):
        body = "\n".join(f"def {x}():\n    return {i}\n" for i, x in enumerate(names))
        (root / "book" / f"0{n}-c{n}.md").write_text(
            fm.format(m=mod) + "```{code-cell} ipython3\n#@save\n" + body + "```\n")
    rc = tangle.tangle(root, quiet=True)
    if set(a) & set(b):
        assert rc != 0
        return
    assert rc == 0
    assert tangle.tangle(root, check=True, quiet=True) == 0
    text = (root / "agentrl" / "ma.py").read_text()
    assert re.findall(r"^    '(\w+)',$", text, re.M) == a
