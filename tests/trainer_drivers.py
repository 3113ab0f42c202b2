"""Drivers that run chapter 21's verl agent loop and OpenRLHF agent executor through the
trainers' own code as far as it goes on a CPU without the packages a GPU install brings
(placeholder modules answer for those), with a stand-in token server that samples from a tiny
model. Test plumbing for tests/test_hf_trainers.py, run as a subprocess (the placeholders
change sys.meta_path): python tests/trainer_drivers.py verl|openrlhf MODEL_DIR."""
import asyncio
import os
import re
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's agentrl

import torch  # noqa: E402

import agentrl as arl  # noqa: E402
from agentrl import hf  # noqa: E402

# the modules verl 0.8.0 (and OpenRLHF 0.11.2) import that a --no-deps install lacks here
VERL_MISSING = ('tensordict', 'codetiming', 'cachetools', 'fastapi', 'uvicorn')
OPENRLHF_MISSING = ('vllm', 'pylatexenc', 'aiohttp', 'peft', 'flash_attn', 'deepspeed',
                    'torchdata')


class LocalTokenServer:
    """A stand-in for verl's LLMServerClient and OpenRLHF's vLLM engine: an HFPolicy
    samples token ids from token ids (a turn ends at a stop id or max_tokens)."""

    def __init__(self, policy, tok, seed=0):
        self.policy, self.tok = policy, tok
        self.generator = torch.Generator().manual_seed(seed)
        self.requests = []                   # per call: (prompt ids, sampled ids)
        self.script = []                     # turn texts to write instead of sampling

    def sample(self, prompt_ids, max_tokens, temperature):
        """prompt ids [P] -> (sampled ids [n], their log-probs [n], stopped: bool); the
        next script text (then a stop id), if any, instead of a sample."""
        if max_tokens < 1:
            raise ValueError(f'max_tokens must be at least 1, got {max_tokens}')
        cache = hf._transformers().DynamicCache()
        logits = self.policy.feed(cache, list(prompt_ids))
        temperature = temperature or 1e-6              # verl and vLLM: 0 means greedy
        if self.script:
            ids = self.tok.encode(self.script.pop(0))[:max_tokens - 1] + [
                min(self.tok.stop_ids)]
            logps = []
            for k, token in enumerate(ids):
                logps.append(float(torch.log_softmax(logits / temperature, -1)[token]))
                if k < len(ids) - 1:
                    logits = self.policy.feed(cache, [token])
            self.requests.append((list(prompt_ids), ids))
            return ids, logps, True
        keep, self.policy.max_new_tokens = self.policy.max_new_tokens, max_tokens
        try:
            ids, logps = self.policy.sample_turn(cache, logits, self.tok, temperature,
                                                  self.generator)
        finally:
            self.policy.max_new_tokens = keep
        self.requests.append((list(prompt_ids), ids))
        return ids, logps, ids[-1] in self.tok.stop_ids

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None,
                       video_data=None, audio_data=None, mm_processor_kwargs=None,
                       **kwargs):
        """verl's LLMServerClient.generate -> verl TokenOutput."""
        from verl.workers.rollout.replica import TokenOutput
        params = dict(sampling_params)
        ids, logps, stopped = self.sample(prompt_ids, params.get('max_tokens', 24),
                                          params.get('temperature', 1.0))
        return TokenOutput(token_ids=ids,
                           log_probs=logps if params.get('logprobs') else None,
                           stop_reason='completed' if stopped else None)


class _Placeholder:
    """Stands in for any object of a missing module: calls, attributes and context
    managers give placeholders; a call on one function returns the function
    (decorators)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        return _Placeholder()

    def __iter__(self):
        return iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _PlaceholderModule(types.ModuleType):
    """A missing module: every attribute is a new placeholder class."""
    __version__ = '0.0.0'

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        cls = type(name, (_Placeholder,), {'__module__': self.__name__})
        setattr(self, name, cls)
        return cls


class _PlaceholderFinder:
    """An import hook that answers for the named top-level packages and their
    submodules with placeholder modules."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery
        if fullname.split('.')[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_placeholders(names):
    """Make `import NAME` (and NAME.sub) give placeholder modules for the names that are
    not installed -> the names replaced. For a subprocess: it changes sys.meta_path."""
    import importlib.util
    missing = [n for n in names if n not in sys.modules and
               importlib.util.find_spec(n) is None]
    if missing:
        sys.meta_path.insert(0, _PlaceholderFinder(missing))
    return missing


def save_tiny_model(policy, tok, directory):
    """Save an HFPolicy's model and its tokenizer (with the chat template) where
    verl's HFModelConfig and OpenRLHF's --actor.model_name_or_path read them -> dir."""
    policy.lm.save_pretrained(directory)
    tok.hf.save_pretrained(directory)
    return str(directory)


def _frame_in(exc, package):
    """The innermost traceback frame of exc inside package -> 'path:line (function)'."""
    import traceback
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f'/{package}/' in f.filename]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename.split('site-packages/')[-1]}:{f.lineno} ({f.name})"


