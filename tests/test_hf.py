"""Chapter 21 (agentrl.hf): the gym as text and a transformers causal LM as a train_rl
policy. Everything is built locally: a tiny randomly initialized Llama and tokenizers
trained on the gym's own texts (agentrl.hf's demonstrations); nothing is downloaded."""
from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch

import agentrl as arl
from agentrl import hf as hb
from conftest import REPO

os.environ.setdefault('HF_HUB_OFFLINE', '1')
transformers = pytest.importorskip('transformers')
tokenizers = pytest.importorskip('tokenizers')

TASKS = arl.make_tasks('train')
# Sampling (cached, one token at a time) and training (one pass over the row) sum in other
# orders. In float64 each logit then differs by a few ulps of the running sums: about
# layers x width x eps x |activations| ~ 2 x 32 x 2.2e-16 x 10 ~ 1e-13 for this model. A
# wrong position, temperature or shift gives differences of 1e-2 and more. 1e-9 sits between.
TOL64 = 1e-9
# float32: the same count with eps = 1.2e-7 gives ~1e-4; a bug is still 100x larger.
TOL32 = 1e-4


@pytest.fixture(scope='module')
def word_tok():
    return hb.local_chat_tokenizer('word')


@pytest.fixture(scope='module')
def bpe_tok():
    return hb.local_chat_tokenizer('bpe')


def tiny_policy(tok, dtype=torch.float64, seed=0, max_new_tokens=10):
    return hb.tiny_chat_llama(tok, dtype, seed, max_new_tokens)


def play_text(policy, tok, tasks, seed=0, temperature=1.0, max_turns=3):
    envs = [hb.TextBugFixEnv(max_turns=max_turns) for _ in tasks]
    return policy.rollout(envs, tasks, tok, max_turns, temperature,
                          torch.Generator().manual_seed(seed))


class Scripted(hb.HFPolicy):
    """HFPolicy whose turns are fixed texts (tokenized, then the stop id); the log-probs are
    still the model's, so everything else runs as in a sampled episode."""

    def __init__(self, model, turns, tok):
        super().__init__(model, max_new_tokens=64)
        self.turns = [tok.encode(t) + [min(tok.stop_ids)] for t in turns]

    def sample_turn(self, cache, logits, tok, temperature, generator):
        ids, logps = self.turns.pop(0), []
        for k, token in enumerate(ids):
            logps.append(float(torch.log_softmax(logits / temperature, -1)[token]))
            if k < len(ids) - 1:
                logits = self.feed(cache, [token])
        return ids, logps


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


# ---------------------------------------------------------------- (e) parsing malformed calls

@pytest.mark.parametrize('text, call, kind', [
    ('<call>read</call>', 'read', None),
    ('I will look first. <call> test </call>', 'test', None),
    ('<call>edit fix_init</call>', 'edit fix_init', None),
    ('<call>submit</call> done', 'submit', None),
    ('read', '', 'no_call'),
    ('', '', 'no_call'),
    ('<call>read</call> <call>submit</call>', '', 'several_calls'),
    ('<call>read', '', 'unclosed'),
    ('read</call>', '', 'unclosed'),
    ('<call>read <call>test</call>', '', 'unclosed'),
    ('<call>  </call>', '', 'empty_call'),
    ('<call>run tests</call>', '', 'unknown_tool'),
    ('<call>Read</call>', '', 'unknown_tool'),
    ('<call>read source</call>', '', 'bad_arguments'),
    ('<call>edit</call>', '', 'bad_arguments'),
    ('<call>edit fix_init fix_index</call>', '', 'bad_arguments'),
    ('<call>submit now</call>', '', 'bad_arguments'),
    ('<call>edit fix_everything</call>', 'edit fix_everything', 'unknown_op'),
])
def test_parse_text_call(text, call, kind):
    got, problem = hb.parse_text_call(text)
    assert got == call
    assert (problem and problem[0]) == kind
    if kind is not None:
        message = problem[1]
        assert kind in message and 'Accepted' in message
        accepted = arl.EDIT_OPS if kind == 'unknown_op' else hb.CALL_FORMS
        assert all(a in message for a in accepted)


