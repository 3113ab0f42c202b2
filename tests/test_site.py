"""Strict site builds (Jupyter Book 1.x, -W -n --keep-going) and the headless-Chromium smoke test.

Select with `pytest -m site`; skip with `-m "not site"`. Needs /usr/bin/chromium (Debian's
`chromium` package; tools/test_all.sh installs it). Screenshots go to _build/smoke/.

Besides links, images, offline assets and math, the smoke test of the book holds (issue 14):
no <pre> wider than its box at 1280 and 1600 px (pages without notebook cells at 1280 only,
the narrower content column) and room for 88 characters of code on every page; the site's search finds every chapter by a word only that chapter uses; the generated API
page lists every public name of the package, linked both ways to the chapters; and the notebook a
reader downloads from a chapter page runs after `pip install` of the package, outside the
repository.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

import nbformat
import pytest

import agentrl_sphinx
import smoke
from conftest import REPO

# one xdist worker runs the whole file, so each site is built once (tools/test_all.sh runs
# pytest with --dist loadgroup)
pytestmark = [pytest.mark.site, pytest.mark.xdist_group("site")]
SHOTS = REPO / "_build" / "smoke"


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    """The strict build of tools/build_book.sh, into out/_build/html."""
    return subprocess.run(["jupyter-book", "build", str(root), "--path-output", str(out),
                           "--builder", "html", "-W", "-n", "--keep-going", "--all"],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def fixture_site(recorded_book, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixture-site")
    r = build(recorded_book, out)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def book_site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book-site")
    r = build(REPO, out)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return out / "_build" / "html"


def test_chromium_is_installed():
    assert Path(smoke.CHROMIUM).exists(), (
        f"{smoke.CHROMIUM} missing: apt-get install -y chromium (tools/test_all.sh does)")


def test_fixture_site_numbers_chapters_sections_figures_and_links(fixture_site):
    beta = (fixture_site / "book/recorded/03-beta.html").read_text()
    for text in ("Chapter 2", "Section 2.1", "Figure 2.1"):
        assert text in beta, text
    assert 'href="02-alpha.html#sec-alpha-figure"' in beta
    alpha = (fixture_site / "book/recorded/02-alpha.html").read_text()
    assert "2.2. </span>A figure" in alpha or "2.2." in alpha
    assert "Figure 2.1" in alpha and "<img" in alpha
    assert '4.000' in alpha                          # recorded outputs are rendered
    assert "ValueError" in alpha                     # and so is the deliberate error
    assert not list(fixture_site.rglob("01-intro.md.html"))   # sources are not built


def test_fixture_site_smoke_in_chromium(recorded_book, fixture_site):
    pages = smoke.toc_pages(recorded_book)
    assert len(pages) == 4
    report = smoke.smoke(fixture_site, pages, "book/recorded/02-alpha.html",
                         SHOTS / "fixture-02-alpha.png")
    assert report == {p: [] for p in pages}
    assert (SHOTS / "fixture-02-alpha.png").stat().st_size > 10_000


def test_smoke_catches_broken_links_and_images(fixture_site, tmp_path):
    import shutil
    site = tmp_path / "html"
    shutil.copytree(fixture_site, site)
    page = site / "book/recorded/03-beta.html"
    html = page.read_text().replace('href="02-alpha.html#sec-alpha-figure"',
                                    'href="02-alpha.html#no-such-anchor"', 1)
    page.write_text(html.replace("</article>", '<img src="missing.png"/><a href="gone.html">x</a>'
                                               # a role split so its next line starts with %
                                               "<p>builds on {numref}`Chapter</p>"
                                               "<p>```{note} a fence left raw</p>"
                                               "<pre>{numref}`fine in code`</pre>"
                                               "</article>", 1))
    report = smoke.smoke(site, ["book/recorded/03-beta.html"])
    problems = "\n".join(report["book/recorded/03-beta.html"])
    assert "broken anchor: 02-alpha.html#no-such-anchor" in problems
    assert "image does not load: missing.png" in problems
    assert "broken link: gone.html" in problems
    raw = [p for p in report["book/recorded/03-beta.html"] if p.startswith("raw MyST markup")]
    assert len(raw) == 2 and "builds on {numref}`Chapter" in raw[0], raw
    assert "```{note}" in raw[1] and "fine in code" not in problems


def _canned_page(code_client: int, width: int) -> str:
    """A dumped DOM as dump_dom returns it, with a measuring report for one window width."""
    report = {"width": width, "pres": 1, "clipped": [],
              "probes": {"code": {"scroll": 10, "client": code_client, "capacity": 95,
                                  "font": "13px mono"}}}
    return (f'<html><head><title>t</title></head><body><h1>x</h1><script type='
            f'"application/json" id="agentrl-smoke-report">{json.dumps(report)}</script>'
            f'</body></html>')


def test_pages_without_cells_are_opened_at_the_narrowest_width_only(tmp_path, monkeypatch):
    (tmp_path / "cells.html").write_text('<div class="cell docutils container">x</div>')
    (tmp_path / "prose.html").write_text('<p>no cells; a class="cell_output" is not one</p>')
    assert smoke.page_widths(tmp_path / "cells.html") == smoke.WIDTHS
    assert smoke.page_widths(tmp_path / "prose.html") == (min(smoke.WIDTHS),)
    opened = []

    def fake_dump(url, budget_ms=10000, width=None):
        opened.append((url.split("?")[0].rsplit("/", 1)[-1], width))
        return _canned_page(800 + (width or 0) // 10, width)

    monkeypatch.setattr(smoke, "dump_dom", fake_dump)
    report = smoke.smoke(tmp_path, ["cells.html", "prose.html"])
    assert report == {"cells.html": [], "prose.html": []}, report
    assert sorted(opened) == [("cells.html", w) for w in smoke.WIDTHS] + [("prose.html", 1280)]


def test_smoke_flags_a_code_box_that_narrows_at_a_wider_window(tmp_path, monkeypatch):
    """The premise of checking cell-less pages at one width, tested where cells exist."""
    (tmp_path / "cells.html").write_text('<div class="cell docutils container">x</div>')
    monkeypatch.setattr(smoke, "dump_dom", lambda url, budget_ms=10000, width=None:
                        _canned_page(900 - (width or 0) // 10, width))
    problems = smoke.smoke(tmp_path, ["cells.html"])["cells.html"]
    assert len(problems) == 1 and "narrower at a wider window" in problems[0], problems


def test_raw_markup_reads_prose_only():
    page = ('<p>See {glue:text}`x` and {ref}`y`.</p><div class="cell_output"><pre>{eq}`z`'
            '</pre></div><span class="math">{eq}`w`</span><code>{numref}`v`</code>'
            '<p>a <a href="#">{doc}`u</a> and :::{admonition} left</p>')
    found = smoke.raw_markup(page)
    assert len(found) == 4, found                       # glue:text, ref, doc, the fence
    assert not any("{eq}" in f or "{numref}" in f for f in found), found


def test_strict_build_fails_on_a_broken_reference(recorded_copy, tmp_path):
    ipynb = recorded_copy / "book/recorded/03-beta.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[0].source += "\n\nSee {ref}`no-such-label`.\n"
    nbformat.write(nb, ipynb)
    r = build(recorded_copy, tmp_path / "out")
    assert r.returncode != 0
    assert "no-such-label" in r.stdout + r.stderr


def test_smoke_catches_clipped_code_and_a_failing_search(fixture_site, tmp_path):
    site = tmp_path / "html"
    shutil.copytree(fixture_site, site)
    page = site / "book/recorded/02-alpha.html"
    long_line = "x = " + "1 + " * 40 + "1"                        # 164 characters
    page.write_text(page.read_text().replace(
        "</article>", f'<div class="cell"><div class="cell_input"><pre>{long_line}</pre></div>'
                      f"</div></article>", 1))
    report = smoke.smoke(site, ["book/recorded/02-alpha.html"],
                         searches={"qqzzxnonexistentword": "book/recorded/02-alpha.html"})
    problems = "\n".join(report["book/recorded/02-alpha.html"])
    for width in smoke.WIDTHS:
        assert f"at {width} px: code <pre>" in problems and "clipped" in problems, problems
    assert "search for 'qqzzxnonexistentword' does not list" in report["search.html"][0]


def test_smoke_catches_a_column_too_narrow_for_88_characters(fixture_site, tmp_path):
    site = tmp_path / "html"
    shutil.copytree(fixture_site, site)
    css = site / "_static" / "agentrl.css"
    css.write_text(css.read_text() + "\n.bd-article { max-width: 40rem; }\n")
    report = smoke.smoke(site, ["book/recorded/02-alpha.html"], widths=(1280,))
    problems = "\n".join(report["book/recorded/02-alpha.html"])
    assert "a 88-character line does not fit in a code box" in problems, problems


def page_texts(site: Path) -> dict[str, str]:
    """Lower-case visible text of every page of the book (toc pages), by site path."""
    out = {}
    for page in smoke.toc_pages(REPO):
        html = (site / page).read_text(encoding="utf-8")
        html = html.split('<main', 1)[-1]
        html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
        out[page] = re.sub(r"<[^>]+>", " ", html).lower()
    return out


def unique_term(texts: dict[str, str], page: str) -> str:
    """A word of a page's text that no other page contains, not even as a word stem
    (its first len-2 letters, at least 6), so Sphinx's stemming search must find this page alone.
    The longest such word, ties broken alphabetically: deterministic for a given book."""
    others = " ".join(t for p, t in texts.items() if p != page)
    words = sorted(set(re.findall(r"\b[a-z]{8,}\b", texts[page])), key=lambda w: (-len(w), w))
    for w in words:
        if w[:max(6, len(w) - 2)] not in others:
            return w
    raise AssertionError(f"{page} has no word that no other page uses")


@pytest.fixture(scope="module")
def chapter_terms(book_site) -> dict[str, str]:
    texts = page_texts(book_site)
    chapters = [p for p in smoke.toc_pages(REPO) if p.startswith("book/recorded/")]
    return {unique_term(texts, p): p for p in chapters}


def test_book_site_builds_strictly_and_passes_smoke(book_site, chapter_terms):
    """Every page: links, images, offline assets, math, nothing clipped at 1280 and 1600 px
    (a page without notebook cells at 1280 only),
    room for 88 characters; and the search finds every chapter by a word only it uses."""
    pages = smoke.toc_pages(REPO)
    assert "book/api.html" in pages
    shot_page = "book/recorded/04-bugfix-gym.html"
    report = smoke.smoke(book_site, pages, shot_page, SHOTS / "book-04-bugfix-gym.png",
                         searches=chapter_terms)
    chapters = [p for p in pages if p.startswith("book/recorded/")]
    assert len(chapters) >= 20 and len(chapter_terms) == len(chapters), chapter_terms
    assert report == {p: [] for p in [*pages, "search.html"]}
    assert (SHOTS / "book-04-bugfix-gym.png").exists()


# ----------------------------------------------------------------------------- the API page

def package_public_names() -> dict[str, list[str]]:
    """Module -> __all__ of the importable agentrl package, as `import agentrl` builds it."""
    import importlib
    arl = importlib.import_module("agentrl")
    mods = re.findall(r"^from \.(\w+) import \*", Path(arl.__file__).read_text(), re.M)
    names = {m: list(importlib.import_module(f"agentrl.{m}").__all__) for m in mods}
    # submodules (generated ones, and hand-written ones such as train and prose once imported)
    # are attributes of the package but not names the chapters save
    public = {n for n in dir(arl) if not n.startswith("_")
              and not inspect.ismodule(getattr(arl, n))}
    assert public == {n for ns in names.values() for n in ns}, "agentrl exports more than __all__"
    return names


def api_problems(site: Path, names: dict[str, list[str]]) -> list[str]:
    """Public names missing from the API page, or not linked to and from their chapter (names
    of a draft chapter's module, not yet in the toc, are listed without links)."""
    api = (site / "book/api.html").read_text(encoding="utf-8")
    chapters = {p: (site / p).read_text(encoding="utf-8")
                for p in smoke.toc_pages(REPO) if p.startswith("book/recorded/")}
    drafts = {m.name for m in agentrl_sphinx.read_book(REPO) if m.draft}
    problems = []
    for mod, ns in names.items():
        for name in ns:
            full = f"agentrl.{mod}.{name}"
            m = re.search(rf'<dt class="sig sig-object py" id="{re.escape(full)}">(.*?)</dl>',
                          api, re.S)
            if not m:
                problems.append(f"{full}: not on the API page")
                continue
            if mod in drafts:                   # its chapter is not on the site yet
                continue
            link = re.search(r'href="(recorded/\d\d-[a-z0-9-]+\.html)#([\w-]+)"', m.group(1))
            if not link:
                problems.append(f"{full}: its entry does not link to a chapter section")
                continue
            back = f'href="../api.html#{full}"'
            if back not in chapters.get("book/" + link.group(1), ""):
                problems.append(f"{full}: book/{link.group(1)} does not link back ({back})")
    return problems


def test_api_page_lists_every_public_name_linked_both_ways(book_site):
    names = package_public_names()
    assert sum(map(len, names.values())) > 100
    assert api_problems(book_site, names) == []
    api = (book_site / "book/api.html").read_text(encoding="utf-8")
    assert "make_tasks</span></span><span class=\"sig-paren\">(</span>" in api   # signatures
    assert "Saved by code cell" in api and "Section 4." in api


def test_api_check_catches_a_missing_entry(book_site, tmp_path):
    site = tmp_path / "html"
    shutil.copytree(book_site, site)
    api = site / "book/api.html"
    api.write_text(api.read_text().replace('id="agentrl.gym.make_tasks"', 'id="gone"'))
    ch4 = site / "book/recorded/04-bugfix-gym.html"
    ch4.write_text(ch4.read_text().replace('href="../api.html#agentrl.gym.BugFixEnv"', 'href="#"'))
    problems = api_problems(site, package_public_names())
    assert "agentrl.gym.make_tasks: not on the API page" in problems
    assert any(p.startswith("agentrl.gym.BugFixEnv: book/recorded/04-bugfix-gym.html does not "
                            "link back") for p in problems), problems


def test_api_build_check_names_a_public_name_the_chapters_do_not_save(tmp_path):
    """The build-time guard of tools/agentrl_sphinx.py (a warning, so -W fails the build)."""
    mods = agentrl_sphinx.read_book(REPO)
    pkg = tmp_path / "agentrl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("".join(f"from .{m.name} import *\n" for m in mods))
    for m in mods:
        extra = ["not_in_any_chapter"] if m.name == "gym" else []
        (pkg / f"{m.name}.py").write_text(f"__all__ = {[e.name for e in m.entries] + extra!r}\n")
    assert agentrl_sphinx.check_against_package(mods, tmp_path) == [
        "public names of agentrl.gym missing from the API page (stale record or package?): "
        "['not_in_any_chapter']"]


# ----------------------------------------------------------------------------- a chapter outside

SMALLEST_CHAPTER = "01-introduction"      # the fastest chapter (book/recorded/timings.json)


def test_downloaded_chapter_runs_outside_the_repository(book_site, tmp_path):
    """The .ipynb offered by a chapter page's download button runs, from a temporary
    directory, in a fresh virtual environment with the package pip-installed (not editable),
    with no path into the repository, and prints what the record shows."""
    page = f"book/recorded/{SMALLEST_CHAPTER}.html"
    html = (book_site / page).read_text(encoding="utf-8")
    m = re.search(r'href="([^"]*\.ipynb)"[^>]*title="Download source file"', html)
    assert m, f"{page} has no .ipynb download link"
    with smoke.Server(book_site) as srv:
        with urllib.request.urlopen(urljoin(urljoin(srv.url, page), m.group(1))) as r:
            downloaded = r.read()
    record = REPO / "book" / "recorded" / f"{SMALLEST_CHAPTER}.ipynb"
    assert downloaded == record.read_bytes()

    # pip install the package (a copy of what a clone holds) into a fresh venv
    src = tmp_path / "src"
    shutil.copytree(REPO / "agentrl", src / "agentrl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the venv sees what the setup installed into *this* environment (torch, nbclient, the
    # build backend), not the base interpreter's (what --system-site-packages would give when
    # this environment is itself a venv); the editable agentrl's .pth is not processed there
    inner = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                            "['purelib'])"], capture_output=True, text=True, check=True)
    outer = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(inner.stdout.strip(), "_agentrl_test_outer.pth").write_text("\n".join(outer) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", "--ignore-installed",
                        str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.rmtree(src)

    # run the downloaded notebook from an unrelated directory
    work = tmp_path / "reader"
    work.mkdir()
    nb_path = work / f"{SMALLEST_CHAPTER}.ipynb"
    nb_path.write_bytes(downloaded)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0", TQDM_DISABLE="1",
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    env.pop("MPLBACKEND", None)
    runner = (
        "import json, sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "nb.cells.append(nbformat.v4.new_code_cell("
        "'import agentrl, os; print(agentrl.__file__); print(os.getcwd())'))\n"
        "NotebookClient(nb, timeout=600, kernel_name='python3',"
        " resources={'metadata': {'path': '.'}}).execute()\n"
        "nbformat.write(nb, sys.argv[2])\n")
    r = subprocess.run([str(py), "-c", runner, nb_path.name, "executed.ipynb"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = nbformat.read(work / "executed.ipynb", as_version=4)
    where = ran.cells[-1].outputs[0]["text"].split("\n")
    assert where[0].startswith(str(venv)) and str(REPO) not in where[0], where
    assert Path(where[1]).resolve() == work.resolve(), where

    def texts(nb):
        return [[(o.get("name"), o.get("text"), o.get("data", {}).get("text/plain"))
                 for o in c.get("outputs", []) if o["output_type"] != "display_data"]
                for c in nb.cells if c.cell_type == "code"]
    assert texts(ran)[:-1] == texts(nbformat.reads(downloaded.decode(), as_version=4))
