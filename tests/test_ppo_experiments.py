"""Tests of the helper behind chapter 8's experiments: train_arms (agentrl.ppo)."""
import copy
import dataclasses

import pytest
import torch

import agentrl as arl

ALL_TASKS = arl.make_tasks('all')
TRAIN = arl.make_tasks('train')
TOK = arl.build_tokenizer(ALL_TASKS)


_AGENT = {}


def small_agent():
    """A copy of a small behaviour-cloned agent that passes some episodes (so updates move it)."""
    if 'base' not in _AGENT:
        _AGENT['base'] = arl.make_base_agent(TOK, kinds=('blind',))
    return copy.deepcopy(_AGENT['base'])


def small_ppo(**fields):
    return arl.PPOConfig(**dict(dict(prompts_per_step=2, group_size=4), **fields))


REINFORCE = dict(prompts_per_step=2, group_size=4, baseline='task')


def _same_params(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_train_arms_equals_the_trainers_run_alone():
    model = small_agent()
    arms = [('ppo', small_ppo(seed=0)), ('reinforce', dict(REINFORCE, seed=1))]
    serial = arl.train_arms(model, TRAIN, TOK, arms, steps=1, processes=1)
    parallel = arl.train_arms(model, TRAIN, TOK, arms, steps=1, processes=2)
    assert [h for _, h in parallel] == [h for _, h in serial]        # identical, not merely close
    assert all(_same_params(m, n) for (m, _), (n, _) in zip(serial, parallel))
    alone = small_agent()
    assert serial[0][1] == arl.train_ppo(alone, TRAIN, TOK, arms[0][1], 1)
    assert _same_params(alone, serial[0][0])
    alone = small_agent()
    assert serial[1][1] == arl.train_reinforce(alone, TRAIN, TOK, 1, **arms[1][1])
    assert _same_params(alone, serial[1][0])
    assert _same_params(model, small_agent())                          # the start is untouched
    assert not any(_same_params(m, model) for m, _ in serial)         # and every arm moved
    assert 'approx_kl' in serial[0][1][0] and 'approx_kl' not in serial[1][1][0]


def test_train_arms_passes_the_settings_on():
    wide = small_ppo(seed=0, clip_low=1 - 1e-9, clip_high=float('inf'))
    arms = [('ppo', wide), ('ppo', dataclasses.replace(wide, seed=1))]
    (_, h0), (_, h1) = arl.train_arms(small_agent(), TRAIN, TOK, arms, steps=1, processes=1)
    assert h0[0]['clip_frac'] == 0.0                                 # bounds no ratio reaches
    assert h0 != h1                                                   # the seed reached the run
    [(_, clipped)] = arl.train_arms(small_agent(), TRAIN, TOK, [('ppo', small_ppo(seed=0))], 1)
    assert clipped[0]['clip_frac'] > 0.0 and clipped != h0



def test_train_arms_errors():
    with pytest.raises(ValueError, match=r"unknown method 'ppo2'; expected one of"):
        arl.train_arms(small_agent(), TRAIN, TOK, [('ppo2', small_ppo())], steps=1)
    with pytest.raises(ValueError, match='processes must be at least 1, got 0'):
        arl.train_arms(small_agent(), TRAIN, TOK, [('ppo', small_ppo())], steps=1, processes=0)
