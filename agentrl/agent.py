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
    'LONG_CHUNK',
    'collate',
    'packed_log_probs',
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


# float64 keeps untrained outputs identical across CPU kinds (see Chapter 1)
DTYPE = torch.float64
MAX_CALL_TOKENS = 3       # a call is at most 3 policy tokens: 'edit fix_init <end>'
SPECIALS = ('<pad>', '<unk>', '<turn>', '<end>')


class Tokenizer:
    """Word-level tokenizer: text <-> ids over a fixed vocabulary of gym words."""

    def __init__(self, words):
        self.vocab = list(SPECIALS) + sorted(set(words) - set(SPECIALS))
        self.index = {word: i for i, word in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.turn_id, self.end_id = (
            self.index[w] for w in SPECIALS)

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
            # the source before and after every single edit
            for op in [None, *arl.EDIT_OPS]:
                edited = (source if op is None
                          else arl.EDIT_OPS[op](source, task.public_tests))
                for op2 in arl.EDIT_OPS:
                    words |= set(arl.compact_source(
                        arl.EDIT_OPS[op2](edited, task.public_tests)).split())
    return words


def build_tokenizer(tasks):
    """The book's tokenizer over every gym word of these tasks."""
    return Tokenizer(gym_words(tasks))


@dataclass
class Trajectory:
    """One episode as a token sequence: ids [T], action_mask [T-1]
    (1 where ids[t+1] is the policy's)."""
    ids: torch.Tensor
    action_mask: torch.Tensor
    reward: float
    info: dict
    # [T-1] log-prob of each policy token when it was sampled
    sample_logp: torch.Tensor = None


def episode_tokens(tok, env, task, calls):
    """Token ids [T] and policy flags [T] of a scripted episode,
    laid out as rollout_batch lays it."""
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
    """Draw token ids [T] as colored boxes: policy tokens (policy[t] == 1) orange,
    the rest blue."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(
            figsize=(per_row * 0.78, 0.55 * math.ceil(len(ids) / per_row) + 0.3))
    for t, (i, p) in enumerate(zip(ids, policy)):
        row, col = divmod(t, per_row)
        word = tok.vocab[int(i)]
        color = '#f4a259' if p else ('#dddddd' if word in SPECIALS else '#a8c8e8')
        ax.add_patch(plt.Rectangle((col, -row - 0.9), 0.95, 0.8,
                                   facecolor=color, edgecolor='white'))
        ax.text(col + 0.475, -row - 0.5, word, ha='center', va='center',
                fontsize=7 if len(word) < 10 else 5.5,
                fontweight='bold' if p else 'normal')
    ax.set_xlim(0, per_row)
    ax.set_ylim(-math.ceil(len(ids) / per_row), 0)
    ax.axis('off')
    return ax


def _attention(q, k, v, bias):
    """softmax(q k^T / sqrt(d) + bias) v: q [G, H, W, d], k and v [G, H, S, d],
    bias [..., W, S] -> [G, H, W, d]."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + bias
    return torch.matmul(torch.softmax(scores, -1), v)


_CAUSAL_BIAS = {}


def _causal_bias(T, dtype):
    """[T, T] additive mask: 0 where the key's position is at most the query's,
    -inf after it."""
    if (T, dtype) not in _CAUSAL_BIAS:
        _CAUSAL_BIAS[T, dtype] = torch.full((T, T), float('-inf'), dtype=dtype).triu(1)
    return _CAUSAL_BIAS[T, dtype]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = (nn.Linear(d_model, 3 * d_model),
                               nn.Linear(d_model, d_model))
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x):
        """x [B, T, D] -> [B, T, D], each position attending to itself
        and the positions before it."""
        B, T, D = x.shape
        return self.packed(x.reshape(B * T, D), [(B, T)]).view(B, T, D)

    def packed(self, x, buckets, biases=None):
        """Rows laid end to end, x [N, D], in buckets [(rows, T)] of rows
        of T positions each -> [N, D]; biases: one [rows, 1, T, T] per bucket,
        None = causal."""
        N, D = x.shape
        qkv, start, attended = self.qkv(self.ln1(x)), 0, []
        # the linear layers see all N tokens; attention one bucket at a time
        for i, (rows, T) in enumerate(buckets):
            q, k, v = qkv[start:start + rows * T].view(
                rows, T, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
            bias = _causal_bias(T, x.dtype) if biases is None else biases[i]
            # [rows, H, T, D/H]
            y = _attention(q, k, v, bias)
            attended.append(y.transpose(1, 2).reshape(rows * T, D))
            start += rows * T
        return self._finish(x, torch.cat(attended))

    def _finish(self, x, attended):
        """Residual connections around the attention output and the MLP:
        [..., D] -> [..., D]."""
        x = x + self.proj(attended)
        return x + self.mlp(self.ln2(x))


class TinyAgent(nn.Module):
    """A small decoder-only transformer over gym words:
    ids [B, T] -> logits [B, T, V]."""

    def __init__(self, vocab_size, d_model=64, n_layers=2, n_heads=4, d_ff=352,
                 max_len=256, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.max_len = max_len
        self.embed, self.pos = (nn.Embedding(vocab_size, d_model),
                                nn.Embedding(max_len, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff)
                                    for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size)
        self.to(DTYPE)

    def forward(self, ids):
        """ids [B, T] -> logits [B, T, V]."""
        B, T = ids.shape
        return self.head(self.ln_f(self.hidden(ids.reshape(B * T), [(B, T)]))).view(
            B, T, -1)

    def hidden(self, ids, buckets):
        """Rows laid end to end, ids [N], in buckets [(rows, T)] -> the last block's
        output [N, D] (before ln_f)."""
        longest = max(T for _, T in buckets)
        if longest > self.max_len:
            raise ValueError(
                f'sequence length {longest} exceeds max_len {self.max_len}')
        x = self.embed(ids) + self.pos(torch.cat(
            [torch.arange(T).repeat(rows) for rows, T in buckets]))
        biases = self.attention_biases(ids, buckets)
        for block in self.blocks:
            x = block.packed(x, buckets, biases)
        return x

    def attention_biases(self, ids, buckets):
        """What each token may attend to, per bucket: None = itself and every earlier
        token of its row (a subclass may hide some)."""
        return None

    def decoder(self, batch_size):
        """The cached decoder rollout_batch samples with: _Lockstep."""
        return _Lockstep(self, batch_size)

    def rollout(self, envs, tasks, tok, max_turns=6, temperature=1.0, generator=None):
        """How this policy plays a batch of episodes, as Chapter 9's sample_groups asks:
        rollout_batch -> [Trajectory]."""
        return rollout_batch(self, envs, tasks, tok, max_turns, temperature, generator)


def count_parameters(model):
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def rollout_batch(model, envs, tasks, tok, max_turns=6, temperature=1.0,
                  generator=None):
    """Play one episode per (env, task) in lockstep, sampling calls from model
    -> [Trajectory]."""
    if len(envs) != len(tasks):
        raise ValueError(f'got {len(envs)} envs for {len(tasks)} tasks; '
                         'need one env per task')
    if temperature <= 0:
        raise ValueError(f'temperature must be positive, got {temperature}')
    B = len(envs)
    tokens = [tok.encode(env.reset(task)) + [tok.turn_id]
              for env, task in zip(envs, tasks)]
    # 1 marks the policy's tokens
    policy = [[0] * len(t) for t in tokens]
    # sampling log-prob of policy tokens
    logps = [[0.0] * len(t) for t in tokens]
    results = [None] * B
    decoder = model.decoder(B)
    logits = decoder.feed(dict(enumerate(tokens)))
    for _ in range(max_turns):
        active = [b for b in range(B) if results[b] is None]
        if not active:
            break
        calls = {b: [] for b in active}
        writing = active
        for k in range(MAX_CALL_TOKENS):
            # [rows writing, V]
            log_probs = torch.log_softmax(logits[writing] / temperature, -1)
            sampled = torch.multinomial(log_probs.exp(), 1, generator=generator)
            chosen = log_probs.gather(1, sampled)[:, 0].tolist()
            for b, token, logp in zip(writing, sampled[:, 0].tolist(), chosen):
                calls[b].append(token)
                logps[b].append(logp)
            writing = [b for b in writing if calls[b][-1] != tok.end_id]
            if not writing or k == MAX_CALL_TOKENS - 1:
                break
            logits = decoder.feed({b: calls[b][-1:] for b in writing})
        # every row's last call token is not yet in the cache:
        # feed it with the observation
        chunks = {}
        for b in active:
            call = calls[b]
            tokens[b] += call
            policy[b] += [1] * len(call)
            text = tok.decode([i for i in call if i != tok.end_id])
            observation, reward, done, info = envs[b].step(text)
            obs = tok.encode(observation) + [tok.turn_id]
            if not done and len(tokens[b]) + len(obs) + MAX_CALL_TOKENS > model.max_len:
                # no room for the answer and one more call: the context is full
                info = envs[b].final_info(False) | {'context_full': True}
                done, reward = True, envs[b].reward_fn(info)
            if done:
                results[b] = (reward, info)
                continue
            chunks[b] = call[-1:] + obs
            tokens[b] += obs
            policy[b] += [0] * len(obs)
            logps[b] += [0.0] * len(obs)
        logits = decoder.feed(chunks)
    trajs = []
    for b in range(B):
        ids = torch.tensor(tokens[b], dtype=torch.long)
        mask = torch.tensor(policy[b][1:], dtype=DTYPE)
        reward, info = (results[b] if results[b] is not None
                        else (0.0, envs[b].final_info(False)))
        trajs.append(Trajectory(ids, mask, reward, info,
                                torch.tensor(logps[b][1:], dtype=DTYPE)))
    return trajs


# a feed runs chunks longer than this apart from the short ones
LONG_CHUNK = 8


class _Lockstep:
    """Cached decoding of a batch of rows whose token sequences grow
    by different amounts."""

    def __init__(self, model, batch_size):
        self.model, self.B = model, batch_size
        heads, (vocab, width) = model.blocks[0].n_heads, model.head.weight.shape
        dtype = model.head.weight.dtype
        # slot p of row b holds position p
        slots = (batch_size, heads, model.max_len, width // heads)
        # per block [B, H, slots, D/H]
        self.keys = [torch.empty(slots, dtype=dtype) for _ in model.blocks]
        self.values = [torch.empty(slots, dtype=dtype) for _ in model.blocks]
        # slots [0, ready) hold keys and values, or zeros
        self.ready = 0
        self.lengths = [0] * batch_size            # tokens fed so far per row
        self.logits = torch.zeros(batch_size, vocab, dtype=dtype)

    @property
    def length(self):
        """Tokens fed so far per row: long [B]."""
        return torch.tensor(self.lengths)

    def feed(self, chunks):
        """Append new tokens {row: [ids]} -> logits [B, V] after each row's
        latest token."""
        long = {b: chunk for b, chunk in chunks.items() if len(chunk) > LONG_CHUNK}
        # feed long chunks apart: short ones need no padding to them
        if long and len(long) < len(chunks):
            self.feed(long)
            chunks = {b: chunk for b, chunk in chunks.items() if b not in long}
        rows = sorted(b for b, chunk in chunks.items() if chunk)
        if not rows:
            return self.logits
        new = self._layout(rows, chunks)
        if new.span > self.model.max_len:
            raise ValueError(f'sequence position {new.span - 1} exceeds max_len '
                             f'{self.model.max_len}')
        # slots attention reads for the first time: zeros, not garbage
        for cache in self.keys + self.values:
            cache[:, :, self.ready:new.span].zero_()
        self.ready = max(self.ready, new.span)
        ids = torch.tensor([i for b in rows for i in chunks[b]])
        with torch.no_grad():
            x = self.model.embed(ids) + self.model.pos(new.pos)                 # [N, D]
            for block, keys, values in zip(self.model.blocks, self.keys, self.values):
                x = self._block(block, x, keys, values, new)
            self.logits[new.rows] = self.model.head(self.model.ln_f(x[new.last]))
        for b in rows:
            self.lengths[b] += len(chunks[b])
        return self.logits

    def _layout(self, rows, chunks):
        """Where the fed rows' tokens go and what they attend to: _NewTokens
        (a subclass may hide more)."""
        return _NewTokens(rows, [len(chunks[b]) for b in rows],
                          [self.lengths[b] for b in rows], self.B, self.logits.dtype)

    @staticmethod
    def _block(block, x, keys, values, new):
        """One block on the new tokens x [N, D] only; their keys and values
        join the cache."""
        N, D = x.shape
        heads = block.n_heads
        # [N, H, D/H] each
        q, k, v = block.qkv(block.ln1(x)).view(N, 3, heads, D // heads).unbind(1)
        keys[new.row, :, new.pos], values[new.row, :, new.pos] = k, v
        queries = x.new_zeros(new.lines * new.width, heads, D // heads)
        # the grid [G * W, H, D/H]
        queries[new.slot] = q
        # [G, H, S, D/H]
        past_k, past_v = (keys[new.attend, :, :new.span],
                          values[new.attend, :, :new.span])
        y = _attention(queries.view(new.lines, new.width, heads, -1).transpose(1, 2),
                       past_k, past_v, new.bias)
        return block._finish(x, y.transpose(1, 2).reshape(-1, D)[new.slot])


class _NewTokens:
    """Where the N new tokens of a feed go: rows [R] of the batch get sizes [R]
    tokens after their lengths [R].

    Attention runs on a grid of G lines of W = the longest chunk queries: one line
    per fed row if they are few (their cache rows are copied out), else one per row
    of the batch (a view of the cache; rows without new tokens get empty queries)."""

    def __init__(self, rows, sizes, lengths, batch_size, dtype):
        self.width = W = max(sizes)
        few = 2 * len(rows) <= batch_size
        self.lines = len(rows) if few else batch_size
        row, pos, slot, last = [], [], [], []
        # position of every query in the grid; 0 if empty
        query_pos = [0] * (self.lines * W)
        for line, b, n, start in zip(range(len(rows)) if few else rows, rows, sizes,
                                     lengths):
            row += [b] * n
            pos += range(start, start + n)
            slot += range(line * W, line * W + n)
            query_pos[line * W:line * W + n] = range(start, start + n)
            last.append(len(row) - 1)
        self.rows, self.row, self.pos, self.slot, self.last = map(
            torch.tensor, (rows, row, pos, slot, last))
        # [G]: the batch row of each line; [G, W]: each query's position
        self.line_rows = self.rows if few else torch.arange(batch_size)
        self.query_pos = torch.tensor(query_pos).view(self.lines, W)
        # cache slots in use
        self.span = max(pos) + 1
        self.attend = self.rows if few else slice(None)
        # [G, 1, W, S]
        hidden = torch.arange(self.span) > self.query_pos.view(self.lines, 1, W, 1)
        self.bias = torch.zeros(hidden.shape, dtype=dtype).masked_fill_(
            hidden, float('-inf'))


def collate(trajs, pad_id):
    """Right-pad trajectories -> ids [B, T], action_mask and sample_logp [B, T-1],
    rewards and lengths [B]."""
    if not trajs:
        raise ValueError('collate needs at least one trajectory')
    T = max(len(t.ids) for t in trajs)
    ids = torch.full((len(trajs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(trajs), T - 1, dtype=DTYPE)
    # 0 where not sampled (or not recorded)
    sample_logp = torch.zeros(len(trajs), T - 1, dtype=DTYPE)
    for b, t in enumerate(trajs):
        ids[b, :len(t.ids)] = t.ids
        mask[b, :len(t.action_mask)] = t.action_mask
        if t.sample_logp is not None:
            sample_logp[b, :len(t.sample_logp)] = t.sample_logp
    rewards = torch.tensor([float(t.reward) for t in trajs], dtype=DTYPE)
    lengths = torch.tensor([len(t.ids) for t in trajs])
    return dict(ids=ids, action_mask=mask, sample_logp=sample_logp, rewards=rewards,
                lengths=lengths)


def packed_log_probs(model, ids, lengths, temperature=1.0, rows_per_pass=4,
                     entropy_grad=False):
    """Log-prob of each next token at a temperature, and the entropy: ids [B, T],
    lengths [B] -> [B, T-1] x 2.

    The model's layers run once over the rows' tokens laid end to end, with no padding
    beyond each bucket of rows_per_pass rows of similar length (attention runs per
    bucket, cut to its longest row); both outputs are 0 past a row's own length. The
    entropy carries a gradient only with entropy_grad (an entropy bonus needs one)."""
    layout = _Buckets(lengths.tolist(), ids.shape[1], rows_per_pass)
    flat = ids.reshape(-1)
    # [K, D]: tokens with a next one
    hidden = model.hidden(flat[layout.tokens], layout.buckets)[layout.inside]
    # [K, V]
    logp = torch.log_softmax(model.head(model.ln_f(hidden)) / temperature, -1)
    where, out, known = ((layout.row, layout.col),
                         logp.new_zeros(ids.shape[0], ids.shape[1] - 1),
                         logp if entropy_grad else logp.detach())
    entropy = out.index_put(where, -(known.exp() * known).sum(-1))
    return (out.index_put(where, logp.gather(1, flat[layout.target, None])[:, 0]),
            entropy)


class _Buckets:
    """Rows of lengths [B] (of a [B, T] batch) sorted by length into buckets of
    `rows` rows, each cut to its longest row."""

    def __init__(self, lengths, T, rows):
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        self.buckets, tokens, inside, row, col = [], [], [], [], []
        for group in (order[i:i + rows] for i in range(0, len(order), rows)):
            width = lengths[group[-1]]
            for b in group:
                inside += range(len(tokens), len(tokens) + lengths[b] - 1)
                row += [b] * (lengths[b] - 1)
                col += range(lengths[b] - 1)
                tokens += range(b * T, b * T + width)
            self.buckets.append((len(group), width))
        index = lambda values: torch.tensor(values, dtype=torch.long)
        # [M] into [B * T]; [K] (may be 0) into [M]
        self.tokens, self.inside = index(tokens), index(inside)
        # [K]: the logit's place in [B, T-1]
        self.row, self.col = index(row), index(col)
        # [K]: the next token, into [B * T]
        self.target = self.row * T + self.col + 1


# one demonstration set: 4 scripted episodes of one kind per training task
EPISODES_PER_SET = 4
BASE_KINDS = ('random', 'blind') * 4
_BASE_CACHE = {}


def demonstrations(tok, kinds, seed=0):
    """Scripted episodes on the training tasks -> {(ids, policy flags): count},
    deduplicated."""
    env, demos = arl.BugFixEnv(), {}
    for set_index, kind in enumerate(kinds):
        rng = random.Random(f'{seed}/{set_index}/{kind}')
        for task in arl.make_tasks('train'):
            for _ in range(EPISODES_PER_SET):
                ids, policy = episode_tokens(tok, env, task,
                                             arl.scripted_calls(task, kind, rng))
                key = (tuple(ids), tuple(policy))
                demos[key] = demos.get(key, 0) + 1
    return demos


def behavior_clone(model, demos, epochs=6, batch_size=8, lr=2e-3, seed=0):
    """Fit model to demonstrations by weighted cross-entropy on policy tokens only
    -> model."""
    # similar lengths batch together
    rows = sorted(demos.items(), key=lambda row: (len(row[0][0]), row[0]))
    batches = [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]
    gen = torch.Generator().manual_seed(seed)
    # one fused kernel per tensor
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    tokens_per_batch = sum(float(w.sum())
                           for w in (_demo_batch(b)[1] for b in batches)) / len(batches)
    for _ in range(epochs):
        for i in torch.randperm(len(batches), generator=gen).tolist():
            ids, weight = _demo_batch(batches[i])
            logits = model(ids)[:, :-1]
            nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                  ids[:, 1:].reshape(-1), reduction='none')
            # counts keep their weight
            loss = (nll * weight.reshape(-1)).sum() / tokens_per_batch
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
    """TinyAgent behavior-cloned on scripted play of the given kinds;
    cached per arguments."""
    for kind in kinds:
        if kind not in arl.PLAYERS:
            raise ValueError(f'unknown demonstration kind {kind!r}; '
                             f'expected one of {arl.PLAYERS}')
    key = (tuple(tok.vocab), seed, tuple(kinds))
    if key not in _BASE_CACHE:
        model = TinyAgent(len(tok), seed=seed)
        _BASE_CACHE[key] = behavior_clone(model, demonstrations(tok, kinds, seed),
                                          seed=seed).eval()
    return copy.deepcopy(_BASE_CACHE[key])
