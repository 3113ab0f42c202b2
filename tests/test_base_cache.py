"""tools/base_cache.py: chapter kernels of one check run share the base agents they clone."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import base_cache  # noqa: E402

KINDS = ("oracle",)          # a small demonstration set: cloning takes a fraction of a second

CLONE = f"""
import sys, torch
import agentrl as arl
sys.path.insert(0, {str(ROOT / 'tools')!r})
import base_cache
assert base_cache.install()
if sys.argv[1] == 'load':      # this process must not clone
    arl.agent.behavior_clone = lambda *a, **k: (_ for _ in ()).throw(AssertionError('cloned'))
tok = arl.build_tokenizer(arl.make_tasks('all'))
model = arl.make_base_agent(tok, kinds={KINDS!r})
torch.save(model.state_dict(), sys.argv[2])
print(model.training)
"""


def run(*args, env):
    return subprocess.run([sys.executable, "-c", CLONE, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_a_second_process_loads_the_agent_the_first_cloned_bit_for_bit(tmp_path):
    env = {**os.environ, base_cache.ENV: str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    first = run("clone", str(tmp_path / "a.pt"), env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(list((tmp_path / "cache").glob("base-*.pt"))) == 1
    second = run("load", str(tmp_path / "b.pt"), env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert first.stdout.split() == second.stdout.split() == ["False"]      # eval mode kept
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_without_the_environment_variable_nothing_is_installed(monkeypatch):
    monkeypatch.delenv(base_cache.ENV, raising=False)
    assert base_cache.install() is False


def test_a_failed_write_leaves_no_file_that_looks_done(tmp_path, monkeypatch):
    cache = base_cache.DiskBaseCache(tmp_path)

    def broken_save(obj, path):
        Path(path).write_bytes(b"half a model")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        cache["key"] = torch.nn.Linear(2, 2)
    assert not cache.path("key").exists()
    fresh = base_cache.DiskBaseCache(tmp_path)
    assert "key" not in fresh
    with pytest.raises(KeyError):
        fresh["key"]


def test_keys_that_differ_get_different_files(tmp_path):
    cache = base_cache.DiskBaseCache(tmp_path)
    assert cache.path((("a",), 0, ("oracle",))) != cache.path((("a",), 1, ("oracle",)))


def test_the_startup_file_installs_the_cache_in_an_ipython_session(tmp_path):
    env = {**os.environ, **base_cache.kernel_env(tmp_path), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "-c",
                        "import agentrl.agent as a; print(type(a._BASE_CACHE).__name__, "
                        "a._BASE_CACHE.folder)"],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"DiskBaseCache {tmp_path / 'base-agents'}" in r.stdout, r.stdout
