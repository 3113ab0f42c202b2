# Generated from book/03-language-models-as-policies.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'temperature_probs',
    'sample_next_token',
    'generate_tokens',
    'sequence_log_prob',
]


import torch


def temperature_probs(logits, temperature=1.0):
    """Softmax of logits / temperature over the last dim: [..., V] -> [..., V].

    Temperature 0 gives the one-hot argmax.
    """
    if temperature < 0:
        raise ValueError("temperature must be >= 0 (0 means greedy), "
                         f"got {temperature!r}")
    if temperature == 0:
        one_hot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1])
        return one_hot.to(logits.dtype)
    return torch.softmax(logits / temperature, dim=-1)


def sample_next_token(logits, temperature=1.0, generator=None):
    """Sample one token id per row of logits [..., V] at a temperature -> long [...].

    Temperature 0 is greedy (the argmax).
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError("logits must have a last dimension of vocabulary size >= 1, "
                         f"got shape {tuple(logits.shape)}")
    if temperature < 0:
        raise ValueError("temperature must be >= 0 (0 means greedy), "
                         f"got {temperature!r}")
    if temperature == 0:
        return logits.argmax(-1)
    probs = temperature_probs(logits, temperature).reshape(-1, logits.shape[-1])
    return torch.multinomial(probs, 1, generator=generator).reshape(logits.shape[:-1])


def generate_tokens(model, prompt_ids, max_new_tokens, temperature=1.0, generator=None,
                    stop_ids=()):
    """Sample continuations of prompts [B, T0] (or one prompt [T0]) from model.

    model(ids [B, T]) -> logits [B, T, V]. Returns a list of B lists of new token ids; a
    row ends after its first token in stop_ids.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens!r}")
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError("prompt_ids must be [T0] or [B, T0] with T0 >= 1, "
                         f"got shape {tuple(ids.shape)}")
    stop = torch.tensor(sorted(stop_ids), dtype=torch.long)
    new = [[] for _ in range(len(ids))]
    running = torch.ones(len(ids), dtype=torch.bool)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if not running.any():
                break
            token = sample_next_token(model(ids)[:, -1], temperature, generator)   # [B]
            for b in running.nonzero().flatten().tolist():
                new[b].append(int(token[b]))
            running &= ~torch.isin(token, stop)
            ids = torch.cat([ids, token[:, None]], dim=1)
    return new


def sequence_log_prob(logits, targets, mask=None):
    """Sum of log p(targets[b, t]) where mask is 1.

    logits [B, T, V], targets [B, T], mask [B, T] or None -> [B].
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"need logits [B, T, V] and targets [B, T], "
                         f"got {tuple(logits.shape)} and {tuple(targets.shape)}")
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)      # [B, T]
    if mask is None:
        return token_logp.sum(-1)
    if mask.shape != targets.shape:
        raise ValueError(f"mask must have the shape of targets {tuple(targets.shape)}, "
                         f"got {tuple(mask.shape)}")
    return (token_logp * mask.to(token_logp.dtype)).sum(-1)
