"""Recorded notebooks: fresh (match their chapter), complete, clean; and the record tool itself."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import record
import tangle
from conftest import REPO, run_tool

ALLOW_STDERR_TAG = "allow-stderr"          # a cell that deliberately shows a warning
RAISES_TAG = "raises-exception"            # a cell that deliberately raises


def toc_chapters(root: Path = REPO) -> list[str]:
    return tangle.toc_chapters(root)


def output_problems(ipynb: Path) -> list[str]:
    """Error outputs outside `raises-exception` cells, stderr outside `allow-stderr` cells."""
    nb = nbformat.read(ipynb, as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = cell.metadata.get("tags", [])
        for out in cell.outputs:
            if out.output_type == "error" and RAISES_TAG not in tags:
                problems.append(f"{ipynb.name}: cell {i} has an error output: {out.ename}: "
                                f"{out.evalue}")
            if out.output_type == "stream" and out.name == "stderr" and ALLOW_STDERR_TAG not in tags:
                first = out.text.strip().split("\n")[0][:120]
                problems.append(f"{ipynb.name}: cell {i} writes to stderr: {first!r} (fix it at "
                                f"the source, or tag the cell '{ALLOW_STDERR_TAG}' on purpose)")
        if RAISES_TAG in tags and not any(o.output_type == "error" for o in cell.outputs):
            problems.append(f"{ipynb.name}: cell {i} is tagged {RAISES_TAG} but raised nothing")
    return problems


# ----------------------------------------------------------------------------- the real book

@pytest.mark.parametrize("rel", toc_chapters() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no chapters in _toc.yml yet"))])
def test_book_chapter_record_is_fresh_and_clean(rel):
    md = REPO / rel
    ipynb = record.recorded_path(REPO, md)
    assert ipynb.exists(), f"{rel} is in _toc.yml but has no record: python tools/record.py {rel}"
    problem = record.stale_report(md, ipynb)
    assert problem is None, problem
    assert output_problems(ipynb) == []
    meta = nbformat.read(ipynb, as_version=4).metadata["agentrl_record"]
    assert {"torch", "threads", "python", "cpu_vendor", "cpu_model", "cpu_capability",
            "mkl_cbwr"} <= set(meta), f"{rel}: the record does not name its CPU kind (re-record)"


def test_every_record_belongs_to_a_chapter():
    chapters = {Path(r).stem for r in toc_chapters()} | {
        p.stem for p in (REPO / "book").glob("[0-9][0-9]-*.md")}
    orphans = [p.name for p in (REPO / "book" / "recorded").glob("*.ipynb")
               if p.stem not in chapters]
    assert orphans == [], f"recorded notebooks without a chapter source: {orphans}"


def test_toc_has_no_placeholders_and_sources_exist():
    for rel in toc_chapters():
        assert (REPO / rel).exists(), rel


# ----------------------------------------------------------------------------- the tool, on the fixture

def test_fixture_records_are_fresh_clean_and_annotated(recorded_book):
    for rel in toc_chapters(recorded_book):
        md = recorded_book / rel
        ipynb = record.recorded_path(recorded_book, md)
        assert record.stale_report(md, ipynb) is None
        assert output_problems(ipynb) == []
        nb = nbformat.read(ipynb, as_version=4)
        meta = nb.metadata["agentrl_record"]
        assert meta["threads"] == int(__import__("bookenv").DEFAULT_THREADS)
        assert meta["torch"].startswith(__import__("torch").__version__.split("+")[0])
        assert [c.id for c in nb.cells] == [f"cell-{i}" for i in range(len(nb.cells))]
        assert all("execution" not in c.metadata for c in nb.cells)
        assert "jupytext" not in nb.metadata
    alpha = nbformat.read(recorded_book / "book/recorded/02-alpha.ipynb", as_version=4)
    texts = [o.get("text", "") for c in alpha.cells if c.cell_type == "code" for o in c.outputs]
    assert "4.000\n" in texts                          # saved code ran via `import agentrl`
    figs = [o for c in alpha.cells if c.cell_type == "code" for o in c.outputs
            if "image/png" in o.get("data", {})]
    assert len(figs) == 1


def test_rerecording_an_unchanged_chapter_is_byte_identical(recorded_copy):
    target = recorded_copy / "book/recorded/03-beta.ipynb"
    before = target.read_bytes()
    r = run_tool("record.py", "--root", str(recorded_copy), "book/03-beta.md")
    assert r.returncode == 0, r.stderr
    assert " s\n" in r.stdout                       # prints how long the chapter took
    assert target.read_bytes() == before


def test_stale_record_names_chapter_and_first_differing_cell(recorded_copy):
    md = recorded_copy / "book/03-beta.md"
    ipynb = record.recorded_path(recorded_copy, md)
    md.write_text(md.read_text().replace('print(f"k = {s.k}', 'print(f"k={s.k}'))
    problem = record.stale_report(md, ipynb)
    assert problem and "03-beta.md" in problem and "cell 3 differs" in problem and "k={s.k}" in problem
    code_problem = record.stale_report(md, ipynb, code_only=True)
    assert code_problem and "code cell 2 differs" in code_problem


def test_missing_record_is_reported(book):
    md = book / "book/02-alpha.md"
    problem = record.stale_report(md, record.recorded_path(book, md))
    assert problem and "no recorded notebook" in problem


def test_prose_only_update_keeps_outputs_and_refuses_code_changes(recorded_copy):
    md = recorded_copy / "book/03-beta.md"
    ipynb = record.recorded_path(recorded_copy, md)
    md.write_text(md.read_text().replace("## A scaler", "## A scaler, revisited"))
    assert record.stale_report(md, ipynb) is not None
    r = run_tool("record.py", "--root", str(recorded_copy), "--prose-only", "book/03-beta.md")
    assert r.returncode == 0, r.stderr
    assert record.stale_report(md, ipynb) is None
    assert "k = 3, s(1.5) = 9.000" in ipynb.read_text()
    # the `trained` tag changes how a cell is checked, not what it runs: prose-only carries it
    md.write_text(md.read_text().replace(":tags: [trained]\n", ""))
    assert record.stale_report(md, ipynb) is not None
    r = run_tool("record.py", "--root", str(recorded_copy), "--prose-only", "book/03-beta.md")
    assert r.returncode == 0, r.stderr
    assert record.stale_report(md, ipynb) is None and '"trained"' not in ipynb.read_text()
    assert "after training: 12.000" in ipynb.read_text()
    md.write_text(md.read_text().replace("```{code-cell} ipython3\nprint(f\"after",
                                         "```{code-cell} ipython3\n:tags: [raises-exception]\n"
                                         "print(f\"after"))
    r = run_tool("record.py", "--root", str(recorded_copy), "--prose-only", "book/03-beta.md")
    assert r.returncode != 0 and "code changed" in (r.stderr + r.stdout)   # other tags do run
    md.write_text(md.read_text().replace(":tags: [raises-exception]\n", "")
                  .replace("s(1.5)", "s(2.5)"))
    r = run_tool("record.py", "--root", str(recorded_copy), "--prose-only", "book/03-beta.md")
    assert r.returncode != 0 and "code changed" in (r.stderr + r.stdout)


def test_record_fails_without_writing_when_a_cell_errors(recorded_copy):
    md = recorded_copy / "book/01-intro.md"
    ipynb = record.recorded_path(recorded_copy, md)
    before = ipynb.read_bytes()
    md.write_text(md.read_text().replace("total = sum(range(5))", "total = 1 / 0"))
    r = run_tool("record.py", "--root", str(recorded_copy), "book/01-intro.md")
    assert r.returncode != 0 and "ZeroDivisionError" in r.stderr
    assert ipynb.read_bytes() == before


def test_record_fails_when_tangle_fails(recorded_copy):
    md = recorded_copy / "book/02-alpha.md"
    md.write_text(md.read_text().replace("    return 2 * x\n", "    return 2 * x)\n"))
    r = run_tool("record.py", "--root", str(recorded_copy), "book/02-alpha.md")
    assert r.returncode != 0 and "does not parse" in r.stderr


def test_output_checker_flags_errors_and_stderr(recorded_copy):
    ipynb = recorded_copy / "book/recorded/01-intro.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs.append(nbformat.v4.new_output("stream", name="stderr", text="UserWarning: x\n"))
    cell.outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="bad",
                                               traceback=[]))
    nbformat.write(nb, ipynb)
    problems = output_problems(ipynb)
    assert any("stderr" in p for p in problems) and any("ValueError" in p for p in problems)
    cell.metadata["tags"] = [ALLOW_STDERR_TAG, RAISES_TAG]
    nbformat.write(nb, ipynb)
    assert output_problems(ipynb) == []


def test_nbval_passes_on_fresh_records_and_catches_a_changed_output(recorded_copy):
    r = run_tool("check.py", "--root", str(recorded_copy))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "passed" in r.stdout
    ipynb = recorded_copy / "book/recorded/03-beta.ipynb"
    ipynb.write_text(ipynb.read_text().replace("9.000", "9.001"))
    r = run_tool("check.py", "--root", str(recorded_copy), str(ipynb))
    assert r.returncode != 0
    assert "1 failed" in r.stdout


def test_check_with_no_records_skips_cleanly(book):
    r = run_tool("check.py", "--root", str(book))
    assert r.returncode == 0 and "nbval step skipped" in r.stdout


def report_rows(stdout: str) -> dict[str, list]:
    """check.py's per-chapter table: name -> [mode, cells, held, marked, m.held, m.diff, failed]."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts[:1] and (parts[0].endswith(".ipynb") or parts[0] == "all") and len(parts) in (7, 8):
            mode = parts[1] if len(parts) == 8 else ""
            rows[parts[0]] = [mode] + [int(x) for x in parts[-6:]]
    return rows


