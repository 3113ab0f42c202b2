"""Trained policies kept on disk: ``save_policy`` / ``load_policy``, and the base agents cached so
that a short run does not rebuild one.

A policy file (``policy.pt``) holds the TinyAgent's state dict, the constructor arguments that
rebuild it, the tokenizer's vocabulary and, when given, the RLConfig it was trained with; it is
read with ``torch.load(weights_only=True)`` (no pickled code runs) and written whole or not at
all. A loaded policy has the saved weights bit for bit, so it samples exactly what the saved one
did from the same generator.

This module is hand-written (not tangled from a chapter).
"""
import dataclasses
import hashlib
import io
import os
from pathlib import Path

import torch

import agentrl as arl
from agentrl import runs

FORMAT = 'agentrl-policy/1'


def policy_spec(model):
    """The TinyAgent constructor arguments that rebuild model's shape -> dict."""
    if type(model) is not arl.TinyAgent:
        raise TypeError(f'save_policy keeps a TinyAgent, got {type(model).__name__}')
    return agent_shape(model)


def agent_shape(model):
    """The TinyAgent constructor arguments of model's shape (a TinyAgent or a subclass)
    -> dict."""
    block = model.blocks[0]
    return dict(vocab_size=model.embed.num_embeddings, d_model=model.embed.embedding_dim,
                n_layers=len(model.blocks), n_heads=block.n_heads,
                d_ff=block.mlp[0].out_features, max_len=model.max_len)


def policy_bytes(model, tok, cfg=None):
    """model, its tokenizer and (optionally) its RLConfig as the bytes of a policy file."""
    spec = policy_spec(model)
    if len(tok) != model.embed.num_embeddings:
        raise ValueError(f'the tokenizer has {len(tok)} words, the model '
                         f'{model.embed.num_embeddings} embeddings')
    record = dict(format=FORMAT, agentrl=arl.__version__, spec=spec,
                  state_dict={k: v.detach().clone() for k, v in model.state_dict().items()},
                  vocab=list(tok.vocab),
                  config=None if cfg is None else dataclasses.asdict(cfg))
    if record['config'] is not None:
        record['config'] = runs._plain(record['config'])
    buffer = io.BytesIO()
    torch.save(record, buffer)
    return buffer.getvalue()


def save_policy(path, model, tok, cfg=None):
    """Write model, tok and cfg to path (a policy file), whole or not at all -> path."""
    runs.write_atomic(path, policy_bytes(model, tok, cfg))
    return Path(path)


def load_policy(path, reward=None):
    """A policy file -> (TinyAgent in eval mode, Tokenizer, RLConfig or None); reward: the
    callable to put back when the policy was trained with one (a file keeps only its name)."""
    try:
        record = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else 'empty or cut short'
        raise ValueError(f'{str(path)!r} is not a policy file (torch.load: '
                         f'{type(error).__name__}: {reason[:120]})') from None
    if not isinstance(record, dict) or record.get('format') != FORMAT:
        raise ValueError(f'{str(path)!r} is not a policy file of format {FORMAT!r}')
    model = arl.TinyAgent(**record['spec'])
    model.load_state_dict(record['state_dict'])
    tok = arl.Tokenizer(record['vocab'])
    if tok.vocab != record['vocab']:
        raise ValueError(f'{str(path)!r}: its vocabulary does not rebuild in order')
    cfg = None
    if record['config'] is not None:
        fields = {f.name for f in dataclasses.fields(arl.RLConfig)}
        saved = {k: v for k, v in record['config'].items() if k in fields}
        if reward is not None:
            saved['reward'] = reward
        elif saved.get('reward') not in arl.REWARDS:
            raise ValueError(f"{str(path)!r} was trained with the reward function "
                             f"{saved.get('reward')!r}; pass it as load_policy(path, "
                             f"reward=...)")
        cfg = arl.RLConfig(**saved)
    return model.eval(), tok, cfg


def cache_dir():
    """Where base agents are cached: $AGENTRL_CACHE, else ~/.cache/agentrl."""
    return Path(os.environ.get('AGENTRL_CACHE') or Path.home() / '.cache' / 'agentrl')


def _code_key():
    """A digest of the library's own code and torch's version: any change makes new keys."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted(Path(arl.__file__).parent.glob('*.py')):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def base_agent(tok, seed=0, base='rl', say=print):
    """make_rl_base (base 'rl') or make_base_agent (base 'default') for tok and seed, from
    the disk cache when it holds one made by this code, else built and cached."""
    build = {'rl': arl.make_rl_base, 'default': arl.make_base_agent}
    if base not in build:
        raise ValueError(f"base must be one of {sorted(build)}, got {base!r}")
    vocab = hashlib.sha256('\n'.join(tok.vocab).encode()).hexdigest()[:8]
    path = cache_dir() / f'base-{base}-seed{seed}-{vocab}-{_code_key()}.pt'
    if path.is_file():
        try:
            model, cached_tok, _ = load_policy(path)
            if cached_tok.vocab == tok.vocab:
                say(f'base agent ({base}, seed {seed}): from the cache')
                return model
        except ValueError:
            pass                                     # unreadable: build it again
    say(f'base agent ({base}, seed {seed}): behaviour cloning, once (then cached)')
    model = build[base](tok, seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_policy(path, model, tok)
    except OSError as error:
        say(f'  (not cached: {error})')
    return model