def test_malformed_turns_are_explained_and_counted_as_the_gym_counts_them():
    env = hb.TextBugFixEnv(max_turns=6)
    task = TASKS[0]
    env.reset(task)
    texts = ['hello', '<call>edit fix_foo</call>', '<call>read x</call>',
             '<call>read</call><call>test</call>', '<call>explode</call>', '<call>submit</call>']
    observations = [env.step(t)[0] for t in texts[:-1]]
    _, reward, done, info = env.step(texts[-1])
    assert done and reward == 0.0
    assert "no <call>" in observations[0] and "unknown edit op 'fix_foo'" in observations[1]
    assert "read takes 0 argument(s)" in observations[2] and '2 calls' in observations[3]
    assert "unknown tool 'explode'" in observations[4]
    assert env.malformed == ['no_call', 'unknown_op', 'bad_arguments', 'several_calls',
                             'unknown_tool', None]
    assert info['actions'] == ['invalid', 'edit fix_foo', 'invalid', 'invalid', 'invalid',
                               'submit']
    assert sum(map(arl.is_malformed, info['actions'])) == 5
    traj = arl.Trajectory(torch.zeros(3, dtype=torch.long), torch.ones(2, dtype=arl.DTYPE),
                          reward, info)
    assert arl.episode_behavior(traj)['malformed'] == 5


def test_final_info_and_reward_are_the_gyms():
    for task in TASKS[::4]:
        calls = ['read', f'edit {task.fix_op}', 'test', 'submit']
        _, reward, info = arl.play(arl.BugFixEnv(), task, calls)
        env = hb.TextBugFixEnv()
        env.reset(task)
        for call in calls:
            text_obs, text_reward, done, text_info = env.step(f'Next: <call>{call}</call>')
        assert done and (text_reward, text_info) == (reward, info) and reward == 1.0
    budget = hb.make_text_env(arl.RLConfig(max_edits=1))
    budget.reset(TASKS[0])
    budget.step('<call>edit fix_init</call>')
    assert 'budget of 1 edit(s)' in budget.step('<call>edit fix_index</call>')[0]
    assert 'Source:\n' + TASKS[0].source == budget.step('<call>read</call>')[0]
    # a gym that shortens its read is shown as it shows itself, not as the full source
    short = hb.TextBugFixEnv(arl.ToolEnv(read_limit=4))
    short.reset(TASKS[0])
    inner = arl.ToolEnv(read_limit=4)
    inner.reset(TASKS[0])
    assert short.step('<call>read</call>')[0] == 'Source:\n' + inner.step('read')[0]
    assert TASKS[0].source not in short.step('<call>read</call>')[0]


# ---------------------------------------------------------------- the adapter

def test_importing_agentrl_does_not_import_transformers():
    code = 'import agentrl, sys; print("transformers" in sys.modules)'
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'False'


def test_bad_arguments_are_named(word_tok):
    policy = tiny_policy(word_tok)
    with pytest.raises(ValueError, match='need one env per task'):
        policy.rollout([hb.TextBugFixEnv()], TASKS[:2], word_tok)
    with pytest.raises(ValueError, match='temperature must be positive'):
        policy.rollout([hb.TextBugFixEnv()], TASKS[:1], word_tok, temperature=0)
    with pytest.raises(ValueError, match='ChatTokenizer'):
        policy.rollout([hb.TextBugFixEnv()], TASKS[:1], word_tok.hf)
    with pytest.raises(ValueError, match="observation_role 'robot'"):
        hb.ChatTokenizer(word_tok.hf, observation_role='robot')
    with pytest.raises(ValueError, match=r"stop tokens \['<eot>'\]"):
        hb.ChatTokenizer(word_tok.hf, stop_tokens=['<eot>'])
    with pytest.raises(ValueError, match='no chat_template'):
        hb.ChatTokenizer(transformers.PreTrainedTokenizerFast(
            tokenizer_object=word_tok.hf.backend_tokenizer, eos_token='<|im_end|>'))
    with pytest.raises(ValueError, match='max_new_tokens'):
        hb.HFPolicy(policy.lm, max_new_tokens=0)
    with pytest.raises(ValueError, match='exceeds max_len 50'):
        hb.HFPolicy(policy.lm, max_len=50).rollout([hb.TextBugFixEnv()], TASKS[:1], word_tok)


def test_a_prompt_that_leaves_no_room_for_a_turn_ends_the_episode_context_full(word_tok):
    policy = tiny_policy(word_tok)
    env = hb.TextBugFixEnv()
    prompt = len(hb.ChatTranscript(word_tok, env.system, env.reset(TASKS[0])).ids)
    cramped = hb.HFPolicy(policy.lm, max_new_tokens=10, max_len=prompt + 9)
    (t,) = cramped.rollout([hb.TextBugFixEnv()], TASKS[:1], word_tok)
    assert t.info['context_full'] and t.action_mask.sum() == 0 and len(t.ids) == prompt
    roomy = hb.HFPolicy(policy.lm, max_new_tokens=10, max_len=prompt + 10)
    (t,) = roomy.rollout([hb.TextBugFixEnv()], TASKS[:1], word_tok)
    assert t.action_mask.sum() > 0


