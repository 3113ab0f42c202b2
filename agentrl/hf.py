# Generated from book/21-real-model.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'CALL_OPEN',
    'CALL_CLOSE',
    'TOOL_ARITY',
    'TEXT_MALFORMED',
    'CALL_FORMS',
    'SYSTEM_PROMPT',
    'OBSERVATION_ROLES',
    'parse_text_call',
    'TextBugFixEnv',
    'make_text_env',
    'ChatTokenizer',
    'ChatTrajectory',
    'LOGIT_TRANSFORMS',
    'check_plain_model',
    'HFPolicy',
    'ChatTranscript',
    'retokenization_report',
    'REWARD_FIELD',
    'task_prompt',
    'episode_layout',
    'TRLRollout',
    'gym_reward',
    'trl_dataset',
    'trl_config',
    'trl_trainer',
    'VERL_AGENT_NAME',
    'VERL_LOOP_TARGET',
    'VERL_LOOP_FILE',
    'gym_fields',
    'gym_config',
    'verl_task',
    'verl_rows',
    'verl_episode',
    'verl_config',
    'OpenRLHFTextAgent',
    'openrlhf_executor',
    'write_openrlhf_agent_file',
    'openrlhf_flags',
    'ModelShape',
    'GIB',
    'training_memory',
    'lora_memory',
    'forward_flops',
    'step_flops',
]


import dataclasses
import functools
import os
import random
import re
import weakref

import torch
import torch.nn as nn

import agentrl as arl

CALL_OPEN, CALL_CLOSE = '<call>', '</call>'
_CALL = re.compile(r'<call>(.*?)</call>', re.DOTALL)
TOOL_ARITY = {'read': 0, 'test': 0, 'edit': 1, 'submit': 0}   # arguments per tool
TEXT_MALFORMED = ('no_call', 'unclosed', 'several_calls', 'empty_call', 'unknown_tool',
                  'bad_arguments', 'unknown_op')
CALL_FORMS = ('<call>read</call>', '<call>test</call>', '<call>edit OP</call>',
              '<call>submit</call>')
SYSTEM_PROMPT = (
    'You fix a bug in a small Python function. Each turn, write exactly one tool '
    'call, in this form: ' + ', '.join(CALL_FORMS) + '. OP is one of: '
    + ', '.join(arl.EDIT_OPS) + '. read shows the code, test runs the public tests, '
    'edit applies one repair, submit ends the episode and the hidden tests decide '
    'whether the fix is right.')
OBSERVATION_ROLES = ('user', 'tool')


def _malformed(kind, detail):
    """(kind, message) for one malformed call, the message ending with what is
    accepted."""
    accepted = ('edit ops: ' + ', '.join(arl.EDIT_OPS) if kind == 'unknown_op'
                else 'calls: ' + ', '.join(CALL_FORMS))
    return kind, f'Malformed call ({kind}): {detail}. Accepted {accepted}.'


def parse_text_call(text):
    """Free text -> (the gym's call string, None) or (the call string the gym logs as
    malformed, (kind, message)), kind one of TEXT_MALFORMED."""
    calls, opened = _CALL.findall(text), text.count(CALL_OPEN)
    if opened != text.count(CALL_CLOSE) or opened != len(calls):
        return '', _malformed('unclosed', f'{opened} {CALL_OPEN} and '
                              f'{text.count(CALL_CLOSE)} {CALL_CLOSE} do not pair up')
    if not calls:
        return '', _malformed('no_call', f'no {CALL_OPEN}...{CALL_CLOSE} in the turn')
    if len(calls) > 1:
        return '', _malformed('several_calls', f'{len(calls)} calls in one turn; '
                              'write exactly one')
    words = calls[0].split()
    if not words:
        return '', _malformed('empty_call', 'the call names no tool')
    tool, args = words[0], words[1:]
    if tool not in TOOL_ARITY:
        return '', _malformed('unknown_tool', f'unknown tool {tool!r}')
    if len(args) != TOOL_ARITY[tool]:
        return '', _malformed('bad_arguments', f'{tool} takes {TOOL_ARITY[tool]} '
                              f'argument(s), got {len(args)}: {args}')
    if tool == 'edit' and args[0] not in arl.EDIT_OPS:
        # logged as the gym logs an unknown op, so is_malformed counts it
        return f'edit {args[0]}', _malformed('unknown_op',
                                             f'unknown edit op {args[0]!r}')
    return ' '.join(words), None


_PLAIN = {arl.MESSAGES['changed']: 'The edit changed the code.',
          arl.MESSAGES['unchanged']: 'The edit did not change the code.'}


class TextBugFixEnv:
    """A BugFix gym (inner: BugFixEnv or a subclass; None = BugFixEnv(**gym_args)) with
    plain-text observations and free-text actions: one <call>TOOL ARGS</call> a turn."""

    system = SYSTEM_PROMPT

    def __init__(self, inner=None, **gym_args):
        if inner is not None and gym_args:
            raise ValueError(f'pass inner or gym arguments, not both: '
                             f'{sorted(gym_args)}')
        self.inner = inner if inner is not None else arl.BugFixEnv(**gym_args)
        self.malformed = []          # per turn: None, or the kind of malformed call

    @property
    def max_turns(self):
        """The inner gym's turn budget."""
        return self.inner.max_turns

    def reset(self, task):
        """Start an episode on task -> the issue as plain text."""
        self.inner.reset(task)
        self.malformed = []
        return (f"Issue: the function {task.fn_name} returns wrong results. "
                f"Find and fix the bug.")

    def step(self, text):
        """Parse and apply one free-text turn -> (observation text, reward, done, info);
        info is the inner gym's."""
        call, problem = parse_text_call(text)
        self.malformed.append(problem and problem[0])
        edits = len(getattr(self.inner, 'ops', ()))
        observation, reward, done, info = self.inner.step(call)
        if problem is not None:
            return problem[1], reward, done, info
        return self._plain(call, observation, edits), reward, done, info

    def _plain(self, call, observation, edits):
        """The gym's answer to a well-formed call as a sentence or the source."""
        tool = call.split()[0]
        if tool == 'read':         # plain Python, unless the gym shortened its read
            plain = observation == arl.compact_source(self.inner.source)
            return f'Source:\n{self.inner.source if plain else observation}'
        if tool == 'test':
            return f'Public tests: {observation}'
        if tool == 'edit' and len(self.inner.ops) == edits and hasattr(
                self.inner, 'max_edits'):
            return (f'Edit refused: the budget of {self.inner.max_edits} edit(s) '
                    f'is spent.')
        return _PLAIN.get(observation, observation or 'Submitted.')

    def final_info(self, submitted):
        """The inner gym's final info."""
        return self.inner.final_info(submitted)

    def reward_fn(self, info):
        """The inner gym's reward of a final info."""
        return self.inner.reward_fn(info)


