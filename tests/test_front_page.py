"""The front page (book/index.md) and chapter 1's map of the book (its section `sec-book-map`)
list exactly the chapters of _toc.yml, in order, say how many there are, and name no chapter
number beyond the last one (issue 14). The front page says how to run a chapter locally and
gives the agent's parameter count as chapter 5's record prints it.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import tangle
from conftest import REPO

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen", "twenty", "twenty-one", "twenty-two", "twenty-three",
         "twenty-four", "twenty-five"]
LABEL_REF = re.compile(r"<(ch-[a-z0-9-]+)>`")
CHAPTER_NUMBER = re.compile(r"\b[Cc]hapters? (\d+)\b")


def toc_labels(root: Path) -> list[str]:
    """The chapter labels `(ch-...)=` of the toc's numbered chapters (its "Chapters" part;
    the appendix is listed apart), in book order."""
    out = []
    for rel in tangle.toc_part(root, "Chapters"):
        m = re.search(r"^\((ch-[a-z0-9-]+)\)=\s*$", (root / rel).read_text(), re.M)
        assert m, f"{rel} has no chapter label"
        out.append(m.group(1))
    return out


def book_map(root: Path) -> str:
    text = (root / "book" / "01-introduction.md").read_text()
    m = re.search(r"^\(sec-book-map\)=\n(.*?)(?=^\(sec-)", text, re.M | re.S)
    assert m, "chapter 1 has no section (sec-book-map)="
    return m.group(1)


def chapter_list(root: Path) -> str:
    text = (root / "book" / "index.md").read_text()
    m = re.search(r"^## The chapters\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "book/index.md has no section '## The chapters'"
    return m.group(1)


def listing_problems(name: str, text: str, labels: list[str], skip_first: bool) -> list[str]:
    problems = []
    n = len(labels)
    if f"{WORDS[n]} chapters" not in text:
        problems.append(f"{name} does not say '{WORDS[n]} chapters'")
    for word in WORDS[2:]:
        if word != WORDS[n] and re.search(rf"\b{word} chapters\b", text, re.I):
            problems.append(f"{name} says '{word} chapters', but the toc has {n}")
    refs = LABEL_REF.findall(text)
    want = labels[1:] if skip_first else labels
    if [r for r in refs if r in labels] != want:
        problems.append(f"{name} lists chapters {refs}, the toc has {want}")
    unknown = [r for r in refs if r not in labels]
    if unknown:
        problems.append(f"{name} refers to chapters not in the toc: {unknown}")
    beyond = sorted({int(k) for k in CHAPTER_NUMBER.findall(text) if int(k) > n})
    if beyond:
        problems.append(f"{name} names chapter numbers beyond the last ({n}): {beyond}")
    return problems


def problems(root: Path) -> list[str]:
    labels = toc_labels(root)
    return (listing_problems("book/index.md (## The chapters)", chapter_list(root), labels,
                             skip_first=False)
            + listing_problems("chapter 1's map (sec-book-map)", book_map(root), labels,
                               skip_first=True))


def test_front_page_and_map_list_exactly_the_toc_chapters_and_count_them():
    assert problems(REPO) == []


def test_the_check_fails_when_a_chapter_is_added_to_the_toc_but_not_to_the_lists(tmp_path):
    root = tmp_path / "book-root"
    (root / "book").mkdir(parents=True)
    shutil.copy(REPO / "_toc.yml", root / "_toc.yml")
    for rel in tangle.toc_chapters(REPO):
        shutil.copy(REPO / rel, root / rel)
    shutil.copy(REPO / "book" / "index.md", root / "book" / "index.md")
    assert problems(root) == []
    numbered = tangle.toc_part(REPO, "Chapters")
    n = len(numbered)
    extra = f"{n + 1:02d}-extra"
    (root / "book" / f"{extra}.md").write_text("(ch-extra)=\n# Extra\n")
    toc = (root / "_toc.yml").read_text()
    last_slug = numbered[-1].removeprefix("book/").removesuffix(".md")
    last = re.findall(rf"^(\s*- file: book/recorded/{last_slug})$", toc, re.M)[-1]
    (root / "_toc.yml").write_text(toc.replace(last, last + "\n" + re.sub(
        r"book/recorded/.*", f"book/recorded/{extra}", last)))
    (root / "book" / "recorded").mkdir()
    found = problems(root)
    assert any(f"does not say '{WORDS[n + 1]} chapters'" in p for p in found), found
    assert any(f"says '{WORDS[n]} chapters', but the toc has {n + 1}" in p for p in found), found
    assert sum("lists chapters" in p for p in found) == 2, found


def test_front_page_says_how_to_run_a_chapter_and_the_parameter_count():
    index = (REPO / "book" / "index.md").read_text()
    assert "(sec-run-a-chapter)=" in index and "pip install ." in index
    assert ".ipynb" in index and "jupytext" in index
    record = (REPO / "book" / "recorded" / "05-tiny-agent.ipynb").read_text()
    counts = set(re.findall(r"(\d{1,3}(?:,\d{3})+) parameters", record))
    assert len(counts) == 1, counts                         # the record prints one count
    assert f"{counts.pop()} parameters" in index
    assert "158 thousand" not in index