def llama(tok, **config):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, **config))


def test_models_whose_log_probs_would_not_be_their_own_are_refused(word_tok):
    with pytest.raises(ValueError, match=r"dropout is on \(\{'attention_dropout': 0.1"):
        hb.HFPolicy(llama(word_tok, attention_dropout=0.1))
    model = llama(word_tok)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match='final_logit_softcapping'):
        hb.HFPolicy(model)
    model = llama(word_tok)
    model.model.layers[0].mlp.add_module('drop', torch.nn.Dropout(0.2))
    with pytest.raises(ValueError, match='dropout is on'):
        hb.HFPolicy(model)
    hb.HFPolicy(llama(word_tok, attention_dropout=0.0))      # a plain model is accepted


@pytest.mark.parametrize('key', ['output_multiplier', 'lm_head_multiplier', 'logit_scale',
                                 'logits_scaling'])
def test_every_logit_scale_trl_knows_is_refused(word_tok, key):
    model = llama(word_tok)
    setattr(model.config, key, 0.5)
    with pytest.raises(ValueError, match=rf"after the output layer \({{'{key}': 0.5}}\)"):
        hb.HFPolicy(model)


def test_a_model_that_changes_its_logits_unannounced_is_caught_by_the_probe(word_tok):
    model = llama(word_tok)
    model.register_forward_hook(lambda module, args, out: out.__setitem__(
        'logits', out['logits'] * 2))          # no config key says so
    with pytest.raises(ValueError, match='differ from its output layer'):
        hb.HFPolicy(model)


def test_the_probe_runs_once_per_model(word_tok):
    """TRLRollout builds an HFPolicy at every generation; the probe's two forward passes
    run for the first only."""
    model, calls = llama(word_tok), []
    model.register_forward_hook(lambda module, args, out: calls.append(1))
    hb.HFPolicy(model)
    rollout = hb.TRLRollout(word_tok, TASKS[:2])
    rollout.make_policy(model)
    rollout.make_policy(model)
    assert len(calls) == 1
    hb.HFPolicy(llama(word_tok))        # another model is probed
    with pytest.raises(ValueError, match='dropout is on'):     # the config is still read
        model.config.attention_dropout = 0.1
        hb.HFPolicy(model)


def test_the_probe_takes_the_vocabulary_from_the_layer_not_a_zero3_shard(word_tok):
    """Under DeepSpeed ZeRO-3 a process holds a shard of each weight, gathered only
    around the layer's forward: the output layer's local weight may have shape [0]."""
    model = llama(word_tok)
    head, full = model.lm_head, model.lm_head.weight.data
    head.weight.data = torch.empty(0, dtype=full.dtype)

    def gather(module, args):
        module.weight.data = full

    def release(module, args, out):
        module.weight.data = torch.empty(0, dtype=full.dtype)
    head.register_forward_pre_hook(gather)
    head.register_forward_hook(release)
    assert head.weight.shape == (0,)
    policy = hb.HFPolicy(model)                     # probed: vocabulary from the layer
    assert policy.head(torch.zeros(2, 16)).shape == (2, len(word_tok))


