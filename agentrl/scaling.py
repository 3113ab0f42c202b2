# Generated from book/14-scaling-and-efficiency.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'median_seconds',
    'approx',
    'profile_steps',
    'OP_KINDS',
    'PHASES',
    'cpu_profile',
    'op_breakdown',
    'linear_flops',
    'gemm_rate',
    'step_floor_flops',
    'decode_work',
    'greedy_cached',
    'greedy_recomputed',
    'padding_shares',
    'padded_log_probs',
    'Curriculum',
    'RayExecutor',
    'hf_tokenizer',
]


import collections
import contextlib
import copy
import functools
import math
import os
import random
import statistics
import time
import zlib

import torch

import agentrl as arl
from agentrl import plumbing


def median_seconds(fn, repeats=5, warmup=1):
    """Median wall-clock seconds of fn() over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def approx(value, unit=''):
    """A measured speed as the book prints it, '≈' + value (+ unit): this machine's
    number, which the book's checks do not compare."""
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f'≈{value:.{digits}f}' + (f' {unit}' if unit else '')


class _Clock:
    """Seconds and counts per named part; each timed part is also a torch.profiler
    range of that name."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.counts = collections.defaultdict(int)

    @contextlib.contextmanager
    def part(self, name):
        start = time.perf_counter()
        with torch.profiler.record_function(name):
            try:
                yield
            finally:
                self.seconds[name] += time.perf_counter() - start


class _TimedEnv:
    """An environment whose reset and step count as the part 'environment'."""

    def __init__(self, env, clock):
        self._env, self._clock = env, clock

    def reset(self, task):
        with self._clock.part('environment'):
            return self._env.reset(task)

    def step(self, text):
        with self._clock.part('environment'):
            return self._env.step(text)

    def __getattr__(self, name):
        return getattr(self._env, name)


class _TimedDecoder:
    """A cached decoder whose feeds count as the part 'model', with the tokens fed and
    the rows fed (each gets logits for its last token only)."""

    def __init__(self, decoder, clock):
        self._decoder, self._clock = decoder, clock

    def feed(self, chunks):
        self._clock.counts['fed'] += sum(len(chunk) for chunk in chunks.values())
        self._clock.counts['fed_rows'] += sum(1 for chunk in chunks.values() if chunk)
        with self._clock.part('model'):
            return self._decoder.feed(chunks)

    def __getattr__(self, name):
        return getattr(self._decoder, name)


class _MarkedObjective:
    """The objective inner, whose advantages also call on_update(batch, advantages,
    cfg), where a step's update begins; every other method (prepare, loss, ...) and
    attribute is inner's."""

    def __init__(self, inner, on_update):
        self._inner, self._on_update = inner, on_update

    def advantages(self, batch, episodes, cfg):
        advantages = self._inner.advantages(batch, episodes, cfg)
        self._on_update(batch, advantages, cfg)
        return advantages

    def __getattr__(self, name):
        if name == '_inner':                 # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self._inner, name)


class _Phases:
    """train_rl's steps cut into the phases 'sampling' and 'update' (seconds, and
    torch.profiler ranges), from the two seams that see their boundaries."""

    def __init__(self, clock):
        self.clock, self.rows = clock, []
        self._range, self._marks = None, {}

    def _enter(self, name):
        """Close the open phase; open `name` (None: none) and note when it began."""
        if self._range is not None:
            self._range.__exit__(None, None, None)
        self._range = torch.profiler.record_function(name) if name else None
        if self._range is not None:
            self._range.__enter__()
        self._marks[name] = time.perf_counter()

    def start(self):
        """A step's sampling begins."""
        self._enter('sampling')

    def on_update(self, batch, advantages, cfg):
        """The update begins: count the tokens of its rows that learn and of those
        only scored (per epoch), and those the reference scores."""
        self._enter('update')
        lengths, learns = batch['lengths'], _learning_rows(batch, advantages, cfg)
        self.clock.counts['learned'] += int(lengths[learns].sum())
        self.clock.counts['scored'] += int(lengths[~learns].sum())
        if 'ref_logp' in batch:
            self.clock.counts['reference'] += int(lengths.sum())

    def on_step(self, record):
        """The step ends: one row of seconds and counts (a step that learned nothing
        has no update: all of it is sampling)."""
        now, marks = time.perf_counter(), self._marks
        updated = marks.get('update', -math.inf) > marks['sampling']
        split = marks['update'] if updated else now
        row = dict(self.clock.seconds, **self.clock.counts,
                   sampling=split - marks['sampling'], update=now - split,
                   total=now - marks['sampling'])
        row['sampling, rest'] = (row['sampling'] - row.get('model', 0)
                                 - row.get('environment', 0))
        self.rows.append(row)
        self.clock.seconds.clear()
        self.clock.counts.clear()
        self.start()

    def stop(self):
        self._enter(None)


