"""The line-length rule (issue 14): chapter code lines and printed output lines are at most 88
characters, so that nothing is cut off in the site's code boxes (tools/smoke.py measures the boxes;
_static/agentrl.css makes them hold 90 characters from a 1280-px window up).

`python tools/line_length.py` lists every offending line with its chapter, cell, line and length.
"""
from __future__ import annotations

import json

import pytest

import line_length
from conftest import REPO


def test_no_chapter_line_is_longer_than_88_characters():
    found = line_length.long_lines(REPO)
    counts = line_length.counts(found)
    assert not found, (f"{len(found)} lines over {line_length.LIMIT} characters "
                       f"(per chapter: {counts}); wrap them:\n" + "\n".join(map(str, found)))


@pytest.fixture
def tiny_book(tmp_path):
    (tmp_path / "book" / "recorded").mkdir(parents=True)
    return tmp_path


def test_an_over_long_code_line_is_named_by_chapter_cell_line_and_length(tiny_book):
    ok = "x = 1"
    long = "y = [" + ", ".join(["1"] * 30) + "]"                     # 94 characters
    src = ("---\njupytext: {}\n---\n\n# T\n\nProse may be long: " + "w" * 120 + "\n\n"
           f"```{{code-cell}} ipython3\n{ok}\n```\n\n"
           f"```{{code-cell}} ipython3\n---\ntags: [x]\n---\n{ok}\n{long}\n```\n\n"
           f"```bash\n{'z' * 89}\n```\n\n```{{note}}\n{'n' * 120}\n```\n")
    (tiny_book / "book" / "01-t.md").write_text(src)
    found = [str(f) for f in line_length.long_lines(tiny_book)]
    assert found == [
        f"book/01-t.md: code cell 2, line 18: 94 chars (> 88): {long[:60]!r}",
        f"book/01-t.md: code block at line 21, line 22: 89 chars (> 88): {'z' * 60!r}",
    ]


def test_an_over_long_output_line_is_named(tiny_book):
    nb = {"cells": [
        {"cell_type": "markdown", "source": "w" * 200, "metadata": {}},
        {"cell_type": "code", "source": "print()", "metadata": {}, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["short\n", "a" * 88 + "\n"]}]},
        {"cell_type": "code", "source": "x", "metadata": {}, "outputs": [
            {"output_type": "execute_result", "data": {"text/plain": "ok\n" + "b" * 95},
             "metadata": {}},
            {"output_type": "display_data", "metadata": {},
             "data": {"image/png": "", "text/plain": "<Figure " + "c" * 100 + ">"}},
            {"output_type": "error", "ename": "E", "evalue": "",
             "traceback": ["\x1b[0;31m" + "d" * 88 + "\x1b[0m"]}]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tiny_book / "book" / "recorded" / "01-t.ipynb").write_text(json.dumps(nb))
    found = [str(f) for f in line_length.long_lines(tiny_book)]
    assert found == [f"book/recorded/01-t.ipynb: output 1 of code cell 2, output line 2: "
                     f"95 chars (> 88): {'b' * 60!r}"]


def test_wide_characters_count_double():
    assert line_length.width("漢字") == 4 and line_length.width("\tx") == 9
