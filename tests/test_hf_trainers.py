"""Chapter 21's text gym through the trainers: TRL's GRPOTrainer (two real optimizer steps
on CPU, agentrl.hf's TRLRollout and gym_reward), verl's agent loop and OpenRLHF's agent
executor (driven by tests/trainer_drivers.py as far as each runs without a GPU)."""
from __future__ import annotations

import collections
import importlib.util
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
os.environ.setdefault('HF_HUB_OFFLINE', '1')
pytest.importorskip('trl')
# verl and OpenRLHF are installed without their GPU dependencies (tools/setup_env.sh), so
# importing them here fails by design; the drivers run them in subprocesses
if importlib.util.find_spec('verl') is None or importlib.util.find_spec('openrlhf') is None:
    pytest.skip('verl and openrlhf are not installed', allow_module_level=True)

import agentrl as arl                       # noqa: E402
from agentrl import hf                      # noqa: E402
from agentrl import hf as tr                # noqa: E402
import trainer_drivers as drv               # noqa: E402

TASKS = arl.make_tasks('train')
# TRL 1.16 scores tokens with its fused LM head, whose log-softmax runs in float32 even
# for a float64 model (trl/kernels/chunked_logprob.py): sampling and training log-probs
# then differ by ~5e-7. Under bf16 autocast (GRPOConfig's default bf16=True, which on a
# CPU needs use_cpu=True) the fused head multiplies in bf16: ~1e-3.
TRL_LOGP_TOL = 1e-5


@pytest.fixture(scope='module')
def tok():
    return hf.local_chat_tokenizer('word')


@pytest.fixture(scope='module', autouse=True)
def drivers(tok, tmp_path_factory):
    """Start the verl and OpenRLHF drivers (subprocesses, placeholders for the missing
    modules) at once, so they run while the TRL steps do; get(kind) -> its report."""
    model_dir = drv.save_tiny_model(hf.tiny_chat_llama(tok), tok,
                                   tmp_path_factory.mktemp('tiny'))
    env = dict(os.environ, PYTHONWARNINGS='ignore', TOKENIZERS_PARALLELISM='false',
               OMP_NUM_THREADS='1')            # three processes share two cores
    procs = {kind: subprocess.Popen([sys.executable, str(HERE / 'trainer_drivers.py'), kind,
                                     model_dir], cwd=HERE, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for kind in ('verl', 'openrlhf')}
    reports = {}

    def get(kind):
        if kind not in reports:
            out, err = procs[kind].communicate(timeout=300)
            lines = [line for line in out.splitlines() if line.startswith('REPORT ')]
            assert procs[kind].returncode == 0 and lines, err[-3000:]
            reports[kind] = json.loads(lines[-1][len('REPORT '):])
        return reports[kind]
    get.tok, get.model_dir = tok, model_dir
    yield get
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()


# ----------------------------------------------------------------------------------- TRL

def logprob_drift(record, trajs):
    """Largest |TRL's log-prob - the sampler's| over the sampled tokens of a recorded
    batch -> float."""
    worst = 0.0
    for row, i in tr.match_rows(record, trajs):
        layout = tr.episode_layout(trajs[i])
        n, mask = len(layout['env_mask']), torch.tensor(layout['env_mask']).bool()
        gap = record['logps'][row, :n].double() - torch.tensor(layout['logprobs'],
                                                               dtype=torch.float64)
        worst = max(worst, gap[mask].abs().max().item())
    return worst


class HalfScripted(hf.HFPolicy):
    """HFPolicy that plays every other episode from a script (the right fix, then
    submit), scored by the model as in test_hf's Scripted; the others are sampled."""

    def __init__(self, model, tok, max_new_tokens=10):
        super().__init__(model, max_new_tokens=max_new_tokens)
        self.tok, self.script, self.count = tok, None, 0

    def _episode(self, env, task, tok, max_turns, temperature, generator):
        texts = [f'<call>edit {task.fix_op}</call>', '<call>submit</call>']
        self.script = ([tok.encode(t) + [min(tok.stop_ids)] for t in texts]
                       if self.count % 2 == 0 else None)
        self.count += 1
        return super()._episode(env, task, tok, max_turns, temperature, generator)

    def sample_turn(self, cache, logits, tok, temperature, generator):
        if not self.script:
            return super().sample_turn(cache, logits, tok, temperature, generator)
        ids, logps = self.script.pop(0), []
        for k, token in enumerate(ids):
            logps.append(float(torch.log_softmax(logits / temperature, -1)[token]))
            if k < len(ids) - 1:
                logits = self.feed(cache, [token])
        return ids, logps


class HalfScriptedRollout(tr.TRLRollout):
    def make_policy(self, model):
        return HalfScripted(model, self.tok, self.max_new_tokens)


@pytest.fixture(scope='module')
def trl_run(tok, tmp_path_factory):
    """Two GRPOTrainer steps, 2 tasks x group 2 a step, on a float64 tiny Llama."""
    from transformers import TrainerCallback
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, max_turns=3, minibatches=1,
                       entropy_coef=0.01, lr=1e-2, temperature=0.7)
    policy = hf.tiny_chat_llama(tok, seed=1)
    before = [p.detach().clone() for p in policy.lm.parameters()]
    env_factory = functools.partial(hf.make_text_env, cfg)
    rollout = HalfScriptedRollout(tok, TASKS[:2], cfg.max_turns, env_factory=env_factory,
                                  rename=cfg.rename)
    trainer = tr.trl_trainer(policy, tok, TASKS[:2], cfg, tmp_path_factory.mktemp('trl'),
                             max_steps=2, rollout=rollout)
    records, logs, per_episode = tr.record_loss_inputs(trainer), [], []

    class KeepLogs(TrainerCallback):
        """The logged metrics and the per-episode rewards TRL keeps for its table."""
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and 'reward' in logs:
                keep.append(dict(logs))
                per_episode.append(list(trainer._logs['rewards']['gym_reward']))
    keep = logs
    trainer.add_callback(KeepLogs())
    result = trainer.train()
    return dict(trainer=trainer, rollout=rollout, records=records, before=before,
                policy=policy, logs=logs, per_episode=per_episode, result=result)


