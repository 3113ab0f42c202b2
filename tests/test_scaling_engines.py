"""Chapter 14's library on the optional engines (agentrl[scale]; the test command installs
them): train_many on Ray, bit for bit; bad addresses and dead workers; RLConfig on a real
trl.GRPOConfig; a single-turn BugFix run on TRL's GRPOTrainer."""
import dataclasses
import os
import sys

import pytest
import torch

import agentrl as arl
from agentrl.scaling import SingleTurnReward, one_by_one, single_turn_prompts, step_clock, \
    tiny_llama

ray = pytest.importorskip('ray')
trl = pytest.importorskip('trl')
pytestmark = pytest.mark.xdist_group('ray')       # with test_ray_cluster: `ray stop` ends all


@pytest.fixture(scope='module')
def local_ray():
    # this module's helper functions travel to the workers by value (they cannot import it)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
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


def _crash_or_echo(value):
    if value == 'crash':
        os._exit(3)
    return value


def test_a_worker_that_dies_is_a_clear_error_after_the_others_finish(local_ray):
    seen = []
    with pytest.raises(RuntimeError, match=r'jobs \[1\] of 3 failed on Ray .*the others'):
        for index, value in local_ray.as_completed(_crash_or_echo, [('a',), ('crash',),
                                                                      ('b',)]):
            seen.append((index, value))
    assert sorted(seen) == [(0, 'a'), (2, 'b')]


def _die_once(marker):
    """Kill this worker the first time (as a lost node would), answer the second time."""
    if not os.path.exists(marker):
        open(marker, 'w').close()
        os._exit(3)
    return 'retried'


def _raise_once(marker):
    """Raise the first time; answer if (wrongly) run again."""
    if not os.path.exists(marker):
        open(marker, 'w').close()
        raise ValueError('a bug in the job')
    return 'retried'


def test_a_job_that_raises_is_not_retried(local_ray, tmp_path):
    with pytest.raises(RuntimeError, match=r'jobs \[0\] of 1 failed on Ray'):
        local_ray(_raise_once, [(str(tmp_path / 'marker'),)])


def test_a_lost_worker_is_retried(local_ray, tmp_path):
    assert local_ray(_die_once, [(str(tmp_path / 'marker'),)]) == ['retried']


def _wait_for(marker, value, write=False, timeout=60.0):
    """Write marker (the fast job), or wait for it and then 2 s more (the slow one) ->
    value, or 'timed out' if the marker never came."""
    import time
    if write:
        open(marker, 'w').close()
        return value
    deadline = time.monotonic() + timeout
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            return 'timed out'
        time.sleep(0.01)
    time.sleep(2.0)                          # finish well after the fast job
    return value


def test_runs_start_at_once_and_come_back_as_they_finish(local_ray, tmp_path):
    """The first job can finish only after the second has run: with every job submitted at
    once it does not time out, and the second comes back first; run one at a time, the
    first would time out."""
    marker = str(tmp_path / 'fast-done')
    results = list(local_ray.as_completed(_wait_for, [(marker, 'slow'),
                                                      (marker, 'fast', True)]))
    assert dict(results) == {0: 'slow', 1: 'fast'}       # ran side by side
    assert results[0] == (1, 'fast')                     # handed back as it finished


def _threads():
    return torch.get_num_threads()


def test_each_task_gets_the_threads_of_the_cpus_it_asked_for(local_ray):
    torch.set_num_threads(1)
    two = arl.RayExecutor(num_cpus=2, cpus_per_run=2)
    assert two(_threads, [()]) == [2]
    assert local_ray(_threads, [(), ()]) == [1, 1]


def test_shared_arguments_go_to_the_object_store_once(local_ray):
    from agentrl.scaling import _shared_refs
    model, cfgs = torch.zeros(3), [{'seed': 0}, {'seed': 1}]
    refs = _shared_refs(ray, [(model, cfgs[0], None), (model, cfgs[1], None)])
    assert list(refs) == [id(model)]
    assert torch.equal(ray.get(refs[id(model)]), model)


@pytest.mark.parametrize('address, error, message', [
    ('127.0.0.1:1', ConnectionError, "cannot reach a Ray cluster at '127.0.0.1:1'"),
    ('ray://127.0.0.1:1', ConnectionError, "cannot reach a Ray cluster at 'ray://"),
    ('[::1]:1', ConnectionError, r"cannot reach a Ray cluster at '\[::1\]:1'"),
    ('localhost', ValueError, "a Ray address is 'host:port'"),
    ('::1:6379', ValueError, r"'\[ipv6\]:port'")])
def test_bad_addresses_fail_fast(address, error, message):
    with pytest.raises(error, match=message):
        arl.RayExecutor(address=address)


def test_to_trl_builds_a_grpo_config_with_our_values():
    cfg = arl.RLConfig(clip_high=0.28, ratio_level='sequence', lr=3e-4, epochs=2)
    kwargs, dropped, caveats = arl.to_trl(cfg)
    trl_cfg = trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', **kwargs)
    assert trl_cfg.num_generations == 8 and trl_cfg.per_device_train_batch_size == 32
    assert trl_cfg.steps_per_generation == 2 and trl_cfg.num_iterations == 2
    assert (trl_cfg.epsilon, trl_cfg.epsilon_high) == (0.2, 0.28)
    assert trl_cfg.importance_sampling_level == 'sequence' and trl_cfg.loss_type == 'dapo'
    assert trl_cfg.scale_rewards == 'group' and trl_cfg.beta == 0.0
    assert trl_cfg.generation_batch_size == cfg.prompts_per_step * cfg.group_size
    assert set(dropped) == set(arl.ENVIRONMENT_FIELDS)
    assert set(caveats) == {'adv_mode', 'minibatches', 'epochs'}   # K-1 std, reuse


