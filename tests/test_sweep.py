"""The sweep command (chapter 14): one directory per run, a summary, resuming an
interrupted sweep without redoing finished runs, and refusing a directory of another sweep."""
import json
import shutil

import pytest

from agentrl import sweep

ARGS = ['--presets', 'default', '--seeds', '0', '1', '--steps', '1', '--processes', '1',
        '--no-progress']


def test_sweep_writes_runs_and_summary_and_resumes(tmp_path, capsys):
    out = tmp_path / 'sweep'
    assert sweep.main(['--out', str(out), *ARGS]) == 0
    for seed in (0, 1):
        run = out / f'default-seed{seed}'
        assert {p.name for p in run.iterdir()} == {'history.json', 'config.json', 'eval.json'}
    assert (out / 'summary.png').exists()
    first = (out / 'summary.csv').read_text()
    assert first.splitlines()[0] == 'preset,seed,reward_last10,reads_last10,heldout_pass'
    shutil.rmtree(out / 'default-seed1')                 # as if interrupted before it
    (out / '.default-seed1.partial').mkdir()             # with a half-written run left over
    capsys.readouterr()
    sweep.main(['--out', str(out), *ARGS])
    assert '1 run(s) already finished' in capsys.readouterr().out
    assert (out / 'summary.csv').read_text() == first   # the rerun gives the same numbers
    assert not (out / '.default-seed1.partial').exists()


def test_sweep_refuses_a_directory_of_another_sweep(tmp_path, capsys):
    out = tmp_path / 'sweep'
    out.mkdir()
    (out / 'sweep.json').write_text(json.dumps(dict(presets=['dapo'], seeds=[0, 1], steps=1,
                                                    base_seed=0)))
    with pytest.raises(SystemExit) as stop:
        sweep.main(['--out', str(out), *ARGS])
    assert stop.value.code == 2
    assert "presets: ['dapo'] there, ['default'] asked" in capsys.readouterr().err


@pytest.mark.parametrize('argv, message', [
    (['--presets', 'nope'], "invalid choice: 'nope'"),
    (['--seeds', '1', '1'], 'must not repeat'),
    (['--steps', '0'], 'must be at least 1')])
def test_sweep_rejects_bad_options(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        sweep.parse_args(['--out', str(tmp_path / 's'), *argv])
    assert message in capsys.readouterr().err


def test_the_summary_leaves_the_matplotlib_backend_alone(tmp_path):
    import matplotlib
    backend = matplotlib.get_backend()
    matplotlib.use('svg')                          # as a notebook's inline backend would be
    try:
        sweep.main(['--out', str(tmp_path / 'sweep'), *ARGS])
        assert matplotlib.get_backend() == 'svg'
    finally:
        matplotlib.use(backend)
    assert (tmp_path / 'sweep' / 'summary.png').stat().st_size > 0