def test_trl_takes_two_optimizer_steps_and_moves_the_weights(trl_run):
    assert trl_run['result'].global_step == 2
    assert len(trl_run['rollout'].calls) == 2            # one generation per step
    moved = max((a - b).abs().max().item() for a, b in
                zip(trl_run['before'], trl_run['policy'].lm.parameters()))
    assert moved > 1e-4
    assert next(trl_run['policy'].lm.parameters()).dtype == torch.float64


def test_trl_hands_the_rollout_each_prompt_once_per_generation(trl_run):
    # 2 prompts x num_generations 2 (TRL's RepeatSampler): the rollout sees 4 prompts,
    # each task twice
    for trajs in trl_run['rollout'].calls:
        counts = collections.Counter(t.info['task'] for t in trajs)
        assert sorted(counts.values()) == [2, 2]


def test_trl_rollout_renames_every_episode_as_rlconfig_rename(trl_run):
    # RLConfig's default rename=True reaches the rollout: each episode plays its task
    # under a name drawn for it, and the ids TRL trains on carry that name
    assert trl_run['trainer'].rollout_func.rename is True
    originals = {task.name: task.fn_name for task in TASKS[:2]}
    drawn = []
    for trajs in trl_run['rollout'].calls:
        for t in trajs:
            name = t.messages[1]['content'].split()[3]
            assert name != originals[t.info['task']] and name in arl.FN_NAMES
            drawn.append(name)
    assert len(set(drawn)) > 2


def test_trl_trainer_honours_cfg_rename(tok, tmp_path):
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, minibatches=1, rename=False)
    policy = hf.tiny_chat_llama(tok)
    trainer = tr.trl_trainer(policy, tok, TASKS[:2], cfg, tmp_path, max_steps=1)
    assert trainer.rollout_func.rename is False
    with pytest.raises(ValueError, match='cfg.rename is False'):
        tr.trl_trainer(policy, tok, TASKS[:2], cfg, tmp_path, max_steps=1,
                       rollout=tr.TRLRollout(tok, TASKS[:2]))