def test_to_trl_builds_trls_cispo_config():
    kwargs, dropped, caveats = arl.to_trl(arl.RLConfig(ratio_level='cispo', clip_low=1.0,
                                                       clip_high=4.0))
    trl_cfg = trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', **kwargs)
    assert trl_cfg.loss_type == 'cispo' and trl_cfg.epsilon_high == 5.0
    assert trl_cfg.importance_sampling_level == 'token'
    assert set(dropped) == set(arl.ENVIRONMENT_FIELDS)
    assert set(caveats) == {'adv_mode', 'minibatches'}


def test_to_trl_reports_what_it_cannot_carry():
    cfg = arl.RLConfig(adv_mode='rloo', loss_mode='seq_mean_token_sum', kl_coef=0.1,
                       kl_kind='k1', entropy_coef=0.01, dynamic_sampling=True,
                       overlong_buffer=2)
    kwargs, dropped, caveats = arl.to_trl(cfg)
    assert {'adv_mode', 'loss_mode', 'kl_kind', 'kl_coef', 'dynamic_sampling',
            'overlong_buffer'} <= set(dropped)
    assert 'scale_rewards' not in kwargs and 'loss_type' not in kwargs and kwargs['beta'] == 0
    trl_cfg = trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', **kwargs)
    assert trl_cfg.entropy_coef == 0.01                                 # TRL 1.16 has it
    assert 'entropy_coef' not in {**dropped, **caveats}


def test_to_trl_rejects_uneven_minibatches():
    with pytest.raises(ValueError, match='do not split into 3 equal minibatches'):
        arl.to_trl(arl.RLConfig(minibatches=3))


def test_a_tiny_trl_grpo_run_on_single_turn_bugfix(tmp_path):
    from datasets import Dataset
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    tasks = arl.make_tasks('train')
    reward = SingleTurnReward(tasks)
    first = next(iter(reward.by_prompt))
    assert reward([first, first], [f'{tasks[0].fix_op}', 'read']) == [1.0, 0.0]
    cfg = arl.RLConfig(group_size=4, prompts_per_step=2, lr=1e-3)
    kwargs, _, _ = arl.to_trl(cfg)
    args = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=2,
                          max_completion_length=3, report_to='none', save_strategy='no',
                          logging_steps=1, disable_tqdm=True, **kwargs)
    trainer = trl.GRPOTrainer(model=tiny_llama(len(tok)), reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(
                                  [{'prompt': p} for p in reward.by_prompt]),
                              processing_class=arl.hf_tokenizer(tok))
    stamps = step_clock(trainer)
    trainer.train()
    logged = [h for h in trainer.state.log_history if 'reward' in h]
    assert logged and all(0.0 <= h['reward'] <= 1.0 for h in logged)   # one per generation
    assert len(stamps) == trainer.state.global_step + 1 == 3
    assert stamps == sorted(stamps)


def test_one_by_one_gives_the_same_runs(local_ray, small_setup):
    model, tasks, tok, configs = small_setup
    serial = arl.train_many(model, tasks, tok, configs[:2], 1,
                            executor=one_by_one(local_ray))
    here = arl.train_many(model, tasks, tok, configs[:2], 1, processes=1)
    assert [h for _, h in serial] == [h for _, h in here]


def test_hf_tokenizer_encodes_as_ours():
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    hf = arl.hf_tokenizer(tok)
    prompt = next(iter(single_turn_prompts(arl.make_tasks('train')[:1])))
    assert hf(prompt)['input_ids'] == tok.encode(prompt)
    assert (hf.pad_token_id, hf.eos_token_id) == (tok.pad_id, tok.index['<end>'])
    assert len(hf) == len(tok)


def test_single_turn_prompts_end_with_edit_and_name_their_task():
    tasks = arl.make_tasks('train')
    prompts = single_turn_prompts(tasks)
    assert len(prompts) == len(tasks)
    for prompt, task in prompts.items():
        assert prompt.startswith(task.issue) and prompt.endswith(' edit')
        assert '\n' not in prompt


def test_tiny_llama_is_seeded_and_sized():
    a, b = tiny_llama(50, seed=1), tiny_llama(50, seed=1, dtype=torch.float64)
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    assert all(torch.equal(p.double(), q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.config.hidden_size == 64 and a.config.num_hidden_layers == 2


def test_to_trl_keeps_the_learning_rate_constant():
    kwargs, _, _ = arl.to_trl(arl.RLConfig())
    args = trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', **kwargs)
    assert args.lr_scheduler_type.value == 'constant' and args.learning_rate == 1e-3


def test_to_trl_adds_use_cpu_without_a_gpu_so_grpo_config_builds():
    kwargs, _, _ = arl.to_trl(arl.RLConfig(), use_cpu=None)
    assert kwargs.get('use_cpu') is (not torch.cuda.is_available())
    args = trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', **kwargs)  # raises without it
    assert args.bf16 is torch.cuda.is_available()     # no bf16 autocast on a CPU
    cpu = arl.to_trl(arl.RLConfig(), use_cpu=True).options
    assert cpu['use_cpu'] is True and cpu['bf16'] is False
    assert not trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', **cpu).bf16
    # with use_cpu alone, TRL keeps its bf16 default on
    assert trl.GRPOConfig(output_dir='/tmp/agentrl-trl-test', use_cpu=True).bf16
    gpu = arl.to_trl(arl.RLConfig(), use_cpu=False).options
    assert 'use_cpu' not in gpu and 'bf16' not in gpu
