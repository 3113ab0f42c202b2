"""agentrl.trainer_logs: the readers turn TRL's, verl's and OpenRLHF's logs (tests/fixtures/
trainer_logs, README.md there says which parts the trainers' own code wrote) into the book's
history with each trainer's metric names mapped, tell the format and the trainer, run the checks
the keys allow and name the others, and `python -m agentrl.diagnose` reads the logs end to end
with exit codes 0, 1 and 2."""
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl import debugging, trainer_logs
from test_debugging import CFG, SIGNATURES, healthy_history, write_run

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / 'tests' / 'fixtures' / 'trainer_logs'
TRL = LOGS / 'trl' / 'healthy' / 'trainer_state.json'

# the mappings, written out here: a metric mapped onto another book key fails the tests
EXPECTED = {
    'trl': {'clip_ratio/region_mean': 'clip_frac', 'clip_ratio/high_mean': 'clip_high_frac',
            'clip_ratio/low_mean': 'clip_low_frac', 'grad_norm': 'grad_norm',
            'entropy': 'entropy', 'reward': 'reward', 'frac_reward_zero_std': 'zero_adv_frac',
            'kl': 'kl_ref'},
    'verl': {'actor/pg_clipfrac': 'clip_frac', 'actor/ppo_kl': 'approx_kl',
             'actor/grad_norm': 'grad_norm', 'actor/entropy': 'entropy',
             'critic/score/mean': 'reward', 'actor/kl_loss': 'kl_ref'},
    'openrlhf': {'ppo_clip_ratio': 'clip_frac', 'ppo_kl': 'approx_kl',
                 'actor_grad_norm': 'grad_norm', 'reward': 'reward', 'kl': 'kl_ref'},
}
# metrics that look like a book key but mean something else: never mapped onto it
NOT_MAPPED = {
    'trl': {'completions/mean_length', 'sampling/sampling_logp_difference/max', 'eval_reward'},
    'verl': {'actor/pg_clipfrac_lower', 'critic/rewards/mean', 'response_length/mean',
             'num_turns/mean'},
    'openrlhf': {'entropy_loss', 'response_length', 'dynamic_filtering_pass_rate', 'vllm_kl'},
}


def raw(path):
    return trainer_logs.read_records(path)[0]


def by_step(records, step_key):
    """The raw records holding a train metric, by step (several at one step merged)."""
    out = {}
    for r in records:
        if r.get(step_key) not in (None, ''):
            out.setdefault(int(float(r[step_key])), {}).update(r)
    return out


# --- the mapping tables --------------------------------------------------------------------

@pytest.mark.parametrize('trainer', sorted(EXPECTED))
def test_each_metric_lands_on_its_book_key_and_look_alikes_on_none(trainer):
    names = sorted(EXPECTED[trainer]) + sorted(NOT_MAPPED[trainer])
    record = {name: 0.5 + i for i, name in enumerate(names)}
    [step] = trainer_logs.to_history([dict(record, step=3)], trainer)
    assert step == dict({'step': 3}, **{book: record[name]
                                         for name, book in EXPECTED[trainer].items()})


def test_a_kl_to_the_reference_is_never_the_step_size():
    for trainer, table in trainer_logs.KEYS.items():
        to_ref = {name for name, book in table.items() if book == 'kl_ref'}
        assert to_ref and not any(table[name] == 'approx_kl' for name in to_ref), trainer
    # verl logs the reference KL under either name, by where the KL term goes
    [step] = trainer_logs.to_history([{'step': 1, 'actor/reward_kl_penalty': 0.2}], 'verl')
    assert step == {'step': 1, 'kl_ref': 0.2}


# --- the readers on each trainer's log ----------------------------------------------------

