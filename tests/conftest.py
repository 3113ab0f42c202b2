"""Shared fixtures: the repo root and copies of the fixture book (tests/fixtures/book), and the
garbage calls the environment fuzz tests send."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "book"
sys.path.insert(0, str(REPO / "tools"))


def copy_fixture(dest: Path) -> Path:
    """A fresh copy of the fixture book at dest, with the real _config.yml and _static."""
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("_build", "agentrl", "recorded",
                                                                 "__pycache__"))
    shutil.copy(REPO / "_config.yml", dest / "_config.yml")
    shutil.copytree(REPO / "_static", dest / "_static")
    (dest / "tools").mkdir(exist_ok=True)                 # the site's Sphinx extension
    shutil.copy(REPO / "tools" / "agentrl_sphinx.py", dest / "tools" / "agentrl_sphinx.py")
    return dest


def run_tool(tool: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / tool), *args],
                          capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def book(tmp_path) -> Path:
    """A writable copy of the fixture book (not tangled, not recorded)."""
    return copy_fixture(tmp_path / "book")


@pytest.fixture(scope="session")
def recorded_book(tmp_path_factory) -> Path:
    """The fixture book, tangled and recorded once per session (read-only for tests)."""
    root = copy_fixture(tmp_path_factory.mktemp("recorded") / "book")
    r = run_tool("record.py", "--root", str(root), "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    return root


@pytest.fixture
def recorded_copy(recorded_book, tmp_path) -> Path:
    """A writable copy of the recorded fixture book."""
    dest = tmp_path / "book"
    shutil.copytree(recorded_book, dest, ignore=shutil.ignore_patterns("_build", "__pycache__"))
    return dest


def garbage_call(rng, words) -> str:
    """One call for an environment fuzz test: words strung at random (40%), random unicode
    (10%), or a well-formed call (50%)."""
    import agentrl as arl
    kind = rng.random()
    if kind < 0.4:
        return ' '.join(rng.choice(words) for _ in range(rng.randint(0, 4)))
    if kind < 0.5:
        return ''.join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 8)))
    return rng.choice(['read', 'test', 'submit'] + [f'edit {op}' for op in arl.EDIT_OPS])