def _set_output(ipynb: Path, old: str, new: str):
    text = ipynb.read_text()
    assert old in text
    ipynb.write_text(text.replace(old, new))


def test_contract_reports_a_trained_cell_that_differs_and_fails_an_unmarked_one(recorded_copy):
    ipynb = recorded_copy / "book/recorded/03-beta.ipynb"
    _set_output(ipynb, "after training: 12.000", "after training: 12.001")
    r = run_tool("check.py", "--root", str(recorded_copy), "--mode", "contract", str(ipynb))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    mode, cells, held, marked, m_held, m_diff, failed = report_rows(r.stdout)["03-beta.ipynb"]
    assert (mode, marked, m_held, m_diff, failed) == ("contract", 1, 0, 1, 0)
    assert held == cells - 1
    assert "outputs reported, not compared" in r.stdout and "after training" in r.stdout
    # an unmarked difference fails under the contract (compared exactly, the trained one fails
    # too: test_auto_mode_is_exact_on_the_recording_kind_and_contract_elsewhere)
    _set_output(ipynb, "9.000", "9.001")
    r = run_tool("check.py", "--root", str(recorded_copy), "--mode", "contract", str(ipynb))
    assert r.returncode != 0
    assert "FAILED (outputs differ and the cell is not tagged 'trained')" in r.stdout


