# Generated from book/14-scaling-and-efficiency.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'check_reachable',
    'RayExecutor',
    'ENVIRONMENT_FIELDS',
    'TRL_LOSS',
    'VERL_LOSS',
    'VERL_KL',
    'to_trl',
    'to_verl',
    'to_openrlhf',
    'padding_shares',
    'decode_work',
    'single_turn_prompts',
    'hf_tokenizer',
    'tiny_llama',
    'SingleTurnReward',
]


import socket

import agentrl as arl


def _run_with_threads(threads, fn, *args):
    """fn(*args) in a Ray worker, with torch set to the caller's thread count."""
    import torch
    torch.set_num_threads(threads)
    return fn(*args)


def check_reachable(address, timeout=5.0):
    """Fail fast if nothing listens at a Ray 'host:port' (ray.init retries for minutes)."""
    host, _, port = address.rpartition(':')
    if not host or not port.isdigit():
        raise ValueError(f"a Ray address is 'host:port', 'auto' or None, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        raise ConnectionError(f'cannot reach a Ray cluster at {address!r} ({error}); '
                              f'address=None starts a local Ray') from error


class RayExecutor:
    """train_many's executor on Ray: each job one task of one CPU, on a local Ray
    (address None, num_cpus) or on the cluster at address ('host:port' or 'auto')."""

    def __init__(self, address=None, num_cpus=None):
        if address not in (None, 'auto'):
            check_reachable(address)
        self.address, self.num_cpus = address, num_cpus

    def connect(self):
        """Start or join Ray, once per process -> the ray module."""
        import ray
        if not ray.is_initialized():
            ray.init(address=self.address, num_cpus=self.num_cpus, include_dashboard=False,
                     log_to_driver=False, logging_level='error')
        return ray

    def __call__(self, fn, jobs):
        """fn(*job) for every job as Ray tasks, gathered once -> results in job order."""
        import torch
        ray = self.connect()
        task = ray.remote(num_cpus=1, max_retries=0)(_run_with_threads)
        refs = [task.remote(torch.get_num_threads(), fn, *job) for job in jobs]
        try:
            return ray.get(refs)
        except ray.exceptions.RayError as error:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            failed = [i for i, ref in enumerate(refs) if ref in ready
                      and _raises(ray, ref)]
            raise RuntimeError(f'jobs {failed} of {len(jobs)} failed on Ray '
                               f'({type(error).__name__}); no result is returned') from error


def _raises(ray, ref):
    """Whether getting a finished Ray object raises."""
    try:
        ray.get(ref)
    except Exception:
        return True
    return False


# RLConfig fields that describe the environment or our sampler, not the trainer's algorithm
ENVIRONMENT_FIELDS = ('max_turns', 'rename', 'max_edits', 'reward')
TRL_LOSS = {'token_mean': 'dapo', 'seq_mean_token_mean': 'grpo', 'constant': 'dr_grpo'}
VERL_LOSS = {'token_mean': 'token-mean', 'seq_mean_token_mean': 'seq-mean-token-mean',
             'seq_mean_token_sum': 'seq-mean-token-sum',
             'constant': 'seq-mean-token-sum-norm'}
VERL_KL = {'k1': 'kl', 'k2': 'mse', 'k3': 'low_var_kl'}


def _per_step(cfg):
    """Completions per optimizer step: the step's episodes over cfg.minibatches."""
    episodes = cfg.prompts_per_step * cfg.group_size
    if episodes % cfg.minibatches:
        raise ValueError(f'{episodes} episodes per step do not split into '
                         f'{cfg.minibatches} equal minibatches')
    return episodes // cfg.minibatches