def make_text_env(cfg):
    """arl.make_env(cfg) (the gym train_rl would use) as a TextBugFixEnv; pickles with
    functools.partial for train_many."""
    return TextBugFixEnv(arl.make_env(cfg))


class ChatTokenizer:
    """A transformers tokenizer with a chat template as train_rl's tok: pad_id, stop
    ids, and the chat layout (observation_role 'user' or 'tool')."""

    def __init__(self, tokenizer, stop_tokens=None, observation_role='user'):
        if not getattr(tokenizer, 'chat_template', None):
            raise ValueError('the tokenizer has no chat_template; set one (a Jinja '
                             'string over messages and add_generation_prompt)')
        if observation_role not in OBSERVATION_ROLES:
            raise ValueError(f'unknown observation_role {observation_role!r}; '
                             f'expected one of {OBSERVATION_ROLES}')
        stop_tokens = stop_tokens or [tokenizer.eos_token]
        if None in stop_tokens:
            raise ValueError('the tokenizer has no eos_token; pass stop_tokens')
        unknown = [s for s in stop_tokens if s not in tokenizer.get_vocab()]
        if unknown:
            raise ValueError(f'stop tokens {unknown} are not in the vocabulary; pass '
                             f'tokens the model can write, e.g. its eos_token')
        self.hf, self.observation_role = tokenizer, observation_role
        self.stop_tokens = list(stop_tokens)
        self.stop_ids = set(tokenizer.convert_tokens_to_ids(self.stop_tokens))
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else tokenizer.eos_token_id
        self.closing_ids = self._closing_ids()

    def _closing_ids(self):
        """The stop ids whose text the template itself writes right after an
        assistant message (ChatML's <|im_end|>); other stop ids stay in the content."""
        probe = 'Zq9'
        text = self.render([{'role': 'system', 'content': 's'},
                            {'role': 'user', 'content': 'u'},
                            {'role': 'assistant', 'content': probe}], False)
        after = text[text.rindex(probe) + len(probe):]
        return {i for i in self.stop_ids if after.startswith(self.token_text(i))}

    def __len__(self):
        return len(self.hf)

    def render(self, messages, generation_prompt):
        """Chat messages [{'role', 'content'}] -> the template's text."""
        return self.hf.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=generation_prompt)

    def encode(self, text):
        """Text -> [ids], no special tokens added beyond those written in text."""
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids):
        """[ids] -> text, special tokens kept, spaces not cleaned up."""
        return self.hf.decode(list(ids), skip_special_tokens=False,
                              clean_up_tokenization_spaces=False)

    def token_text(self, token_id):
        """The text one id stands for in a rendered template (its token string)."""
        return self.hf.convert_ids_to_tokens(int(token_id))