def test_trl_rollout_seeds_each_process_apart(tok):
    import types
    policy = hf.tiny_chat_llama(tok)
    prompts = [tr.task_prompt(hf.TextBugFixEnv(), TASKS[0])] * 2
    episodes = []
    for rank in (0, 1):
        rollout = tr.TRLRollout(tok, TASKS[:2], max_turns=1, seed=5, rename=False)
        trainer = types.SimpleNamespace(
            model=policy.lm, temperature=1.0, accelerator=types.SimpleNamespace(
                process_index=rank, unwrap_model=lambda model: model))
        out = rollout(prompts, trainer)
        assert rollout.generator.initial_seed() == 5 + rank
        episodes.append(out['completion_ids'])
    assert episodes[0] != episodes[1]       # two processes sample different episodes


def test_trl_loss_mask_is_the_env_mask(trl_run):
    for record, trajs in zip(trl_run['records'], trl_run['rollout'].calls):
        for row, i in tr.match_rows(record, trajs):
            env_mask = tr.episode_layout(trajs[i])['env_mask']
            assert record['mask'][row, :len(env_mask)].tolist() == env_mask
            assert not record['mask'][row, len(env_mask):].any()
            # observation tokens sit inside the completion, after the first sampled turn
            assert env_mask[0] == 1 and 0 in env_mask


def test_trl_logged_rewards_are_the_gyms(trl_run):
    calls = trl_run['rollout'].calls
    gym = [t.reward for trajs in calls for t in trajs]
    assert sorted(set(gym)) == [0.0, 1.0]     # the scripted fixes pass, the rest fail
    assert len(trl_run['logs']) == len(trl_run['per_episode']) == 2
    for log, logged, trajs in zip(trl_run['logs'], trl_run['per_episode'], calls):
        assert logged == [t.reward for t in trajs]     # the rollout's order
        mean = sum(t.reward for t in trajs) / len(trajs)
        assert log['reward'] == pytest.approx(mean, abs=1e-12)
        assert log['rewards/gym_reward/mean'] == pytest.approx(mean, abs=1e-12)


def test_trl_advantages_follow_the_gyms_rewards(trl_run):
    for record, trajs in zip(trl_run['records'], trl_run['rollout'].calls):
        for row, i in tr.match_rows(record, trajs):
            assert (record['advantages'][row].item() > 0) == (trajs[i].reward == 1.0)


def test_trl_log_probs_match_the_sampling_log_probs(trl_run):
    for record, trajs in zip(trl_run['records'], trl_run['rollout'].calls):
        assert logprob_drift(record, trajs) < TRL_LOGP_TOL


def test_trl_config_turns_bf16_off_on_cpu(tmp_path):
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, minibatches=1)
    args = tr.trl_config(cfg, tmp_path, 1)
    assert args.use_cpu and not args.bf16
    from trl import GRPOConfig
    assert GRPOConfig(output_dir=str(tmp_path), use_cpu=True).bf16   # TRL's default


def test_trl_rollout_and_reward_name_bad_values(tok):
    with pytest.raises(ValueError, match='ChatTokenizer'):
        tr.TRLRollout(tok.hf, TASKS[:2])
    rollout = tr.TRLRollout(tok, TASKS[:2])
    with pytest.raises(ValueError, match='none of the 2 tasks'):
        rollout.task_of([{'role': 'user', 'content': 'fix it'}])
    with pytest.raises(ValueError, match="no 'gym_reward' field"):
        tr.gym_reward(['p'], ['c'], other=[1.0])
    assert tr.gym_reward(['p', 'q'], ['c', 'd'], gym_reward=[1, 0.0]) == [1.0, 0.0]


# ---------------------------------------------------------------------------------- verl

class _Drawn:
    """A stand-in rng whose choice is a given name (to rebuild a renamed task)."""

    def __init__(self, name):
        self.name = name

    def choice(self, names):
        assert self.name in names
        return self.name


def played(task, fn_name):
    """task under the function name an episode played it with."""
    return task if fn_name == task.fn_name else arl.randomize_names(task, _Drawn(fn_name))


def gym_replay(task, turn_ids, tok, cfg):
    """The gym's reward and final info for the turns sampled (ids, stop id dropped), in
    the gym of cfg (a driver's RLConfig fields)."""
    env = hf.make_text_env(arl.RLConfig(**cfg))
    env.reset(task)
    for ids in turn_ids:
        text = tok.decode(ids[:-1] if ids[-1] in tok.stop_ids else ids)
        _, reward, done, info = env.step(text)
        if done:
            return reward, info
    raise AssertionError('the replayed episode did not end')


