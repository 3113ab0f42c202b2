"""Tests of the command line entry point `python -m agentrl.train` (agentrl/train.py).

One real training run (1 step, 2 x 2 episodes) in a subprocess, shared by the file checks; the
option parsing is tested in-process, where no model is built."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl as arl
from agentrl import train

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group('train-cli')     # one worker: the module's run is made once


def run_cli(*args, cwd=None, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED='0')
    return subprocess.run([sys.executable, '-m', 'agentrl.train', *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=timeout)


@pytest.fixture(scope='module')
def cli_run(tmp_path_factory):
    """One run: dapo preset, clip_high overridden, 1 step of 2 tasks x 2 attempts, evaluated at step 0."""
    out = tmp_path_factory.mktemp('cli') / 'run'
    result = run_cli('--variant', 'dapo', '--steps', '1', '--group-size', '2', '--prompts-per-step', '2',
                     '--seed', '1', '--clip-high', '0.3', '--eval-every', '1', '--threads', '1',
                     '--out', str(out))
    return result, out


def test_cli_run_succeeds_and_prints_paths(cli_run):
    result, out = cli_run
    assert result.returncode == 0, result.stdout + result.stderr
    names = ('history.json', 'config.json', 'eval.json', 'policy.pt', 'curves.png')
    assert sorted(p.name for p in out.iterdir()) == sorted(names)            # nothing else
    assert f"wrote {out}/: {' '.join(names)}" in result.stdout
    assert '\r' not in result.stderr and 'train_rl' not in result.stderr     # no bar off a terminal
    assert 'held-out pass@1 (8 episodes per task)' in result.stdout
    assert not list(out.parent.glob('.*partial'))
    last = result.stdout.strip().splitlines()[-1]                   # chapter 19's findings
    assert last.startswith('diagnose: ') or last.startswith('    '), last


def test_cli_history_holds_the_audit_and_the_diagnose_command_reads_the_run(cli_run):
    _, out = cli_run
    record = json.loads((out / 'history.json').read_text())[0]
    if 'grad_norm' in record:                                       # the step learned
        assert record['loss_token_ratio'] == 1.0 and 0 <= record['start_logp_gap'] < 1e-6
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, '-m', 'agentrl.diagnose', str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (0, 1) and done.stdout.startswith(f'{out}:'), done.stderr
    assert 'diagnose: ' in done.stdout


def test_cli_history_json(cli_run):
    _, out = cli_run
    history = json.loads((out / 'history.json').read_text())
    assert isinstance(history, list) and len(history) == 1
    record = history[0]
    assert record['step'] == 0 and record['n_episodes'] >= 4                 # dynamic sampling may resample
    for key in ('reward', 'reads', 'edits', 'pass_rate', 'zero_adv_frac', 'eval_pass'):
        assert isinstance(record[key], float) and 0.0 <= record[key] <= 6.0, key


def test_cli_config_json_applies_preset_then_options(cli_run):
    _, out = cli_run
    config = json.loads((out / 'config.json').read_text())
    fields = {f.name for f in dataclasses.fields(arl.RLConfig)}
    assert fields <= set(config)
    assert config['variant'] == 'dapo' and config['base'] == 'rl' and config['steps'] == 1
    assert config['dynamic_sampling'] is True and config['overlong_buffer'] == 2     # from the preset
    assert config['clip_high'] == 0.3                                                # option beats preset
    assert config['group_size'] == 2 and config['prompts_per_step'] == 2 and config['seed'] == 1
    assert config['max_edits'] == 1 and config['norm_const'] is None and config['reward'] == 'hidden'


def test_cli_eval_json_and_png(cli_run):
    _, out = cli_run
    held = json.loads((out / 'eval.json').read_text())
    assert held['n_samples'] == 8 and held['n_tasks'] == len(arl.make_tasks('heldout'))
    assert 0.0 <= held['pass_rate'] <= 1.0 and set(held) >= {'reward', 'reads', 'edits', 'turns'}
    assert (out / 'curves.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_cli_policy_evaluates_to_its_eval_json(cli_run, tmp_path):
    from agentrl import evaluation, policies
    _, out = cli_run
    model, tok, cfg = policies.load_policy(out / 'policy.pt')
    assert cfg == dataclasses.replace(arl.RLConfig(**arl.VARIANTS['dapo']), group_size=2,
                                      prompts_per_step=2, seed=1, clip_high=0.3)
    report = tmp_path / 'again.json'
    assert evaluation.main([str(out), '--samples', '8', '--seed', '1', '--json', str(report)]) == 0
    held = json.loads((out / 'eval.json').read_text())
    assert json.loads(report.read_text())['pass_rate'] == held['pass_rate']


def test_cli_refuses_a_folder_that_holds_files_unless_overwrite(cli_run):
    _, out = cli_run
    result = run_cli('--steps', '1', '--out', str(out), timeout=300)
    assert result.returncode == 2
    assert 'already holds files' in result.stderr and '--overwrite' in result.stderr
    args, _ = train.parse_args(['--out', str(out), '--overwrite'])
    assert args.overwrite


def test_ctrl_c_prints_one_line_and_writes_nothing(tmp_path):
    import signal
    import time
    out = tmp_path / 'run'
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED='0')
    process = subprocess.Popen([sys.executable, '-m', 'agentrl.train', '--steps', '200',
                                '--threads', '1', '--checkpoint-every', '0', '--out', str(out)],
                               cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith('base agent')       # training has begun
    time.sleep(2)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130
    assert 'Traceback' not in stderr
    assert stderr.strip().splitlines()[-1].startswith('interrupted after ')
    assert stderr.strip().splitlines()[-1].endswith(f'of 200 steps; nothing written to {out}')
    assert not out.exists() and not list(tmp_path.glob('.*'))


# learns from step 0 (seed 0's groups differ), so a resume that lost the optimizer's moments or
# the KL reference (the starting policy, not the checkpointed one) would end elsewhere
SMALL = ['--steps', '6', '--group-size', '4', '--prompts-per-step', '2', '--eval-every', '2',
         '--threads', '1', '--seed', '0', '--kl-coef', '0.05', '--checkpoint-every', '2']


def test_a_killed_run_resumed_ends_identical_to_an_uninterrupted_one(tmp_path):
    """SIGKILL after the first checkpoint, then --resume: histories, weights, evaluation and
    curves equal, byte for byte, those of a run never stopped (KL on: the reference too)."""
    import signal
    import time
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    assert run_cli(*SMALL, '--out', str(whole)).returncode == 0
    assert not (tmp_path / '.whole.checkpoint.pt').exists()          # removed once written
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED='0')
    process = subprocess.Popen([sys.executable, '-m', 'agentrl.train', *SMALL, '--out', str(cut)],
                               cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / '.cut.checkpoint.pt'
    deadline = time.monotonic() + 600
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert checkpoint.exists() and not cut.exists()                  # stopped mid-run
    again = run_cli(*SMALL, '--out', str(cut))
    assert again.returncode == 2 and 'pass --resume' in again.stderr
    resumed = run_cli(*SMALL, '--out', str(cut), '--resume')
    assert resumed.returncode == 0, resumed.stderr
    assert 'resuming after step' in resumed.stdout
    for name in ('history.json', 'policy.pt', 'eval.json', 'config.json', 'curves.png'):
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name
    assert not checkpoint.exists()


def test_resume_refuses_another_runs_checkpoint(tmp_path):
    from agentrl import runs
    out = tmp_path / 'run'
    args, cfg = train.parse_args([*SMALL, '--out', str(out)])
    model = arl.TinyAgent(len(arl.build_tokenizer(arl.make_tasks('all'))), d_model=16,
                          n_layers=1, n_heads=2, d_ff=32)
    state = {}
    arl.train_rl(model, arl.make_tasks('train'), arl.build_tokenizer(arl.make_tasks('all')),
                 cfg, 0, state=state)
    config = runs.run_config(cfg, 'default', 'rl', 0, 6, 2)
    assert cfg.group_size == 4
    runs.save_checkpoint(runs.checkpoint_path(out), model, state, config)
    with pytest.raises(ValueError, match="steps: 6 there, 8 asked"):
        runs.load_checkpoint(runs.checkpoint_path(out), dict(config, steps=8))
    with pytest.raises(SystemExit):
        train.parse_args([*SMALL, '--out', str(tmp_path / 'other'), '--resume'])


def test_cli_help_lists_every_option_with_default():
    result = run_cli('--help', timeout=300)
    assert result.returncode == 0, result.stderr
    text = ' '.join(result.stdout.split())
    for field in dataclasses.fields(arl.RLConfig):
        assert f'--{field.name.replace("_", "-")}' in text
        assert f'RLConfig.{field.name} (default: {field.default!r})' in text
    for option in ('--variant', '--steps', '--base', '--eval-every', '--out'):
        assert option in text
    assert 'training steps (default: 40)' in text


def test_cli_negative_steps_exit_2_and_write_nothing(tmp_path):
    out = tmp_path / 'run'
    result = run_cli('--steps', '-1', '--out', str(out), timeout=300)
    assert result.returncode == 2 and not out.exists()
    assert '--steps must be at least 1, got -1' in result.stderr


def test_cli_bad_value_exits_2_in_a_subprocess():
    result = run_cli('--adv-mode', 'ppo', timeout=300)
    assert result.returncode == 2
    assert "'ppo'" in result.stderr and 'grpo' in result.stderr and 'rloo' in result.stderr


# ------------------------------------------------------------------------- parsing, in-process

def test_parse_defaults_and_out_path():
    args, cfg = train.parse_args([])
    assert cfg == arl.RLConfig() and args.variant == 'default' and args.steps == 40 and args.base == 'rl'
    assert args.out == str(Path('runs') / 'default-seed0')
    args, cfg = train.parse_args(['--variant', 'gspo', '--seed', '3'])
    assert args.out == str(Path('runs') / 'gspo-seed3')
    assert cfg == arl.RLConfig(seed=3, **arl.VARIANTS['gspo'])


@pytest.mark.parametrize('variant', sorted(arl.VARIANTS))
def test_parse_every_variant(variant):
    _, cfg = train.parse_args(['--variant', variant])
    assert cfg == arl.RLConfig(**arl.VARIANTS[variant])


def test_parse_typed_values():
    _, cfg = train.parse_args(['--max-edits', 'none', '--rename', 'false', '--norm-const', '120',
                               '--temperature', '0.7', '--group-size', '4', '--reward', 'public',
                               '--dynamic-sampling', 'yes', '--kl-kind', 'k1', '--loss-mode', 'constant'])
    assert cfg.max_edits is None and cfg.rename is False and cfg.norm_const == 120.0
    assert cfg.temperature == 0.7 and cfg.group_size == 4 and cfg.reward == 'public'
    assert cfg.dynamic_sampling is True and cfg.kl_kind == 'k1' and cfg.loss_mode == 'constant'
    _, cfg = train.parse_args(['--max-edits', '3', '--norm-const', 'none', '--variant', 'grpo', '--kl-coef', '0'])
    assert cfg.max_edits == 3 and cfg.norm_const is None and cfg.kl_coef == 0.0


@pytest.mark.parametrize('argv, words', [
    (['--adv-mode', 'ppo'], ["'ppo'", 'grpo', 'mean', 'rloo']),
    (['--ratio-level', 'word'], ["'word'", 'token', 'sequence']),
    (['--kl-kind', 'k4'], ["'k4'", 'k1', 'k2', 'k3']),
    (['--kl-placement', 'advantage'], ["'advantage'", 'loss', 'reward']),
    (['--entropy-coef', '-0.01'], ['entropy_coef', '>= 0', '-0.01']),
    (['--loss-mode', 'sum'], ["'sum'", 'token_mean', 'constant']),
    (['--reward', 'secret'], ["'secret'", 'hidden', 'public']),
    (['--variant', 'ppo'], ["'ppo'", 'dapo', 'gspo', 'default']),
    (['--base', 'big'], ["'big'", 'rl', 'default']),
    (['--group-size', 'eight'], ['--group-size', "'eight'", 'integer']),
    (['--lr', 'fast'], ['--lr', "'fast'", 'number']),
    (['--rename', 'maybe'], ['--rename', "'maybe'", 'true', 'false']),
    (['--max-edits', 'many'], ['--max-edits', "'many'", 'integer', 'none']),
    (['--max-edits', '0'], ['max_edits', '0']),
    (['--group-size', '0'], ['group_size']),
    (['--temperature', '0'], ['temperature', 'positive', '0.0']),
    (['--clip-low', '1.5'], ['clip_low', '1.5']),
    (['--adv-mode', 'rloo', '--group-size', '1'], ['rloo', 'group_size', '1']),
    (['--steps', '0'], ['--steps', '0']),
    (['--field-that-does-not-exist', '1'], ['unrecognized', '--field-that-does-not-exist']),
    # every run option out of its range, named with its value and the accepted range
    (['--steps', '-1'], ['--steps', '-1', 'at least 1']),
    (['--eval-every', '-1'], ['--eval-every', '-1', '0 or more']),
    (['--log-every', '-2'], ['--log-every', '-2', '0 or more']),
    (['--threads', '0'], ['--threads', '0', 'at least 1']),
    (['--base-seed', '-1'], ['--base-seed', '-1', '[0, 18446744073709551615]']),
    (['--seed', '-1'], ['seed', '-1', '[0, 18446744073709551615]']),
    (['--seed', str(2 ** 64)], ['seed', str(2 ** 64), '[0, 18446744073709551615]']),
    (['--lr', 'nan'], ['--lr', "'nan'", 'finite']),
    (['--temperature', 'inf'], ['--temperature', "'inf'", 'finite']),
    (['--clip-high=-inf'], ['--clip-high', "'-inf'", 'finite']),
    (['--norm-const', 'nan'], ['--norm-const', "'nan'", 'none']),
    (['--lr', '0'], ['lr', 'positive', '0.0']),
    (['--clip-low', '-0.1'], ['clip_low', '-0.1']),
    (['--clip-high', '-0.5'], ['clip_high', '-0.5']),
    (['--kl-coef', '-0.1'], ['kl_coef', '>= 0', '-0.1']),
    (['--max-grad-norm', '0'], ['max_grad_norm', 'positive', '0.0']),
    (['--norm-const', '0'], ['norm_const', 'none or positive', '0.0']),
    (['--max-turns', '0'], ['max_turns', 'at least 1', '0']),
    (['--max-turns', '7'], ['max_turns', '[1, 6]', '7', '256']),
    (['--overlong-buffer', '7'], ['overlong_buffer', '[0, max_turns=6]', '7']),
    (['--overlong-buffer', '-1'], ['overlong_buffer', '-1']),
    (['--prompts-per-step', '0'], ['prompts_per_step', 'at least 1', '0']),
    (['--max-sample-rounds', '0'], ['max_sample_rounds', 'at least 1', '0']),
    (['--minibatches', '0'], ['minibatches', 'at least 1', '0']),
    (['--epochs', '-1'], ['epochs', 'at least 1', '-1']),
    (['--out', 'README.md'], ['--out', 'README.md', 'directory']),
])
def test_parse_errors_exit_2_naming_value_and_accepted(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        train.parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)


def test_longest_episode_bounds_real_episodes_and_allows_the_default():
    tasks = arl.make_tasks('all')
    tok = arl.build_tokenizer(tasks)
    for turns in (1, 3, 6, 7):
        for task in tasks:
            for first in ('read', 'edit fix_range_end', 'test'):
                calls = [first] + ['read'] * (turns - 1)
                ids, _ = arl.episode_tokens(tok, arl.BugFixEnv(max_turns=turns), task, calls)
                assert len(ids) <= train.longest_episode(turns), (turns, task.name, first)
    limit, max_len = train.max_turns_limit()
    assert limit >= arl.RLConfig().max_turns and train.longest_episode(limit) <= max_len
    assert train.longest_episode(limit + 1) > max_len


def test_check_ranges_accepts_defaults_and_variants():
    assert train.check_ranges(arl.RLConfig()) is None
    for fields in arl.VARIANTS.values():
        assert train.check_ranges(arl.RLConfig(**fields)) is None


def test_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys):
    afile = tmp_path / 'afile'
    afile.write_text('not a folder')
    for out, words in ((afile, 'is a file'), (afile / 'sub', 'its parent'),
                       (afile / 'a' / 'b', 'its parent')):
        with pytest.raises(SystemExit) as stop:
            train.parse_args(['--out', str(out)])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert words in err and str(out) in err, err
    args, _ = train.parse_args(['--out', str(tmp_path / 'new' / 'run')])   # made later, whole
    assert args.out == str(tmp_path / 'new' / 'run') and not (tmp_path / 'new').exists()


def test_overwrite_replaces_only_a_run_folder(tmp_path, capsys):
    precious = tmp_path / 'precious'
    precious.mkdir()
    (precious / 'notes.txt').write_text('mine')
    with pytest.raises(SystemExit) as stop:
        train.parse_args(['--out', str(precious), '--overwrite'])
    assert stop.value.code == 2
    assert 'holds files that are not a run (notes.txt)' in capsys.readouterr().err


def test_resume_with_other_options_exits_2_naming_them_and_may_extend_steps(tmp_path, capsys):
    from agentrl import runs
    out = tmp_path / 'run'
    args, cfg = train.parse_args([*SMALL, '--out', str(out)])
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32)
    state = {}
    arl.train_rl(model, arl.make_tasks('train'), tok, cfg, 0, state=state)
    state['history'].extend([{'step': 0}, {'step': 1}])
    runs.save_checkpoint(runs.checkpoint_path(out), model, state,
                         runs.run_config(cfg, 'default', 'rl', 0, 6, 2))
    with pytest.raises(SystemExit) as stop:
        train.parse_args([*SMALL, '--out', str(out), '--resume', '--lr', '0.002'])
    assert stop.value.code == 2
    assert 'lr: 0.001 there, 0.002 asked' in capsys.readouterr().err
    args, _ = train.parse_args([*SMALL[2:], '--steps', '9', '--out', str(out), '--resume'])
    assert args.steps == 9                                        # a longer run: allowed
    with pytest.raises(SystemExit):
        train.parse_args([*SMALL[2:], '--steps', '2', '--out', str(out), '--resume'])
    assert 'the checkpoint holds 2 steps' in capsys.readouterr().err
    (out).mkdir()                                                 # an older run, being overwritten
    (out / 'config.json').write_text('{}')
    assert train.parse_args([*SMALL, '--out', str(out), '--resume'])[0].resume


def test_checkpoints_go_to_a_parent_that_did_not_exist(tmp_path):
    out = tmp_path / 'new' / 'deeper' / 'run'
    result = run_cli('--steps', '2', '--group-size', '2', '--prompts-per-step', '2',
                     '--eval-every', '0', '--threads', '1', '--checkpoint-every', '1',
                     '--out', str(out))
    assert result.returncode == 0, result.stderr
    assert (out / 'policy.pt').is_file() and not list(out.parent.glob('.*'))


def test_two_trains_cannot_write_one_folder(tmp_path, capsys):
    from agentrl import runs
    out = tmp_path / 'run'
    with runs.locked_file(runs.lock_path(out)):
        assert train.main(['--steps', '1', '--out', str(out)]) == 2
    assert 'is being written by another process' in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize('out', ['/', ''])
def test_an_out_without_a_name_is_a_clean_error(out, capsys):
    with pytest.raises(SystemExit) as stop:
        train.parse_args(['--out', out])
    assert stop.value.code == 2 and '--out' in capsys.readouterr().err
