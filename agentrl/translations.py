# Generated from book/14-scaling-and-efficiency.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'TRAINER_VERSIONS',
    'ENVIRONMENT_FIELDS',
    'TRL_LOSS',
    'VERL_LOSS',
    'OPENRLHF_LOSS',
    'VERL_KL',
    'OVERLONG_IN_TURNS',
    'GROUP_STD',
    'Translation',
    'to_trl',
    'to_verl',
    'to_openrlhf',
]


import typing

import torch

import agentrl as arl

# the trainer releases whose source the translations follow (the book's one version set)
TRAINER_VERSIONS = {'trl': '1.16.0', 'verl': '0.8.0', 'openrlhf': '0.11.2'}
# RLConfig fields that describe the environment, not the trainer's algorithm
ENVIRONMENT_FIELDS = ('max_turns', 'rename', 'max_edits', 'reward')
TRL_LOSS = {'token_mean': 'dapo', 'seq_mean_token_mean': 'grpo', 'constant': 'dr_grpo'}
VERL_LOSS = {'token_mean': 'token-mean', 'seq_mean_token_mean': 'seq-mean-token-mean',
             'seq_mean_token_sum': 'seq-mean-token-sum',
             'constant': 'seq-mean-token-sum-norm'}
OPENRLHF_LOSS = {'token_mean': 'token-mean',
                 'seq_mean_token_mean': 'seq-mean-token-mean'}
VERL_KL = {'k1': 'kl', 'k2': 'mse', 'k3': 'low_var_kl'}
OVERLONG_IN_TURNS = 'our buffer counts turns, the trainers\' count response tokens'
GROUP_STD = ('divides by the group\'s K-1 standard deviation (+{eps}), ours by the '
             'population one (+1e-6): its advantages are ours times sqrt((K-1)/K)')


class Translation(typing.NamedTuple):
    """An RLConfig in a trainer's terms: its options (keyword arguments, overrides or
    flags), the fields no option carries {field: why}, and the fields carried with a
    difference {field: what differs}."""
    options: object
    dropped: dict
    caveats: dict


def _per_step(cfg, processes=1):
    """Completions per optimizer step on each of `processes`: the step's episodes
    over cfg.minibatches, shared out."""
    episodes = cfg.prompts_per_step * cfg.group_size
    if episodes % (cfg.minibatches * processes):
        raise ValueError(f'{episodes} episodes per step do not split into '
                         f'{cfg.minibatches} equal minibatches on {processes} '
                         f'process(es)')
    return episodes // (cfg.minibatches * processes)


def _dropped_everywhere(cfg, trainer, environment, overlong, constant=None):
    """The fields every translation drops when they matter: the environment's, the
    overlong buffer (turns here, tokens there) and norm_const -> {field: why}."""
    dropped = {name: f'the environment: {environment}' for name in ENVIRONMENT_FIELDS}
    if cfg.overlong_buffer:
        dropped['overlong_buffer'] = f'{OVERLONG_IN_TURNS}; {trainer}: {overlong}'
    if cfg.loss_mode == 'constant' and constant:
        dropped['norm_const'] = (f'ours divides by norm_const (None: rows x max_turns '
                                 f'x MAX_CALL_TOKENS); {trainer}: {constant}')
    return dropped


