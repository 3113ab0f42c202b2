"""The benchmarks still run against the library: every benchmark script imports, and the timed
copy of train_rl's loop in bench_grpo_step takes a step with a tiny agent (a library API change
that the benchmark does not follow fails here, not when someone next measures)."""
import importlib.util
from pathlib import Path

import pytest
import torch

import agentrl as arl
from conftest import REPO

SCRIPTS = sorted((REPO / 'benchmarks').glob('bench_*.py'))


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('path', SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_script_imports(path):
    assert hasattr(load(path), 'main')


def test_grpo_step_benchmark_takes_a_step_with_a_tiny_agent():
    bench = load(REPO / 'benchmarks' / 'bench_grpo_step.py')
    tasks = arl.make_tasks('train')
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    base = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, max_turns=2)
    rows = bench.timed_steps(base, tasks, tok, cfg, steps=1, warmup=0)
    assert len(rows) == 1 and rows[0]['total'] > 0