def runs(flags):
    """Maximal runs of 1 in a 0/1 list -> [(start, end)]."""
    out, start = [], None
    for i, f in enumerate(list(flags) + [0]):
        if f and start is None:
            start = i
        if not f and start is not None:
            out.append((start, i))
            start = None
    return out


def test_verl_worker_runs_the_agent_loop_and_stops_at_tensordict(drivers):
    report = drivers('verl')
    assert report['placeholders'] == list(drv.VERL_MISSING)
    # the worker found the loop in the file verl_config wrote (the driver registered
    # nothing), as verl's Ray actors, in processes of their own, must
    assert report['loop_file'].endswith('/' + hf.VERL_LOOP_FILE)
    assert report['loop_entry'] == {'name': 'bugfix_text',
                                    '_target_': 'agentrl.hf.BugFixTextAgentLoop'}
    assert len(report['episodes']) == 4                  # 2 tasks x rollout.n 2
    # verl's dataset read one row per task; its trainer's uid makes the group
    assert [(ep['index'], ep['uid']) for ep in report['episodes']] == [
        (0, 'uid-0'), (0, 'uid-0'), (1, 'uid-1'), (1, 'uid-1')]
    # generate_sequences ran every agent loop, then needs the real TensorDict
    assert report['stopped_at'].startswith(
        'verl/experimental/agent_loop/agent_loop.py:') and '_postprocess' in \
        report['stopped_at']


def test_verl_response_mask_is_1_on_exactly_the_models_tokens(drivers):
    tok = drivers.tok
    header = tok.encode('<|im_start|>assistant\n')
    for ep in drivers('verl')['episodes']:
        mask, response = ep['response_mask'], ep['response']
        spans = runs(mask)
        assert len(spans) == len(ep['turns'])
        for (start, end), sampled in zip(spans, ep['turns']):
            assert response[start:end] == sampled           # the server's ids, kept
            if start:                      # an observation, then the assistant header
                assert response[start - len(header):start] == header
        assert all(a for a, m in zip(ep['attention'], mask) if m)   # no pad in the mask
        n = sum(ep['attention'])
        assert not any(mask[n:]) and all(p == 0 for p in ep['logprobs'][n:])
        assert all(lp < 0 for lp, m in zip(ep['logprobs'], mask) if m)
        assert all(lp == 0 for lp, m in zip(ep['logprobs'], mask) if not m)


def test_verl_config_is_the_rlconfig_and_verl_accepts_it(drivers):
    report = drivers('verl')
    assert report['validated']                         # verl's validate_config passed
    assert report['config'] == {
        'actor_rollout_ref.rollout.n': 2, 'algorithm.adv_estimator': 'grpo',
        'data.train_batch_size': 2, 'actor_rollout_ref.rollout.prompt_length': 256,
        'actor_rollout_ref.rollout.response_length': 192,
        'actor_rollout_ref.rollout.tensor_model_parallel_size': 1,
        'actor_rollout_ref.rollout.temperature': 0.7,
        'actor_rollout_ref.actor.optim.lr': 1e-6, 'trainer.n_gpus_per_node': 1}


def test_verl_config_applies_to_verl_and_keeps_the_length_links(tmp_path):
    from omegaconf import OmegaConf
    cfg = arl.RLConfig(group_size=4, prompts_per_step=8, minibatches=2, max_turns=5,
                       temperature=0.9, lr=1e-6, kl_coef=0.01)
    config = tr.verl_config(cfg, 'M', tmp_path / 'run', prompt_length=300,
                            response_length=700, gpus=2)
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.n, rollout.temperature, rollout.multi_turn.max_assistant_turns) == \
        (4, 0.9, 5)
    assert (config.algorithm.adv_estimator, config.data.train_batch_size,
            config.actor_rollout_ref.actor.ppo_mini_batch_size) == ('grpo', 8, 4)
    assert config.actor_rollout_ref.actor.kl_loss_coef == 0.01
    assert (rollout.prompt_length, rollout.response_length) == (300, 700)
    raw = OmegaConf.to_container(rollout, resolve=False)   # still verl's links
    assert raw['prompt_length'] == '${oc.select:data.max_prompt_length,512}'
    assert raw['response_length'] == '${oc.select:data.max_response_length,512}'
    assert (rollout.tensor_model_parallel_size, rollout.n_gpus_per_node) == (1, 2)
    # the loop's entry, in the file verl's AgentLoopWorker reads in its own process
    path = tmp_path / 'run' / hf.VERL_LOOP_FILE
    assert rollout.agent.agent_loop_config_path == str(path)
    assert rollout.agent.default_agent_loop == 'bugfix_text'
    assert OmegaConf.to_container(OmegaConf.load(path)) == [
        {'name': 'bugfix_text', '_target_': 'agentrl.hf.BugFixTextAgentLoop'}]