def test_trl_trainer_state_reads_the_train_records_in_step_order():
    records = raw(TRL)
    history = trainer_logs.load_trainer_log(TRL)
    assert [r['step'] for r in history] == list(range(1, 9))
    train = {r['step']: r for r in records if 'loss' in r}             # not eval_, not summary
    for record in history:
        logged = train[record['step']]
        for name, book in EXPECTED['trl'].items():
            if name in logged:
                assert record[book] == logged[name], (record['step'], name)
    # the eval records at steps 4 and 8 do not overwrite the train ones
    assert history[3]['entropy'] == train[4]['entropy'] != by_step(
        [r for r in records if 'eval_entropy' in r], 'step')[4]['eval_entropy']
    # steps 2, 4, ... train on the generation of the step before: its rewards carry over
    assert 'reward' not in train[2]
    assert (history[1]['reward'], history[1]['zero_adv_frac']) \
        == (train[1]['reward'], train[1]['frac_reward_zero_std'])
    assert all('approx_kl' not in r for r in history)


def assert_mapped(history, logged, trainer, prefix=''):
    """Each record of history holds exactly its step and the mapped metrics logged there."""
    for record in history:
        assert record == dict({'step': record['step']},
                              **{book: float(logged[record['step']][prefix + name])
                                 for name, book in EXPECTED[trainer].items()})


@pytest.mark.parametrize('name', ['healthy.jsonl', 'planted.jsonl', 'console.log'])
def test_verl_logs_read_as_the_book_history(name):
    records = raw(LOGS / 'verl' / name)
    history = trainer_logs.load_trainer_log(LOGS / 'verl' / name)
    assert [r['step'] for r in history] == list(range(1, 9))            # step 0: validation
    assert_mapped(history, by_step(records, 'step'), 'verl')


def test_verls_console_lines_give_the_file_loggers_history():
    assert trainer_logs.load_trainer_log(LOGS / 'verl' / 'console.log') \
        == trainer_logs.load_trainer_log(LOGS / 'verl' / 'healthy.jsonl')


@pytest.mark.parametrize('name', ['healthy.csv', 'planted.csv'])
def test_openrlhf_wandb_export_reads_train_rows_by_global_step(name):
    with open(LOGS / 'openrlhf' / name, newline='') as handle:
        rows = list(csv.DictReader(handle))
    history = trainer_logs.load_trainer_log(LOGS / 'openrlhf' / name)
    assert [r['step'] for r in history] == list(range(1, 9))            # not wandb's _step
    logged = {int(r['train/global_step']): r for r in rows if r['train/global_step']}
    assert_mapped(history, logged, 'openrlhf', prefix='train/')


def test_openrlhfs_console_lines_give_the_exports_history():
    assert trainer_logs.load_trainer_log(LOGS / 'openrlhf' / 'console.log') \
        == trainer_logs.load_trainer_log(LOGS / 'openrlhf' / 'healthy.csv')


def test_a_json_list_and_verl_records_without_nesting_read_too(tmp_path):
    flat = tmp_path / 'flat.json'
    flat.write_text(json.dumps([{'training/global_step': 2, 'actor/pg_clipfrac': 0.5},
                                {'training/global_step': 1, 'actor/ppo_kl': 'nan'}]))
    history = trainer_logs.load_trainer_log(flat)
    assert history[1] == {'step': 2, 'clip_frac': 0.5}
    assert history[0]['step'] == 1 and math.isnan(history[0]['approx_kl'])  # kept


# --- telling the format and the trainer ------------------------------------------------------

@pytest.mark.parametrize('path, trainer', [
    (TRL, 'trl'), (LOGS / 'trl' / 'planted' / 'trainer_state.json', 'trl'),
    (LOGS / 'verl' / 'healthy.jsonl', 'verl'), (LOGS / 'verl' / 'console.log', 'verl'),
    (LOGS / 'openrlhf' / 'planted.csv', 'openrlhf'),
    (LOGS / 'openrlhf' / 'console.log', 'openrlhf')])
def test_the_trainer_is_told_by_the_format_or_the_metric_names(path, trainer):
    records, implied = trainer_logs.read_records(path)
    assert implied == ('trl' if path.name == 'trainer_state.json' else None)
    assert trainer_logs.detect_trainer(records) == trainer
    assert trainer_logs.read_trainer_log(path)[0] == trainer


