# Generated from book/05-tiny-agent.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'DTYPE',
    'MAX_CALL_TOKENS',
    'SPECIALS',
    'Tokenizer',
    'gym_words',
    'build_tokenizer',
    'Trajectory',
    'episode_tokens',
    'plot_episode_tokens',
    'Block',
    'TinyAgent',
    'count_parameters',
    'rollout_batch',
    'collate',
    'EPISODES_PER_SET',
    'BASE_KINDS',
    'demonstrations',
    'behavior_clone',
    'make_base_agent',
]


import copy
import math
import random
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import agentrl as arl


DTYPE = torch.float64     # float64 keeps recorded outputs identical across CPUs (see Chapter 1)
MAX_CALL_TOKENS = 3       # a call is at most 3 policy tokens: 'edit fix_init <end>'
SPECIALS = ('<pad>', '<unk>', '<turn>', '<end>')


class Tokenizer:
    """Word-level tokenizer: text <-> ids over a fixed vocabulary of gym words."""

    def __init__(self, words):
        self.vocab = list(SPECIALS) + sorted(set(words) - set(SPECIALS))
        self.index = {word: i for i, word in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.turn_id, self.end_id = (self.index[w] for w in SPECIALS)

    def __len__(self):
        return len(self.vocab)

    def encode(self, text):
        """'read the code' -> [ids]; unknown words map to unk_id."""
        return [self.index.get(word, self.unk_id) for word in text.split()]

    def decode(self, ids):
        """[ids] -> space-separated words."""
        return ' '.join(self.vocab[int(i)] for i in ids)


def gym_words(tasks):
    """Every word the gym can show or accept, with every function name in every role."""
    names = sorted({t.fn_name for t in tasks})
    words = set(arl.TOOLS) | set(arl.EDIT_OPS) | {'pass', 'fail', 'error', 'timeout'}
    for message in arl.MESSAGES.values():
        words |= set(message.split())
    for task in tasks:
        for name in names:
            issue = task.issue.replace(task.fn_name, name)
            source = task.source.replace(f'def {task.fn_name}(', f'def {name}(')
            words |= set(issue.split())
            for op in [None, *arl.EDIT_OPS]:   # the source before and after every single edit
                edited = source if op is None else arl.EDIT_OPS[op](source, task.public_tests)
                for op2 in arl.EDIT_OPS:
                    words |= set(arl.compact_source(arl.EDIT_OPS[op2](edited, task.public_tests)).split())
    return words


def build_tokenizer(tasks):
    """The book's tokenizer over every gym word of these tasks."""
    return Tokenizer(gym_words(tasks))


@dataclass
class Trajectory:
    """One episode as a token sequence: ids [T], action_mask [T-1] (1 where ids[t+1] is the policy's)."""
    ids: torch.Tensor
    action_mask: torch.Tensor
    reward: float
    info: dict
    sample_logp: torch.Tensor = None   # [T-1] log-prob of each policy token when it was sampled


def episode_tokens(tok, env, task, calls):
    """Token ids [T] and policy flags [T] of a scripted episode, laid out as rollout_batch lays it."""
    ids = tok.encode(env.reset(task)) + [tok.turn_id]
    policy = [0] * len(ids)
    for call in calls:
        observation, _, done, _ = env.step(call)
        ids += tok.encode(call) + [tok.end_id]
        policy += [1] * (len(tok.encode(call)) + 1)
        if done:
            break
        obs = tok.encode(observation) + [tok.turn_id]
        ids += obs
        policy += [0] * len(obs)
    return ids, policy


def plot_episode_tokens(tok, ids, policy, ax=None, per_row=16):
    """Draw token ids [T] as colored boxes: policy tokens (policy[t] == 1) orange, the rest blue."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(per_row * 0.78, 0.55 * math.ceil(len(ids) / per_row) + 0.3))
    for t, (i, p) in enumerate(zip(ids, policy)):
        row, col = divmod(t, per_row)
        word = tok.vocab[int(i)]
        color = '#f4a259' if p else ('#dddddd' if word in SPECIALS else '#a8c8e8')
        ax.add_patch(plt.Rectangle((col, -row - 0.9), 0.95, 0.8, facecolor=color, edgecolor='white'))
        ax.text(col + 0.475, -row - 0.5, word, ha='center', va='center', fontsize=7 if len(word) < 10 else 5.5,
                fontweight='bold' if p else 'normal')
    ax.set_xlim(0, per_row)
    ax.set_ylim(-math.ceil(len(ids) / per_row), 0)
    ax.axis('off')
    return ax


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, with an optional KV cache."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x, attn_mask=None, cache=None):
        """x [B, W, D] -> [B, W, D]; cache: dict with past 'k', 'v' [B, H, S, D/H], extended in place."""
        B, W, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, W, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            if 'k' in cache:
                k, v = torch.cat([cache['k'], k], 2), torch.cat([cache['v'], v], 2)
            cache['k'], cache['v'] = k, v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None)
        x = x + self.proj(y.transpose(1, 2).reshape(B, W, D))
        return x + self.mlp(self.ln2(x))


class TinyAgent(nn.Module):
    """A small decoder-only transformer over gym words: ids [B, T] -> logits [B, T, V]."""

    def __init__(self, vocab_size, d_model=64, n_layers=2, n_heads=4, d_ff=352, max_len=256, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.max_len = max_len
        self.embed, self.pos = nn.Embedding(vocab_size, d_model), nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size)
        self.to(DTYPE)

    def forward(self, ids, positions=None, attn_mask=None, caches=None):
        """ids [B, W] -> logits [B, W, V]; positions/attn_mask/caches only for cached generation."""
        if positions is None:
            positions = torch.arange(ids.shape[1]).expand_as(ids)
        if int(positions.max()) >= self.max_len:
            raise ValueError(f'sequence position {int(positions.max())} exceeds max_len {self.max_len}')
        x = self.embed(ids) + self.pos(positions)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask, None if caches is None else caches[i])
        return self.head(self.ln_f(x))


def count_parameters(model):
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class _Lockstep:
    """Cached decoding for a batch of rows whose token sequences grow by different amounts."""

    def __init__(self, model, batch_size):
        self.model, self.B = model, batch_size
        self.caches = [{} for _ in model.blocks]
        self.key_valid = torch.zeros(batch_size, 0, dtype=torch.bool)   # [B, S] real tokens in the cache
        self.length = torch.zeros(batch_size, dtype=torch.long)         # real tokens fed per row

    def feed(self, chunks):
        """Append per-row token lists (may be empty) -> logits [B, V] after each row's last new token."""
        W = max(len(c) for c in chunks)
        ids = torch.zeros(self.B, W, dtype=torch.long)
        valid = torch.zeros(self.B, W, dtype=torch.bool)
        for b, chunk in enumerate(chunks):
            ids[b, :len(chunk)], valid[b, :len(chunk)] = torch.tensor(chunk, dtype=torch.long), True
        positions = (self.length[:, None] + valid.long().cumsum(1) - 1).clamp(min=0)
        keys = torch.cat([self.key_valid, valid], 1)                            # [B, S + W]
        causal = torch.ones(W, W, dtype=torch.bool).tril()
        new = torch.cat([torch.ones(W, self.key_valid.shape[1], dtype=torch.bool), causal], 1)  # [W, S + W]
        attn_mask = (new[None] & keys[:, None, :])[:, None]                     # [B, 1, W, S + W]
        with torch.no_grad():
            logits = self.model(ids, positions, attn_mask, self.caches)         # [B, W, V]
        self.key_valid = keys
        last = (valid.sum(1) - 1).clamp(min=0)
        self.length += valid.sum(1)
        return logits[torch.arange(self.B), last]


def rollout_batch(model, envs, tasks, tok, max_turns=6, temperature=1.0, generator=None):
    """Play one episode per (env, task) in lockstep, sampling calls from model -> [Trajectory]."""
    if len(envs) != len(tasks):
        raise ValueError(f'got {len(envs)} envs for {len(tasks)} tasks; need one env per task')
    if temperature <= 0:
        raise ValueError(f'temperature must be positive, got {temperature}')
    B = len(envs)
    tokens = [tok.encode(env.reset(task)) + [tok.turn_id] for env, task in zip(envs, tasks)]
    policy = [[0] * len(t) for t in tokens]                      # 1 marks the policy's tokens
    logps = [[0.0] * len(t) for t in tokens]                     # sampling log-prob of policy tokens
    results = [None] * B
    decoder = _Lockstep(model, B)
    logits = decoder.feed(tokens)
    for _ in range(max_turns):
        active = [b for b in range(B) if results[b] is None]
        if not active:
            break
        calls = {b: [] for b in active}
        writing = set(active)
        for k in range(MAX_CALL_TOKENS):
            log_probs = torch.log_softmax(logits / temperature, -1)
            sampled = torch.multinomial(log_probs.exp(), 1, generator=generator)[:, 0]
            chosen = log_probs.gather(1, sampled[:, None])[:, 0].tolist()
            sampled = sampled.tolist()
            for b in list(writing):
                calls[b].append(sampled[b])
                logps[b].append(chosen[b])
                if sampled[b] == tok.end_id:
                    writing.discard(b)
            if not writing or k == MAX_CALL_TOKENS - 1:
                break
            logits = decoder.feed([[calls[b][-1]] if b in writing else [] for b in range(B)])
        # every row's last call token is not yet in the cache: feed it with the observation
        chunks = [[] for _ in range(B)]
        for b in active:
            call = calls[b]
            tokens[b] += call
            policy[b] += [1] * len(call)
            text = tok.decode([i for i in call if i != tok.end_id])
            observation, reward, done, info = envs[b].step(text)
            if done:
                results[b] = (reward, info)
                continue
            obs = tok.encode(observation) + [tok.turn_id]
            chunks[b] = call[-1:] + obs
            tokens[b] += obs
            policy[b] += [0] * len(obs)
            logps[b] += [0.0] * len(obs)
        if any(chunks):
            logits = decoder.feed(chunks)
    trajs = []
    for b in range(B):
        ids = torch.tensor(tokens[b], dtype=torch.long)
        mask = torch.tensor(policy[b][1:], dtype=DTYPE)
        reward, info = results[b] if results[b] is not None else (0.0, envs[b].final_info(False))
        trajs.append(Trajectory(ids, mask, reward, info, torch.tensor(logps[b][1:], dtype=DTYPE)))
    return trajs


def collate(trajs, pad_id):
    """Right-pad trajectories -> {'ids' [B, T], 'action_mask' [B, T-1], 'rewards' [B]}."""
    if not trajs:
        raise ValueError('collate needs at least one trajectory')
    T = max(len(t.ids) for t in trajs)
    ids = torch.full((len(trajs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(trajs), T - 1, dtype=DTYPE)
    for b, t in enumerate(trajs):
        ids[b, :len(t.ids)] = t.ids
        mask[b, :len(t.action_mask)] = t.action_mask
    rewards = torch.tensor([float(t.reward) for t in trajs], dtype=DTYPE)
    return dict(ids=ids, action_mask=mask, rewards=rewards)


EPISODES_PER_SET = 4          # one demonstration set: 4 scripted episodes of one kind per training task
BASE_KINDS = ('random', 'blind') * 4
_BASE_CACHE = {}


def demonstrations(tok, kinds, seed=0):
    """Scripted episodes on the training tasks -> {(ids, policy flags): count}, deduplicated."""
    env, demos = arl.BugFixEnv(), {}
    for set_index, kind in enumerate(kinds):
        rng = random.Random(f'{seed}/{set_index}/{kind}')
        for task in arl.make_tasks('train'):
            for _ in range(EPISODES_PER_SET):
                ids, policy = episode_tokens(tok, env, task, arl.scripted_calls(task, kind, rng))
                key = (tuple(ids), tuple(policy))
                demos[key] = demos.get(key, 0) + 1
    return demos


def behavior_clone(model, demos, epochs=6, batch_size=8, lr=2e-3, seed=0):
    """Fit model to demonstrations by weighted cross-entropy on policy tokens only -> model."""
    rows = sorted(demos.items(), key=lambda row: (len(row[0][0]), row[0]))   # similar lengths batch together
    batches = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    tokens_per_batch = sum(float(w.sum()) for w in (_demo_batch(b)[1] for b in batches)) / len(batches)
    for _ in range(epochs):
        for i in torch.randperm(len(batches), generator=gen).tolist():
            ids, weight = _demo_batch(batches[i])
            logits = model(ids)[:, :-1]
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction='none')
            loss = (nll * weight.reshape(-1)).sum() / tokens_per_batch   # counts keep their weight
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def _demo_batch(rows):
    """[((ids, policy flags), count)] -> ids [B, T] and per-target weights [B, T-1]."""
    T = max(len(seq) for (seq, _), _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    weight = torch.zeros(len(rows), T - 1, dtype=DTYPE)
    for b, ((seq, policy), count) in enumerate(rows):
        ids[b, :len(seq)] = torch.tensor(seq)
        weight[b, :len(seq) - 1] = torch.tensor(policy[1:], dtype=DTYPE) * count
    return ids, weight


def make_base_agent(tok, seed=0, kinds=BASE_KINDS):
    """TinyAgent behavior-cloned on scripted play of the given kinds; cached per arguments."""
    for kind in kinds:
        if kind not in arl.PLAYERS:
            raise ValueError(f'unknown demonstration kind {kind!r}; expected one of {arl.PLAYERS}')
    key = (tuple(tok.vocab), seed, tuple(kinds))
    if key not in _BASE_CACHE:
        model = TinyAgent(len(tok), seed=seed)
        _BASE_CACHE[key] = behavior_clone(model, demonstrations(tok, kinds, seed), seed=seed).eval()
    return copy.deepcopy(_BASE_CACHE[key])
