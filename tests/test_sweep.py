"""The sweep command (chapter 14): one directory per run, a summary, resuming an
interrupted sweep without redoing finished runs, and refusing a directory of another sweep."""
import json
import shutil
from pathlib import Path

import pytest

from agentrl import sweep

ARGS = ['--presets', 'default', '--seeds', '0', '1', '--steps', '1', '--processes', '1',
        '--no-progress']


def test_sweep_writes_runs_and_summary_and_resumes(tmp_path, capsys):
    out = tmp_path / 'sweep'
    assert sweep.main(['--out', str(out), *ARGS]) == 0
    for seed in (0, 1):
        run = out / f'default-seed{seed}'
        assert {p.name for p in run.iterdir()} == {'history.json', 'config.json', 'eval.json',
                                                   'policy.pt', 'curves.png'}
    assert (out / 'summary.png').exists()
    first = (out / 'summary.csv').read_text()
    assert first.splitlines()[0] == 'preset,seed,reward_last1,reads_last1,heldout_pass'
    shutil.rmtree(out / 'default-seed1')                 # as if interrupted before it
    (out / '.default-seed1.partial').mkdir()             # with a half-written run left over
    capsys.readouterr()
    sweep.main(['--out', str(out), *ARGS])
    assert '1 run(s) already finished' in capsys.readouterr().out
    assert (out / 'summary.csv').read_text() == first   # the rerun gives the same numbers
    assert not (out / '.default-seed1.partial').exists()


class CountingBar:
    """Stands in for tqdm: records its total and every update."""
    made = []

    def __init__(self, total, **kwargs):
        self.total, self.n = total, 0
        CountingBar.made.append(self)

    def update(self, n=1):
        self.n += n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize('processes', ['1', '2'])
def test_sweep_scores_held_out_periodically_and_counts_steps(tmp_path, monkeypatch, processes):
    """Each run's history holds the held-out pass rate every --eval-every steps and at the last,
    as the train command's does; the progress bar advances once per training step of every run,
    in this process and from worker processes."""
    import tqdm.auto
    monkeypatch.setattr(tqdm.auto, 'tqdm', CountingBar)
    CountingBar.made.clear()
    out = tmp_path / 'sweep'
    argv = ['--out', str(out), '--seeds', '0', '1', '--steps', '3', '--eval-every', '2',
            '--processes', processes]
    assert sweep.main(argv) == 0
    (bar,) = CountingBar.made
    assert (bar.total, bar.n) == (6, 6)
    for seed in (0, 1):
        history = json.loads((out / f'default-seed{seed}' / 'history.json').read_text())
        assert ['eval_pass' in h for h in history] == [True, False, True]
        config = json.loads((out / f'default-seed{seed}' / 'config.json').read_text())
        assert config['eval_every'] == 2
    assert json.loads((out / 'sweep.json').read_text())['eval_every'] == 2


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
    (['--steps', '0'], 'must be at least 1'),
    (['--eval-every', '-1'], '--eval-every must be 0 or more, got -1')])
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


def _sweep(out, *extra):
    return sweep.main(['--out', str(out), *ARGS, *extra])


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
    """An uninterrupted sweep's folder, to copy and damage."""
    out = tmp_path_factory.mktemp('done') / 'sweep'
    assert _sweep(out) == 0
    return out


@pytest.mark.parametrize('damage', ['empty history', 'truncated eval', 'empty folder',
                                    'another sweep', 'no config'])
