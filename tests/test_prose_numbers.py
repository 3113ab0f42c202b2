"""Prose numbers come from the record: agentrl.prose.glue and tools/prose_numbers.py."""
from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

import prose_numbers
from agentrl.prose import GLUE_PREFIX, glue
from conftest import REPO

CHAPTER = """---
jupytext: {}
agentrl:
  literals: ["0.2"]
---
# T

The clip is 0.2 and the run passed {glue:text}`pass_rate` (see {numref}`Section %s <sec-x>`).
We used torch 2.13.0, see [the docs](https://example.org/v1.5/page).
Check it with `python -m agentrl.exercises check 9.3 FILE`.

```{code-cell} ipython3
x = 0.75
```

```{note}
Held-out pass was 0.875 in this run.
```

$$ \\epsilon = 0.2, \\quad J = 0.31 $$

```text
a listing with 0.5 in it
```
"""


def test_bare_decimals_finds_quoted_results_only():
    found = prose_numbers.bare_decimals(CHAPTER, prose_numbers.chapter_literals(CHAPTER))
    assert [tok for _, tok, _ in found] == ["0.875", "0.31"]
    lines = CHAPTER.split("\n")
    assert all(tok in lines[n - 1] for n, tok, _ in found)


def test_without_declared_literals_definitions_are_reported():
    found = prose_numbers.bare_decimals(CHAPTER, set())
    assert [tok for _, tok, _ in found] == ["0.2", "0.875", "0.2", "0.31"]


def test_literals_must_be_a_list():
    with pytest.raises(ValueError, match="literals"):
        prose_numbers.chapter_literals("---\nagentrl:\n  literals: 0.2\n---\n")


def test_every_chapter_quotes_its_decimals_from_the_record():
    chapters = sorted(p for p in (REPO / "book").glob("*.md")
                      if prose_numbers.CHAPTER_RE.match(p.name))
    msgs = prose_numbers.check(chapters)
    assert not msgs, ("decimals in the prose that are neither glued ({glue:text}`name`) nor "
                      "declared in front matter agentrl.literals:\n" + "\n".join(msgs))


def test_glue_refuses_floats_and_bad_names():
    with pytest.raises(TypeError, match="format numbers"):
        glue(x=0.5)
    with pytest.raises(TypeError, match="bool"):
        glue(x=True)
    with pytest.raises(ValueError, match="identifier"):
        glue(**{"not a name": "1"})
    glue(x="0.500", n=3)          # outside a notebook: records nothing, raises nothing


def _glue_notebook(recorded: str):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("from agentrl.prose import glue\nglue(rate='0.500')")
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={GLUE_PREFIX + "text/plain": repr(recorded)},
        metadata={"scrapbook": {"name": "rate", "mime_prefix": GLUE_PREFIX}})]
    cell.execution_count = 1
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


@pytest.mark.parametrize("recorded, passes", [("0.500", True), ("0.501", False)])
def test_nbval_compares_glued_values(tmp_path, recorded, passes):
    path = tmp_path / "glued.ipynb"
    nbformat.write(_glue_notebook(recorded), path)
    r = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
                        "-p", "no:cacheprovider", "-q", str(path)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert (r.returncode == 0) == passes, r.stdout[-2000:]


def test_bounded_prints_a_bound_for_rounding_and_a_value_above_it():
    from agentrl.prose import bounded
    assert bounded(3.1e-15) == "<1e-12" and bounded(-6.9e-17) == "<1e-12" and bounded(0.0) == "<1e-12"
    assert bounded(2.5e-12) == "2.5e-12" and bounded(-0.031) == "-3.1e-02"
    assert bounded(3e-9, bound=1e-8) == "<1e-08"
    with pytest.raises(ValueError, match="bound must be positive, got 0"):
        bounded(1.0, bound=0)


def test_span_reads_lowest_to_highest_and_collapses_equal_ends():
    from agentrl.prose import span
    assert span([0.31, 0.2, 0.25], ".2f") == "0.20 to 0.31"
    assert span([0.301, 0.299], ".2f") == "0.30"          # equal once formatted: one number
    assert span((x for x in [3]), "d") == "3"
    with pytest.raises(ValueError, match="at least one"):
        span([], ".2f")