def _transformers():
    """The transformers package, imported on first use (the core needs torch only),
    without tqdm's notice that Jupyter widgets are missing."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='IProgress not found')
        import transformers
    return transformers


def _cache_keyword(body):
    """The name body.forward takes its KV cache under: 'cache' (transformers >= 5.2x)
    or 'past_key_values'."""
    import inspect
    return ('cache' if 'cache' in inspect.signature(body.forward).parameters
            else 'past_key_values')


@dataclasses.dataclass
class ChatTrajectory(arl.Trajectory):
    """A Trajectory (ids [T], action_mask and sample_logp [T-1]) with its chat
    messages, the transcript the ids were laid out from."""
    messages: list = None


# config keys with which transformers models change the logits after the output layer
# (the keys TRL 1.16's fused head reads: Gemma 2, Cohere, Granite, Falcon-H1, ...)
LOGIT_TRANSFORMS = ('final_logit_softcapping', 'logit_scale', 'logits_scaling',
                    'output_multiplier', 'lm_head_multiplier')


def check_plain_model(model):
    """Refuse a model whose logits are not its output layer applied to its decoder's
    last hidden states (its config says so, or a probe of four tokens shows it), or
    whose dropout would make two passes disagree."""
    config = model.config.to_dict()
    if model.config.get_text_config() is not model.config:
        config |= model.config.get_text_config().to_dict()
    transforms = {k: config[k] for k in LOGIT_TRANSFORMS
                  if config.get(k) not in (None, 1, 1.0)}
    if transforms:
        raise ValueError(f'the model transforms its logits after the output layer '
                         f'({transforms}); HFPolicy scores head(decoder output) and '
                         f'would not match the model: set them to None or 1')
    dropout = {k: v for k, v in config.items() if ('dropout' in k or k.endswith(
        'pdrop')) and isinstance(v, (int, float)) and v > 0}
    dropout |= {name: m.p for name, m in model.named_modules()
                if isinstance(m, nn.Dropout) and m.p > 0}
    if dropout:
        raise ValueError(f'dropout is on ({dropout}): the training pass would score '
                         f'a different network than the one that sampled; set it to 0')
    _probe_head(model)


_PROBED = weakref.WeakSet()     # the models _probe_head has passed: probed once each


def _probe_head(model):
    """Compare the model's logits on four tokens with its output layer applied to
    its decoder's last hidden states; raise if they differ (a meta model is skipped;
    a model that passed is not probed again)."""
    head = model.get_output_embeddings()
    if head.weight.is_meta or model in _PROBED:
        return
    # the vocabulary from the layer's shape attribute or the config: under ZeRO-3 a
    # process holds a shard of the weight, whose local shape may be [0]
    vocab = getattr(head, 'out_features', None) or \
        model.config.get_text_config().vocab_size
    ids = torch.arange(4, device=head.weight.device)[None] % vocab
    with torch.no_grad():
        own = model(input_ids=ids, use_cache=False).logits.double()
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        ours = head(hidden).double()
    gap = (own - ours).abs().max().item()
    if gap > 1e-3 * (1 + ours.abs().max().item()):
        raise ValueError(f'the model\'s logits differ from its output layer applied '
                         f'to its decoder\'s hidden states by up to {gap:.3g}; '
                         f'HFPolicy scores head(decoder output) and would not match '
                         f'the model')
    _PROBED.add(model)


class HFPolicy(nn.Module):
    """A transformers causal LM as a train_rl policy: rollout plays chat episodes,
    hidden/ln_f/head give log-probs on the same ids [B, T]. With loss_mode='constant'
    set cfg.norm_const (its default counts MAX_CALL_TOKENS tokens a turn)."""

    def __init__(self, model, max_new_tokens=24, max_len=None):
        super().__init__()
        if max_new_tokens < 1:
            raise ValueError(f'max_new_tokens must be at least 1, got {max_new_tokens}')
        check_plain_model(model)
        self.lm, self.max_new_tokens = model, max_new_tokens
        self.max_len = max_len or model.config.max_position_embeddings
        self.ln_f = nn.Identity()          # the body's output is already normalized

    def head(self, hidden):
        """The output layer: hidden [..., D] -> logits [..., V], in float32 or wider
        (a log-softmax in bf16 keeps 8 significant bits)."""
        logits = self.lm.get_output_embeddings()(hidden)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def forward(self, ids):
        """ids [B, T] -> logits [B, T, V], through hidden and head."""
        B, T = ids.shape
        return self.head(self.hidden(ids.reshape(B * T), [(B, T)])).view(B, T, -1)

    def hidden(self, ids, buckets):
        """Rows laid end to end, ids [N], in buckets [(rows, T)] -> the body's last
        hidden states [N, D]; rows are right-padded, so causal attention suffices."""
        longest = max(T for _, T in buckets)
        if longest > self.max_len:
            raise ValueError(f'sequence length {longest} exceeds max_len '
                             f'{self.max_len}')
        body, start, out = self.lm.get_decoder(), 0, []
        for rows, T in buckets:
            x = ids[start:start + rows * T].view(rows, T)
            out.append(body(input_ids=x, use_cache=False).last_hidden_state.reshape(
                rows * T, -1))
            start += rows * T
        return torch.cat(out)

    def feed(self, cache, ids):
        """Append ids [n] to one row's cache -> logits [V] after the last of them."""
        body = self.lm.get_decoder()
        with torch.no_grad():
            h = body(input_ids=torch.tensor([ids], device=self.lm.device),
                     use_cache=True, **{_cache_keyword(body): cache}).last_hidden_state
            return self.head(self.ln_f(h[0, -1])).cpu()

    def sample_turn(self, cache, logits, tok, temperature, generator):
        """Sample one assistant turn from logits [V] on: up to max_new_tokens ids, a
        stop id ends it -> (ids, their log-probs at temperature); the last id is not
        fed."""
        ids, logps = [], []
        for k in range(self.max_new_tokens):
            log_probs = torch.log_softmax(logits / temperature, -1)
            token = int(torch.multinomial(log_probs.exp(), 1, generator=generator))
            ids.append(token)
            logps.append(float(log_probs[token]))
            if token in tok.stop_ids or k == self.max_new_tokens - 1:
                break
            logits = self.feed(cache, [token])
        return ids, logps

    def rollout(self, envs, tasks, tok, max_turns=6, temperature=1.0, generator=None):
        """Play one chat episode per (env, task), each env a TextBugFixEnv (reset, step,
        system) -> [ChatTrajectory]; what arl.sample_groups asks of a model."""
        if len(envs) != len(tasks):
            raise ValueError(f'got {len(envs)} envs for {len(tasks)} tasks; '
                             'need one env per task')
        if temperature <= 0:
            raise ValueError(f'temperature must be positive, got {temperature}')
        if not isinstance(tok, ChatTokenizer):
            raise ValueError(f'tok must be a ChatTokenizer, got {type(tok).__name__}')
        return [self._episode(env, task, tok, max_turns, temperature, generator)
                for env, task in zip(envs, tasks)]

    def _episode(self, env, task, tok, max_turns, temperature, generator):
        """One chat episode: template and observation tokens flagged 0, sampled tokens 1
        with their log-probs -> ChatTrajectory."""
        chat = ChatTranscript(tok, env.system, env.reset(task))
        if len(chat.ids) > self.max_len:
            raise ValueError(f'the prompt alone ({len(chat.ids)} tokens) exceeds '
                             f'max_len {self.max_len}; shorten the task or the system')
        if len(chat.ids) + self.max_new_tokens > self.max_len:
            # no room for one turn after the prompt: the context is full at once
            info = env.final_info(False) | {'context_full': True}
            return chat.trajectory(env.reward_fn(info), info)
        cache = _transformers().DynamicCache()
        logits, result = self.feed(cache, chat.ids), None
        for _ in range(max_turns):
            sampled, logps = self.sample_turn(cache, logits, tok, temperature,
                                               generator)
            observation, reward, done, info = env.step(chat.assistant(sampled, logps))
            if done:
                result = (reward, info)
                break
            delta = chat.observation(observation)
            if len(chat.ids) + len(delta) + self.max_new_tokens > self.max_len:
                # no room for the answer and one more turn: the context is full
                info = env.final_info(False) | {'context_full': True}
                result = (env.reward_fn(info), info)
                break
            logits = self.feed(cache, sampled[-1:] + chat.extend(delta))
        if result is None:       # max_turns spent before the gym's own budget ended it
            info = env.final_info(False)
            result = (env.reward_fn(info), info)
        return chat.trajectory(*result)


class ChatTranscript:
    """One chat episode as it grows: messages, the rendered text, ids [T], policy flags
    [T] and sampling log-probs [T] (0 off the policy's tokens)."""

    def __init__(self, tok, system, first):
        self.tok = tok
        self.messages = [{'role': 'system', 'content': system},
                         {'role': 'user', 'content': first}]
        self.text = tok.render(self.messages, True)
        self.ids = tok.encode(self.text)
        self.flags, self.logps = [0] * len(self.ids), [0.0] * len(self.ids)
        self.content, self.stop_id, self._pending = None, None, None

    def assistant(self, sampled, logps):
        """Add a sampled turn (ids, log-probs) -> its content, the text the env reads
        (without a stop token the template writes itself, such as <|im_end|>)."""
        if not sampled or len(sampled) != len(logps):
            raise ValueError(f'a turn needs at least one sampled id and one log-prob '
                             f'per id; got {len(sampled)} ids, {len(logps)} log-probs')
        self.ids, self.flags = self.ids + sampled, self.flags + [1] * len(sampled)
        self.logps += logps
        closing = sampled[-1] in self.tok.closing_ids
        self.stop_id = sampled[-1] if closing else None
        self.content = self.tok.decode(sampled[:-1] if closing else sampled)
        self.messages.append({'role': 'assistant', 'content': self.content})
        return self.content

    def observation(self, text):
        """Render the env's answer as the next message -> the new template ids after
        the sampled turn, up to the next generation prompt (not yet added)."""
        role = self.tok.observation_role
        messages = self.messages + [{'role': role, 'content': text}]
        rendered, before = self.tok.render(messages, True), self.text + self.content
        if not rendered.startswith(before):
            at = next((i for i, (a, b) in enumerate(zip(rendered, before)) if a != b),
                      min(len(rendered), len(before)))
            raise ValueError(f'the chat template renders the conversation differently '
                             f'from the previous rendering plus the assistant content, '
                             f'at character {at}: expected {before[at:at + 24]!r}, got '
                             f'{rendered[at:at + 24]!r}; a template that rewrites or '
                             f'trims earlier turns cannot be sampled turn by turn')
        delta = rendered[len(before):]
        stop = self.stop_id is not None and self.tok.token_text(self.stop_id)
        if stop and delta.startswith(stop):          # the model already wrote it
            delta = delta[len(stop):]
        self._pending = messages, rendered
        return self.tok.encode(delta)

    def extend(self, delta):
        """Keep the observation whose ids [n] observation() returned -> delta."""
        self.messages, self.text = self._pending
        self.ids, self.flags = self.ids + delta, self.flags + [0] * len(delta)
        self.logps += [0.0] * len(delta)
        return delta

    def trajectory(self, reward, info):
        """The episode -> ChatTrajectory (action_mask and sample_logp [T-1])."""
        return ChatTrajectory(torch.tensor(self.ids, dtype=torch.long),
                              torch.tensor(self.flags[1:], dtype=arl.DTYPE), reward,
                              info, torch.tensor(self.logps[1:], dtype=arl.DTYPE),
                              self.messages)