def _learning_rows(batch, advantages, cfg):
    """The rows rl_update runs with autograd, advantages [B] or [B, T-1] -> bool [B]:
    those with an advantage != 0, or every row when the loss has a KL or entropy
    term."""
    rows = len(batch['lengths'])
    kl_in_loss = 'ref_logp' in batch and cfg.kl_placement == 'loss'
    if kl_in_loss or cfg.entropy_coef > 0:
        return torch.ones(rows, dtype=torch.bool)
    return (advantages != 0).reshape(rows, -1).any(-1)


def profile_steps(model, tasks, tok, cfg, steps=4, env_factory=None,
                  objective=arl.Objective()):
    """train_rl for `steps` steps on a copy of model, timed through its seams (env
    factory, model.decoder, objective, callback) -> (one dict per step of seconds per
    part and the token counts fed/fed_rows/learned/scored/reference, the history)."""
    model, clock = copy.deepcopy(model), _Clock()
    env_factory = env_factory or functools.partial(arl.make_env, cfg)
    untimed = model.decoder
    model.decoder = lambda batch_size: _TimedDecoder(untimed(batch_size), clock)
    phases = _Phases(clock)
    phases.start()
    try:
        history = arl.train_rl(model, tasks, tok, cfg, steps,
                               env_factory=lambda: _TimedEnv(env_factory(), clock),
                               objective=_MarkedObjective(objective, phases.on_update),
                               callback=phases.on_step)
    finally:
        phases.stop()
    return phases.rows, history


OP_KINDS = {
    'matrix multiplies': ('aten::mm', 'aten::addmm'),
    'attention': ('aten::bmm', 'aten::baddbmm', 'aten::_softmax',
                  'aten::_softmax_backward_data'),
    'copies and cache writes': ('aten::copy_', 'aten::fill_', 'aten::zero_',
                                'aten::index', 'aten::_index_put_impl_', 'aten::cat',
                                'aten::clone', 'aten::empty', 'aten::empty_strided')}
PHASES = ('model', 'environment', 'sampling', 'update')


def _op_kind(name):
    """The OP_KINDS kind of a torch op name, else 'other tensor ops'."""
    return next((kind for kind, ops in OP_KINDS.items() if name in ops),
                'other tensor ops')


@contextlib.contextmanager
def cpu_profile():
    """torch.profiler over the block, CPU ops -> the profiler. torch 2.13 prints a
    timestamped line to stderr when profiling starts and stops: both are dropped."""
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with plumbing.stderr_captured():
        profiler.__enter__()
    try:
        yield profiler
    finally:
        with plumbing.stderr_captured():
            profiler.__exit__(None, None, None)


def op_breakdown(events):
    """torch.profiler events of profile_steps -> {(phase, kind): seconds}: each op's own
    time, under the innermost of PHASES around it; a phase's own time (outside every op)
    is its kind 'Python'."""
    seconds = collections.defaultdict(float)
    for event in events:
        if event.name in PHASES:
            phase, kind = event.name, 'Python'
        else:
            parent = event.cpu_parent
            while parent is not None and parent.name not in PHASES:
                parent = parent.cpu_parent
            if parent is None:
                continue
            phase, kind = parent.name, _op_kind(event.name)
        seconds[phase, kind] += event.self_cpu_time_total / 1e6
    return dict(seconds)


def linear_flops(model, head=True):
    """FLOPs (2 per multiply-add) of one token through model's nn.Linear layers (without
    the output layer model.head if head is False)."""
    return sum(2 * m.in_features * m.out_features for m in model.modules()
               if isinstance(m, torch.nn.Linear) and (head or m is not model.head))