def test_head_gives_logits_in_float32_or_wider(word_tok):
    for dtype, want in [(torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                        (torch.float64, torch.float64)]:
        policy = hb.HFPolicy(llama(word_tok).to(dtype))
        assert policy.head(torch.zeros(3, 16, dtype=dtype)).dtype == want
    policy = hb.HFPolicy(llama(word_tok).to(torch.bfloat16))
    (t,) = play_text(policy, word_tok, TASKS[:1], max_turns=1)
    assert t.sample_logp.dtype == arl.DTYPE and torch.isfinite(t.sample_logp).all()


def test_a_stop_token_the_template_does_not_write_stays_in_the_turn(word_tok):
    assert word_tok.closing_ids == {word_tok.hf.convert_tokens_to_ids('<|im_end|>')}
    tok = hb.ChatTokenizer(word_tok.hf, stop_tokens=['</call>', '<|im_end|>'])
    assert tok.closing_ids == word_tok.closing_ids
    chat = hb.ChatTranscript(tok, 'S', 'U')
    turn = tok.encode('<call>read</call>')
    assert turn[-1] in tok.stop_ids and turn[-1] not in tok.closing_ids
    content = chat.assistant(turn, [0.0] * len(turn))
    assert hb.parse_text_call(content) == ('read', None)
    chat.extend(chat.observation('Source: x'))
    assert tok.encode(tok.render(chat.messages, True)) == chat.ids
    # the template's own closing token, when the model wrote it, is cut from the content
    chat = hb.ChatTranscript(tok, 'S', 'U')
    turn = tok.encode('<call>read</call> <|im_end|>')
    assert chat.assistant(turn, [0.0] * len(turn)).strip().endswith('</call>')
    chat.extend(chat.observation('Source: x'))
    assert tok.encode(tok.render(chat.messages, True)) == chat.ids


def test_an_empty_turn_is_named(word_tok):
    chat = hb.ChatTranscript(word_tok, 'S', 'U')
    with pytest.raises(ValueError, match='got 0 ids, 0 log-probs'):
        chat.assistant([], [])
    with pytest.raises(ValueError, match='got 2 ids, 1 log-probs'):
        chat.assistant([4, 5], [0.0])


def always_half(info):
    return 0.5


def test_an_episode_out_of_turns_gets_the_gyms_reward_as_a_full_context_does(word_tok):
    # the rollout's max_turns (1) ends the episode before the gym's budget (6): the
    # reward is the gym's reward of an unsubmitted episode, not a typed 0
    policy = tiny_policy(word_tok)
    env = hb.TextBugFixEnv(arl.BugFixEnv(max_turns=6, reward=always_half))
    (t,) = policy.rollout([env], TASKS[:1], word_tok, max_turns=1)
    assert t.reward == 0.5 and not t.info['submitted'] and t.info['n_turns'] == 1


def test_a_template_that_rewrites_earlier_turns_is_refused_where_it_differs(word_tok):
    trimming = hb.CHATML.replace("{{ m['content'] }}", "{{ m['content'] | trim }}")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_tok.hf.backend_tokenizer, eos_token='<|im_end|>',
        pad_token='<pad>')
    hf.chat_template = trimming
    tok = hb.ChatTokenizer(hf)
    chat = hb.ChatTranscript(tok, 'S', 'U')
    turn = tok.encode('<call>read</call>') + [min(tok.stop_ids)]
    chat.assistant(turn, [0.0] * len(turn))
    chat.content = chat.messages[-1]['content'] = chat.content + '  '  # trailing blanks
    with pytest.raises(ValueError, match=r"at character \d+: expected '  ', got '<\|im_end"):
        chat.observation('obs')


# (a) log-probs: sampling time, the training pass and the model's own forward agree
@pytest.mark.parametrize('dtype, tol', [(torch.float64, TOL64), (torch.float32, TOL32)])
def test_log_probs_match_the_models_own_forward(word_tok, dtype, tol):
    policy, temperature = tiny_policy(word_tok, dtype), 0.7
    trajs = play_text(policy, word_tok, TASKS[:3], temperature=temperature)
    batch = arl.collate(trajs, word_tok.pad_id)
    with torch.no_grad():
        train_logp, _ = arl.token_log_probs(policy, batch['ids'], batch['lengths'],
                                            temperature)
    worst = 0.0
    for b, t in enumerate(trajs):
        with torch.no_grad():
            logits = policy.lm(t.ids[None]).logits[0, :-1].double()
        own = torch.log_softmax(logits / temperature, -1).gather(1, t.ids[1:, None])[:, 0]
        sampled = t.action_mask.bool()
        assert sampled.sum() > 0
        worst = max(worst, float((t.sample_logp[sampled] - own[sampled]).abs().max()),
                    float((train_logp[b, :len(own)] - own).abs().max()))
        assert (t.sample_logp[~sampled] == 0).all()
        assert (train_logp[b, len(own):] == 0).all()
    assert worst < tol, worst