# the chat template of the local tokenizer: ChatML, as many instruction-tuned models use
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
          "<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_SPECIAL = ['<pad>', '<unk>', '<|im_start|>', '<|im_end|>']


def gym_texts():
    """Every text the text gym shows or accepts, on every task -> [str]: the corpus a
    local tokenizer is trained on."""
    texts = [SYSTEM_PROMPT, *CALL_FORMS, 'system user assistant tool']
    calls = ['read', 'test', *(f'edit {op}' for op in arl.EDIT_OPS)]
    bad = ['', 'read', '<call>x</call>', '<call>read</call><call>test</call>', '<call>',
           '<call></call>', '<call>read 1</call>', '<call>edit fix_foo</call>']
    for task in arl.make_tasks('all'):
        env = TextBugFixEnv(max_turns=20)
        texts.append(env.reset(task))
        turns = [f'<call>{c}</call>' for c in calls] + bad + ['<call>submit</call>']
        for text in turns:
            texts.append(env.step(text)[0])
    return texts


def local_chat_tokenizer(kind='word'):
    """A transformers tokenizer trained here on gym_texts, with CHATML: 'word' (one
    id per word or punctuation mark) or 'bpe' (byte-level BPE, 400 ids)
    -> ChatTokenizer."""
    transformers = _transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    if kind not in ('word', 'bpe'):
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected 'word' or 'bpe'")
    if kind == 'word':
        core = Tokenizer(models.WordLevel(unk_token='<unk>'))
        core.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordLevelTrainer(special_tokens=_SPECIAL,
                                            show_progress=False)
    else:
        core = Tokenizer(models.BPE())
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, special_tokens=_SPECIAL, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(gym_texts(), trainer)
    core.add_tokens([CALL_OPEN, CALL_CLOSE])
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token='<pad>', unk_token='<unk>',
        eos_token='<|im_end|>', bos_token='<|im_start|>')
    hf.chat_template = CHATML
    return ChatTokenizer(hf)


def tiny_chat_llama(tok, dtype=torch.float64, seed=0, max_new_tokens=10):
    """A randomly initialized Llama (2 layers, width 32) over tok's ids, built from a
    config, nothing downloaded -> HFPolicy."""
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        pad_token_id=tok.pad_id, bos_token_id=tok.hf.bos_token_id,
        eos_token_id=tok.hf.eos_token_id, tie_word_embeddings=False)
    return HFPolicy(transformers.LlamaForCausalLM(config).to(dtype),
                    max_new_tokens=max_new_tokens)


def retokenization_report(traj, tok):
    """Render traj.messages with the chat template and encode the text -> None if that
    gives traj.ids (the template may add closing tokens after them), else a dict
    naming the first differing position."""
    again = tok.encode(tok.render(traj.messages, False))
    ids = traj.ids.tolist()
    position = next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), None)
    if position is None and len(again) >= len(ids):
        return None
    position = len(again) if position is None else position
    flags = [0] + traj.action_mask.long().tolist()
    return dict(position=position, sampled=tok.decode(ids[position:position + 6]),
                retokenized=tok.decode(again[position:position + 6]),
                in_assistant_turn=bool(position < len(flags) and flags[position]),
                n_sampled=len(ids), n_retokenized=len(again))


REWARD_FIELD = 'gym_reward'        # the rollout's extra field that gym_reward reads


def task_prompt(env, task):
    """The chat messages an episode of task starts from -> [system, user] dicts."""
    return [{'role': 'system', 'content': env.system},
            {'role': 'user', 'content': env.reset(task)}]


def episode_layout(traj):
    """A ChatTrajectory (ids [T], action_mask and sample_logp [T-1]) -> dict of lists:
    prompt_ids [P] (up to the first sampled id), completion_ids [T-P], env_mask (1 on
    sampled ids) and logprobs [T-P] (0 off them)."""
    flags = [0] + traj.action_mask.long().tolist()
    if 1 not in flags:
        raise ValueError('the episode has no sampled token; nothing to train on')
    start, ids = flags.index(1), traj.ids.tolist()
    logps = traj.sample_logp[start - 1:].tolist()
    return dict(prompt_ids=ids[:start], completion_ids=ids[start:],
                env_mask=flags[start:],
                logprobs=[x if f else 0.0 for f, x in zip(flags[start:], logps)])


class TRLRollout:
    """GRPOTrainer's rollout_func: each prompt it gets played as one text-gym episode
    by HFPolicy at the trainer's temperature, under a random function name when rename
    is on (as RLConfig.rename) -> prompt_ids, completion_ids, logprobs, env_mask,
    gym_reward. TRL's RepeatSampler hands it each prompt num_generations times."""

    def __init__(self, tok, tasks, max_turns=3, max_new_tokens=10, env_factory=None,
                 seed=0, rename=True):
        if not isinstance(tok, ChatTokenizer):
            raise ValueError(f'tok must be a ChatTokenizer, got {type(tok).__name__}')
        self.tok, self.max_turns, self.max_new_tokens = tok, max_turns, max_new_tokens
        self.env_factory = env_factory or TextBugFixEnv
        self.tasks = {}
        for task in tasks:
            issue = task_prompt(self.env_factory(), task)[-1]['content']
            if issue in self.tasks:
                raise ValueError(f'two tasks share the issue {issue!r}; the rollout '
                                 f'finds a prompt\'s task by its issue')
            self.tasks[issue] = task
        self.seed, self.rename, self.generator = seed, rename, None
        self.calls = []                  # per call: the episodes [ChatTrajectory]

    def make_policy(self, model):
        """The policy that plays the episodes: HFPolicy over the trainer's model."""
        return HFPolicy(model, max_new_tokens=self.max_new_tokens)

    def task_of(self, prompt):
        """A prompt (task_prompt's messages) -> its task, under its own name."""
        issue = prompt[-1]['content'] if isinstance(prompt, list) else prompt
        if issue not in self.tasks:
            raise ValueError(f'prompt {issue!r} is none of the {len(self.tasks)} '
                             f'tasks\' issues; build the dataset with '
                             f'trl_dataset(tasks)')
        return self.tasks[issue]

    def __call__(self, prompts, trainer):
        """prompts [B] and the trainer -> dict of [B] lists, as TRL asks."""
        if self.generator is None:       # each process samples its own episodes
            rank = trainer.accelerator.process_index
            self.generator = torch.Generator().manual_seed(self.seed + rank)
        model = trainer.accelerator.unwrap_model(trainer.model)
        tasks = [self.task_of(p) for p in prompts]
        if self.rename:                  # as sample_groups: a new name per episode
            draw = torch.randint(2 ** 62, (), generator=self.generator).item()
            renamer = random.Random(draw)
            tasks = [arl.randomize_names(task, renamer) for task in tasks]
        was_training = model.training
        model.eval()
        try:
            trajs = self.make_policy(model).rollout(
                [self.env_factory() for _ in tasks], tasks, self.tok, self.max_turns,
                trainer.temperature, self.generator)
        finally:
            model.train(was_training)
        self.calls.append(trajs)
        layouts = [episode_layout(t) for t in trajs]
        out = {key: [layout[key] for layout in layouts] for key in layouts[0]}
        out[REWARD_FIELD] = [float(t.reward) for t in trajs]
        return out