def to_trl(cfg):
    """TRL GRPOConfig keyword arguments for cfg (trl 1.16) -> (kwargs, {field: why not
    carried})."""
    kwargs = dict(num_generations=cfg.group_size, per_device_train_batch_size=_per_step(cfg),
                  steps_per_generation=cfg.minibatches, num_iterations=cfg.epochs,
                  temperature=cfg.temperature, epsilon=cfg.clip_low,
                  epsilon_high=cfg.clip_high, importance_sampling_level=cfg.ratio_level,
                  learning_rate=cfg.lr, max_grad_norm=cfg.max_grad_norm, seed=cfg.seed,
                  beta=0.0)
    missing = {name: 'the environment: TRL samples one completion per prompt; port it '
                     'into the reward function or a rollout function'
               for name in ENVIRONMENT_FIELDS}
    if cfg.adv_mode == 'rloo':
        missing['adv_mode'] = "GRPOTrainer has no leave-one-out baseline (TRL's RLOOTrainer)"
    else:
        kwargs['scale_rewards'] = 'group' if cfg.adv_mode == 'grpo' else 'none'
    if cfg.loss_mode in TRL_LOSS:
        kwargs['loss_type'] = TRL_LOSS[cfg.loss_mode]
    else:
        missing['loss_mode'] = f'no TRL loss_type sums tokens per sequence ({cfg.loss_mode})'
    if cfg.kl_coef and (cfg.kl_kind, cfg.kl_placement) == ('k3', 'loss'):
        kwargs['beta'] = cfg.kl_coef
    elif cfg.kl_coef:
        missing['kl_kind'] = 'TRL puts only the k3 estimator in the loss (beta)'
    if cfg.entropy_coef:
        missing['entropy_coef'] = 'GRPOTrainer has no entropy bonus'
    if cfg.dynamic_sampling:
        missing['dynamic_sampling'] = ('no flag; TRL logs frac_reward_zero_std, the share '
                                       'of groups it would filter')
    if cfg.overlong_buffer:
        missing['overlong_buffer'] = ('a reward function, '
                                      'trl.rewards.get_soft_overlong_punishment')
    return kwargs, missing


