"""Chapter 19 (agentrl.debugging): the injected bugs do what their names say on a real batch,
Audited's two invariants hold on a correct trainer and break under each mask bug, diagnose
finds each signature in a crafted history and nothing in a healthy one, and the command
line reads run folders with clear errors and exit codes."""
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import agentrl as arl
from agentrl import debugging

REPO = Path(__file__).resolve().parents[1]
TRAIN = arl.make_tasks('train')


@pytest.fixture(scope='module')
def tok():
    return arl.build_tokenizer(arl.make_tasks('all'))


def tiny_agent(tok, seed=0):
    return arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=seed)


def small_cfg(**fields):
    return arl.RLConfig(**dict(dict(group_size=4, prompts_per_step=2), **fields))


@pytest.fixture(scope='module')
def batch(tok):
    """A collated batch of 8 episodes of a tiny agent, with advantages not all zero."""
    cfg = small_cfg()
    episodes = arl.sample_groups(tiny_agent(tok), lambda: arl.make_env(cfg), TRAIN[:2], tok,
                                 cfg, torch.Generator().manual_seed(3))
    b = arl.collate(episodes, tok.pad_id)
    b['rewards'] = torch.tensor([1.0, 0.0] * 4, dtype=arl.DTYPE)
    return b


def loss_and_grad(model, objective, batch, cfg):
    b = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    objective.prepare(model, b, cfg)
    adv = objective.advantages(b, None, cfg)
    logp, _ = arl.token_log_probs(model, b['ids'], b['lengths'], cfg.temperature)
    model.zero_grad()
    loss, stats = objective.loss(logp, b, torch.arange(len(b['ids'])), adv, cfg)
    loss.backward()
    norm = sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None)
    return loss.item(), stats, norm.sqrt().item(), b, adv


# --- the bugs ------------------------------------------------------------------------------

def test_flipped_advantages_are_minus_the_correct_ones(tok, batch):
    cfg = small_cfg()
    right = arl.Objective().advantages(batch, None, cfg)
    assert right.abs().sum() > 0
    assert torch.equal(debugging.FlippedAdvantages().advantages(batch, None, cfg), -right)


def test_ratio_with_gradient_has_an_exactly_zero_gradient_and_the_correct_loss_does_not(
        tok, batch):
    cfg = small_cfg()
    _, _, right, _, _ = loss_and_grad(tiny_agent(tok), arl.Objective(), batch, cfg)
    loss, stats, buggy, _, _ = loss_and_grad(tiny_agent(tok), debugging.RatioWithGradient(),
                                             batch, cfg)
    assert right > 1e-3 and buggy == 0.0
    assert stats['approx_kl'] == 0.0 and stats['ratio_min'] == stats['ratio_max'] == 1.0


def test_current_policy_as_old_keeps_the_gradient_but_every_ratio_is_one(tok, batch):
    cfg = small_cfg()
    model = tiny_agent(tok)
    _, stats, norm, _, _ = loss_and_grad(model, debugging.CurrentPolicyAsOld(), batch, cfg)
    assert norm > 1e-3 and stats['approx_kl'] == 0.0 and stats['clip_frac'] == 0.0


def test_shifted_mask_moves_every_policy_token_one_place_right(batch):
    b = dict(batch, action_mask=batch['action_mask'].clone())
    debugging.ShiftedMask().prepare(None, b, small_cfg())
    assert torch.equal(b['action_mask'][:, 1:], batch['action_mask'][:, :-1])
    assert (b['action_mask'][:, 0] == 0).all()


def test_end_token_masked_removes_exactly_the_end_tokens(tok, batch):
    b = dict(batch, action_mask=batch['action_mask'].clone())
    debugging.EndTokenMasked(tok.end_id).prepare(None, b, small_cfg())
    ends = (batch['ids'][:, 1:] == tok.end_id) & (batch['action_mask'] > 0)
    assert ends.any()
    assert (b['action_mask'][ends] == 0).all()
    assert torch.equal(b['action_mask'][~ends], batch['action_mask'][~ends])


def test_padding_in_loss_adds_exactly_the_positions_past_each_rows_end(batch):
    b = dict(batch, action_mask=batch['action_mask'].clone())
    debugging.PaddingInLoss().prepare(None, b, small_cfg())
    positions = torch.arange(batch['action_mask'].shape[1])
    past = positions[None, :] >= (batch['lengths'] - 1)[:, None]
    assert past.any()
    assert (b['action_mask'][past] == 1).all()
    assert torch.equal(b['action_mask'][~past], batch['action_mask'][~past])