def gym_reward(prompts, completions, **fields):
    """TRL reward function: the gym's reward of each episode, from the rollout's
    gym_reward field -> [float] [B]."""
    if REWARD_FIELD not in fields:
        raise ValueError(f'no {REWARD_FIELD!r} field; pass TRLRollout as rollout_func '
                         f'(fields given: {sorted(fields)})')
    return [float(r) for r in fields[REWARD_FIELD]]


def trl_dataset(tasks, env_factory=None):
    """One row per task, its column 'prompt' the task's first messages -> Dataset."""
    import datasets
    env_factory = env_factory or TextBugFixEnv
    return datasets.Dataset.from_list([{'prompt': task_prompt(env_factory(), task)}
                                       for task in tasks])


def trl_config(cfg, output_dir, max_steps, **overrides):
    """GRPOConfig for an RLConfig (chapter 14's to_trl: bf16 off on a CPU), no saving,
    no gradient checkpointing, a log every step; overrides win -> GRPOConfig."""
    from trl import GRPOConfig
    options = dict(arl.to_trl(cfg).options)
    options.update(output_dir=str(output_dir), max_steps=max_steps, logging_steps=1,
                   save_strategy='no', report_to='none', gradient_checkpointing=False,
                   disable_tqdm=True, dataloader_num_workers=0)
    return GRPOConfig(**(options | overrides))


def trl_trainer(model, tok, tasks, cfg, output_dir, max_steps=2, rollout=None,
                **overrides):
    """A GRPOTrainer on the text gym: model (a causal LM or an HFPolicy), tok
    (ChatTokenizer), tasks, cfg (RLConfig, its rename honoured by the rollout)
    -> GRPOTrainer with a TRLRollout and gym_reward, its logs kept in
    trainer.state.log_history, not printed."""
    from trl import GRPOTrainer
    os.environ.setdefault('TRL_EXPERIMENTAL_SILENCE', '1')    # rollout_func is new
    model = model.lm if isinstance(model, HFPolicy) else model
    env_factory = functools.partial(make_text_env, cfg)
    rollout = rollout or TRLRollout(tok, tasks, cfg.max_turns, env_factory=env_factory,
                                    seed=cfg.seed, rename=cfg.rename)
    if rollout.rename != cfg.rename:
        raise ValueError(f'the rollout renames {rollout.rename}, cfg.rename is '
                         f'{cfg.rename}; build the rollout with rename=cfg.rename')
    trainer = GRPOTrainer(model=model, reward_funcs=gym_reward,
                          args=trl_config(cfg, output_dir, max_steps, **overrides),
                          train_dataset=trl_dataset(tasks, env_factory),
                          processing_class=tok.hf, rollout_func=rollout)
    trainer.remove_callback(_transformers().PrinterCallback)  # logs: state.log_history
    return trainer


def record_loss_inputs(trainer):
    """Wrap trainer._compute_loss to keep, per call: the loss mask [B, C] (completion
    mask x tool mask), prompt ids (unpadded), completion ids [B, C], advantages [B]
    and TRL's own log-probs [B, C], as the loss computes them and under bf16 autocast
    (what bf16=True with use_cpu=True would run) -> that list."""
    records, compute = [], trainer._compute_loss

    def recording(model, inputs):
        mask = inputs['completion_mask'] * inputs.get('tool_mask', 1)
        ids = torch.cat([inputs['prompt_ids'], inputs['completion_ids']], 1)
        attention = torch.cat([inputs['prompt_mask'], inputs['completion_mask']], 1)
        score = functools.partial(trainer._get_per_token_logps_and_entropies, model,
                                  ids, attention, inputs['completion_ids'].size(1))
        with torch.no_grad():
            logps, _, _ = score()
            with torch.autocast(ids.device.type, dtype=torch.bfloat16):
                logps_bf16, _, _ = score()
        prompts = [row[m.bool()].tolist() for row, m in
                   zip(inputs['prompt_ids'], inputs['prompt_mask'])]
        records.append(dict(mask=mask.detach().clone(), prompt_ids=prompts,
                            completion_ids=inputs['completion_ids'].clone(),
                            logps=logps.detach().clone(),
                            logps_bf16=logps_bf16.detach().float().clone(),
                            advantages=inputs['advantages'].detach().clone()))
        return compute(model, inputs)

    trainer._compute_loss = recording
    return records


def match_rows(record, trajs):
    """The episode each row of a recorded batch came from, by its prompt and completion
    ids -> [(row, index in trajs)]; raises if a row matches none, or two rows one."""
    layouts, pairs = [episode_layout(t) for t in trajs], []
    for row, ids in enumerate(record['completion_ids'].tolist()):
        found = [i for i, layout in enumerate(layouts)
                 if record['prompt_ids'][row] == layout['prompt_ids']
                 and ids[:len(layout['completion_ids'])] == layout['completion_ids']
                 and not record['mask'][row, len(layout['completion_ids']):].any()]
        if not found:
            raise ValueError(f'row {row} of the trainer\'s batch matches no episode')
        pairs.append((row, found[0]))
    if len({i for _, i in pairs}) != len(pairs):
        raise ValueError(f'rows {pairs} match an episode twice')
    return pairs


VERL_AGENT_NAME = 'bugfix_text'
# where verl's workers import the loop from, and the file verl_config lists it in
VERL_LOOP_TARGET, VERL_LOOP_FILE = 'agentrl.hf.BugFixTextAgentLoop', 'agent_loops.yaml'