# the drivers' RLConfigs: two edits an episode (the default is one), so that the scripted
# episode below, an idle edit, the fix and submit, passes only if the trainer's gym
# follows cfg; OpenRLHF's turn budget differs from the agent's default too
VERL_CFG = dict(group_size=2, prompts_per_step=2, minibatches=1, max_turns=3,
                max_edits=2, entropy_coef=0.01, temperature=0.7, lr=1e-6)
OPENRLHF_CFG = dict(group_size=2, prompts_per_step=2, minibatches=1, max_turns=4,
                    max_edits=2, entropy_coef=0.01)


def idle_then_fix(task):
    """Turn texts that spend an edit on an op that leaves task's source as it is,
    apply the fix and submit: a pass with two edits, a fail with one."""
    idle = next(op for op, edit in arl.EDIT_OPS.items()
                if edit(task.source, task.public_tests) == task.source)
    return [f'<call>edit {idle}</call>', f'<call>edit {task.fix_op}</call>',
            '<call>submit</call>']


def verl_worker_rows(config, dataset_rows, directory):
    """What an AgentLoopWorker receives for dataset_rows: verl's RLHFDataset reads them
    from a parquet file (raw_prompt from prompt, index from extra_info), the trainer
    adds a uid a row and repeats each rollout.n times -> (DataProto, [row dict])."""
    import numpy as np
    import datasets
    import transformers
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset
    path = os.path.join(directory, 'train.parquet')
    datasets.Dataset.from_list(dataset_rows).to_parquet(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        config.actor_rollout_ref.model.path)
    dataset = RLHFDataset(path, tokenizer, config.data)
    items = [{k: v for k, v in dataset[i].items() if not isinstance(v, torch.Tensor)}
             for i in range(len(dataset))]
    for k, item in enumerate(items):
        item['uid'] = f'uid-{k}'
    batch = DataProto(non_tensor_batch={key: np.array([item[key] for item in items],
                                                      dtype=object)
                                        for key in items[0]}, meta_info={})
    batch = batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n,
                         interleave=True)
    rows = [{key: value[i] for key, value in batch.non_tensor_batch.items()}
            for i in range(len(batch))]
    return batch, rows


