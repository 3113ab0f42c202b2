"""Chapter 14's library (DRAFT, branch draft/ch14): train_many on Ray, and RLConfig translated to
TRL's GRPOConfig and verl's overrides. Needs the optional extras (ray, trl)."""
import dataclasses
import os

import pytest
import torch

import agentrl as arl

ray = pytest.importorskip('ray')
trl = pytest.importorskip('trl')


@pytest.fixture(scope='module')
def local_ray():
    executor = arl.RayExecutor(num_cpus=2)
    executor.connect()
    yield executor
    ray.shutdown()


@pytest.fixture(scope='module')
def small_setup():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    model = arl.TinyAgent(len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, seed=0)
    configs = [arl.RLConfig(seed=s, prompts_per_step=2, group_size=2, max_turns=3)
               for s in (0, 1, 2)]
    return model, arl.make_tasks('train'), tok, configs


def test_ray_runs_match_in_process_runs_bit_for_bit(local_ray, small_setup):
    model, tasks, tok, configs = small_setup
    on_ray = arl.train_many(model, tasks, tok, configs, 2, executor=local_ray)
    here = arl.train_many(model, tasks, tok, configs, 2, processes=1)
    for (m1, h1), (m2, h2) in zip(on_ray, here):
        assert h1 == h2
        assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))


def _crash(*args):
    os._exit(3)


def test_a_worker_that_dies_is_a_clear_error(local_ray):
    with pytest.raises(RuntimeError, match=r'failed on Ray .*no result is returned'):
        local_ray(_crash, [(1,), (2,)])


@pytest.mark.parametrize('address, error, message', [
    ('127.0.0.1:1', ConnectionError, "cannot reach a Ray cluster at '127.0.0.1:1'"),
    ('localhost', ValueError, "a Ray address is 'host:port'")])
def test_bad_addresses_fail_fast(address, error, message):
    with pytest.raises(error, match=message):
        arl.RayExecutor(address=address)


def test_to_trl_builds_a_grpo_config_with_our_values():
    cfg = arl.RLConfig(clip_high=0.28, ratio_level='sequence', lr=3e-4, epochs=2)
    kwargs, missing = arl.to_trl(cfg)
    trl_cfg = trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', use_cpu=True, **kwargs)
    assert trl_cfg.num_generations == 8 and trl_cfg.per_device_train_batch_size == 32
    assert trl_cfg.steps_per_generation == 2 and trl_cfg.num_iterations == 2
    assert (trl_cfg.epsilon, trl_cfg.epsilon_high) == (0.2, 0.28)
    assert trl_cfg.importance_sampling_level == 'sequence' and trl_cfg.loss_type == 'dapo'
    assert trl_cfg.scale_rewards == 'group' and trl_cfg.beta == 0.0
    assert set(missing) == set(arl.ENVIRONMENT_FIELDS)


def test_to_trl_reports_what_it_cannot_carry():
    cfg = arl.RLConfig(adv_mode='rloo', loss_mode='seq_mean_token_sum', kl_coef=0.1,
                       kl_kind='k1', entropy_coef=0.01, dynamic_sampling=True,
                       overlong_buffer=2)
    kwargs, missing = arl.to_trl(cfg)
    assert {'adv_mode', 'loss_mode', 'kl_kind', 'entropy_coef', 'dynamic_sampling',
            'overlong_buffer'} <= set(missing)
    assert 'scale_rewards' not in kwargs and 'loss_type' not in kwargs and kwargs['beta'] == 0
    trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', use_cpu=True, **kwargs)


def test_to_trl_rejects_uneven_minibatches():
    with pytest.raises(ValueError, match='do not split into 3 equal minibatches'):
        arl.to_trl(arl.RLConfig(minibatches=3))


def test_to_verl_known_overrides():
    overrides, missing = arl.to_verl(arl.RLConfig(kl_coef=0.01, dynamic_sampling=True))
    assert 'actor_rollout_ref.rollout.n=8' in overrides
    assert 'actor_rollout_ref.actor.ppo_mini_batch_size=4' in overrides
    assert 'actor_rollout_ref.actor.use_kl_loss=true' in overrides
    assert 'actor_rollout_ref.actor.kl_loss_type=low_var_kl' in overrides
    assert 'algorithm.filter_groups.enable=true' in overrides
    assert 'algorithm.norm_adv_by_std_in_grpo=true' in overrides
    assert set(missing) == set(arl.ENVIRONMENT_FIELDS)
    overrides, _ = arl.to_verl(arl.RLConfig(adv_mode='mean', kl_coef=0.1,
                                            kl_placement='reward'))
    assert 'algorithm.norm_adv_by_std_in_grpo=false' in overrides
    assert 'algorithm.use_kl_in_reward=true' in overrides


def test_padding_shares_known_values():
    # rows of 2, 4, 4, 10: padded to 10 -> 40 slots for 20 tokens; buckets of 2 -> 2*4 + 2*10
    assert arl.padding_shares([4, 10, 2, 4], rows_per_pass=2) == (0.5, 1 - 20 / 28)
    assert arl.padding_shares([5, 5]) == (0.0, 0.0)
    with pytest.raises(ValueError, match='positive length'):
        arl.padding_shares([3, 0])


def test_decode_work_counts_each_prefix_once_per_sampled_token():
    mask = torch.tensor([0, 1, 1, 0, 1], dtype=arl.DTYPE)   # ids[2], ids[3], ids[5] sampled
    traj = arl.Trajectory(torch.zeros(6, dtype=torch.long), mask, 0.0, {})
    assert arl.decode_work([traj, traj]) == (12, 2 * (2 + 3 + 5))


def test_a_tiny_trl_grpo_run_on_single_turn_bugfix(tmp_path):
    from datasets import Dataset
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    reward = arl.SingleTurnReward(tasks)
    first = next(iter(reward.by_prompt))
    assert reward([first, first], [f'{tasks[0].fix_op}', 'read']) == [1.0, 0.0]
    cfg = arl.RLConfig(group_size=4, prompts_per_step=2, lr=1e-3)
    kwargs, _ = arl.to_trl(cfg)
    args = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=2,
                          max_completion_length=3, report_to='none', save_strategy='no',
                          logging_steps=1, disable_tqdm=True, **kwargs)
    trainer = trl.GRPOTrainer(model=arl.tiny_llama(len(tok)), reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(
                                  [{'prompt': p} for p in reward.by_prompt]),
                              processing_class=arl.hf_tokenizer(tok))
    trainer.train()
    logged = [h for h in trainer.state.log_history if 'reward' in h]
    assert logged and all(0.0 <= h['reward'] <= 1.0 for h in logged)   # one per generation


def test_to_openrlhf_known_flags_and_reports_the_rest():
    flags, missing = arl.to_openrlhf(arl.RLConfig(clip_high=0.28, kl_coef=0.01,
                                                  dynamic_sampling=True))
    text = ' '.join(flags)
    assert '--rollout.n_samples_per_prompt 8' in text
    assert '--actor.eps_clip_low_high 0.2 0.28' in text
    assert '--algo.kl.estimator k3 --algo.kl.init_coef 0.01 --algo.kl.use_loss' in text
    assert '--algo.dynamic_filtering_enable' in text
    assert {'lr', 'temperature', *arl.ENVIRONMENT_FIELDS} <= set(missing)
