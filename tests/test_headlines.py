"""The headline standard (tools/AUTHORING.md, issue 41): every experimental chapter (6 to 20)
in the toc has a code cell tagged `headline` that runs `arl.compare_paired`, its recorded output
carries the verdict, and the chapter's summary opens with a value that cell glues. Chapters whose
headline issue is still open are listed in PENDING, by name; the test fails when a pending
chapter gains a headline (take it off the list) or a finished one loses it.
"""
from __future__ import annotations

import re
from pathlib import Path

import jupytext
import nbformat
import pytest

import tangle
from conftest import REPO

# chapters 6-9 have theirs (issue 41), 10-14 too (issue 42), 15-18 (issue 43); the rest
# in issue 44 (19-20)
PENDING: set[str] = set()
GLUE_KEY = re.compile(r"\bglue\((\w+)=|['\"](\w+)['\"]\s*:")
GLUE_ROLE = re.compile(r"\{glue:text\}`(\w+)`")


def experimental_chapters(root: Path) -> list[str]:
    """The toc's chapters numbered 6 to 20, as book/NN-slug.md paths."""
    return [rel for rel in tangle.toc_chapters(root)
            if 6 <= int(Path(rel).name[:2]) <= 20]


def headline_cells(text: str) -> list:
    """The code cells of a chapter source tagged `headline`."""
    nb = jupytext.reads(text, fmt="md:myst")
    return [c for c in nb.cells if c.cell_type == "code"
            and "headline" in c.metadata.get("tags", [])]


def summary_opening(text: str) -> str:
    """The first paragraph or bullet of the chapter's `## Summary` section."""
    m = re.search(r"^## Summary\n+(.*?)(?=\n\n|\n- |\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def problems(text: str, recorded: nbformat.NotebookNode | None, name: str) -> list[str]:
    """What the chapter source (and its record) lacks of the headline standard."""
    cells = headline_cells(text)
    if not cells:
        return [f"{name}: no code cell tagged `headline`"]
    out = []
    keys = set()
    for cell in cells:
        if "compare_paired(" not in cell.source:
            out.append(f"{name}: a headline cell does not call arl.compare_paired")
        keys |= {a or b for a, b in GLUE_KEY.findall(cell.source)}
    opening = summary_opening(text)
    if not set(GLUE_ROLE.findall(opening)) & keys:
        out.append(f"{name}: the summary does not open with a value a headline cell glues")
    if recorded is not None:
        said = [o for c in recorded.cells if "headline" in c.metadata.get("tags", [])
                for o in c.get("outputs", []) if o.get("output_type") == "stream"]
        if not any("established at α" in o["text"] for o in said):
            out.append(f"{name}: the recorded headline cells print no verdict")
    return out


def recorded_notebook(root: Path, rel: str):
    path = root / "book" / "recorded" / (Path(rel).stem + ".ipynb")
    return nbformat.read(path, as_version=4) if path.exists() else None


@pytest.mark.parametrize("rel", experimental_chapters(REPO), ids=lambda r: Path(r).stem)
def test_experimental_chapter_has_a_headline_or_is_pending(rel):
    name = Path(rel).stem
    text = (REPO / rel).read_text()
    found = problems(text, recorded_notebook(REPO, rel), name)
    if name in PENDING:
        assert headline_cells(text) == [], (
            f"{name} now has a headline cell: take it off PENDING in {__file__}")
    else:
        assert found == []


def test_pending_names_are_chapters():
    stems = {Path(rel).stem for rel in experimental_chapters(REPO)}
    assert PENDING <= stems, sorted(PENDING - stems)


SOURCE = '''# T

```{code-cell} ipython3
:tags: [trained, headline]
result = arl.compare_paired(a, b)
glue(verdict=result.verdict())
```

## Summary

- The headline: {glue:text}`verdict`.
'''


def test_the_check_passes_a_complete_headline_and_catches_each_gap():
    assert problems(SOURCE, None, "t") == []
    assert problems(SOURCE.replace("trained, headline", "trained"), None, "t") == [
        "t: no code cell tagged `headline`"]
    assert any("arl.compare_paired" in p for p in
               problems(SOURCE.replace("compare_paired", "compare"), None, "t"))
    assert any("summary" in p for p in
               problems(SOURCE.replace("{glue:text}`verdict`", "done"), None, "t"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "x", metadata={"tags": ["headline"]},
        outputs=[nbformat.v4.new_output("stream", name="stdout", text="a table\n")])])
    assert any("verdict" in p for p in problems(SOURCE, nb, "t"))
    nb.cells[0].outputs[0]["text"] = "not established at α = 0.05 (p = 0.2)\n"
    assert problems(SOURCE, nb, "t") == []
