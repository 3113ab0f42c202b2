"""Shared fixtures: the repo root and copies of the fixture book (tests/fixtures/book), and the
garbage calls the environment fuzz tests send."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EPS64 = 2.0 ** -52                     # float64 machine epsilon (torch.finfo(torch.float64).eps)
FIXTURE = REPO / "tests" / "fixtures" / "book"
sys.path.insert(0, str(REPO / "tools"))

# A test command started in the background (`bash tools/test_all.sh &`) inherits SIGINT ignored,
# and Python then installs no KeyboardInterrupt handler, in this process or in the commands it
# starts: the Ctrl-C tests would fail for how the suite was launched. Restore the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if not os.environ.get("AGENTRL_CACHE"):         # base agents cached for this test run only
    import atexit
    import tempfile
    os.environ["AGENTRL_CACHE"] = tempfile.mkdtemp(prefix="agentrl-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AGENTRL_CACHE"], True)

if os.environ.get("PYTEST_XDIST_WORKER"):      # two workers on two cores: one thread each
    import torch
    torch.set_num_threads(1)


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


def logp_roundoff(model, tokens: int, magnitude: float = 10.0) -> float:
    """A bound, true on any CPU, for the gap between two float64 computations of a sum of
    `tokens` log-probabilities of a TinyAgent that differ only in summation order (another
    batch layout, another CPU's kernels).

    Each log-probability is the end of a chain of accumulations: per block, a LayerNorm and
    attention over up to max_len positions, the QKV and output projections over d_model terms,
    the MLP over d_model and d_ff terms; then the head over d_model terms and the logsumexp over
    the vocabulary. A sum of n terms carries a rounding error of at most n * eps times the sum
    of their magnitudes (the standard a-priori bound); activations after LayerNorm are of order
    one and `magnitude` covers the size of the logits. The bound is loose by design: it follows
    from the computation, not from one machine's bits.
    """
    d = model.embed.embedding_dim
    blocks = list(model.blocks)
    d_ff = blocks[0].mlp[0].out_features if blocks else 0
    per_block = 2 * d + model.max_len + 3 * d + d + d + d_ff
    inner = len(blocks) * per_block + d + model.head.out_features
    return tokens * inner * magnitude * EPS64


def pytest_collection_modifyitems(config, items):
    """The site tests (the longest group: two strict builds and the browser smoke test) first,
    so that with pytest-xdist one worker starts on them at once while the other runs the rest;
    the order within each part is kept."""
    items.sort(key=lambda item: item.get_closest_marker("site") is None)