def test_a_damaged_run_is_not_taken_as_finished(finished, tmp_path, capsys, damage):
    out = tmp_path / 'sweep'
    shutil.copytree(finished, out)
    run = out / 'default-seed1'
    if damage == 'empty history':                     # what a power loss before fsync leaves
        (run / 'history.json').write_text('')
    elif damage == 'truncated eval':
        text = (run / 'eval.json').read_text()
        (run / 'eval.json').write_text(text[:len(text) // 2])
    elif damage == 'empty folder':
        shutil.rmtree(run)
        run.mkdir()
    elif damage == 'another sweep':
        config = json.loads((run / 'config.json').read_text())
        (run / 'config.json').write_text(json.dumps(dict(config, steps=99)))
    else:
        (run / 'config.json').unlink()
    capsys.readouterr()
    assert _sweep(out) == 0
    assert '1 run(s) already finished' in capsys.readouterr().out
    for name in ('history.json', 'config.json', 'eval.json'):
        assert (run / name).read_bytes() == (finished / 'default-seed1' / name).read_bytes()
    assert (out / 'summary.csv').read_bytes() == (finished / 'summary.csv').read_bytes()


def test_two_sweeps_cannot_write_one_folder(tmp_path, capsys):
    from agentrl import runs
    out = tmp_path / 'sweep'
    with runs.locked(out):                            # as another sweep would hold it
        assert _sweep(out) == 2
    assert 'is being written by another process' in capsys.readouterr().err
    assert not (out / 'sweep.json').exists()


def test_sweep_rejects_seeds_that_train_rejects(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        sweep.parse_args(['--out', str(tmp_path / 's'), '--seeds', '-1'])
    assert stop.value.code == 2
    assert 'seed must be in [0, 18446744073709551615], got -1' in capsys.readouterr().err
    assert not (tmp_path / 's').exists()


def test_sweep_kills_at_random_moments_then_resumed_end_as_one_uninterrupted(
        finished, tmp_path):
    """SIGKILL a sweep process at random moments, again and again, then let it finish: its
    folder ends byte for byte as the uninterrupted sweep's."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time
    out, rng = tmp_path / 'sweep', random.Random(0)
    command = [sys.executable, '-m', 'agentrl.sweep', '--out', str(out), *ARGS]
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONHASHSEED='0')
    start = time.perf_counter()                       # one whole run: how long one takes
    assert subprocess.run(command, env=env, cwd=repo, capture_output=True).returncode == 0
    seconds = time.perf_counter() - start
    shutil.rmtree(out)
    kills = 0
    for _ in range(40):
        if kills == 6:
            break
        launched = time.perf_counter()
        process = subprocess.Popen(command, env=env, cwd=repo, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.1, 0.95) * seconds)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        elif process.wait() == 0:                    # it finished first: start afresh,
            shutil.rmtree(out)                       # and aim earlier (the first timing may
            seconds = min(seconds, time.perf_counter() - launched)   # have run on a busy CPU)
        process.wait()
    assert kills == 6
    assert subprocess.run(command, env=env, cwd=repo, capture_output=True).returncode == 0
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob('*')
                   if p.is_file() and p.name not in ('.lock', 'summary.png'))
    expected = sorted(p.relative_to(finished).as_posix() for p in finished.rglob('*')
                      if p.is_file() and p.name not in ('.lock', 'summary.png'))
    assert names == expected
    for name in names:
        assert (out / name).read_bytes() == (finished / name).read_bytes(), name


def test_sweep_names_a_repeated_value_and_an_out_under_a_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sweep.parse_args(['--out', str(tmp_path / 's'), '--seeds', '0', '3', '3'])
    assert 'repeated: 3' in capsys.readouterr().err
    (tmp_path / 'afile').write_text('')
    with pytest.raises(SystemExit) as stop:
        sweep.parse_args(['--out', str(tmp_path / 'afile' / 'x')])
    assert stop.value.code == 2 and 'is a file' in capsys.readouterr().err


def test_ctrl_c_on_a_sweep_is_one_line(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONHASHSEED='0')
    out = tmp_path / 's'
    process = subprocess.Popen([sys.executable, '-m', 'agentrl.sweep', '--out', str(out),
                                '--presets', 'default', '--seeds', '0', '1', '--steps', '30',
                                '--processes', '2'], cwd=repo, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    assert 'to run' in process.stdout.readline()
    time.sleep(4)
    os.killpg(process.pid, signal.SIGINT)                 # Ctrl-C reaches the whole group
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert 'Traceback' not in stderr
    assert stderr.strip().splitlines() == [
        f'interrupted: 0 of 2 runs are written in {out}; run the same command again to go on']
