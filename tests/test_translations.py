"""to_verl and to_openrlhf checked by the trainers' own machinery, not by string comparison:
verl's trainer config composed by Hydra with to_verl's overrides (struct mode: an unknown key
fails), OpenRLHF's own argument parser and post-parse checks on to_openrlhf's flags; the values
read back are the config's. to_trl on several processes. The caveats' descriptions of TRL's
reuse of a generation and of OpenRLHF's group filter, against the installed source. The setup
installs verl 0.8.0 and openrlhf 0.11.2 without their GPU dependencies (tools/setup_env.sh),
with hydra-core; the versions themselves: tests/test_scaling.py."""
import importlib.util
import math
from pathlib import Path

import pytest

import agentrl as arl

pytest.importorskip('hydra')
trainer_configs = pytest.importorskip('trainer_configs')
if not all(__import__('importlib').util.find_spec(name) for name in ('verl', 'openrlhf')):
    pytest.skip('verl and openrlhf not installed (tools/setup_env.sh installs them)',
                allow_module_level=True)

CONFIGS = {'default': arl.RLConfig(), **{k: arl.RLConfig(**v) for k, v in arl.VARIANTS.items()},
           'kl in the loss, k1': arl.RLConfig(kl_coef=0.05, kl_kind='k1'),
           'kl in the reward': arl.RLConfig(kl_coef=0.05, kl_placement='reward'),
           'rloo, entropy': arl.RLConfig(adv_mode='rloo', entropy_coef=0.01, epochs=2),
           'constant, norm_const': arl.RLConfig(loss_mode='constant', norm_const=960.0)}


def composed(cfg):
    from omegaconf import OmegaConf
    overrides = arl.to_verl(cfg).options
    return OmegaConf.to_container(trainer_configs.verl_compose(overrides), resolve=True)


def at(tree, key):
    for part in key.split('.'):
        tree = tree[part]
    return tree


@pytest.mark.parametrize('name', CONFIGS)
def test_every_verl_override_composes_into_main_ppo_and_lands(name):
    cfg = CONFIGS[name]
    overrides = arl.to_verl(cfg).options
    tree = composed(cfg)
    for item in overrides:
        key, value = item.split('=', 1)
        assert str(at(tree, key)).lower() == value.lower(), key


def test_verl_rejects_an_unknown_key_so_the_check_can_fail():
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException, match='no_such_key'):
        trainer_configs.verl_compose(['actor_rollout_ref.actor.no_such_key=1'])


def test_verl_gets_our_optimizer_clip_seed_and_reward_kl():
    actor = at(composed(arl.RLConfig(max_grad_norm=0.5, seed=7, kl_coef=0.05,
                                     kl_placement='reward', kl_kind='k3')),
               'actor_rollout_ref.actor')
    assert actor['optim']['clip_grad'] == 0.5           # the key verl's optimizer reads
    assert actor['optim']['weight_decay'] == 0.0        # ours is Adam: no weight decay
    assert actor['optim']['betas'] == [0.9, 0.999] and actor['optim']['lr_warmup_steps_ratio'] == 0
    assert actor['data_loader_seed'] == 7
    tree = composed(arl.RLConfig(kl_coef=0.05, kl_placement='reward', kl_kind='k3'))
    assert tree['algorithm']['use_kl_in_reward'] and tree['algorithm']['kl_penalty'] == 'kl'
    assert not tree['actor_rollout_ref']['actor']['use_kl_loss']


def test_verl_loss_scale_factor_equals_our_constant_per_row():
    for cfg in (arl.RLConfig(loss_mode='constant'),
                arl.RLConfig(loss_mode='constant', norm_const=960.0)):
        factor = at(composed(cfg), 'actor_rollout_ref.actor.loss_scale_factor')
        rows = cfg.prompts_per_step * cfg.group_size // cfg.minibatches
        ours = cfg.norm_const or rows * cfg.max_turns * arl.MAX_CALL_TOKENS
        assert math.isclose(factor * rows, ours)


def test_dynamic_sampling_names_the_dapo_recipe_instead_of_a_dead_override():
    overrides, dropped, _ = arl.to_verl(arl.RLConfig(**arl.VARIANTS['dapo']))
    assert not any('filter_groups' in o for o in overrides)
    assert 'only the DAPO recipe' in dropped['dynamic_sampling']
    assert dropped['max_sample_rounds'] == dropped['dynamic_sampling']


def parsed(cfg):
    flags = arl.to_openrlhf(cfg).options
    # a real run names its agent (the environment); dynamic filtering requires one
    return trainer_configs.openrlhf_validate([*flags, '--train.agent_func_path', 'agent.py'])


@pytest.mark.parametrize('name', CONFIGS)
def test_every_openrlhf_flag_parses_and_passes_openrlhfs_checks(name):
    flags = arl.to_openrlhf(CONFIGS[name]).options
    namespace = trainer_configs.openrlhf_parse(flags)
    assert getattr(namespace, 'algo.kl.init_coef') == CONFIGS[name].kl_coef
    parsed(CONFIGS[name])


def test_openrlhf_rejects_an_unknown_flag_so_the_check_can_fail():
    with pytest.raises(SystemExit):
        trainer_configs.openrlhf_parse(['--no_such_flag'])