def test_stale_old_policy_uses_the_copy_from_lag_steps_back(tok, batch):
    cfg = small_cfg()
    stale, models = debugging.StaleOldPolicy(lag=2), [tiny_agent(tok, seed) for seed in range(4)]
    seen = []
    for model in models:
        b = dict(batch)
        stale.prepare(model, b, cfg)
        seen.append(b['sample_logp'])
    for step, logp in enumerate(seen):
        source = models[max(0, step - 2)]
        want, _ = arl.token_log_probs(source, batch['ids'], batch['lengths'], cfg.temperature)
        assert torch.allclose(logp, want * batch['action_mask'], rtol=0, atol=1e-12), step
    with pytest.raises(ValueError, match='lag must be at least 1, got 0'):
        debugging.StaleOldPolicy(lag=0)


# --- Audited -------------------------------------------------------------------------------

def test_audited_logs_the_invariants_and_changes_nothing_else(tok):
    cfg = small_cfg()
    plain = arl.train_rl(tiny_agent(tok), TRAIN, tok, cfg, 3)
    audited = arl.train_rl(tiny_agent(tok), TRAIN, tok, cfg, 3, objective=debugging.Audited())
    for a, b in zip(plain, audited):
        extra = set(b) - set(a)
        assert extra == {'loss_token_ratio', 'mask_mismatch', 'start_logp_gap'}
        assert {k: b[k] for k in a} == a
        assert b['loss_token_ratio'] == 1.0 and b['mask_mismatch'] == 0.0
        assert 0 <= b['start_logp_gap'] < debugging.GAP_BOUND


@pytest.mark.parametrize('bug, direction', [('shifted', 0), ('end', -1), ('padding', 1)])
def test_audited_sees_each_mask_bug(tok, bug, direction):
    make = dict(shifted=debugging.ShiftedMask, end=lambda: debugging.EndTokenMasked(tok.end_id),
                padding=debugging.PaddingInLoss)
    history = arl.train_rl(tiny_agent(tok), TRAIN, tok, small_cfg(), 3,
                           objective=debugging.Audited(make[bug]()))
    learned = [r for r in history if 'loss_token_ratio' in r]
    ratios = [r['loss_token_ratio'] for r in learned]
    gaps = [r['start_logp_gap'] for r in learned]
    assert all(r['mask_mismatch'] > 0 for r in learned)   # every mask bug moves positions
    if direction < 0:
        assert all(r < 1 for r in ratios)
    elif direction > 0:
        assert all(r > 1 for r in ratios)
    else:                                     # shifted: same count, scored on observations
        assert max(gaps) > debugging.GAP_BOUND


def test_audited_sees_a_stale_pi_old_once_the_policy_has_moved(tok, batch):
    cfg = small_cfg()
    audited = debugging.Audited(debugging.StaleOldPolicy(lag=1))
    rows = torch.arange(len(batch['ids']))
    gaps = []
    for model in (tiny_agent(tok, 0), tiny_agent(tok, 1)):   # the policy 'moved' in between
        b = dict(batch)
        audited.prepare(model, b, cfg)
        logp, _ = arl.token_log_probs(model, b['ids'], b['lengths'], cfg.temperature)
        _, stats = audited.loss(logp, b, rows, audited.advantages(b, None, cfg), cfg)
        gaps.append(stats['start_logp_gap'])
    assert gaps[0] < debugging.GAP_BOUND < gaps[1]


# --- diagnose on crafted histories ---------------------------------------------------------

def healthy_history(steps=30):
    """A history like a healthy run's: pass rate rising, small steps, every invariant held."""
    return [dict(step=s, pass_rate=0.2 + 0.02 * s, reward=0.2 + 0.02 * s, zero_adv_frac=0.2,
                 turns=4.0, malformed=0.1, entropy=0.7 - 0.01 * s, approx_kl=1e-3,
                 clip_frac=0.004, grad_norm=0.3, ratio_min=0.9, ratio_max=1.1,
                 loss_token_ratio=1.0, mask_mismatch=0.0, start_logp_gap=2e-15)
            for s in range(steps)]


def with_(history, steps=None, **values):
    """history with values set on the given steps (all when None)."""
    out = copy.deepcopy(history)
    for r in out:
        if steps is None or r['step'] in steps:
            r.update(values)
    return out