def test_verl_loop_renames_each_episode(drivers):
    episodes = drivers('verl')['episodes']
    for ep in episodes:
        assert ep['fn_name'] != TASKS[ep['index']].fn_name and ep['fn_name'] in arl.FN_NAMES
    assert len({ep['fn_name'] for ep in episodes}) > 1


def test_verl_reward_is_the_gyms(drivers):
    episodes = drivers('verl')['episodes']
    # the scripted 1st needs the two edits of the driver's cfg: its rows carry them
    assert [ep['reward'] for ep in episodes] == [1.0, 0.0, 0.0, 0.0]
    assert episodes[0]['gym_info']['ops'][-1] == TASKS[0].fix_op
    assert all(ep['gym'] == {'rename': True, 'max_edits': 2, 'reward': 'hidden'}
               for ep in episodes)
    for ep in episodes:
        reward, info = gym_replay(played(TASKS[ep['index']], ep['fn_name']), ep['turns'],
                                  drivers.tok, drv.VERL_CFG)
        assert ep['reward'] == reward
        assert ep['gym_info']['actions'] == info['actions']


def test_verl_layout_is_chapter_21s(drivers):
    """prompt + response ids and the mask are HFPolicy's layout of the same turns."""
    tok = drivers.tok
    for ep in drivers('verl')['episodes']:
        env = hf.make_text_env(arl.RLConfig(**drv.VERL_CFG))
        task = played(TASKS[ep['index']], ep['fn_name'])
        chat = hf.ChatTranscript(tok, env.system, env.reset(task))
        assert chat.ids == ep['prompt']
        for ids in ep['turns']:
            observation, _, done, _ = env.step(chat.assistant(ids, [0.0] * len(ids)))
            if not done:
                chat.extend(chat.observation(observation))
        n = len(chat.ids) - len(ep['prompt'])
        assert ep['response'][:n] == chat.ids[len(ep['prompt']):]
        assert ep['response_mask'][:n] == chat.flags[len(ep['prompt']):]


# ------------------------------------------------------------------------------ OpenRLHF

def test_openrlhf_cli_parses_the_flags_up_to_ray_init(drivers):
    report = drivers('openrlhf')
    assert report['placeholders'] == list(drv.OPENRLHF_MISSING)
    args = report['args']
    assert args['train.agent_func_path'].endswith('agent.py')
    assert args['reward.remote_url'] == ['agent']          # set by the CLI for an agent
    assert (args['rollout.n_samples_per_prompt'], args['rollout.batch_size'],
            args['train.batch_size']) == (2, 2, 4)
    assert args['algo.advantage.estimator'] == 'group_norm'
    assert args['actor.entropy_coef'] == 0.01 and args['data.label_key'] == 'label'
    assert args['algo.kl.init_coef'] == 0.0     # no KL: OpenRLHF builds no reference
    # one vLLM engine (without it OpenRLHF starts none and never loads the agent),
    # colocated with the trainer on the one GPU, both sleeping while the other works
    assert (args['vllm.num_engines'], args['vllm.tensor_parallel_size']) == (1, 1)
    assert args['train.colocate_all'] and args['vllm.enable_sleep']
    assert args['ds.enable_sleep'] and args['vllm.gpu_memory_utilization'] == 0.5
    assert args['actor.num_gpus_per_node'] == args['ref.num_gpus_per_node'] == 1


def test_openrlhf_action_mask_is_1_on_exactly_the_models_tokens(drivers):
    for ep in drivers('openrlhf')['episodes']:
        flags = [0] + ep['action_mask']              # OpenRLHF's mask drops position 0
        spans = runs(flags)
        assert spans == [tuple(r) for r in ep['action_ranges']]
        for (start, end), sampled in zip(spans, ep['turns']):
            assert ep['ids'][start:end] == sampled
            logps = ep['rollout_log_probs'][start:end]
            assert all(lp < 0 for lp in logps)
        assert all(lp == 0 for lp, f in zip(ep['rollout_log_probs'], flags) if not f)