def gym_fields(cfg):
    """An RLConfig's environment fields but max_turns -> {'rename', 'max_edits',
    'reward'} as plain values, what a verl row or an OpenRLHF agent module carries to
    the trainer's workers; a callable reward goes as its import path 'module:name'."""
    reward = cfg.reward
    if callable(reward):
        module = getattr(reward, '__module__', None)
        reward = f"{module}:{getattr(reward, '__qualname__', '')}"
        if module == '__main__' or _imported(reward) is not cfg.reward:
            raise ValueError(f'reward {cfg.reward!r} cannot be imported by name '
                             f'({reward!r}), and the trainer\'s workers import it; '
                             f'use a module-level function of an importable module '
                             f'or one of {arl.REWARDS}')
    return dict(rename=cfg.rename, max_edits=cfg.max_edits, reward=reward)


def _imported(path):
    """'module:name' -> the object it names, or None if it cannot be imported."""
    import importlib
    module, _, name = path.partition(':')
    try:
        found = importlib.import_module(module)
        for part in name.split('.'):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError):
        return None
    return found


def gym_config(fields, max_turns):
    """gym_fields' dict (or part of it; None: RLConfig's defaults) and a turn budget
    -> the RLConfig of the gym (make_text_env's argument), a reward path imported."""
    fields = dict(fields or {})
    reward = fields.get('reward')
    if isinstance(reward, str) and reward not in arl.REWARDS:
        fields['reward'] = _imported(reward)
        if fields['reward'] is None:
            raise ValueError(f'reward {reward!r} is neither one of {arl.REWARDS} nor '
                             f'an importable \'module:name\'')
    return arl.RLConfig(**{'max_turns': max_turns} | fields)


def verl_task(extra_info):
    """A verl dataset row's extra_info {'split', 'index'(, 'gym')} -> (task, its gym
    fields as a dict)."""
    missing = {'split', 'index'} - set(extra_info or {})
    if missing:
        raise ValueError(f'extra_info needs {sorted(missing)} (a make_tasks split and '
                         f'an index into it); got {dict(extra_info or {})}')
    return (arl.make_tasks(extra_info['split'])[int(extra_info['index'])],
            dict(extra_info.get('gym', {})))


def verl_rows(split, indices, cfg):
    """verl dataset rows, one per task index of make_tasks(split), for the run's
    RLConfig cfg: data_source, prompt (the task's first messages), agent_name,
    extra_info {'split', 'index', 'gym': gym_fields(cfg)} -> [dict]; cfg.max_turns
    travels in verl's config (verl_config). Never repeat a row: verl gives each row
    its own uid, the key of its group, then repeats it rollout.n times."""
    tasks, env, gym = arl.make_tasks(split), TextBugFixEnv(), gym_fields(cfg)
    return [dict(data_source=VERL_AGENT_NAME, prompt=task_prompt(env, tasks[i]),
                 agent_name=VERL_AGENT_NAME,
                 extra_info={'split': split, 'index': i, 'gym': dict(gym)})
            for i in indices]


def _server_turn(out, request):
    """A server's TokenOutput -> (ids, log-probs), or a clear error when the request
    was aborted (with or without tokens), or a turn has no token or not one log-prob
    per token."""
    ids, logps = list(out.token_ids), out.log_probs
    stop = getattr(out, 'stop_reason', None)
    if stop == 'aborted':
        raise RuntimeError(f'request {request} was aborted (stop_reason {stop!r}) '
                           f'after {len(ids)} token(s); an aborted turn is no turn '
                           f'the model finished, and the loop does not resume it')
    if not ids:
        raise RuntimeError(f'request {request} returned no token (stop_reason '
                           f'{stop!r}); a turn needs at least one')
    if logps is None or len(logps) != len(ids):
        got = 'no' if logps is None else len(logps)
        raise RuntimeError(f'request {request} returned {got} log-probs for {len(ids)} '
                           f'tokens; the loop asks for logprobs=True and needs one a '
                           f'token')
    return ids, list(logps)


async def verl_episode(server, tok, env, task, sampling_params, per_turn, budget,
                       prompt_limit=None):
    """Play env on task through server.generate (verl's signature: ids in, ids out), at
    most per_turn tokens a turn, budget after the prompt, and a prompt of at most
    prompt_limit tokens -> (ChatTranscript, prompt length, reward, final info)."""
    from uuid import uuid4
    chat = ChatTranscript(tok, env.system, env.reset(task))
    prompt_len, request = len(chat.ids), uuid4().hex
    if prompt_limit is not None and prompt_len > prompt_limit:
        raise ValueError(f'the prompt has {prompt_len} tokens, more than verl\'s '
                         f'rollout.prompt_length {prompt_limit}; raise '
                         f'data.max_prompt_length')
    while True:
        room = prompt_len + budget - len(chat.ids)
        params = dict(sampling_params, max_tokens=min(per_turn, room), logprobs=True)
        out = await server.generate(request_id=request, prompt_ids=list(chat.ids),
                                    sampling_params=params)
        observation, reward, done, info = env.step(
            chat.assistant(*_server_turn(out, request)))
        if done:
            return chat, prompt_len, reward, info
        delta = chat.observation(observation)
        if len(chat.ids) + len(delta) + 1 > prompt_len + budget:
            info = env.final_info(False) | {'context_full': True}
            return chat, prompt_len, env.reward_fn(info), info
        chat.extend(delta)