def to_trl(cfg, processes=1, use_cpu=None):
    """TRL GRPOConfig keyword arguments for cfg on `processes` processes (use_cpu
    None: True when torch sees no GPU) -> Translation(kwargs, dropped, caveats)."""
    kwargs = dict(num_generations=cfg.group_size,
                  per_device_train_batch_size=_per_step(cfg, processes),
                  steps_per_generation=cfg.minibatches, num_iterations=cfg.epochs,
                  gradient_accumulation_steps=1,
                  temperature=cfg.temperature, epsilon=cfg.clip_low,
                  epsilon_high=cfg.clip_high,
                  importance_sampling_level='sequence' if cfg.ratio_level == 'sequence'
                  else 'token',
                  learning_rate=cfg.lr, lr_scheduler_type='constant',
                  max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, beta=0.0)
    if not torch.cuda.is_available() if use_cpu is None else use_cpu:
        # else bf16 (GRPOConfig's default) raises on a CPU, or autocasts with use_cpu
        kwargs.update(use_cpu=True, bf16=False)
    dropped = _dropped_everywhere(cfg, 'TRL', 'reward functions, or the experimental '
                                  'environment_factory or rollout_func',
                                  'trl.rewards.get_soft_overlong_punishment',
                                  'dr_grpo divides by max_completion_length, which '
                                  'also cuts completions')
    caveats = _trl_batches(cfg)
    if cfg.adv_mode == 'rloo':
        dropped['adv_mode'] = ("GRPOTrainer has no leave-one-out baseline "
                               "(TRL's RLOOTrainer)")
    else:
        kwargs['scale_rewards'] = 'group' if cfg.adv_mode == 'grpo' else 'none'
    if cfg.adv_mode == 'grpo':
        caveats['adv_mode'] = 'TRL ' + GROUP_STD.format(eps='1e-4')
    if cfg.ratio_level == 'cispo':
        _trl_cispo(cfg, kwargs, dropped)   # loss_type 'cispo' fixes the aggregation
    elif cfg.loss_mode in TRL_LOSS:
        kwargs['loss_type'] = TRL_LOSS[cfg.loss_mode]
    else:
        dropped['loss_mode'] = (f'no TRL loss_type sums tokens per sequence '
                                f'({cfg.loss_mode})')
    _trl_kl(cfg, kwargs, dropped)
    if cfg.entropy_coef:               # a token mean of the entropy, as ours
        kwargs['entropy_coef'] = cfg.entropy_coef
    if cfg.dynamic_sampling:
        dropped['dynamic_sampling'] = dropped['max_sample_rounds'] = (
            'no flag; TRL logs frac_reward_zero_std, the share of groups it would '
            'filter')
    return Translation(kwargs, dropped, caveats)


def _trl_batches(cfg):
    """How TRL trains on one generation, against our minibatches and epochs ->
    {field: what differs}."""
    caveats = {}
    if cfg.minibatches > 1:
        caveats['minibatches'] = (
            f'TRL shuffles a generation once and cuts it into steps_per_generation = '
            f'{cfg.minibatches} slices, one optimizer step each (with '
            f'gradient_accumulation_steps=1, as set); its max_steps counts '
            f'these steps, {cfg.minibatches * cfg.epochs} for each of ours '
            f'(minibatches x epochs)')
        if cfg.loss_mode == 'token_mean' or cfg.ratio_level == 'cispo':
            caveats['minibatches'] += (
                '; its token mean divides a slice\'s token sum by the generation\'s '
                'tokens / steps_per_generation, ours by the slice\'s own tokens')
    if cfg.epochs > 1:
        caveats['epochs'] = (
            f'num_iterations = {cfg.epochs} passes over the same slices in the same '
            f'order, where ours draws new minibatches each epoch' if cfg.minibatches > 1
            else f'num_iterations = {cfg.epochs} passes over the whole generation, '
                 f'as ours does')
    if cfg.minibatches * cfg.epochs > 1:
        for field in caveats:
            caveats[field] += ('; TRL scores pi_old in a forward pass of its own, ours '
                               'takes the sampler\'s log-probs')
    return caveats


def _trl_cispo(cfg, kwargs, dropped):
    """TRL's CISPO: loss_type 'cispo' caps the weight at epsilon_high (a ratio, not a
    distance from 1) and has no lower clamp; it takes the token mean over the batch."""
    kwargs.update(loss_type='cispo', epsilon_high=1.0 + cfg.clip_high)
    if cfg.clip_low < 1.0:
        dropped['clip_low'] = (f"TRL's cispo has no lower clamp of the weight; ours "
                               f"clamps it at 1 - clip_low = {1.0 - cfg.clip_low:g}")
    if cfg.loss_mode != 'token_mean':
        dropped['loss_mode'] = (f"TRL's cispo averages over the batch's tokens "
                                f"(token_mean), not {cfg.loss_mode}")