def test_contract_fails_a_trained_cell_that_raises(recorded_copy):
    ipynb = recorded_copy / "book/recorded/03-beta.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    cell = next(c for c in nb.cells if "trained" in c.metadata.get("tags", []))
    cell.source = "raise RuntimeError('a trained cell that breaks')"
    nbformat.write(nb, ipynb)
    r = run_tool("check.py", "--root", str(recorded_copy), "--mode", "contract", str(ipynb))
    assert r.returncode != 0
    assert "FAILED (raised, timed out or failed to run)" in r.stdout


def test_auto_mode_is_exact_on_the_recording_kind_and_contract_elsewhere(recorded_copy):
    ipynb = recorded_copy / "book/recorded/03-beta.ipynb"
    meta = nbformat.read(ipynb, as_version=4).metadata["agentrl_record"]
    assert {"cpu_vendor", "cpu_model", "cpu_capability", "mkl_cbwr"} <= set(meta)
    r = run_tool("check.py", "--root", str(recorded_copy), str(ipynb))
    assert r.returncode == 0 and "mode exact (this machine is the recording CPU kind)" in r.stdout
    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata["agentrl_record"]["cpu_model"] = "Another CPU (family 0, model 0)"
    nbformat.write(nb, ipynb)
    _set_output(ipynb, "after training: 12.000", "after training: 12.001")
    r = run_tool("check.py", "--root", str(recorded_copy), str(ipynb))
    assert r.returncode == 0, r.stdout[-3000:]
    assert "mode contract (another CPU kind" in r.stdout and "Another CPU" in r.stdout
    env_run = subprocess.run([sys.executable, str(REPO / "tools/check.py"), "--root",
                              str(recorded_copy), str(ipynb)], capture_output=True, text=True,
                             env={**os.environ, "AGENTRL_CHECK_MODE": "exact"})
    assert env_run.returncode != 0 and "mode exact for every record (forced)" in env_run.stdout
    assert report_rows(env_run.stdout)["03-beta.ipynb"][-1] == 1      # the trained cell fails
    r = run_tool("check.py", "--root", str(recorded_copy), "--mode", "sometimes", str(ipynb))
    assert r.returncode == 2 and "'sometimes'" in r.stderr and "exact" in r.stderr


def test_other_kernels_checks_that_every_unmarked_cell_holds(recorded_copy):
    r = run_tool("check.py", "--root", str(recorded_copy), "--other-kernels", "--jobs", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = report_rows(r.stdout)
    assert rows["all"][1] == sum(v[1] for k, v in rows.items() if k != "all")
    assert rows["03-beta.ipynb"][3] == 1 and rows["all"][-1] == 0
    assert "MKL_CBWR=COMPATIBLE" in r.stdout and "every unmarked cell holds" in r.stdout
    beta = recorded_copy / "book/recorded/03-beta.ipynb"
    _set_output(beta, "9.000", "9.001")
    r = run_tool("check.py", "--root", str(recorded_copy), "--other-kernels", str(beta))
    assert r.returncode == 1 and report_rows(r.stdout)["all"][-1] == 1


def test_coalesce_streams_joins_a_cells_consecutive_prints_of_one_stream():
    import nbformat
    from record import coalesce_streams
    out = lambda name, text: nbformat.v4.new_output('stream', name=name, text=text)  # noqa: E731
    png = nbformat.v4.new_output('display_data', data={'image/png': 'AA=='})
    merged = coalesce_streams([out('stdout', 'a\n'), out('stdout', 'b\n'), out('stderr', 'w\n'),
                               out('stdout', 'c\n'), png, out('stdout', 'd\n')])
    assert [(o.get('name'), o.get('text')) for o in merged] == [
        ('stdout', 'a\nb\n'), ('stderr', 'w\n'), ('stdout', 'c\n'), (None, None),
        ('stdout', 'd\n')]