def gemm_rate(model, rows=(256, 1024, 2048), repeats=20):
    """This machine's best matrix-multiply speed on model's linear layer shapes and
    dtype, over batches of `rows` tokens -> FLOP/s."""
    shapes = [(m.in_features, m.out_features) for m in model.modules()
              if isinstance(m, torch.nn.Linear)]
    dtype, best = model.head.weight.dtype, 0.0
    for n in rows:
        flops = seconds = 0.0
        for n_in, n_out in shapes:
            x = torch.randn(n, n_in, dtype=dtype)
            w = torch.randn(n_out, n_in, dtype=dtype)
            seconds += median_seconds(lambda: torch.nn.functional.linear(x, w),
                                      repeats, warmup=2)
            flops += 2 * n * n_in * n_out
        best = max(best, flops / seconds)
    return best


def step_floor_flops(model, row, cfg):
    """A step's matrix-multiply work from a profile_steps row of a run with cfg: every
    fed token once through the blocks and every fed row once through the output layer
    (sampling); in each of cfg.epochs, learned tokens forward + backward (3 forwards)
    and scored ones forward; reference tokens forward once."""
    full, blocks = linear_flops(model), linear_flops(model, head=False)
    sampling = blocks * row['fed'] + (full - blocks) * row['fed_rows']
    passes = cfg.epochs * (3 * row['learned'] + row['scored'])
    return sampling + full * (passes + row.get('reference', 0))


def decode_work(trajs):
    """Token positions a rollout computes: with a KV cache (each token once) and without
    one (every prefix again for each sampled token) -> (cached, recomputed)."""
    cached = recomputed = 0
    for t in trajs:
        mask = [0, *t.action_mask.long().tolist()]     # 1 where ids[p] was sampled
        cached += len(mask)
        recomputed += sum(p for p, sampled in enumerate(mask) if sampled)
    return cached, recomputed


def greedy_cached(model, prompts, new_tokens):
    """Greedy continuation through model's cached decoder: prompts [B, P] ->
    (ids [B, P + new_tokens], logits at each new position [B, new_tokens, V])."""
    decoder = model.decoder(len(prompts))
    logits = decoder.feed({b: row.tolist() for b, row in enumerate(prompts)})
    ids, seen = prompts, []
    for _ in range(new_tokens):
        seen.append(logits.clone())
        chosen = logits.argmax(-1)
        ids = torch.cat([ids, chosen[:, None]], 1)
        logits = decoder.feed({b: [int(t)] for b, t in enumerate(chosen)})
    return ids, torch.stack(seen, 1)


def greedy_recomputed(model, prompts, new_tokens):
    """The same continuation with no cache: the whole sequence through the model for
    every new token -> (ids [B, P + new_tokens], logits [B, new_tokens, V])."""
    ids, seen = prompts, []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(ids)[:, -1]
            seen.append(logits)
            ids = torch.cat([ids, logits.argmax(-1)[:, None]], 1)
    return ids, torch.stack(seen, 1)


def padding_shares(lengths, rows_per_pass=4):
    """Share of the tokens a forward pass processes that are padding, lengths [B]:
    padded to the longest row, and in buckets of rows_per_pass similar lengths ->
    (padded, bucketed)."""
    lengths = sorted(int(n) for n in lengths)
    if not lengths or min(lengths) < 1:
        raise ValueError(f'need at least one row of positive length, got {lengths}')
    real = sum(lengths)
    padded = len(lengths) * lengths[-1]
    buckets = [lengths[i:i + rows_per_pass]
               for i in range(0, len(lengths), rows_per_pass)]
    bucketed = sum(len(b) * b[-1] for b in buckets)
    return 1 - real / padded, 1 - real / bucketed


def padded_log_probs(model, ids, lengths, temperature=1.0):
    """Log-prob of each next token from one padded forward pass over the whole batch:
    ids [B, T], lengths [B] -> [B, T-1], 0 past a row's length."""
    logp = torch.log_softmax(model(ids)[:, :-1] / temperature, -1)
    taken = logp.gather(2, ids[:, 1:, None])[..., 0]
    inside = torch.arange(ids.shape[1] - 1) < (lengths[:, None] - 1)
    return taken * inside