def test_openrlhf_scripted_episode_is_laid_out_as_chapter_21(drivers):
    tok = drivers.tok
    ep = drivers('openrlhf')['episodes'][0]            # an idle edit, the fix, submit
    env = hf.make_text_env(arl.RLConfig(**drv.OPENRLHF_CFG))
    assert ep['fn_name'] != TASKS[0].fn_name          # renamed by the agent's reset
    chat = hf.ChatTranscript(tok, env.system, env.reset(played(TASKS[0], ep['fn_name'])))
    for ids in ep['turns']:
        observation, _, done, _ = env.step(chat.assistant(ids, [0.0] * len(ids)))
        if not done:
            chat.extend(chat.observation(observation))
    assert ep['ids'] == chat.ids
    assert ep['action_mask'] == chat.flags[1:]


def test_openrlhf_rewards_are_the_gyms(drivers):
    episodes = drivers('openrlhf')['episodes']
    # the scripted 1st needs the two edits of the driver's cfg, written in the agent file
    assert [ep['reward'] for ep in episodes] == [1.0, 0.0]
    for ep in episodes:
        task = played(TASKS[int(ep['label'])], ep['fn_name'])
        reward, info = gym_replay(task, ep['turns'], drivers.tok, drv.OPENRLHF_CFG)
        assert ep['reward'] == ep['scores'] == reward
        # OpenRLHF keeps the last step's extra_logs: the episode's count of malformed
        assert ep['extra_logs']['malformed'] == sum(map(arl.is_malformed, info['actions']))
    # the sampled one: malformed every turn, until the cfg's turn budget (not the
    # agent's default) ended it
    assert len(episodes[1]['turns']) == drv.OPENRLHF_CFG['max_turns']
    assert episodes[1]['extra_logs']['malformed'] == drv.OPENRLHF_CFG['max_turns']


def test_bad_rows_and_episodes_are_named():
    with pytest.raises(ValueError, match=r"extra_info needs \['index'\]"):
        tr.verl_task({'split': 'train'})
    task, gym = tr.verl_task({'split': 'train', 'index': 3, 'gym': {'max_edits': 2}})
    assert task == TASKS[3] and gym == {'max_edits': 2}
    # dataset rows: one a task (verl repeats each rollout.n times under one uid), each
    # with the run's environment settings
    cfg = arl.RLConfig(rename=False, max_edits=None, reward='public', max_turns=4)
    rows = tr.verl_rows('train', [0, 1], cfg)
    gym = {'rename': False, 'max_edits': None, 'reward': 'public'}
    assert [r['extra_info'] for r in rows] == [
        {'split': 'train', 'index': i, 'gym': gym} for i in (0, 1)]
    assert {r['agent_name'] for r in rows} == {tr.VERL_AGENT_NAME}
    assert rows[1]['prompt'] == tr.task_prompt(hf.TextBugFixEnv(), TASKS[1])
    empty = arl.Trajectory(torch.tensor([1, 2, 3]), torch.zeros(2, dtype=arl.DTYPE), 0.0,
                           {}, torch.zeros(2, dtype=arl.DTYPE))
    with pytest.raises(ValueError, match='no sampled token'):
        tr.episode_layout(empty)
    layout = tr.episode_layout(arl.Trajectory(
        torch.tensor([5, 6, 7, 8]), torch.tensor([0.0, 1.0, 0.0], dtype=arl.DTYPE), 1.0,
        {}, torch.tensor([0.0, -0.5, 0.0], dtype=arl.DTYPE)))
    assert layout == dict(prompt_ids=[5, 6], completion_ids=[7, 8], env_mask=[1, 0],
                          logprobs=[-0.5, 0.0])


class FixedServer:
    """A verl-style server that answers every request with one TokenOutput-like reply."""

    def __init__(self, **reply):
        self.reply = reply

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        import types
        return types.SimpleNamespace(**({'stop_reason': None} | self.reply))


def verl_play(tok, server, prompt_limit=None):
    import asyncio
    env = hf.make_text_env(arl.RLConfig(max_turns=3))
    return asyncio.run(tr.verl_episode(server, tok, env, TASKS[0], {}, 8, 512,
                                       prompt_limit))


