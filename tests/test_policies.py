"""Saved policies (agentrl.policies), the base-agent disk cache, and python -m agentrl.evaluate:
a loaded policy is the saved one bit for bit and samples what it sampled; files are whole or
absent; the evaluation's numbers are arl.evaluate's, with standard errors over tasks."""
import dataclasses
import functools
import json
import math
import os

import pytest
import torch

import agentrl as arl
from agentrl import evaluation as evaluate_cli
from agentrl import policies


@pytest.fixture(scope='module')
def tok():
    return arl.build_tokenizer(arl.make_tasks('all'))


@pytest.fixture
def small(tok):
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=128,
                          seed=3)
    return model, arl.RLConfig(seed=5, max_turns=3, group_size=2, temperature=0.9)


def _sample(model, tok, cfg, seed=0):
    tasks = arl.make_tasks('train')[:3]
    return arl.sample_groups(model, functools.partial(arl.make_env, cfg), tasks, tok, cfg,
                             torch.Generator().manual_seed(seed))


def test_a_loaded_policy_is_the_saved_one_and_samples_the_same(tmp_path, tok, small):
    model, cfg = small
    path = policies.save_policy(tmp_path / 'policy.pt', model, tok, cfg)
    loaded, loaded_tok, loaded_cfg = policies.load_policy(path)
    assert loaded_tok.vocab == tok.vocab and loaded_cfg == cfg
    assert policies.policy_spec(loaded) == policies.policy_spec(model)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b) and a.dtype == b.dtype, name
    here, there = _sample(model, tok, cfg), _sample(loaded, loaded_tok, loaded_cfg)
    assert [t.ids.tolist() for t in here] == [t.ids.tolist() for t in there]


def test_a_policy_without_a_config_loads_with_none(tmp_path, tok, small):
    policies.save_policy(tmp_path / 'p.pt', small[0], tok)
    assert policies.load_policy(tmp_path / 'p.pt')[2] is None


@pytest.mark.parametrize('content', [b'', b'not a torch file', 'other-format'])
def test_anything_but_a_policy_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / 'bad.pt'
    if content == 'other-format':
        torch.save({'format': 'something else'}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match='is not a policy file'):
        policies.load_policy(path)


def test_save_policy_checks_what_it_is_given(tmp_path, tok, small):
    with pytest.raises(TypeError, match='keeps a TinyAgent'):
        policies.save_policy(tmp_path / 'p.pt', torch.nn.Linear(2, 2), tok)
    other = arl.Tokenizer(['read', 'test'])
    with pytest.raises(ValueError, match='words, the model'):
        policies.save_policy(tmp_path / 'p.pt', small[0], other)


def test_a_failed_write_leaves_the_old_policy_and_no_temporary(tmp_path, tok, small,
                                                                monkeypatch):
    path = policies.save_policy(tmp_path / 'policy.pt', small[0], tok)
    before = path.read_bytes()

    def crash(*args):
        raise OSError('disk full')

    monkeypatch.setattr(os, 'replace', crash)
    bigger = arl.TinyAgent(len(tok), d_model=32, n_layers=1, n_heads=2, d_ff=32, seed=1)
    with pytest.raises(OSError, match='disk full'):
        policies.save_policy(path, bigger, tok)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ['policy.pt']


def test_the_base_agent_cache_builds_once_then_loads_the_same(tmp_path, tok, monkeypatch):
    monkeypatch.setenv('AGENTRL_CACHE', str(tmp_path))
    built = []
    real = arl.make_base_agent

    def counting(tok_, seed=0, **kwargs):
        built.append(seed)
        return real(tok_, seed, **kwargs)

    monkeypatch.setattr(arl, 'make_base_agent', counting)
    said = []
    first = policies.base_agent(tok, 0, base='default', say=said.append)
    second = policies.base_agent(tok, 0, base='default', say=said.append)
    assert built == [0] and 'behaviour cloning' in said[0] and 'from the cache' in said[1]
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))
    cached, = tmp_path.glob('base-default-seed0-*.pt')
    cached.write_bytes(b'')                           # a damaged cache file is rebuilt
    policies.base_agent(tok, 0, base='default', say=said.append)
    assert built == [0, 0]
    with pytest.raises(ValueError, match="base must be one of"):
        policies.base_agent(tok, 0, base='nope')