CFG = dataclasses.asdict(arl.RLConfig())
SIGNATURES = {
    'non-finite statistics': with_(healthy_history(), steps={7}, approx_kl=float('nan')),
    "the loss's mask is not the sampler's": with_(healthy_history(), steps={2},
                                                  mask_mismatch=0.01),
    'pi_old is not the sampling policy': with_(healthy_history(), steps={5}, start_logp_gap=0.3),
    'the loss counts the wrong tokens': with_(healthy_history(), steps={0}, loss_token_ratio=0.6),
    'the clip never acts': with_(healthy_history(), approx_kl=0.0, ratio_min=1.0, ratio_max=1.0,
                                 clip_frac=0.0),
    'no gradient': with_(healthy_history(), steps={3, 4, 5}, grad_norm=0.0),
    'large policy steps': with_(healthy_history(), steps={1, 2, 3}, approx_kl=0.5),
    'clipping saturates': with_(healthy_history(), steps={1, 2, 3}, clip_frac=0.2),
    'pass rate fell': [dict(r, pass_rate=max(0.0, 0.5 - 0.03 * r['step']))
                       for r in healthy_history()],
    'collapsed to failure': with_(healthy_history(), steps=set(range(24, 30)), pass_rate=0.0,
                                  zero_adv_frac=1.0),
    'episodes run to the turn limit': with_(healthy_history(), steps=set(range(24, 30)),
                                            turns=6.0),
    'malformed calls': with_(healthy_history(), steps=set(range(24, 30)), malformed=3.0),
}


def test_a_healthy_history_has_no_finding():
    assert debugging.diagnose(healthy_history(), CFG) == []
    assert debugging.diagnose(healthy_history(), arl.RLConfig()) == []


@pytest.mark.parametrize('check', sorted(SIGNATURES))
def test_each_signature_is_found_and_only_it(check):
    found = debugging.diagnose(SIGNATURES[check], CFG)
    names = [f.check for f in found]
    if check == 'collapsed to failure':                  # a collapse is also a fall
        assert names == ['pass rate fell', 'collapsed to failure']
    else:
        assert names == [check]
    finding = found[-1]
    assert finding.steps and finding.statistic in SIGNATURES[check][0]
    assert 'likely:' in str(finding) and finding.threshold in str(finding)


def test_thresholds_are_exclusive_at_their_edges():
    at_edge = with_(healthy_history(), approx_kl=debugging.KL_LIMIT,
                    clip_frac=debugging.CLIP_LIMIT, start_logp_gap=debugging.GAP_BOUND)
    assert debugging.diagnose(at_edge, CFG) == []
    two = with_(healthy_history(), steps={1, 2}, approx_kl=1.0)
    assert debugging.diagnose(two, CFG) == []            # fewer than MIN_STEPS steps


def test_the_clip_check_needs_several_updates_per_batch():
    inert = SIGNATURES['the clip never acts']
    assert debugging.diagnose(inert, dict(CFG, minibatches=1, epochs=1)) == []
    assert debugging.diagnose(inert) == []               # no config: not checked
    assert [f.check for f in debugging.diagnose(inert, dict(CFG, minibatches=1, epochs=2))] \
        == ['the clip never acts']


def test_a_sequence_level_ratio_skips_the_clip_check():
    """GSPO's band clips a large share by design (chapter 9: about a quarter of tokens)."""
    clipped = with_(healthy_history(), clip_frac=0.3)
    assert [f.check for f in debugging.diagnose(clipped, CFG)] == ['clipping saturates']
    assert debugging.diagnose(clipped, dict(CFG, **arl.VARIANTS['gspo'])) == []


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_a_non_finite_value_anywhere_is_reported_first(bad):
    history = with_(healthy_history(), steps={4, 9}, grad_norm=bad, entropy=bad)
    found = debugging.diagnose(history, CFG)
    assert found[0].check == 'non-finite statistics'
    assert found[0].steps == (4, 9) and found[0].statistic == 'entropy, grad_norm'


def test_the_turn_limit_comes_from_the_config():
    long = with_(healthy_history(), turns=8.0)
    assert [f.check for f in debugging.diagnose(long, dict(CFG, max_turns=8))] \
        == ['episodes run to the turn limit']
    assert debugging.diagnose(long, dict(CFG, max_turns=12)) == []


def test_steps_without_learning_statistics_are_skipped():
    history = healthy_history()
    for r in history[:5]:
        for key in ('approx_kl', 'clip_frac', 'grad_norm', 'ratio_min', 'ratio_max',
                    'loss_token_ratio', 'start_logp_gap'):
            del r[key]
    assert debugging.diagnose(history, CFG) == []