class Curriculum:
    """An environment factory that stops sampling the tasks a run always or never
    solves: once a task's last `window` attempts all passed or all failed, its later
    episodes play an informative task drawn uniformly. Other tasks pass through
    unchanged."""

    def __init__(self, env_factory, tasks, window=16):
        if window < 1:
            raise ValueError(f'window must be at least 1 attempt, got {window!r}')
        self.env_factory, self.window = env_factory, window
        self.tasks = {t.name: t for t in tasks}
        self.order = [t.name for t in tasks]
        self.results = collections.defaultdict(list)    # task name -> [passed, ...]
        self.recorded = 0                               # outcomes noted so far

    def __call__(self):
        return _CurriculumEnv(self.env_factory(), self)

    def informative(self, name):
        """Whether a task still teaches: fewer than `window` attempts, or mixed
        results."""
        recent = self.results[name][-self.window:]
        return len(recent) < self.window or 0 < sum(recent) < len(recent)

    def retired(self):
        """The retired tasks -> {name: 'solved' or 'failed'}, in order."""
        return {n: 'solved' if all(self.results[n][-self.window:]) else 'failed'
                for n in self.order if not self.informative(n)}

    def choose(self, task):
        """The task an episode of `task` plays: task itself while informative (or
        unknown), else an informative one drawn uniformly, renamed from this attempt's
        own function name if task was renamed."""
        if task.name not in self.tasks or self.informative(task.name):
            return task
        live = [name for name in self.order if self.informative(name)]
        if not live:
            return task                                 # every task retired
        # one draw per retired task and batch: no outcome is noted while a batch
        # resets, so every attempt of a group draws the same substitute
        draw = random.Random(zlib.crc32(f'{task.name}/{self.recorded}'.encode()))
        substitute = self.tasks[draw.choice(live)]
        if task.fn_name == self.tasks[task.name].fn_name:
            return substitute                           # not renamed: kept as it is
        rng = random.Random(zlib.crc32(task.fn_name.encode()))
        return arl.randomize_names(substitute, rng)

    def record(self, name, passed):
        """Note an attempt's outcome (tasks outside the curriculum are ignored)."""
        if name in self.tasks:
            self.results[name].append(bool(passed))
            self.recorded += 1


class _CurriculumEnv:
    """An environment that plays the curriculum's choice and reports each outcome."""

    def __init__(self, env, curriculum):
        self._env, self._curriculum, self._name = env, curriculum, None

    def reset(self, task):
        task = self._curriculum.choose(task)
        self._name = task.name
        return self._env.reset(task)

    def step(self, text):
        observation, reward, done, info = self._env.step(text)
        if done:
            self._curriculum.record(self._name, reward > 0)
        return observation, reward, done, info

    def __getattr__(self, name):
        return getattr(self._env, name)


def train_with_curriculum(model, tasks, tok, cfg, steps, window):
    """train_rl from a copy of model with a Curriculum of `window` over make_env(cfg)
    -> (model, history, the curriculum, its retired count after each step)."""
    curriculum = Curriculum(functools.partial(arl.make_env, cfg), tasks, window)
    model, counts = copy.deepcopy(model), []
    history = arl.train_rl(
        model, tasks, tok, cfg, steps, env_factory=curriculum,
        callback=lambda record: counts.append(len(curriculum.retired())))
    return model, history, curriculum, counts


def _run_with_threads(threads, fn, *args):
    """fn(*args) in a Ray worker, with torch on `threads` threads (the CPUs the task
    asked for)."""
    import torch
    torch.set_num_threads(threads)
    return fn(*args)