def _verl_agent_loop():
    """verl's agent loop over the text gym -> the class (agentrl.hf.BugFixTextAgentLoop,
    built on first use: verl is imported then). verl finds it through the file
    verl_config writes, not through a registration in this process."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

    class BugFixTextAgentLoop(AgentLoopBase):
        """One TextBugFixEnv episode through server_manager.generate: the gym of the
        row's extra_info gym fields and verl's multi_turn.max_assistant_turns, under a
        random function name when rename; response_mask is 1 on the model's tokens, 0
        on observation and template tokens."""

        max_new_tokens = 24          # a turn's token budget (extra_info may override)
        renamer = random.Random()    # verl builds a loop a sample: one stream a process

        async def run(self, sampling_params, **row):
            """sampling_params and a dataset row -> AgentLoopOutput."""
            task, gym = verl_task(row.get('extra_info'))
            cfg = gym_config(gym, self.rollout_config.multi_turn.max_assistant_turns
                             or arl.RLConfig().max_turns)
            task = arl.randomize_names(task, self.renamer) if cfg.rename else task
            per_turn = int(row['extra_info'].get('max_new_tokens', self.max_new_tokens))
            budget = self.rollout_config.response_length
            chat, prompt_len, reward, info = await verl_episode(
                self.server_manager, ChatTokenizer(self.tokenizer), make_text_env(cfg),
                task, sampling_params, per_turn, budget,
                self.rollout_config.prompt_length)
            response = slice(prompt_len, prompt_len + budget)
            return AgentLoopOutput(
                prompt_ids=chat.ids[:prompt_len], response_ids=chat.ids[response],
                response_mask=chat.flags[response],
                response_logprobs=chat.logps[response], reward_score=float(reward),
                num_turns=len(chat.messages), metrics={},
                extra_fields={'gym_info': info, 'fn_name': task.fn_name,
                              'turn_scores': [], 'tool_rewards': []})

    BugFixTextAgentLoop.__module__, BugFixTextAgentLoop.__qualname__ = (
        __name__, 'BugFixTextAgentLoop')
    return BugFixTextAgentLoop


def __getattr__(name):
    """Build the verl agent loop class on first use."""
    if name == 'BugFixTextAgentLoop':
        cls = globals()[name] = _verl_agent_loop()
        return cls
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def verl_config(cfg, model_dir, directory, prompt_length=256, response_length=192,
                gpus=1, micro_batch=4):
    """verl's own generated PPO config with chapter 14's to_verl(cfg) applied, the
    model, the data's prompt and response lengths (the rollout's follow them),
    cfg.max_turns, one GPU node of gpus GPUs with a vLLM engine of tensor parallel
    size 1 on each, micro_batch sequences a forward pass, and the agent loop as the
    default, listed in directory/agent_loops.yaml (written here), the file verl's
    AgentLoopWorker, a Ray actor in a process of its own, reads its loops from
    -> DictConfig. cfg's other environment fields (rename, max_edits, reward) travel
    in the rows (verl_rows). Reads verl's YAML, not verl."""
    import importlib.util
    from omegaconf import OmegaConf
    spec = importlib.util.find_spec('verl')
    if spec is None:
        raise ModuleNotFoundError('verl is not installed')
    config = OmegaConf.load(os.path.join(spec.submodule_search_locations[0], 'trainer',
                                         'config', '_generated_ppo_trainer.yaml'))
    overrides, absent = arl.to_verl(cfg).options, object()
    unknown = [o for o in overrides
               if OmegaConf.select(config, o.split('=')[0], default=absent) is absent]
    if unknown:
        raise ValueError(f'verl\'s config has no key for {unknown}')
    config = OmegaConf.merge(config, OmegaConf.from_dotlist(overrides))
    ref, rollout = config.actor_rollout_ref, config.actor_rollout_ref.rollout
    ref.model.path = str(model_dir)
    config.data.max_prompt_length = prompt_length
    config.data.max_response_length = response_length
    config.trainer.n_gpus_per_node, config.trainer.nnodes = gpus, 1
    rollout.name, rollout.tensor_model_parallel_size = 'vllm', 1
    rollout.calculate_log_probs = True
    rollout.multi_turn.max_assistant_turns = cfg.max_turns
    rollout.agent.default_agent_loop = VERL_AGENT_NAME
    loops = os.path.abspath(os.path.join(directory, VERL_LOOP_FILE))
    os.makedirs(directory, exist_ok=True)
    OmegaConf.save(OmegaConf.create([{'name': VERL_AGENT_NAME,
                                      '_target_': VERL_LOOP_TARGET}]), loops)
    rollout.agent.agent_loop_config_path = loops
    ref.actor.ppo_micro_batch_size_per_gpu = micro_batch
    rollout.log_prob_micro_batch_size_per_gpu = micro_batch
    ref.ref.log_prob_micro_batch_size_per_gpu = micro_batch
    return config


class OpenRLHFTextAgent:
    """One text-gym episode in OpenRLHF's agent protocol (async reset and step on state
    dicts; OpenRLHF's base class is added by openrlhf_executor): the dataset label is a
    task index in tasks, the gym make_text_env(cfg) (cfg an RLConfig; None: its
    defaults), the task renamed by renamer (a random.Random, or None) when given."""

    def __init__(self, tok, tasks, cfg=None, renamer=None):
        self.tok, self.tasks, self.renamer = tok, tasks, renamer
        self.cfg = cfg or arl.RLConfig()
        self.closing = [tok.token_text(i) for i in tok.closing_ids]
        self.env, self.text, self.messages, self.task = None, '', [], None
        self.earned = 0.0            # the episode's reward so far (see step)

    async def reset(self, states, **kwargs):
        """{'label': a task index, ...} -> {'observation': the prompt text}."""
        label = states.get('label')
        if label is None or not str(label).isdigit() or int(label) >= len(self.tasks):
            raise ValueError(f'label {label!r} is no task index; expected 0 to '
                             f'{len(self.tasks) - 1}')
        self.task = self.tasks[int(label)]
        if self.renamer is not None:
            self.task = arl.randomize_names(self.task, self.renamer)
        self.env = make_text_env(self.cfg)
        self.messages = task_prompt(self.env, self.task)
        self.text = self.tok.render(self.messages, True)
        self.earned = 0.0
        return {'observation': self.text}

    async def step(self, states, **kwargs):
        """{'action_text', ...} -> rewards, scores, environment_feedback, done and
        extra_logs (the episode's malformed calls so far: OpenRLHF keeps the last
        step's). OpenRLHF's reward is the sum of the steps' rewards, and its loop may
        stop after any step for lack of context, so each step's is the change in what
        the episode has earned: at the end the gym's reward, before it the reward of
        final_info(False) with context_full, as HFPolicy and the verl loop score an
        episode the context cut (up to rounding); scores is the earned reward."""
        content = states['action_text']
        for stop in self.closing:                # if the engine kept it in the text
            content = content[:-len(stop)] if content.endswith(stop) else content
        observation, reward, done, info = self.env.step(content)
        if not done:                   # what the episode earns if the loop stops here
            reward = self.env.reward_fn(self.env.final_info(False) |
                                        {'context_full': True})
        step_reward, self.earned = reward - self.earned, reward
        feedback = '' if done else self._feedback(content, observation)
        malformed = sum(kind is not None for kind in self.env.malformed)
        # OpenRLHF adds the rewards up as Python floats (.item()): float64 keeps them
        return {'rewards': torch.tensor(float(step_reward), dtype=torch.float64),
                'scores': torch.tensor(float(reward)),
                'environment_feedback': feedback, 'done': done,
                'sampling_params': states.get('sampling_params'),
                'extra_logs': {'malformed': float(malformed)}}

    def _feedback(self, content, observation):
        """The template's text after the content, up to the next generation prompt,
        less the template's closing token, which the model wrote (a turn cut by length
        ends OpenRLHF's loop, so a turn followed by feedback ended with its stop
        token; the engine keeps its id, not its text)."""
        self.messages = self.messages + [
            {'role': 'assistant', 'content': content},
            {'role': self.tok.observation_role, 'content': observation}]
        rendered, before = self.tok.render(self.messages, True), self.text + content
        if not rendered.startswith(before):
            raise ValueError('the chat template rewrites earlier turns; the '
                             'episode cannot be laid out turn by turn')
        delta, self.text = rendered[len(before):], rendered
        stop = next((c for c in self.closing if delta.startswith(c)), '')
        return delta[len(stop):]


