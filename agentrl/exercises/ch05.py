"""Checks for chapter 5's exercises."""
import torch
import agentrl as arl
from agentrl.agent import DTYPE, MAX_CALL_TOKENS, Trajectory


# ----------------------------------------------------------------------------- 5.1 (derive)

def derive_check_5_1():
    """Six reads of the longest source: 234 tokens, <= max_len = 256."""
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    env = arl.BugFixEnv()
    longest = max(len(arl.episode_tokens(tok, env, t, ['read'] * 6)[0])
                  for t in arl.make_tasks('all'))
    src = max(len(tok.encode(arl.compact_source(t.source))) for t in arl.make_tasks('all'))
    issue = len(tok.encode(arl.make_tasks('all')[0].issue))
    assert (longest, src, issue) == (234, 42, 6), (longest, src, issue)
    assert longest == issue + 1 + 5 * (2 + src + 1) + 2 <= arl.TinyAgent(len(tok)).max_len


# ----------------------------------------------------------------------------- 5.3 (implement)

def solution_5_3(model, envs, tasks, tok, max_turns=6, temperature=1.0, generator=None):
    """rollout_batch without a key-value cache: every new token is sampled from a full
    forward pass over the right-padded prefixes of the rows still writing."""
    B = len(envs)
    tokens = [tok.encode(env.reset(task)) + [tok.turn_id]
              for env, task in zip(envs, tasks)]
    policy = [[0] * len(t) for t in tokens]
    logps = [[0.0] * len(t) for t in tokens]
    results = [None] * B

    def next_logits(rows, calls):
        seqs = [tokens[b] + calls[b] for b in rows]
        ids = torch.full((len(rows), max(map(len, seqs))), tok.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
        with torch.no_grad():
            out = model(ids)                                           # [rows, T, V]
        last = torch.tensor([len(s) - 1 for s in seqs])
        return out[torch.arange(len(rows)), last]                      # [rows, V]

    for _ in range(max_turns):
        active = [b for b in range(B) if results[b] is None]
        if not active:
            break
        calls = {b: [] for b in active}
        writing = active
        for k in range(MAX_CALL_TOKENS):
            log_probs = torch.log_softmax(next_logits(writing, calls) / temperature, -1)
            sampled = torch.multinomial(log_probs.exp(), 1, generator=generator)
            chosen = log_probs.gather(1, sampled)[:, 0].tolist()
            for b, token, logp in zip(writing, sampled[:, 0].tolist(), chosen):
                calls[b].append(token)
                logps[b].append(logp)
            writing = [b for b in writing if calls[b][-1] != tok.end_id]
            if not writing:
                break
        for b in active:
            call = calls[b]
            tokens[b] += call
            policy[b] += [1] * len(call)
            text = tok.decode([i for i in call if i != tok.end_id])
            observation, reward, done, info = envs[b].step(text)
            obs = tok.encode(observation) + [tok.turn_id]
            if not done and len(tokens[b]) + len(obs) + MAX_CALL_TOKENS > model.max_len:
                info = envs[b].final_info(False) | {'context_full': True}
                done, reward = True, envs[b].reward_fn(info)
            if done:
                results[b] = (reward, info)
                continue
            tokens[b] += obs
            policy[b] += [0] * len(obs)
            logps[b] += [0.0] * len(obs)
    trajs = []
    for b in range(B):
        reward, info = (results[b] if results[b] is not None
                        else (0.0, envs[b].final_info(False)))
        trajs.append(Trajectory(torch.tensor(tokens[b], dtype=torch.long),
                                torch.tensor(policy[b][1:], dtype=DTYPE), reward, info,
                                torch.tensor(logps[b][1:], dtype=DTYPE)))
    return trajs


def wrong_5_3_last_padded_position(model, envs, tasks, tok, max_turns=6, temperature=1.0,
                                   generator=None):
    """Takes every row's logits at the last position of the padded batch: a shorter row
    then samples after its padding."""
    return _variant(model, envs, tasks, tok, max_turns, temperature, generator)


def wrong_5_3_no_temperature(model, envs, tasks, tok, max_turns=6, temperature=1.0,
                             generator=None):
    """Forgets to divide the logits by the temperature."""
    return solution_5_3(model, envs, tasks, tok, max_turns, 1.0, generator)


def _variant(model, envs, tasks, tok, max_turns, temperature, generator):
    """solution_5_3 with the logits read at the last padded position."""
    original = model.forward

    def forward(ids):
        out = original(ids)
        return out[:, -1:].expand_as(out)       # every position sees the last padded one
    model.forward = forward
    try:
        return solution_5_3(model, envs, tasks, tok, max_turns, temperature, generator)
    finally:
        del model.forward


def _test_model(tok):
    """An untrained TinyAgent whose head favours call words, so its episodes read, test,
    edit and submit at random, with calls of different lengths (ragged rows)."""
    model = arl.TinyAgent(len(tok), seed=3)
    with torch.no_grad():
        for word, bias in (('read', 4.0), ('test', 3.0), ('edit', 3.5), ('submit', 2.0),
                           ('<end>', 4.0), ('swap_minmax', 3.0), ('fix_init', 3.0),
                           ('fix_index', 3.0)):
            model.head.bias[tok.index[word]] += bias
    return model.eval()


def check_5_3(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                   # tiny tensors: one thread is fastest
    try:
        _check_5_3(fn)
    finally:
        torch.set_num_threads(threads)


def _check_5_3(fn):
    tok = arl.build_tokenizer(arl.make_tasks('all'))
    model = _test_model(tok)
    tasks = arl.make_tasks('all')[::6]                          # 5 tasks, one per family
    for seed, temperature, max_turns in ((0, 1.0, 4), (1, 0.7, 3)):
        want = arl.rollout_batch(model, [arl.BugFixEnv() for _ in tasks], tasks, tok,
                                 max_turns, temperature, torch.Generator().manual_seed(seed))
        got = fn(model, [arl.BugFixEnv() for _ in tasks], tasks, tok, max_turns, temperature,
                 torch.Generator().manual_seed(seed))
        assert len(got) == len(want), f'expected {len(want)} trajectories, got {len(got)}'
        for i, (a, b) in enumerate(zip(want, got)):
            if not torch.equal(a.ids, b.ids):
                n = min(len(a.ids), len(b.ids))
                k = next((j for j in range(n) if a.ids[j] != b.ids[j]), n)
                raise AssertionError(
                    f'episode {i} ({tasks[i].name}, seed {seed}, temperature {temperature}): '
                    f'the tokens differ from rollout_batch\'s from position {k} on '
                    f'(cached: {tok.decode(a.ids[k:k + 4].tolist())!r}, yours: '
                    f'{tok.decode(b.ids[k:k + 4].tolist())!r})')
            assert torch.equal(a.action_mask, b.action_mask), f'episode {i}: action masks differ'
            gap = ((a.sample_logp - b.sample_logp) * a.action_mask).abs().max().item()
            assert gap < 1e-12, (f'episode {i}: sampling log-probabilities differ from the cached '
                                 f'ones by {gap:.1e} (the chapter\'s bound is 1e-12)')
            assert a.reward == b.reward, f'episode {i}: rewards differ'


CHECKS = [dict(number='5.3', name='rollout_batch_uncached', solution=solution_5_3,
               check=check_5_3, wrong=[wrong_5_3_last_padded_position, wrong_5_3_no_temperature],
               summary='rollout_batch recomputing the padded prefixes at every token; same tokens')]