# (b) the mask is 1 exactly on the assistant's tokens
def test_mask_covers_exactly_the_sampled_turns(word_tok):
    policy = tiny_policy(word_tok)
    header = word_tok.encode('<|im_start|>assistant\n')
    for t in play_text(policy, word_tok, TASKS[:4], seed=1):
        flags = [0] + t.action_mask.long().tolist()
        turns = [m for m in t.messages if m['role'] == 'assistant']
        spans = runs(flags)
        assert len(spans) == len(turns) > 0
        # the tokens inside each assistant message, as the template renders it
        text = word_tok.render(t.messages, False)
        encoded = word_tok.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert encoded['input_ids'][:len(t.ids)] == t.ids.tolist()
        starts = [len(word_tok.render(t.messages[:k], True))
                  for k, m in enumerate(t.messages) if m['role'] == 'assistant']
        inside = [int(any(s <= a < b <= s + len(m['content'])
                          for s, m in zip(starts, turns)))
                  for a, b in encoded['offset_mapping'][:len(t.ids)]]
        for (start, end), message in zip(spans, turns):
            ids = t.ids[start:end].tolist()
            assert t.ids[start - len(header):start].tolist() == header
            stopped = ids[-1] in word_tok.stop_ids
            assert inside[start:end] == [1] * (end - start - stopped) + [0] * stopped
            assert stopped or len(ids) == policy.max_new_tokens
        assert sum(inside) == sum(flags) - sum(
            t.ids[b - 1].item() in word_tok.stop_ids for _, b in spans)
        assert (t.sample_logp[t.action_mask == 0] == 0).all()
        assert (t.sample_logp[t.action_mask == 1] < 0).all()


def test_a_scripted_chat_episode_is_laid_out_and_scored_as_the_gym(word_tok):
    task = TASKS[5]
    turns = ['Let me look. <call>read</call>', f'<call>edit {task.fix_op}</call>',
             '<call>submit</call>']
    policy = Scripted(tiny_policy(word_tok).lm, list(turns), word_tok)
    (t,) = play_text(policy, word_tok, [task], max_turns=6)
    assert t.reward == 1.0 and t.info['actions'] == ['read', f'edit {task.fix_op}', 'submit']
    ids, flags = t.ids.tolist(), [0] + t.action_mask.long().tolist()
    expected = [word_tok.encode(text) + [min(word_tok.stop_ids)] for text in turns]
    assert [ids[a:b] for a, b in runs(flags)] == expected
    # the rest is exactly the template and the observations, as one rendering gives them
    again = word_tok.encode(word_tok.render(t.messages, False))
    assert again[:len(ids)] == ids
    assert [m['role'] for m in t.messages] == ['system', 'user', 'assistant', 'user',
                                               'assistant', 'user', 'assistant']
    assert t.messages[3]['content'] == 'Source:\n' + task.source


# (c) retokenizing a transcript gives its ids, or the mismatch is reported
def test_word_level_transcripts_retokenize_to_their_ids(word_tok):
    trajs = play_text(tiny_policy(word_tok), word_tok, TASKS[:4], seed=2)
    assert [hb.retokenization_report(t, word_tok) for t in trajs] == [None] * 4


def test_byte_level_bpe_mismatches_are_detected_and_located(bpe_tok):
    trajs = play_text(tiny_policy(bpe_tok), bpe_tok, TASKS[:4], seed=3)
    reports = [hb.retokenization_report(t, bpe_tok) for t in trajs]
    assert any(r is not None for r in reports)
    for t, r in zip(trajs, reports):
        if r is not None:
            assert t.ids[r['position']].item() != bpe_tok.encode(
                bpe_tok.render(t.messages, False))[r['position']]
    # a turn spelled one byte at a time: not the ids the tokenizer would choose
    spelled = [bpe_tok.hf.convert_tokens_to_ids(c) for c in 'submit']
    policy = Scripted(tiny_policy(bpe_tok).lm, ['<call>submit</call>'], bpe_tok)
    policy.turns[0] = bpe_tok.encode('<call>') + spelled + bpe_tok.encode('</call>') + [
        min(bpe_tok.stop_ids)]
    (t,) = play_text(policy, bpe_tok, TASKS[:1])
    report = hb.retokenization_report(t, bpe_tok)
    assert report is not None and report['in_assistant_turn']
    assert t.info['actions'] == ['submit']         # the gym read the turn all the same
    start = len(t.ids) - 1 - len(spelled) - len(bpe_tok.encode('</call>'))
    assert report['position'] == start and report['sampled'].startswith('submit')


# (d) train_rl end to end through its seams
class SpreadAdvantages(arl.Objective):
    """Advantages spread over [-1, 1] so every row learns, and the loss in the record."""

    def advantages(self, batch, episodes, cfg):
        return torch.linspace(-1, 1, len(episodes), dtype=arl.DTYPE)

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        return loss, stats | {'loss': loss.item()}