def test_a_short_run_skips_the_window_checks():
    short = with_(healthy_history(5), turns=6.0, malformed=5.0, pass_rate=0.0)
    assert debugging.diagnose(short, CFG) == []


@pytest.mark.parametrize('history, message', [
    ([], 'non-empty list'), ({'step': 0}, 'non-empty list'),
    ([{'step': 0}], "lacks \\['malformed', 'pass_rate', 'turns', 'zero_adv_frac'\\]"),
    ([3], 'history\\[0\\] lacks')])
def test_bad_histories_are_refused_by_name(history, message):
    with pytest.raises(ValueError, match=message):
        debugging.diagnose(history)


def test_a_bad_config_is_refused():
    with pytest.raises(ValueError, match='cfg must be an RLConfig, a dict or None, got str'):
        debugging.diagnose(healthy_history(), 'default')


# --- run folders and the command line ------------------------------------------------------

def write_run(folder, history, cfg=CFG):
    folder.mkdir(parents=True)
    (folder / 'history.json').write_text(json.dumps(history))
    (folder / 'config.json').write_text(json.dumps(cfg))
    return folder


def test_diagnose_main_exit_codes_and_output(tmp_path, capsys):
    good = write_run(tmp_path / 'good', healthy_history())
    bad = write_run(tmp_path / 'bad', SIGNATURES['no gradient'])
    assert debugging.diagnose_main([str(good)]) == 0
    assert 'diagnose: no findings' in capsys.readouterr().out
    assert debugging.diagnose_main([str(good), str(bad)]) == 1
    out = capsys.readouterr().out
    assert 'diagnose: no gradient: grad_norm' in out and f'{bad}:' in out


def test_folders_that_are_not_runs_exit_2_with_the_reason(tmp_path, capsys):
    assert debugging.diagnose_main([str(tmp_path / 'nowhere')]) == 2
    assert 'has no history.json: not a run folder' in capsys.readouterr().err
    broken = write_run(tmp_path / 'broken', healthy_history())
    (broken / 'history.json').write_text('[{"step": 0,')
    assert debugging.diagnose_main([str(broken)]) == 2
    assert 'history.json is not valid JSON' in capsys.readouterr().err


def test_python_m_agentrl_diagnose_runs_as_a_command(tmp_path):
    run = write_run(tmp_path / 'run', SIGNATURES['malformed calls'])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, '-m', 'agentrl.diagnose', str(run)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert 'diagnose: malformed calls' in done.stdout
    import agentrl
    assert callable(agentrl.diagnose)                    # the module did not shadow it


def test_the_start_gap_is_the_first_minibatchs_even_after_the_policy_moves(tok, batch):
    cfg = small_cfg()
    audited, model = debugging.Audited(), tiny_agent(tok)
    b = dict(batch)
    audited.prepare(model, b, cfg)
    adv = audited.advantages(b, None, cfg)
    first, second = torch.arange(4), torch.arange(4, 8)
    logp, _ = arl.token_log_probs(model, b['ids'], b['lengths'], cfg.temperature)
    _, before = audited.loss(logp[first], b, first, adv[first], cfg)
    with torch.no_grad():                                  # an update moved the policy
        for p in model.parameters():
            p.add_(0.1)
    logp, _ = arl.token_log_probs(model, b['ids'], b['lengths'], cfg.temperature)
    moved = ((logp[second] - b['sample_logp'][second]).abs() * b['action_mask'][second]).max()
    _, after = audited.loss(logp[second], b, second, adv[second], cfg)
    assert before['start_logp_gap'] < debugging.GAP_BOUND < moved.item()
    assert after['start_logp_gap'] == before['start_logp_gap']


def test_a_dip_smaller_than_the_margin_is_not_a_fall():
    dip = [dict(r, pass_rate=0.5 - 0.05 * (r['step'] >= 24)) for r in healthy_history()]
    assert debugging.diagnose(dip, CFG) == []


@pytest.mark.parametrize('x, n', [(0, 8), (8, 8), (3, 8), (1, 20), (13, 40)])
def test_rate_interval_is_scipys_exact_clopper_pearson(x, n):
    """rate_interval is scipy's binomtest(...).proportion_ci(method='exact'); both ends
    come from a bisection to 2^-60, so agreement within 1e-12."""
    import scipy.stats
    expected = scipy.stats.binomtest(x, n).proportion_ci(0.95, method='exact')
    low, high = debugging.rate_interval(x, n)
    assert low == pytest.approx(expected.low, abs=1e-12)
    assert high == pytest.approx(expected.high, abs=1e-12)