def test_a_log_of_shared_names_needs_the_trainer_named(tmp_path):
    shared = tmp_path / 'shared.jsonl'
    shared.write_text('{"step": 1, "reward": 0.5, "kl": 0.2}\n')
    assert trainer_logs.detect_trainer(raw(shared)) is None
    with pytest.raises(ValueError, match=r'cannot tell which trainer wrote it; pass --trainer '
                                         r'\(trl, verl, openrlhf\)'):
        trainer_logs.load_trainer_log(shared)
    assert trainer_logs.load_trainer_log(shared, 'openrlhf') == [
        {'step': 1, 'reward': 0.5, 'kl_ref': 0.2}]


def test_a_trainer_state_is_a_trl_log_whatever_the_trainer_named():
    with pytest.raises(ValueError, match='is a trl log, not a verl log'):
        trainer_logs.load_trainer_log(TRL, 'verl')


@pytest.mark.parametrize('name, text, message', [
    ('empty.jsonl', '', 'holds no log records'),
    ('trainer_state.json', '{"log_history": []}', 'holds no log records'),
    ('blank.csv', '', 'holds no log records'),
    ('quiet.log', 'INFO nothing logged\n', 'holds no log records'),
    ('bad.jsonl', '{"step": 1}\n{"step": 2,\n', r'bad.jsonl:2 is not JSON'),
    ('bad.json', '{"step": 1', 'is not valid JSON'),
    ('scalar.json', '3', 'neither a trainer_state.json .* got a JSON int'),
    ('lists.jsonl', '[1, 2]\n', 'every record must be a JSON object'),
    ('metrics.parquet', 'PAR1', r'cannot read a \.parquet file; accepted: trainer_state'),
    ('nostep.jsonl', '{"actor/pg_clipfrac": 0.1}\n', 'has metrics but no step'),
    ('other.jsonl', '{"step": 1, "actor/pg_clipfrac_lower": 0.1, "training/epoch": 0}\n',
     'holds none of the verl metrics read here'),
])
def test_bad_logs_are_refused_by_name(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        trainer_logs.load_trainer_log(path, None if name.endswith('.json') else 'verl')


def test_a_missing_file_and_an_unknown_trainer_are_refused(tmp_path):
    with pytest.raises(ValueError, match='nowhere.jsonl: no such file'):
        trainer_logs.load_trainer_log(tmp_path / 'nowhere.jsonl')
    with pytest.raises(ValueError, match="unknown trainer 'deepspeed'; accepted: trl, verl, "
                                         "openrlhf"):
        trainer_logs.load_trainer_log(TRL, 'deepspeed')


# --- which checks can run -------------------------------------------------------------------

def test_the_check_table_lists_what_each_check_reads():
    names = [check.__name__ for check in debugging.CHECKS]
    assert sorted(trainer_logs.CHECK_KEYS) == sorted(names)
    for check in debugging.CHECKS:
        keys = ('step',) + trainer_logs.CHECK_KEYS[check.__name__]
        fired = [s for s in SIGNATURES.values() if check(s, CFG)]
        assert fired, check.__name__
        for history in fired:                          # the listed keys suffice ...
            if check is debugging.check_non_finite:        # it reads every key
                continue
            only = [{k: r[k] for k in keys if k in r} for r in history]
            assert check(only, CFG) == check(history, CFG)
            for key in keys[1:]:                       # ... and each of them is needed
                without = [{k: v for k, v in r.items() if k != key} for r in only]
                try:
                    assert check(without, CFG) is None, (check.__name__, key)
                except KeyError:
                    pass


def test_a_full_history_with_its_config_runs_every_check():
    assert trainer_logs.runnable_checks(healthy_history(), CFG) == (list(debugging.CHECKS), {})
    _, skipped = trainer_logs.runnable_checks(healthy_history())
    assert skipped == {'check_clip_inert': ["the run's config (epochs, minibatches)"],
                       'check_turn_limit': ["the run's config (max_turns)"]}


def test_a_key_the_check_reads_on_every_step_must_be_on_every_step():
    history = healthy_history(6)
    del history[2]['zero_adv_frac']
    _, skipped = trainer_logs.runnable_checks(history, CFG)
    assert skipped['check_no_gradient'] == ['zero_adv_frac (on 5 of 6 steps)']
    del history[0]['clip_frac']                        # read where present: still runs
    assert 'check_clipping' not in trainer_logs.runnable_checks(history, CFG)[1]


def test_a_check_the_table_does_not_know_is_skipped_with_the_reason(monkeypatch):
    def check_new(history, cfg):
        return None
    monkeypatch.setattr(debugging, 'CHECKS', debugging.CHECKS + (check_new,))
    _, skipped = trainer_logs.runnable_checks(healthy_history(), CFG)
    assert skipped == {'check_new': ['its keys (trainer_logs.CHECK_KEYS does not list '
                                     'check_new)']}


def test_each_trainers_log_runs_the_checks_its_metrics_allow():
    ran = {name: [c.__name__ for c in trainer_logs.runnable_checks(
        trainer_logs.load_trainer_log(path))[0]] for name, path in [
        ('trl', TRL), ('verl', LOGS / 'verl' / 'healthy.jsonl'),
        ('openrlhf', LOGS / 'openrlhf' / 'healthy.csv')]}
    assert ran == {'trl': ['check_non_finite', 'check_no_gradient', 'check_clipping'],
                   'verl': ['check_non_finite', 'check_large_steps', 'check_clipping'],
                   'openrlhf': ['check_non_finite', 'check_large_steps', 'check_clipping']}


def test_the_healthy_logs_kl_to_the_reference_is_above_the_step_size_limit():
    for path in (TRL, LOGS / 'verl' / 'healthy.jsonl', LOGS / 'openrlhf' / 'healthy.csv'):
        history = trainer_logs.load_trainer_log(path)
        above = [r['step'] for r in history if r.get('kl_ref', 0) > debugging.KL_LIMIT]
        assert len(above) >= debugging.MIN_STEPS, path
        assert trainer_logs.diagnose_history(history)[0] == [], path


# --- the command line -----------------------------------------------------------------------

SKIPPED = ['check_logp_gap: start_logp_gap', 'check_loss_tokens: loss_token_ratio',
           'check_pass_fell: pass_rate', 'check_malformed: malformed',
           "check_turn_limit: turns, the run's config (max_turns)"]


@pytest.mark.parametrize('args, status, finding', [
    ([str(TRL.parent)], 0, None),
    ([str(LOGS / 'trl' / 'planted' / 'trainer_state.json')], 1,
     'diagnose: no gradient: grad_norm <= 1e-12 with groups to learn from on 8 step(s)'),
    ([str(LOGS / 'verl' / 'healthy.jsonl'), '--trainer', 'verl'], 0, None),
    ([str(LOGS / 'verl' / 'planted.jsonl')], 1,
     'diagnose: clipping saturates: clip_frac > 0.05 on 4 step(s) (5, 6, 7, 8)'),
    ([str(LOGS / 'openrlhf' / 'healthy.csv')], 0, None),
    ([str(LOGS / 'openrlhf' / 'planted.csv'), '--trainer', 'openrlhf'], 1,
     'diagnose: large policy steps: approx_kl > 0.01 on 4 step(s) (5, 6, 7, 8)'),
])
def test_the_command_reads_each_trainers_log(capsys, args, status, finding):
    assert trainer_logs.diagnose_main(args) == status
    out = capsys.readouterr().out
    assert ('diagnose: no findings' in out) == (finding is None)
    assert finding is None or finding in out
    assert ' log, 8 steps):\n' in out and 'diagnose: ran 3 of 12 checks; skipped 9' in out
    lines = [line.strip() for line in out.splitlines()]
    assert all(line in lines for line in SKIPPED), out
    assert max(len(line) for line in out.splitlines()[1:]) <= 88    # below the path


def test_the_command_still_reads_run_folders_and_mixes_them_with_logs(tmp_path, capsys):
    good = write_run(tmp_path / 'good', healthy_history())
    assert trainer_logs.diagnose_main([str(good)]) == 0
    assert capsys.readouterr().out == f'{good}:\ndiagnose: no findings\n'
    bad = write_run(tmp_path / 'bad', SIGNATURES['no gradient'])
    assert trainer_logs.diagnose_main([str(good), str(LOGS / 'verl' / 'planted.jsonl'),
                                       str(bad)]) == 1
    out = capsys.readouterr().out
    assert f'{bad}:\ndiagnose: no gradient' in out and 'clipping saturates' in out


@pytest.mark.parametrize('args, message', [
    (['nowhere'], 'nowhere has no history.json: not a run folder'),
    (['nowhere.jsonl'], 'nowhere.jsonl: no such file'),
    ([str(TRL), '--trainer', 'deepspeed'],
     "unknown --trainer 'deepspeed'; accepted: trl, verl, openrlhf"),
    ([str(TRL), '--trainer', 'openrlhf'], 'is a trl log, not a openrlhf log'),
    (['empty.jsonl'], 'empty.jsonl holds no log records'),
    (['scores.jsonl', '--trainer', 'verl'], 'no check can run on this verl log'),
])
def test_what_the_command_cannot_read_exits_2_with_the_reason(tmp_path, monkeypatch, capsys,
                                                               args, message):
    monkeypatch.chdir(tmp_path)
    Path('empty.jsonl').write_text('\n')
    Path('scores.jsonl').write_text('{"step": 1, "critic/score/mean": 0.5}\n')
    assert trainer_logs.diagnose_main(args) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.startswith('python -m agentrl.diagnose: '
                                                                'error: ')


def test_python_m_agentrl_diagnose_reads_a_trainer_log():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    done = subprocess.run([sys.executable, '-m', 'agentrl.diagnose',
                           str(LOGS / 'trl' / 'planted'), '--trainer', 'trl'],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert 'diagnose: no gradient' in done.stdout and 'check_logp_gap: start_logp_gap' \
        in done.stdout


def test_a_nan_in_a_console_log_reaches_diagnose(tmp_path):
    """An OpenRLHF console line with a NaN KL: the history keeps it and diagnose's first
    finding names it (dropping it would let every other check pass on what is left)."""
    log = tmp_path / 'console.log'
    log.write_text("Global step 1: {'ppo_kl': nan, 'ppo_clip_ratio': 0.01}\n"
                   "Global step 2: {'ppo_kl': 0.001, 'ppo_clip_ratio': -inf}\n")
    history = trainer_logs.load_trainer_log(log, 'openrlhf')
    findings, _ = trainer_logs.diagnose_history(history)
    assert findings[0].check == 'non-finite statistics'
    assert findings[0].steps == (1, 2)


def test_a_json_null_on_a_logged_metric_is_read_as_nan(tmp_path):
    """verl's file logger writes NaN and inf as null (orjson): the reader keeps them as
    NaN so that the finiteness check sees them; an absent metric stays absent."""
    log = tmp_path / 'metrics.jsonl'
    log.write_text('{"step": 1, "data": {"actor/grad_norm": null, "actor/pg_clipfrac": 0.01}}\n'
                   '{"step": 2, "data": {"actor/pg_clipfrac": 0.02}}\n')
    history = trainer_logs.load_trainer_log(log, 'verl')
    assert math.isnan(history[0]['grad_norm']) and 'grad_norm' not in history[1]
    findings, _ = trainer_logs.diagnose_history(history)
    assert findings[0].check == 'non-finite statistics'


def test_a_sequence_level_log_skips_the_clip_check_and_says_so(tmp_path, capsys):
    """A GSPO run's clip_frac counts sequences: --ratio-level sequence skips the check
    (listed among the skipped), where the token default flags it."""
    log = tmp_path / 'console.log'
    log.write_text(''.join(f"Global step {s}: {{'ppo_kl': 0.001, 'ppo_clip_ratio': 0.3}}\n"
                           for s in range(1, 9)))
    assert trainer_logs.diagnose_main([str(log), '--trainer', 'openrlhf']) == 1
    assert 'clipping saturates' in capsys.readouterr().out
    assert trainer_logs.diagnose_main([str(log), '--trainer', 'openrlhf',
                                       '--ratio-level', 'sequence']) == 0
    out = capsys.readouterr().out
    assert 'check_clipping: a token-level ratio' in out and 'ran 2 of 12' in out
    assert trainer_logs.diagnose_main([str(log), '--ratio-level', 'seq']) == 2