class RayExecutor:
    """train_many's executor on Ray: each job one task of cpus_per_run CPUs, on a local
    Ray (address None, num_cpus) or on the cluster at address (see plumbing)."""

    def __init__(self, address=None, num_cpus=None, cpus_per_run=1, retries=2):
        if address not in (None, 'auto'):
            plumbing.check_reachable(address)
        self.address, self.num_cpus = address, num_cpus
        self.cpus_per_run, self.retries = cpus_per_run, retries

    def connect(self):
        """Start or join Ray, once per process -> the ray module; a cluster that
        refuses us is a ConnectionError that names the fix."""
        with plumbing.quiet_ray() as ray:
            if not ray.is_initialized():
                with plumbing.stderr_captured() as said:
                    try:
                        ray.init(**self._init_options())
                    except Exception as error:
                        raise plumbing.join_failure(self.address, error,
                                                    said()) from None
        return ray

    def _init_options(self):
        """ray.init's arguments: a fresh local Ray, or a cluster that gets this
        package's code (its workers need torch, not agentrl)."""
        options = dict(include_dashboard=False, log_to_driver=False,
                       logging_level='error')
        if self.address is None:
            return dict(options, address='local', num_cpus=self.num_cpus)
        package = os.path.dirname(arl.__file__)
        return dict(options, address=self.address,
                    runtime_env={'py_modules': [package], 'excludes': ['__pycache__']})

    def as_completed(self, fn, jobs):
        """(index, fn(*job)) for every job, all submitted at once, in the order they
        finish; a failed job is a RuntimeError once the others are done."""
        ray = self.connect()
        task = ray.remote(num_cpus=self.cpus_per_run, max_retries=self.retries)(
            _run_with_threads)
        shared = _shared_refs(ray, jobs)
        refs = [task.remote(self.cpus_per_run, fn,
                            *(shared.get(id(arg), arg) for arg in job)) for job in jobs]
        index, failed = {ref: i for i, ref in enumerate(refs)}, {}
        pending = list(refs)
        while pending:
            (ref,), pending = ray.wait(pending, num_returns=1)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as error:
                failed[index[ref]] = error
                continue
            yield index[ref], result
        if failed:
            first = failed[min(failed)]
            raise RuntimeError(f'jobs {sorted(failed)} of {len(jobs)} failed on Ray '
                               f'({type(first).__name__}); the others finished'
                               ) from first

    def __call__(self, fn, jobs):
        """fn(*job) for every job as Ray tasks -> results in job order."""
        results = [None] * len(jobs)
        for i, result in self.as_completed(fn, jobs):
            results[i] = result
        return results


def _shared_refs(ray, jobs):
    """Each argument object that every job passes (the model, the tasks, the tokenizer)
    put in Ray's object store once -> {id(object): its reference}."""
    first = jobs[0] if jobs else ()
    return {id(arg): ray.put(arg) for k, arg in enumerate(first)
            if len(jobs) > 1 and all(job[k] is arg for job in jobs)
            and not isinstance(arg, (int, float, str, type(None)))}


def one_by_one(executor):
    """An executor with the classic Ray mistake: ray.get inside the submitting loop,
    so each task waits for the one before it (for the book's comparison)."""
    def run(fn, jobs):
        ray, cpus = executor.connect(), executor.cpus_per_run
        task = ray.remote(num_cpus=cpus, max_retries=0)(_run_with_threads)
        shared = _shared_refs(ray, jobs)
        return [ray.get(task.remote(cpus, fn, *(shared.get(id(a), a) for a in job)))
                for job in jobs]
    return run


def hf_tokenizer(tok):
    """Our word-level vocabulary as a transformers PreTrainedTokenizerFast (built
    locally, nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    core = Tokenizer(models.WordLevel(tok.index, unk_token='<unk>'))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token='<pad>',
                                   unk_token='<unk>', eos_token='<end>',
                                   bos_token='<turn>')


def single_turn_prompts(tasks):
    """One prompt per task for a single-turn trainer: the issue, the whole source and
    the word 'edit'; the completion should be the fix op -> {prompt: task}."""
    return {f"{t.issue} {arl.compact_source(t.source).replace(chr(10), ' ')} edit": t
            for t in tasks}


def tiny_llama(vocab_size, seed=0, dtype=None):
    """A randomly initialized LlamaForCausalLM about TinyAgent's size (width 64, 2
    layers), with our vocabulary's special ids (<pad> 0, <turn> 2, <end> 3)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=176,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3)
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


def step_clock(trainer):
    """Add a callback to a transformers Trainer that notes when each optimizer step
    ends -> the list of perf_counter stamps it fills (the first: training begins)."""
    from transformers import TrainerCallback
    stamps = []

    class _Stamps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    trainer.add_callback(_Stamps())
    return stamps