ENV_FIELDS = ('max_turns', 'rename', 'max_edits', 'reward')


def env_fields(cfg):
    return {key: getattr(cfg, key) for key in ENV_FIELDS}


def test_the_environment_settings_travel_by_value_and_rewards_by_import_path():
    cfg = arl.RLConfig(max_turns=5, rename=False, max_edits=2,
                       reward=arl.partial_credit)
    fields = tr.gym_fields(cfg)
    assert fields == {'rename': False, 'max_edits': 2,
                      'reward': 'agentrl.rewards:partial_credit'}
    assert env_fields(tr.gym_config(fields, 5)) == env_fields(cfg)
    # what verl's loop rebuilds from a row, with verl's turn budget
    task, gym = tr.verl_task(tr.verl_rows('train', [2], cfg)[0]['extra_info'])
    assert task == TASKS[2] and env_fields(tr.gym_config(gym, 5)) == env_fields(cfg)
    assert tr.gym_config(None, 3) == arl.RLConfig(max_turns=3)
    with pytest.raises(ValueError, match='cannot be imported by name'):
        tr.gym_fields(arl.RLConfig(reward=lambda info: 1.0))
    with pytest.raises(ValueError, match="'no.such:reward' is neither"):
        tr.gym_config({'reward': 'no.such:reward'}, 3)


def test_verl_episode_names_missing_log_probs_aborts_and_long_prompts(tok):
    stop = min(tok.stop_ids)
    read = tok.encode('<call>read</call>') + [stop]
    with pytest.raises(RuntimeError, match=rf'returned no log-probs for {len(read)} tok'):
        verl_play(tok, FixedServer(token_ids=read, log_probs=None))
    with pytest.raises(RuntimeError, match=rf'returned 2 log-probs for {len(read)} tok'):
        verl_play(tok, FixedServer(token_ids=read, log_probs=[-1.0, -1.0]))
    with pytest.raises(RuntimeError, match=r"was aborted \(stop_reason 'aborted'\) "
                                           r"after 0 token"):
        verl_play(tok, FixedServer(token_ids=[], log_probs=None, stop_reason='aborted'))
    # verl's vLLM server also returns the tokens of a request aborted midway
    with pytest.raises(RuntimeError, match=rf"'aborted'\) after {len(read) - 1} token"):
        verl_play(tok, FixedServer(token_ids=read[:-1], log_probs=[-1.0] * (len(read) - 1),
                                   stop_reason='aborted'))
    with pytest.raises(RuntimeError, match=r"no token \(stop_reason None\)"):
        verl_play(tok, FixedServer(token_ids=[], log_probs=[]))
    chat, prompt_len, reward, info = verl_play(
        tok, FixedServer(token_ids=read, log_probs=[-1.0] * len(read)))
    assert reward == 0.0 and info['actions'] == ['read'] * 3
    with pytest.raises(ValueError, match=rf'prompt has {prompt_len} tokens, more than '
                                         rf"verl's rollout.prompt_length {prompt_len - 1}"):
        verl_play(tok, FixedServer(token_ids=read, log_probs=[-1.0] * len(read)),
                  prompt_limit=prompt_len - 1)


def agent_turn(agent, label, texts):
    """Reset an OpenRLHFTextAgent on label and play texts -> the step results."""
    import asyncio

    async def play():
        await agent.reset({'label': label})
        return [await agent.step({'action_text': text}) for text in texts]
    return asyncio.run(play())


def test_openrlhf_agent_strips_only_the_templates_closing_token(tok):
    """A stop token the template does not write (</call>) stays in the turn; the one it
    writes (<|im_end|>) is cut from the text and from the feedback's start."""
    two = hf.ChatTokenizer(tok.hf, stop_tokens=['</call>', '<|im_end|>'])
    agent = hf.OpenRLHFTextAgent(two, TASKS, arl.RLConfig(max_turns=3))
    results = agent_turn(agent, '0', ['<call>read</call>', '<call>test</call><|im_end|>'])
    assert agent.env.malformed == [None, None]
    assert agent.env.inner.actions == ['read', 'test']
    for result in results:
        assert result['extra_logs'] == {'malformed': 0.0}
        assert not result['environment_feedback'].startswith('<|im_end|>')
        assert result['environment_feedback'].startswith('\n<|im_start|>user\n')
        assert result['environment_feedback'].endswith('<|im_start|>assistant\n')
    # the model's ids (the turn, then its closing id) plus the feedback: the template's
    # rendering of the whole conversation
    ids = two.encode(two.render(agent.messages[:2], True))
    for message, result in zip(agent.messages[2::2], results):
        ids += two.encode(message['content']) + [two.hf.convert_tokens_to_ids('<|im_end|>')]
        ids += two.encode(result['environment_feedback'])
    assert ids == two.encode(two.render(agent.messages, True))