@pytest.mark.parametrize('objective', [SpreadAdvantages(), arl.Objective()])
def test_train_rl_runs_end_to_end_on_the_text_gym(word_tok, objective):
    policy = tiny_policy(word_tok, torch.float32)
    before = [p.detach().clone() for p in policy.parameters()]
    cfg = arl.RLConfig(group_size=2, prompts_per_step=2, max_turns=2, minibatches=2,
                       kl_coef=0.04, lr=1e-2)
    history = arl.train_rl(policy, TASKS[:4], word_tok, cfg, 2,
                           env_factory=functools.partial(hb.make_text_env, cfg),
                           objective=objective)
    assert [h['step'] for h in history] == [0, 1]
    for h in history:
        # a random model's words are never a call: every turn is malformed
        assert h['n_episodes'] == 4 and h['malformed'] == cfg.max_turns and h['length'] > 0
        assert all(torch.isfinite(torch.tensor(float(v))) for v in h.values())
    if isinstance(objective, SpreadAdvantages):
        assert all('loss' in h and h['grad_norm'] > 0 for h in history)
        assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


# ---------------------------------------------------------------- what a real model costs

QWEN = {  # config.json values of three published models
    'Qwen2.5-0.5B': (151936, 896, 24, 14, 2, 4864, True),
    'Qwen2.5-1.5B': (151936, 1536, 28, 12, 2, 8960, True),
    'Qwen2.5-7B': (152064, 3584, 28, 28, 4, 18944, False),
}


def count_on_meta(vocab, hidden, layers, heads, kv_heads, intermediate, tied):
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, tie_word_embeddings=tied)
    with torch.device('meta'):
        model = transformers.Qwen2ForCausalLM(config)
    return sum(p.numel() for p in model.parameters()), model


@pytest.mark.parametrize('name', sorted(QWEN))
def test_model_shape_counts_what_transformers_builds(name):
    shape = hb.ModelShape(name, *QWEN[name])
    count, model = count_on_meta(*QWEN[name])
    assert shape.parameters() == count
    linear = sum(m.in_features + m.out_features for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and n.startswith('model.layers'))
    assert shape.lora_parameters(16) == 16 * linear
    embedding = model.get_input_embeddings().weight.numel()
    assert shape.matmul_parameters() == count - (0 if shape.tied else embedding)
    assert shape.kv_bytes_per_token() == 2 * model.config.num_hidden_layers * \
        model.config.num_key_value_heads * (shape.hidden // shape.heads) * 2


def test_training_memory_and_flops_known_values():
    shape = hb.ModelShape('toy', 10, 8, 2, 2, 1, 16, True)
    n = shape.parameters()
    # embeddings 80; per layer: attention 2*64 + 2*8*4 + 8 + 2*4 = 208, MLP 384, norms 16
    assert n == 80 + 2 * (208 + 384 + 16) + 8
    assert shape.kv_bytes_per_token() == 2 * 2 * 1 * 4 * 2
    # LoRA rank 2 per block: q, o 2*(8+8); k, v 2*(8+4); gate, up 2*(8+16); down (16+8)
    assert shape.lora_parameters(2) == 2 * 2 * (32 + 24 + 48 + 24)
    parts = hb.training_memory(shape, tokens_in_flight=3)
    assert parts['optimizer'] == pytest.approx(12 * n / hb.GIB)
    assert parts['kv_cache'] == pytest.approx(3 * 32 / hb.GIB)
    assert parts['reference'] == 0
    assert hb.training_memory(shape, 3, kl_reference=True)['reference'] == \
        pytest.approx(2 * n / hb.GIB)
    assert hb.training_memory(shape, 3, adam_bytes=6)['optimizer'] == \
        pytest.approx(6 * n / hb.GIB)
    a = shape.lora_parameters(2)
    lora = hb.lora_memory(shape, 3, 2)
    assert lora['weights'] == pytest.approx(2 * (n + a) / hb.GIB)
    assert (lora['gradients'], lora['optimizer']) == pytest.approx(
        (2 * a / hb.GIB, 12 * a / hb.GIB))
    untied = hb.ModelShape('toy', 10, 8, 2, 2, 1, 16, False)
    assert untied.matmul_parameters() == untied.parameters() - 80 == n
    # a forward: 2 per weight; attention 4 x hidden per layer and attended token
    assert hb.forward_flops(shape, 0) == 2 * n
    assert hb.forward_flops(shape, 5) == 2 * n + 4 * 2 * 8 * 5
    assert hb.step_flops(shape, 7, 5) == 7 * hb.forward_flops(shape, 5) * 4
    assert hb.step_flops(shape, 7, 5, forwards=3, updates=2) == \
        7 * hb.forward_flops(shape, 5) * 9
