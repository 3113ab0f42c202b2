"""Strict site builds (Jupyter Book 1.x, -W -n --keep-going) and the headless-Chromium smoke test.

Select with `pytest -m site`; skip with `-m "not site"`. Needs /usr/bin/chromium (Debian's
`chromium` package; tools/test_all.sh installs it). Screenshots go to _build/smoke/.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import nbformat
import pytest

import smoke
from conftest import REPO

pytestmark = pytest.mark.site
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
                                               "</article>", 1))
    report = smoke.smoke(site, ["book/recorded/03-beta.html"])
    problems = "\n".join(report["book/recorded/03-beta.html"])
    assert "broken anchor: 02-alpha.html#no-such-anchor" in problems
    assert "image does not load: missing.png" in problems
    assert "broken link: gone.html" in problems


def test_strict_build_fails_on_a_broken_reference(recorded_copy, tmp_path):
    ipynb = recorded_copy / "book/recorded/03-beta.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[0].source += "\n\nSee {ref}`no-such-label`.\n"
    nbformat.write(nb, ipynb)
    r = build(recorded_copy, tmp_path / "out")
    assert r.returncode != 0
    assert "no-such-label" in r.stdout + r.stderr


def test_book_site_builds_strictly_and_passes_smoke(book_site):
    pages = smoke.toc_pages(REPO)
    shot_page = pages[-1]
    report = smoke.smoke(book_site, pages, shot_page, SHOTS / "book-last-page.png")
    assert report == {p: [] for p in pages}
    assert (SHOTS / "book-last-page.png").exists()