def openrlhf_executor(tok, cfg=None, split='train', seed=None):
    """OpenRLHF's AgentExecutor class: a MultiTurnAgentExecutor over OpenRLHFTextAgent,
    the dataset label a task index in make_tasks(split), the gym of cfg (an RLConfig;
    None: its defaults), a random function name an episode when cfg.rename, drawn from
    seed (None: fresh entropy in each engine; a seed: every engine, each loading the
    class, draws the same sequence of names); tok a ChatTokenizer, a transformers
    tokenizer or a directory holding one -> the class."""
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor
    if isinstance(tok, (str, os.PathLike)):
        tok = _transformers().AutoTokenizer.from_pretrained(str(tok))
    tok = tok if isinstance(tok, ChatTokenizer) else ChatTokenizer(tok)
    cfg = cfg or arl.RLConfig()
    tasks, renamer = arl.make_tasks(split), random.Random(seed) if cfg.rename else None

    class BugFixTextAgent(OpenRLHFTextAgent, AgentInstanceBase):
        """OpenRLHFTextAgent as OpenRLHF instantiates it: with no arguments."""

        def __init__(self, *args, **kwargs):
            super().__init__(tok, tasks, cfg, renamer)

    class AgentExecutor(MultiTurnAgentExecutor):
        """What --train.agent_func_path's module defines (OpenRLHF instantiates it with
        no arguments)."""

        def __init__(self):
            super().__init__(BugFixTextAgent)

    return AgentExecutor


def write_openrlhf_agent_file(path, model_dir, cfg, split='train', seed=None):
    """Write the module --train.agent_func_path names, defining AgentExecutor over the
    tokenizer saved in model_dir and the gym of the run's RLConfig cfg (its max_turns
    and gym_fields, a callable reward by its import path); split and seed as in
    openrlhf_executor (with a seed every engine draws the same names) -> path."""
    with open(path, 'w') as f:
        f.write(f'"""OpenRLHF agent module for the text BugFix gym."""\n'
                f'from agentrl import hf\n\n'
                f'cfg = hf.gym_config({gym_fields(cfg)!r}, max_turns={cfg.max_turns})\n'
                f'AgentExecutor = hf.openrlhf_executor({str(model_dir)!r}, cfg, '
                f'split={split!r}, seed={seed!r})\n')
    return str(path)


def openrlhf_flags(cfg, model_dir, agent_file, data_file, gpus=1, max_len=512,
                   vllm_memory=0.5):
    """Chapter 14's to_openrlhf flags plus the model, the agent module, the prompts
    (keys 'prompt' and 'label'), the context, and gpus GPUs per node shared by the
    trainer, one vLLM engine a GPU (tensor parallel size 1; without
    --vllm.num_engines OpenRLHF starts no engine and never loads the agent) and, when
    cfg.kl_coef > 0 makes OpenRLHF build one, the reference; vLLM (vllm_memory of a
    GPU when awake) and DeepSpeed sleep while the other works -> [str]."""
    return [*arl.to_openrlhf(cfg).options, '--actor.num_gpus_per_node', str(gpus),
            '--ref.num_gpus_per_node', str(gpus), '--vllm.num_engines', str(gpus),
            '--vllm.tensor_parallel_size', '1', '--train.colocate_all',
            '--vllm.enable_sleep', '--ds.enable_sleep', '--vllm.gpu_memory_utilization',
            str(vllm_memory), '--data.max_len', str(max_len),
            '--actor.model_name_or_path', str(model_dir), '--train.agent_func_path',
            str(agent_file), '--data.prompt_dataset', str(data_file),
            '--data.input_key', 'prompt', '--data.label_key', 'label']


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The config.json numbers that size a decoder-only model (Qwen2's layout)."""
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool              # input embedding reused as the output layer

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def parameters(self):
        """Parameter count: embeddings, attention with q/k/v biases, SwiGLU MLP, two
        norms a block, the final norm and an untied output layer."""
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv \
            + self.hidden + 2 * kv
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * layer + self.hidden + head

    def matmul_parameters(self):
        """The parameters a forward pass multiplies by: all but an untied input
        embedding, which is a lookup."""
        return self.parameters() - (0 if self.tied else self.vocab * self.hidden)

    def lora_parameters(self, rank):
        """Adapter parameters of rank-r LoRA on the seven linear layers of every block
        (q, k, v, o, gate, up, down): r x (inputs + outputs) each."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        per_block = 2 * (h + h) + 2 * (h + kv) + 2 * (h + i) + (i + h)
        return rank * self.layers * per_block

    def kv_bytes_per_token(self, bytes_per_value=2):
        """Key-value cache of one token, all layers (bf16: 2 bytes a value)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value


GIB = 2 ** 30


def training_memory(shape, tokens_in_flight, adam_bytes=12, kl_reference=False):
    """GiB on one GPU for full-parameter RL in mixed precision -> dict: bf16 weights
    and gradients (2 bytes a parameter each); the optimizer's fp32 master weights and
    two moments (adam_bytes: 12 with fp32 moments, 6 with 8-bit ones); a bf16
    reference copy for a KL penalty; the sampler's KV cache for tokens_in_flight
    tokens. Activations are left out (checkpointing and micro-batch size set them)."""
    n = shape.parameters()
    parts = dict(weights=2 * n, gradients=2 * n, optimizer=adam_bytes * n,
                 reference=2 * n if kl_reference else 0,
                 kv_cache=tokens_in_flight * shape.kv_bytes_per_token())
    return {key: value / GIB for key, value in parts.items()}


def lora_memory(shape, tokens_in_flight, rank):
    """GiB on one GPU for RL with rank-r LoRA -> training_memory's dict: frozen bf16
    weights plus the adapters, whose gradients, fp32 master copy and Adam moments
    (2 + 12 bytes an adapter parameter) are all that trains; a KL reference is the same
    weights with the adapters off."""
    n, a = shape.parameters(), shape.lora_parameters(rank)
    parts = dict(weights=2 * (n + a), gradients=2 * a, optimizer=12 * a, reference=0,
                 kv_cache=tokens_in_flight * shape.kv_bytes_per_token())
    return {key: value / GIB for key, value in parts.items()}


def forward_flops(shape, context):
    """Floating-point operations of one token's forward pass when it attends to
    context tokens: 2 per multiplied weight, 4 x hidden per layer and attended token
    (scores and weighted values) -> float."""
    return 2 * shape.matmul_parameters() + 4 * shape.layers * shape.hidden * context


def step_flops(shape, tokens, context, forwards=1, updates=1):
    """Operations of one RL step over tokens (every token of every episode, prompts
    and observations too): forwards passes without gradients (sampling is one; a KL
    reference or a recomputed pi_old one more each) and updates passes with them (a
    forward and a backward, 3 forwards' worth) -> float."""
    return tokens * forward_flops(shape, context) * (forwards + 3 * updates)