def test_clustered_means_known_values():
    rows = [dict(x=1.0), dict(x=1.0), dict(x=0.0), dict(x=0.0)]    # two tasks of two
    mean, se = evaluate_cli.clustered_means(rows, 2)['x']
    assert mean == 0.5 and math.isclose(se, statistics_stdev([1.0, 0.0]) / math.sqrt(2))
    assert evaluate_cli.clustered_means(rows[:2], 2)['x'] == (1.0, 0.0)
    with pytest.raises(ValueError, match='do not split into tasks of 3'):
        evaluate_cli.clustered_means(rows, 3)


def statistics_stdev(values):
    import statistics
    return statistics.stdev(values)


def test_evaluate_policy_means_are_arl_evaluates(tok, small):
    model, cfg = small
    tasks = arl.make_tasks('heldout')[:4]
    ours = evaluate_cli.evaluate_policy(model, tok, cfg, tasks, samples=3, seed=2)
    theirs = arl.evaluate(model, tasks, tok, 3, cfg.temperature,
                          torch.Generator().manual_seed(2), cfg)
    assert {k: v[0] for k, v in ours.items() if isinstance(v, tuple)} == theirs
    assert ours['n_tasks'] == 4 and ours['n_episodes'] == 12


def test_evaluate_cli_on_a_run_folder(tmp_path, tok, small, capsys):
    model, cfg = small
    policies.save_policy(tmp_path / 'policy.pt', model, tok, cfg)
    out = tmp_path / 'e.json'
    assert evaluate_cli.main([str(tmp_path), '--samples', '2', '--json', str(out)]) == 0
    printed = capsys.readouterr().out
    assert 'pass@1' in printed and 'heldout split, 10 tasks x 2 episodes' in printed
    record = json.loads(out.read_text())
    assert record['n_samples'] == 2 and 'pass_rate' in record['standard_errors']
    again = tmp_path / 'again.json'
    evaluate_cli.main([str(tmp_path / 'policy.pt'), '--samples', '2', '--json', str(again)])
    assert json.loads(again.read_text())['pass_rate'] == record['pass_rate']


@pytest.mark.parametrize('argv, message', [
    (['nowhere'], 'no policy at'), (['.', '--samples', '0'], '--samples must be at least 1'),
    (['.', '--split', 'test'], "invalid choice: 'test'"),
    (['.', '--temperature', '0'], '--temperature must be a positive number')])
def test_evaluate_cli_bad_input_exits_2_naming_it(tmp_path, capsys, argv, message, tok, small):
    policies.save_policy(tmp_path / 'policy.pt', small[0], tok, small[1])
    argv = [str(tmp_path) if a == '.' else str(tmp_path / a) if a == 'nowhere' else a
            for a in argv]
    with pytest.raises(SystemExit) as stop:
        evaluate_cli.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_the_command_module_refuses_an_import_that_would_hide_arl_evaluate():
    with pytest.raises(ImportError, match='import agentrl.evaluation'):
        import agentrl.evaluate  # noqa: F401
    assert callable(arl.evaluate) and not isinstance(arl.evaluate, type(os))


def test_python_m_agentrl_evaluate_runs(tmp_path, tok, small):
    import subprocess
    import sys
    from pathlib import Path
    policies.save_policy(tmp_path / 'policy.pt', small[0], tok, small[1])
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, '-m', 'agentrl.evaluate', str(tmp_path),
                           '--samples', '1', '--split', 'heldout'], capture_output=True,
                          text=True, cwd=repo, env=dict(os.environ, PYTHONPATH=str(repo)),
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'pass@1' in done.stdout