def test_openrlhf_carries_kl_off_the_batch_and_the_optimizer():
    cfg = arl.RLConfig(lr=3e-4, max_grad_norm=0.5, seed=7, epochs=2, temperature=0.7)
    namespace = trainer_configs.openrlhf_parse(arl.to_openrlhf(cfg).options)
    value = lambda key: getattr(namespace, key)                       # noqa: E731
    assert value('algo.kl.init_coef') == 0.0            # OpenRLHF's own default is 0.01
    assert value('rollout.batch_size') == cfg.prompts_per_step
    assert value('train.batch_size') == cfg.prompts_per_step * cfg.group_size // cfg.minibatches
    assert value('rollout.n_samples_per_prompt') == cfg.group_size
    assert value('train.max_epochs') == 2 and value('rollout.temperature') == 0.7
    assert value('actor.adam.lr') == 3e-4 and value('actor.max_norm') == 0.5
    assert list(value('actor.adam.betas')) == [0.9, 0.999]
    assert value('actor.lr_scheduler') == 'constant' and value('actor.lr_warmup_ratio') == 0
    assert value('train.seed') == 7


def test_openrlhf_mean_baseline_is_its_dr_grpo_estimator():
    namespace = trainer_configs.openrlhf_parse(
        arl.to_openrlhf(arl.RLConfig(adv_mode='mean')).options)
    assert getattr(namespace, 'algo.advantage.estimator') == 'dr_grpo'


def test_openrlhf_reward_kl_is_k1_and_its_placement_is_reported():
    flags, _, caveats = arl.to_openrlhf(
        arl.RLConfig(kl_coef=0.05, kl_placement='reward', kl_kind='k3'))
    namespace = trainer_configs.openrlhf_parse(flags)
    assert getattr(namespace, 'algo.kl.estimator') == 'k1'
    assert not getattr(namespace, 'algo.kl.use_loss')
    assert 'reward-to-go' in caveats['kl_placement']          # not the same penalty as ours


def test_verl_differences_we_cannot_switch_off_are_reported():
    caveats = arl.to_verl(arl.RLConfig()).caveats
    assert 'clip_ratio_c' in caveats['clip_low']
    tree = composed(arl.RLConfig())
    assert tree['actor_rollout_ref']['actor']['clip_ratio_c'] == 3.0   # what it reports
    assert tree['actor_rollout_ref']['actor']['shuffle'] is True
    caveats = arl.to_verl(arl.RLConfig(**arl.VARIANTS['grpo'])).caveats
    assert 'aggregates the KL' in caveats['loss_mode']


def test_group_std_difference_is_reported_with_its_factor():
    for translate in (arl.to_trl, arl.to_verl, arl.to_openrlhf):
        assert 'sqrt((K-1)/K)' in translate(arl.RLConfig()).caveats['adv_mode']


def test_to_trl_shares_the_batch_out_over_processes():
    cfg = arl.RLConfig()
    one, four = arl.to_trl(cfg).options, arl.to_trl(cfg, processes=4).options
    assert four['per_device_train_batch_size'] * 4 == one['per_device_train_batch_size']
    with pytest.raises(ValueError, match='on 5 process'):
        arl.to_trl(cfg, processes=5)


def test_the_chapters_throughput_options_exist_where_it_says():
    import dataclasses

    import trl
    tree = composed(arl.RLConfig())
    for key in ('actor_rollout_ref.rollout.name', 'actor_rollout_ref.rollout.gpu_memory_utilization',
                'actor_rollout_ref.rollout.enable_prefix_caching',
                'actor_rollout_ref.actor.use_dynamic_bsz',
                'actor_rollout_ref.actor.ppo_max_token_len_per_gpu',
                'actor_rollout_ref.model.use_remove_padding'):
        at(tree, key)
    namespace = trainer_configs.openrlhf_parse([])
    for dest in ('vllm.num_engines', 'train.colocate_all', 'vllm.gpu_memory_utilization',
                 'vllm.enable_prefix_caching', 'vllm.sync_backend', 'ds.packing_samples'):
        assert hasattr(namespace, dest), dest
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert {'use_vllm', 'vllm_mode', 'vllm_gpu_memory_utilization',
            'generation_batch_size'} <= fields
    assert 'padding_free' not in fields


def _installed_source(package, *parts):
    """The text of a file of an installed package, found without importing it."""
    origin = importlib.util.find_spec(package).origin
    return Path(origin).parent.joinpath(*parts).read_text(encoding='utf-8')


def test_openrlhfs_filter_is_the_mean_score_strictly_inside_the_range():
    """What to_openrlhf's dynamic_sampling caveat says, in OpenRLHF's own code."""
    generator = _installed_source('openrlhf', 'trainer', 'ppo_utils', 'samples_generator.py')
    assert 'avg_reward = sum(scores) / len(scores)' in generator
    assert 'if not (min_r < avg_reward < max_r):' in generator
    agent = _installed_source('openrlhf', 'utils', 'agent.py')
    assert 'final_scores = step_result.get("scores", total_reward)' in agent
    assert 'dynamic_filtering_range' in arl.to_openrlhf(
        arl.RLConfig(dynamic_sampling=True)).caveats['dynamic_sampling']


def test_trl_reuses_a_generations_slices_as_to_trl_says():
    """What to_trl's minibatches and epochs caveats say, in TRL's own GRPOTrainer."""
    if importlib.util.find_spec('trl') is None:
        pytest.skip('trl is not installed')
    trainer = _installed_source('trl', 'trainer', 'grpo_trainer.py')
    assert 'generate_every = self.args.steps_per_generation * self.num_iterations' in trainer
    assert 'generation_batch = shuffle_sequence_dict(generation_batch)' in trainer
    assert 'self._buffered_inputs[self._step % self.args.steps_per_generation]' in trainer
    assert ('normalizer = normalizer * self.current_gradient_accumulation_steps / '
            'self.args.steps_per_generation') in trainer            # dapo's divisor
    assert 'if self.args.gradient_accumulation_steps % generate_every != 0' in trainer