def verl_drive(model_dir, indices=(0, 1), seed=0):
    """Run the agent loop through verl's own AgentLoopWorker (built by its __init__ from
    hf.verl_config, which verl's validate_config accepts, the loop found through the
    file verl_config names) with a LocalTokenServer (the first episode scripted to fix
    its bug, the others sampled) on the rows verl's dataset and trainer make of
    hf.verl_rows: _run_agent_loop on each, then generate_sequences until it stops ->
    JSON-able report. Needs VERL_MISSING."""
    import tempfile
    import transformers
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import (AgentLoopWorker,
                                                         _agent_loop_registry,
                                                         get_trajectory_info)
    from verl.utils.config import validate_config
    hf.BugFixTextAgentLoop.renamer.seed(seed)              # builds the class
    # verl's workers are Ray actors in processes of their own, where no registration
    # made here exists: the worker must find the loop in the file verl_config wrote
    _agent_loop_registry.pop(hf.VERL_AGENT_NAME, None)
    cfg, work = arl.RLConfig(**VERL_CFG), tempfile.mkdtemp(prefix='verl-')
    config = hf.verl_config(cfg, model_dir, work)
    validate_config(config, use_reference_policy=False, use_critic=False)
    tok = hf.ChatTokenizer(transformers.AutoTokenizer.from_pretrained(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                              dtype=torch.float64)
    server = LocalTokenServer(hf.HFPolicy(model), tok, seed)
    worker = AgentLoopWorker(config, llm_client=server)
    entry = _agent_loop_registry.get(hf.VERL_AGENT_NAME)
    loop_entry = None if entry is None else OmegaConf.to_container(OmegaConf.create(
        entry))
    batch, rows = verl_worker_rows(config, hf.verl_rows('train', indices, cfg), work)
    params = dict(temperature=cfg.temperature, top_p=1.0, top_k=-1,
                  repetition_penalty=1.0, logprobs=True)
    loop = asyncio.new_event_loop()
    info = loop.run_until_complete(get_trajectory_info(0, [r['index'] for r in rows],
                                                       False))
    episodes, task = [], arl.make_tasks('train')[indices[0]]
    for k, (row, trajectory) in enumerate(zip(rows, info)):
        start = len(server.requests)
        if k == 0:                  # the first episode: an idle edit, the fix, submit
            server.script = idle_then_fix(task)
        out = loop.run_until_complete(worker._run_agent_loop(params, trajectory, **row))
        episodes.append(dict(
            prompt=out.prompt_ids[out.attention_mask[0, :out.prompt_ids.shape[1]].bool()
                                  [None]].tolist(),
            response=out.response_ids[0].tolist(),
            response_mask=out.response_mask[0].tolist(),
            attention=out.attention_mask[0, out.prompt_ids.shape[1]:].tolist(),
            logprobs=out.response_logprobs[0].tolist(), reward=out.reward_score,
            gym_info=out.extra_fields['gym_info'], index=int(row['index']),
            uid=row['uid'], fn_name=out.extra_fields['fn_name'],
            gym=dict(row['extra_info']['gym']),
            turns=[ids for _, ids in server.requests[start:]]))
    rollout = config.actor_rollout_ref.rollout
    report = dict(episodes=episodes, response_length=rollout.response_length,
                  loop_file=rollout.agent.agent_loop_config_path, loop_entry=loop_entry,
                  loop_file_text=open(rollout.agent.agent_loop_config_path).read(),
                  pad_id=worker.tokenizer.pad_token_id, validated=True,
                  config={key: _select(config, key) for key in (
                      'actor_rollout_ref.rollout.n', 'algorithm.adv_estimator',
                      'data.train_batch_size', 'actor_rollout_ref.rollout.prompt_length',
                      'actor_rollout_ref.rollout.response_length',
                      'actor_rollout_ref.rollout.tensor_model_parallel_size',
                      'actor_rollout_ref.rollout.temperature',
                      'actor_rollout_ref.actor.optim.lr', 'trainer.n_gpus_per_node')})
    try:
        loop.run_until_complete(worker.generate_sequences(batch))
        report['generate_sequences'] = 'returned'
    except Exception as exc:                   # where verl needs what is missing here
        report['generate_sequences'] = f'{type(exc).__name__}: {exc}'
        report['stopped_at'] = _frame_in(exc, 'verl')
    return report


def _select(config, key):
    """config's value at a dotted key, interpolations resolved."""
    from omegaconf import OmegaConf
    return OmegaConf.select(config, key)


class VLLMStyleEngine(LocalTokenServer):
    """LocalTokenServer as OpenRLHF's rollout actor sees its engine: generate(prompt ids,
    SamplingParams) -> a vLLM-like RequestOutput (token_ids with the stop id, text
    without it, finish_reason, logprobs); turn_cap stands in for a model that stops
    sooner."""

    def __init__(self, policy, tok, seed=0, turn_cap=16):
        super().__init__(policy, tok, seed)
        self.turn_cap = turn_cap

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        """-> SimpleNamespace(outputs=[SimpleNamespace(token_ids, text, finish_reason,
        logprobs)])."""
        limit = min(sampling_params.max_tokens, self.turn_cap)
        ids, logps, stopped = self.sample(prompt_token_ids, limit,
                                          sampling_params.temperature)
        text = self.tok.decode(ids[:-1] if stopped else ids)
        out = types.SimpleNamespace(
            token_ids=ids, text=text, finish_reason='stop' if stopped else 'length',
            logprobs=[{t: types.SimpleNamespace(logprob=lp)}
                      for t, lp in zip(ids, logps)])
        return types.SimpleNamespace(outputs=[out])


def openrlhf_parse(flags):
    """Run OpenRLHF's own CLI (openrlhf.cli.train_ppo_ray as __main__: its parser and its
    checks) up to train(), stopped at its ray.init -> the parsed args."""
    import runpy
    import ray

    class Reached(Exception):
        pass

    def stop_here(*args, **kwargs):
        raise Reached(sys._getframe(1).f_locals.get('args'))

    argv, init = sys.argv, ray.init
    sys.argv, ray.init = ['train_ppo_ray', *flags], stop_here
    try:
        runpy.run_module('openrlhf.cli.train_ppo_ray', run_name='__main__')
    except Reached as reached:
        return reached.args[0]
    finally:
        sys.argv, ray.init = argv, init
    raise RuntimeError('train_ppo_ray returned without reaching ray.init')


def openrlhf_drive(model_dir, seed=0):
    """OpenRLHF's own code around the agent: the CLI parse (to ray.init), the agent
    module loaded by its loader, RolloutRayActor.generate_responses (the Ray actor's
    method, called on a stand-in with the executor and a VLLMStyleEngine) for a scripted
    and a sampled episode, and SamplesGenerator._process_response_into_experience ->
    JSON-able report. Needs OPENRLHF_MISSING in place."""
    import json
    import tempfile
    import transformers
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray import vllm_engine
    work = tempfile.mkdtemp(prefix='openrlhf-agent-')
    cfg = arl.RLConfig(**OPENRLHF_CFG)
    agent_file = hf.write_openrlhf_agent_file(os.path.join(work, 'agent.py'), model_dir,
                                              cfg, seed=seed)
    data_file = os.path.join(work, 'prompts.jsonl')
    with open(data_file, 'w') as f:
        for i in range(2):
            f.write(json.dumps({'prompt': f'task {i}', 'label': str(i)}) + '\n')
    args = openrlhf_parse(hf.openrlhf_flags(cfg, model_dir, agent_file, data_file))
    report = dict(args={k: _dotted(args, k) for k in (
        'train.agent_func_path', 'reward.remote_url', 'rollout.n_samples_per_prompt',
        'rollout.batch_size', 'train.batch_size', 'rollout.temperature',
        'algo.advantage.estimator', 'actor.eps_clip_low_high', 'actor.loss_agg_mode',
        'actor.entropy_coef', 'data.input_key', 'data.label_key', 'data.max_len',
        'rollout.max_new_tokens', 'algo.advantage.is_correction_level',
        'vllm.num_engines', 'vllm.tensor_parallel_size', 'train.colocate_all',
        'vllm.enable_sleep', 'ds.enable_sleep', 'actor.num_gpus_per_node',
        'ref.num_gpus_per_node', 'vllm.gpu_memory_utilization', 'algo.kl.init_coef')})
    executor = vllm_engine._load_agent_executor(agent_file)
    tok = hf.ChatTokenizer(transformers.AutoTokenizer.from_pretrained(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                              dtype=torch.float64)
    engine = VLLMStyleEngine(hf.HFPolicy(model), tok, seed)
    actor = types.SimpleNamespace(executor=executor, generate=engine.generate)
    generate_responses = vllm_engine.RolloutRayActor.__ray_metadata__.modified_class \
        .generate_responses
    params = types.SimpleNamespace(temperature=cfg.temperature, max_tokens=None,
                                   logprobs=1)
    engine.script = idle_then_fix(arl.make_tasks('train')[0])
    loop, episodes = asyncio.new_event_loop(), []
    for label in ('0', '1'):                   # label 0 scripted, label 1 sampled
        start = len(engine.requests)
        responses = loop.run_until_complete(generate_responses(
            actor, prompt=f'task {label}', label=label, sampling_params=params,
            max_length=args.data.max_len, hf_tokenizer=tok.hf, num_samples=1))
        for response in responses:
            exp = SamplesGenerator._process_response_into_experience(
                None, response, max_len=args.data.max_len)
            episodes.append(dict(
                label=label, ids=response['observation_tokens'],
                action_ranges=response['action_ranges'],
                action_mask=exp.action_mask[0].tolist(),
                rollout_log_probs=response['rollout_log_probs'],
                reward=response['reward'], scores=float(response['scores']),
                truncated=response['truncated'], extra_logs=response['extra_logs'],
                fn_name=re.search(r'the function (\w+) returns',
                                  tok.decode(response['observation_tokens'])).group(1),
                turns=[ids for _, ids in engine.requests[start:]]))
    report['episodes'] = episodes
    return report


def _dotted(args, key):
    """args.a.b for key 'a.b' (OpenRLHF's hierarchized namespace)."""
    for part in key.split('.'):
        args = getattr(args, part)
    return args


def _main(argv):
    """python trainers.py verl MODEL_DIR | openrlhf MODEL_DIR: run a driver in this
    process, placeholders installed, and print its report as JSON."""
    import json
    import warnings
    warnings.simplefilter('ignore')
    kind, model_dir = argv
    if kind == 'verl':
        report = dict(placeholders=install_placeholders(VERL_MISSING))
        report.update(verl_drive(model_dir))
    elif kind == 'openrlhf':
        report = dict(placeholders=install_placeholders(OPENRLHF_MISSING))
        report.update(openrlhf_drive(model_dir))
    else:
        raise ValueError(f"unknown driver {kind!r}; expected 'verl' or 'openrlhf'")
    print('REPORT ' + json.dumps(report, default=str))


if __name__ == '__main__':
    _main(sys.argv[1:])