def to_verl(cfg):
    """verl Hydra overrides for cfg (verl 0.8) -> (['key=value', ...], {field: why not
    carried})."""
    actor, rollout = 'actor_rollout_ref.actor', 'actor_rollout_ref.rollout'
    estimator = {'grpo': 'grpo', 'mean': 'grpo', 'rloo': 'rloo'}[cfg.adv_mode]
    pairs = [('data.train_batch_size', cfg.prompts_per_step),
             (f'{rollout}.n', cfg.group_size), (f'{rollout}.temperature', cfg.temperature),
             (f'{actor}.ppo_mini_batch_size', cfg.prompts_per_step // cfg.minibatches),
             (f'{actor}.ppo_epochs', cfg.epochs), (f'{actor}.clip_ratio_low', cfg.clip_low),
             (f'{actor}.clip_ratio_high', cfg.clip_high),
             (f'{actor}.loss_agg_mode', VERL_LOSS[cfg.loss_mode]),
             (f'{actor}.optim.lr', cfg.lr), (f'{actor}.grad_clip', cfg.max_grad_norm),
             (f'{actor}.entropy_coeff', cfg.entropy_coef),
             ('algorithm.adv_estimator', estimator),
             ('algorithm.norm_adv_by_std_in_grpo', cfg.adv_mode == 'grpo')]
    if cfg.ratio_level == 'sequence':
        pairs.append((f'{actor}.policy_loss.loss_mode', 'gspo'))
    in_loss = bool(cfg.kl_coef) and cfg.kl_placement == 'loss'
    pairs += [(f'{actor}.use_kl_loss', in_loss),
              ('algorithm.use_kl_in_reward', bool(cfg.kl_coef) and not in_loss)]
    if in_loss:
        pairs += [(f'{actor}.kl_loss_coef', cfg.kl_coef),
                  (f'{actor}.kl_loss_type', VERL_KL[cfg.kl_kind])]
    elif cfg.kl_coef:
        pairs.append(('algorithm.kl_ctrl.kl_coef', cfg.kl_coef))
    if cfg.dynamic_sampling:
        pairs += [('algorithm.filter_groups.enable', True),
                  ('algorithm.filter_groups.max_num_gen_batches', cfg.max_sample_rounds)]
    if cfg.overlong_buffer:
        pairs += [('reward_model.reward_kwargs.overlong_buffer_cfg.enable', True),
                  ('reward_model.reward_kwargs.overlong_buffer_cfg.len',
                   cfg.overlong_buffer)]
    missing = {name: 'the environment: a verl agent loop or reward function'
               for name in ENVIRONMENT_FIELDS}
    if cfg.prompts_per_step % cfg.minibatches:
        missing['minibatches'] = (f'{cfg.prompts_per_step} prompts do not split into '
                                  f'{cfg.minibatches} minibatches of whole groups')
    return [f'{key}={_hydra(value)}' for key, value in pairs], missing


def to_openrlhf(cfg):
    """OpenRLHF command-line flags for cfg (its dotted flags, 2026-08) -> ([flag, value, ...],
    {field: why not carried})."""
    estimator = {'grpo': 'group_norm', 'mean': 'group_norm', 'rloo': 'rloo'}[cfg.adv_mode]
    flags = ['--rollout.n_samples_per_prompt', str(cfg.group_size),
             '--algo.advantage.estimator', estimator,
             '--actor.eps_clip_low_high', str(cfg.clip_low), str(cfg.clip_high)]
    if cfg.adv_mode == 'mean':
        flags.append('--algo.advantage.no_std_norm')
    if cfg.ratio_level == 'sequence':
        flags += ['--actor.policy_loss_type', 'gspo']
    if cfg.kl_coef:
        flags += ['--algo.kl.estimator', cfg.kl_kind, '--algo.kl.init_coef', str(cfg.kl_coef)]
        if cfg.kl_placement == 'loss':
            flags.append('--algo.kl.use_loss')
    if cfg.dynamic_sampling:
        flags += ['--algo.dynamic_filtering_enable', '--algo.dynamic_filtering_range', '0', '1']
    if cfg.overlong_buffer:
        flags += ['--reward.overlong_buffer_len', str(cfg.overlong_buffer)]
    missing = {name: 'the environment: an OpenRLHF agent function or reward function'
               for name in ENVIRONMENT_FIELDS}
    unknown = ('prompts_per_step', 'minibatches', 'epochs', 'temperature', 'lr',
               'max_grad_norm', 'loss_mode', 'entropy_coef', 'seed')
    missing.update({name: 'not in our table of OpenRLHF flags: look it up in '
                          '`python -m openrlhf.cli.train_ppo_ray --help`' for name in unknown})
    return flags, missing


def _hydra(value):
    """A value as Hydra reads it on the command line."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def padding_shares(lengths, rows_per_pass=4):
    """Share of the tokens a forward pass processes that are padding: padded to the batch's
    longest row, and in buckets of rows_per_pass similar lengths -> (padded, bucketed)."""
    lengths = sorted(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise ValueError(f'need at least one row of positive length, got {lengths}')
    real = sum(lengths)
    padded = len(lengths) * lengths[-1]
    buckets = [lengths[i:i + rows_per_pass] for i in range(0, len(lengths), rows_per_pass)]
    bucketed = sum(len(b) * b[-1] for b in buckets)
    return 1 - real / padded, 1 - real / bucketed


def decode_work(trajs):
    """Token positions a rollout computes: with a KV cache (each token once) and without
    one (every prefix again for each sampled token) -> (cached, recomputed)."""
    cached = recomputed = 0
    for t in trajs:
        mask = [0, *t.action_mask.long().tolist()]     # 1 where ids[p] was sampled
        cached += len(mask)
        recomputed += sum(p for p, sampled in enumerate(mask) if sampled)
    return cached, recomputed


def single_turn_prompts(tasks):
    """One prompt per task for a single-turn trainer: the issue, the whole source and the
    word 'edit'; the completion should be the fix op -> {prompt: task}."""
    return {f"{t.issue} {arl.compact_source(t.source).replace(chr(10), ' ')} edit": t
            for t in tasks}


def hf_tokenizer(tok):
    """Our word-level vocabulary as a transformers PreTrainedTokenizerFast (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    core = Tokenizer(models.WordLevel(tok.index, unk_token='<unk>'))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token='<pad>',
                                   unk_token='<unk>', eos_token='<end>', bos_token='<turn>')


def tiny_llama(vocab_size, seed=0, dtype=None):
    """A randomly initialized LlamaForCausalLM about TinyAgent's size (d 64, 2 layers)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=128, pad_token_id=0, bos_token_id=2,
                         eos_token_id=3)
    return LlamaForCausalLM(config).to(dtype or torch.float32)


class SingleTurnReward:
    """TRL reward function: 1.0 when the completion's first word is an op that makes the
    prompt's task pass its hidden tests."""

    def __init__(self, tasks):
        self.by_prompt = single_turn_prompts(tasks)
        self.__name__ = 'bugfix_hidden_tests'

    def __call__(self, prompts, completions, **kwargs):
        rewards = []
        for prompt, completion in zip(prompts, completions):
            task, words = self.by_prompt[prompt], completion.split()
            op = words[0] if words else ''
            if op not in arl.EDIT_OPS:
                rewards.append(0.0)
                continue
            source = arl.EDIT_OPS[op](task.source, task.public_tests)
            results = arl.run_tests(source, task.hidden_tests, task.fn_name)
            rewards.append(float(all(ok for ok, _ in results)))
        return rewards