def _trl_kl(cfg, kwargs, dropped):
    """TRL's KL term: beta weighs k3 in the loss; any other KL of ours is dropped,
    and kl_coef with it."""
    if not cfg.kl_coef:
        return
    if cfg.kl_placement != 'loss':
        dropped['kl_placement'] = 'GRPOTrainer has no KL penalty in the reward'
    if cfg.kl_kind != 'k3':
        dropped['kl_kind'] = "TRL's beta weighs the k3 estimator only"
    if {'kl_placement', 'kl_kind'} & set(dropped):
        dropped['kl_coef'] = ('beta stays 0: TRL has no KL term like ours (see '
                              'kl_placement, kl_kind)')
    else:
        kwargs['beta'] = cfg.kl_coef


def _scale_factor(cfg):
    """verl's loss_scale_factor for loss_mode 'constant': norm_const per row of an
    optimizer step (verl divides each sequence's token sum by it, then averages)."""
    if cfg.norm_const is None:
        return cfg.max_turns * arl.MAX_CALL_TOKENS
    return cfg.norm_const / _per_step(cfg)


def to_verl(cfg):
    """verl Hydra overrides for cfg, for `python -m verl.trainer.main_ppo` ->
    Translation(['key=value', ...], dropped, caveats)."""
    actor, rollout = 'actor_rollout_ref.actor', 'actor_rollout_ref.rollout'
    estimator = {'grpo': 'grpo', 'mean': 'grpo', 'rloo': 'rloo'}[cfg.adv_mode]
    pairs = [('data.train_batch_size', cfg.prompts_per_step),
             (f'{rollout}.n', cfg.group_size),
             (f'{rollout}.temperature', cfg.temperature),
             (f'{actor}.ppo_mini_batch_size', cfg.prompts_per_step // cfg.minibatches),
             (f'{actor}.ppo_epochs', cfg.epochs),
             (f'{actor}.clip_ratio_low', cfg.clip_low),
             (f'{actor}.clip_ratio_high', cfg.clip_high),
             (f'{actor}.loss_agg_mode', VERL_LOSS[cfg.loss_mode]),
             (f'{actor}.optim.lr', cfg.lr), (f'{actor}.optim.weight_decay', 0.0),
             (f'{actor}.optim.clip_grad', cfg.max_grad_norm),
             (f'{actor}.entropy_coeff', cfg.entropy_coef),
             ('algorithm.adv_estimator', estimator),
             ('algorithm.norm_adv_by_std_in_grpo', cfg.adv_mode == 'grpo'),
             ('data.seed', cfg.seed), (f'{actor}.data_loader_seed', cfg.seed),
             (f'{actor}.shuffle', True)]       # ours draws new minibatches each epoch
    if cfg.loss_mode == 'constant':
        pairs.append((f'{actor}.loss_scale_factor', _scale_factor(cfg)))
    if cfg.ratio_level in ('sequence', 'cispo'):
        pairs.append((f'{actor}.policy_loss.loss_mode',
                      {'sequence': 'gspo', 'cispo': 'cispo'}[cfg.ratio_level]))
    pairs += _verl_kl(cfg, actor)
    dropped = _dropped_everywhere(cfg, 'verl', 'an agent loop or a reward function',
                                  "+reward.reward_kwargs.overlong_buffer_cfg.* with "
                                  "reward.reward_manager.name=dapo")
    if cfg.dynamic_sampling:
        dropped['dynamic_sampling'] = dropped['max_sample_rounds'] = (
            f'main_ppo has no group filter in verl {TRAINER_VERSIONS["verl"]}: its '
            f'AlgoConfig dataclass declares algorithm.filter_groups (enable, metric, '
            f'max_num_gen_batches), but main_ppo\'s YAML has no such key and no '
            f'code of main_ppo reads it; only the DAPO recipe, a separate repository '
            f'we have not read, uses it')
    overrides = [f'{key}={_hydra(value)}' for key, value in pairs]
    return Translation(overrides, dropped, _verl_caveats(cfg))


def _verl_kl(cfg, actor):
    """verl's KL overrides: ours in the loss, or k1 summed over an episode in the
    reward (any kl_kind) -> [(key, value), ...]."""
    in_loss = bool(cfg.kl_coef) and cfg.kl_placement == 'loss'
    pairs = [(f'{actor}.use_kl_loss', in_loss),
             ('algorithm.use_kl_in_reward', bool(cfg.kl_coef) and not in_loss)]
    if in_loss:
        pairs += [(f'{actor}.kl_loss_coef', cfg.kl_coef),
                  (f'{actor}.kl_loss_type', VERL_KL[cfg.kl_kind])]
    elif cfg.kl_coef:
        pairs += [('algorithm.kl_ctrl.kl_coef', cfg.kl_coef),
                  ('algorithm.kl_penalty', 'kl')]
    return pairs


def _verl_caveats(cfg):
    """What verl does differently with the fields it carries -> {field: what
    differs}."""
    verl = TRAINER_VERSIONS['verl']
    caveats = {'seed': f'data.seed and actor.data_loader_seed carry the shuffling, '
                       f'and verl re-seeds its minibatch order with data_loader_seed '
                       f'at every update, so every step uses the same permutations '
                       f'(ours runs on across steps); verl {verl} has no seed for the '
                       f'rollout engine\'s sampling'}
    if cfg.ratio_level != 'cispo':     # verl's cispo loss has no dual clip
        caveats['clip_low'] = ('verl also caps the loss of negative-advantage tokens '
                               'at ratio actor.clip_ratio_c (3.0, dual-clip PPO); ours '
                               'does not')
    if cfg.loss_mode != 'token_mean' and (cfg.kl_coef or cfg.entropy_coef):
        caveats['loss_mode'] = ('verl aggregates the KL and entropy terms by '
                                'loss_agg_mode too; ours takes their token mean')
    if cfg.adv_mode == 'grpo':
        caveats['adv_mode'] = 'verl ' + GROUP_STD.format(eps='1e-6')
    if cfg.prompts_per_step % cfg.minibatches:
        caveats['minibatches'] = (f'{cfg.prompts_per_step} prompts do not split into '
                                  f'{cfg.minibatches} minibatches of whole groups')
    return caveats


def _hydra(value):
    """A value as Hydra reads it on the command line."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def to_openrlhf(cfg):
    """Flags for `python -m openrlhf.cli.train_ppo_ray` for cfg ->
    Translation([flag, value, ...], dropped, caveats)."""
    estimator = {'grpo': 'group_norm', 'mean': 'dr_grpo', 'rloo': 'rloo'}[cfg.adv_mode]
    flags = ['--rollout.n_samples_per_prompt', str(cfg.group_size),
             '--rollout.batch_size', str(cfg.prompts_per_step),
             '--train.batch_size', str(_per_step(cfg)),
             '--train.max_epochs', str(cfg.epochs),
             '--rollout.temperature', str(cfg.temperature),
             '--algo.advantage.estimator', estimator,
             '--actor.eps_clip_low_high', str(cfg.clip_low), str(cfg.clip_high),
             '--actor.adam.lr', str(cfg.lr), '--actor.adam.betas', '0.9', '0.999',
             '--actor.lr_scheduler', 'constant', '--actor.lr_warmup_ratio', '0',
             '--actor.max_norm', str(cfg.max_grad_norm), '--train.seed', str(cfg.seed),
             # said even when 0: OpenRLHF's default is 0.01
             '--algo.kl.init_coef', str(cfg.kl_coef)]
    if cfg.ratio_level == 'sequence':
        flags += ['--actor.policy_loss_type', 'gspo']
    if cfg.loss_mode in OPENRLHF_LOSS:
        flags += ['--actor.loss_agg_mode', OPENRLHF_LOSS[cfg.loss_mode]]
    if cfg.kl_coef and cfg.kl_placement == 'loss':
        flags += ['--algo.kl.estimator', cfg.kl_kind, '--algo.kl.use_loss']
    elif cfg.kl_coef:                  # ours: k1 summed over an episode, any kl_kind
        flags += ['--algo.kl.estimator', 'k1']
    if cfg.entropy_coef:
        flags += ['--actor.entropy_coef', str(cfg.entropy_coef)]
    if cfg.dynamic_sampling:
        flags += ['--algo.dynamic_filtering_enable',
                  '--algo.dynamic_filtering_range', '0', '1']
    return Translation(flags, _openrlhf_dropped(cfg), _openrlhf_caveats(cfg))


def _openrlhf_dropped(cfg):
    """The fields no OpenRLHF flag carries -> {field: why}."""
    dropped = _dropped_everywhere(cfg, 'OpenRLHF',
                                  'an agent function or a reward function',
                                  '--reward.overlong_buffer_len',
                                  'no loss aggregation divides by a constant')
    if cfg.loss_mode not in OPENRLHF_LOSS:
        dropped['loss_mode'] = (f'--actor.loss_agg_mode has token-mean and '
                                f'seq-mean-token-mean only ({cfg.loss_mode})')
    if cfg.ratio_level == 'cispo':
        dropped['ratio_level'] = (f"--actor.policy_loss_type is 'ppo' or 'gspo' in "
                                  f"OpenRLHF {TRAINER_VERSIONS['openrlhf']}: no CISPO "
                                  f"loss (the flags give PPO's)")
    if cfg.dynamic_sampling:
        dropped['max_sample_rounds'] = ('OpenRLHF refills a step with new prompts '
                                        'without a limit on rounds')
    return dropped


def _openrlhf_caveats(cfg):
    """What OpenRLHF does differently with the fields it carries -> {field: what
    differs}."""
    caveats = {}
    if cfg.adv_mode == 'grpo':
        caveats['adv_mode'] = 'OpenRLHF ' + GROUP_STD.format(eps='1e-9')
    if cfg.kl_coef and cfg.kl_placement == 'reward':
        caveats['kl_placement'] = ('OpenRLHF adds -coef x k1 to each token\'s reward '
                                   'after the group normalization, and each token '
                                   'learns its reward-to-go; ours subtracts the '
                                   'episode\'s summed k1 before it')
    if cfg.dynamic_sampling:
        caveats['dynamic_sampling'] = _openrlhf_filter(cfg)
    return caveats


def _openrlhf_filter(cfg):
    """OpenRLHF's group filter against ours, which drops the groups whose rewards are
    all equal -> the caveat."""
    rule = ('OpenRLHF keeps a group when the mean of its episodes\' scores lies '
            'strictly between the bounds of --algo.dynamic_filtering_range (0 and 1 '
            'here); a score is what the agent function returns as "scores" (its '
            'summed rewards if it returns none), so the filter is ours only when '
            'every score is 0 or 1')
    if callable(cfg.reward):
        return rule + ('; cfg.reward is a function, whose rewards may lie outside '
                       '{0, 1} (turn costs, partial credit): then it keeps groups of '
                       'equal rewards between the bounds and drops mixed groups whose '
                       'mean is outside them, so return pass or fail as the scores')
    return rule + ('; with make_env\'s environments our rewards are 0 or 1 (in ours '
                   'and in OpenRLHF the overlong penalty and a KL in the reward come '
                   'after the filter): return them as the scores; the filter applies '
                   'only when every episode has a score')