def test_openrlhf_agent_logs_the_episodes_malformed_calls_and_renames(tok):
    import random
    agent = hf.OpenRLHFTextAgent(tok, TASKS, arl.RLConfig(max_turns=3),
                                 renamer=random.Random(0))
    results = agent_turn(agent, '2', ['hello', '<call>read</call>', 'bye'])
    assert [r['extra_logs']['malformed'] for r in results] == [1.0, 1.0, 2.0]
    assert results[-1]['done'] and agent.task.name == TASKS[2].name
    assert agent.task.fn_name != TASKS[2].fn_name
    assert f'the function {agent.task.fn_name} returns' in agent.text
    with pytest.raises(ValueError, match=r"label '99' is no task index"):
        agent_turn(agent, '99', [])


def test_openrlhf_step_rewards_add_up_to_the_reward_wherever_the_loop_stops(tok):
    """OpenRLHF sums the steps' rewards and may stop after any step when the context
    is full: the sum so far is then what HFPolicy and verl give such an episode."""
    cfg = arl.RLConfig(max_turns=4, reward=arl.turn_cost_reward)
    agent = hf.OpenRLHFTextAgent(tok, TASKS, cfg)
    texts = ['<call>read</call>', f'<call>edit {TASKS[0].fix_op}</call>',
             '<call>submit</call>']
    results, total = agent_turn(agent, '0', texts), 0.0
    for k, result in enumerate(results):
        total += result['rewards'].item()              # as OpenRLHF adds them up
        assert total == pytest.approx(result['scores'].item(), abs=1e-7)   # float32
        if not result['done']:               # a context-full ending after turn k + 1
            env = hf.make_text_env(cfg)
            env.reset(TASKS[0])
            for text in texts[:k + 1]:
                env.step(text)
            cut = env.reward_fn(env.final_info(False) | {'context_full': True})
            assert cut == pytest.approx(-0.05 * (k + 1), abs=1e-12)
            assert total == pytest.approx(cut, abs=1e-12)
    assert results[-1]['done'] and total == pytest.approx(1.0 - 0.05 * 3, abs=1e-12)


def test_openrlhf_flags_and_agent_file(tmp_path):
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, minibatches=1)
    flags = tr.openrlhf_flags(cfg, 'M', 'A.py', 'D.jsonl', gpus=2)
    for flag, value in [('--actor.num_gpus_per_node', '2'), ('--train.agent_func_path',
                        'A.py'), ('--actor.model_name_or_path', 'M'),
                        ('--data.label_key', 'label'), ('--vllm.num_engines', '2'),
                        ('--vllm.tensor_parallel_size', '1'),
                        ('--ref.num_gpus_per_node', '2')]:
        assert flags[flags.index(flag) + 1] == value, flag
    assert {'--train.colocate_all', '--vllm.enable_sleep'} <= set(flags)
    # no KL: OpenRLHF builds no reference model (its --ref flags then go unused)
    assert flags[flags.index('--algo.kl.init_coef') + 1] == '0.0'
    run = arl.RLConfig(max_turns=5, rename=False, max_edits=2, reward=arl.partial_credit)
    path = tr.write_openrlhf_agent_file(tmp_path / 'agent.py', tmp_path / 'model', run,
                                        seed=3)
    text = open(path).read()
    compile(text, path, 'exec')
    assert 'from agentrl import hf' in text
    assert "AgentExecutor = hf.openrlhf_executor(" in text and "seed=3)" in text
    # the module's gym is the run's: evaluate its cfg line as the engine would
    line = next(line for line in text.splitlines() if line.startswith('cfg = '))
    names = {'hf': hf}
    exec(line, names)
    assert env_fields(names['cfg']) == env_fields(run)
