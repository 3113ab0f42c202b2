# Generated from book/13-tools-and-observations.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'DIGITS',
    'CUT_MARK',
    'DETAIL_WORDS',
    'SHOWN',
    'tool_tokenizer',
    'shorten',
    'evidence_positions',
    'evidence_kept',
    'KEYWORD_FIX',
    'keyword_fix',
    'value_words',
    'returned_value',
    'test_report',
    'ON_MALFORMED',
    'MALFORMED_PENALTY',
    'USAGE',
    'is_malformed',
    'ToolEnv',
    'malformed_push',
    'MalformedLog',
    'observation_clock',
    'forgotten',
    'ForgetfulAgent',
    'with_memory',
]


import difflib

import torch
import agentrl as arl


DIGITS = tuple('0123456789')
CUT_MARK = '...'
# the words of test reports and the cut mark, beyond the gym's own
DETAIL_WORDS = ('input', 'expected', 'got', '-', CUT_MARK) + DIGITS
SHOWN = ('head', 'ends', 'tail')


def tool_tokenizer():
    """Chapter 5's tokenizer over every task's gym words, plus DETAIL_WORDS."""
    return arl.Tokenizer(arl.gym_words(arl.make_tasks('all')) | set(DETAIL_WORDS))


def shorten(text, limit, shown='ends', mark=True):
    """At most `limit` words of text (its head, its tail or both ends: shown), plus
    CUT_MARK where words were cut if mark: limit + 1 words then."""
    if shown not in SHOWN:
        raise ValueError(f'unknown shown {shown!r}; expected one of {SHOWN}')
    if limit < 1:
        raise ValueError(f'limit must be at least 1 word, got {limit!r}')
    words = text.split()
    if len(words) <= limit:
        return ' '.join(words)
    head = {'head': limit, 'tail': 0, 'ends': (limit + 1) // 2}[shown]
    tail = words[len(words) - (limit - head):] if limit > head else []
    return ' '.join(words[:head] + [CUT_MARK] * bool(mark) + tail)


def evidence_positions(task):
    """Word positions in the task's compact source that its fix op changes (for an
    insertion, the word before it) -> sorted [int]."""
    buggy = arl.compact_source(task.source).split()
    fixed = arl.compact_source(arl.EDIT_OPS[task.fix_op](task.source,
                                                         task.public_tests)).split()
    spots = set()
    for kind, i1, i2, _, _ in difflib.SequenceMatcher(a=buggy, b=fixed,
                                                      autojunk=False).get_opcodes():
        if kind != 'equal':
            spots |= set(range(i1, i2)) if i2 > i1 else {i1 - 1}
    return sorted(spots)


def evidence_kept(task, limit, shown):
    """Whether shorten(read, limit, shown) still shows every word the fix changes."""
    n = len(arl.compact_source(task.source).split())
    kept = shorten(' '.join(map(str, range(n))), limit, shown).split()
    return set(evidence_positions(task)) <= {int(w) for w in kept if w != CUT_MARK}


# one word of each family's code (never a function name) and the fix it calls for
KEYWORD_FIX = {'max': 'swap_minmax', 'total': 'fix_range_end',
               'count': 'fix_comparison', 'result': 'fix_init', 'item': 'fix_index'}


def keyword_fix(text):
    """The fix op that the KEYWORD_FIX words of text name, or None if they name none or
    several."""
    named = {KEYWORD_FIX[word] for word in text.split() if word in KEYWORD_FIX}
    return named.pop() if len(named) == 1 else None


def value_words(value):
    """A test value as words: -12 -> '- 1 2', (1, 2) -> '( 1 , 2 )'."""
    if isinstance(value, bool) or not isinstance(value, (int, tuple)):
        raise ValueError(f'cannot spell {value!r}; expected an int or a tuple of them')
    if isinstance(value, tuple):
        return ' '.join(['(', ' , '.join(map(value_words, value)), ')'])
    digits = ' '.join(str(abs(value)))
    return f'- {digits}' if value < 0 else digits


def returned_value(source, fn_name, args):
    """What fn_name in source returns on args; only for a case run_tests reported as
    'fail' (it ran within the gym's limits)."""
    namespace = {'__builtins__': dict(arl.SAFE_BUILTINS)}
    exec(source, namespace)
    return namespace[fn_name](*args)


def test_report(source, task):
    """The public tests' verdicts, then the first failing case's input, expected and
    returned value -> words."""
    results = arl.run_tests(source, task.public_tests, task.fn_name)
    verdicts = ' '.join(message for _, message in results)
    failing = next((i for i, (ok, _) in enumerate(results) if not ok), None)
    if failing is None:
        return verdicts
    (args, expected), message = task.public_tests[failing], results[failing][1]
    got = (value_words(returned_value(source, task.fn_name, args))
           if message == 'fail' else message)
    return (f"{verdicts} input {' , '.join(map(value_words, args))} "
            f"expected {value_words(expected)} got {got}")


ON_MALFORMED = ('terse', 'explain', 'silent', 'end')
MALFORMED_PENALTY = -0.1
# the calls the explained answer lists; 'op' stands for one of the EDIT_OPS
USAGE = ('read', 'test', 'edit', 'op', 'submit')


def is_malformed(action):
    """Whether an action as the gym logs it ('read', 'edit fix_init', 'invalid', ...) is
    a call the gym could not carry out."""
    return action == 'invalid' or (action.startswith('edit ')
                                   and action.split()[1] not in arl.EDIT_OPS)


class ToolEnv(arl.EditBudgetEnv):
    """EditBudgetEnv with its interface as arguments: read shortened to read_limit
    words (cut marked if mark_cut), test reports, and the answer to a malformed call."""

    def __init__(self, max_turns=6, reward='hidden', max_edits=1, read_limit=None,
                 shown='ends', test_detail=False, on_malformed='terse', mark_cut=True):
        super().__init__(max_turns, reward, max_edits)
        if on_malformed not in ON_MALFORMED:
            raise ValueError(f'unknown on_malformed {on_malformed!r}; '
                             f'expected one of {ON_MALFORMED}')
        if shown not in SHOWN:
            raise ValueError(f'unknown shown {shown!r}; expected one of {SHOWN}')
        if read_limit is not None and read_limit < 1:
            raise ValueError(f'read_limit must be None or at least 1, '
                             f'got {read_limit!r}')
        self.read_limit, self.shown, self.test_detail = read_limit, shown, test_detail
        self.on_malformed, self.mark_cut = on_malformed, mark_cut

    def step(self, text):
        """BugFixEnv.step; with on_malformed='end' a malformed call ends the episode
        with reward MALFORMED_PENALTY."""
        observation, reward, done, info = super().step(text)
        if self.on_malformed != 'end' or not is_malformed(self.actions[-1]):
            return observation, reward, done, info
        if not done:
            self.done, info = True, self.final_info(False)
        return '', MALFORMED_PENALTY, True, info | {'malformed_end': True}

    def _observe(self, call):
        observation = super()._observe(call)
        if call == ('read',) and self.read_limit is not None:
            return shorten(observation, self.read_limit, self.shown, self.mark_cut)
        if call == ('test',) and self.test_detail:
            return test_report(self.source, self.task)
        if is_malformed(self.actions[-1]):
            return self._answer_malformed(observation)
        return observation

    def _answer_malformed(self, terse):
        """The gym's terse message, the calls or ops it accepts, or nothing."""
        if self.on_malformed == 'silent':
            return ''
        if self.on_malformed == 'explain':
            accepted = (arl.EDIT_OPS if terse == arl.MESSAGES['unknown_op']
                        else USAGE)
            return f"{terse} : {' '.join(accepted)}"
        return terse


def malformed_push(advantages, malformed, passed, group_size):
    """How one step's advantages weigh its malformed calls: advantages, malformed
    (calls per episode), passed (bool) [B], groups of group_size -> dict of floats."""
    if advantages.dim() != 1 or not advantages.shape == malformed.shape == passed.shape:
        raise ValueError(f'need one advantage, count and verdict per episode [B]; got '
                         f'{tuple(advantages.shape)}, {tuple(malformed.shape)}, '
                         f'{tuple(passed.shape)}')
    if group_size < 1 or len(advantages) % group_size:
        raise ValueError(f'group_size {group_size!r} does not divide the '
                         f'{len(advantages)} episodes into groups')
    passless = ~passed.view(-1, group_size).any(-1).repeat_interleave(group_size)
    weighted, episodes = advantages * malformed, len(advantages)
    return dict(any_malformed=float((malformed > 0).sum()) / episodes,
                malformed_push=float(weighted.sum()) / episodes,
                push_passless=float(weighted[passless].sum()) / episodes,
                malformed_passless=float(malformed[passless].sum()
                                         / malformed.sum().clamp(min=1)))


class MalformedLog(arl.Objective):
    """Chapter 9's objective, unchanged, whose records also hold malformed_push's
    statistics for the step."""

    def advantages(self, batch, episodes, cfg):
        advantages = super().advantages(batch, episodes, cfg)
        rows = [arl.episode_behavior(t) for t in episodes]
        batch['malformed_log'] = malformed_push(
            advantages, torch.tensor([float(r['malformed']) for r in rows]),
            torch.tensor([r['pass_rate'] == 1.0 for r in rows]), cfg.group_size)
        return advantages

    def loss(self, logp, batch, rows, advantages, cfg):
        loss, stats = super().loss(logp, batch, rows, advantages, cfg)
        return loss, stats | batch['malformed_log']


def observation_clock(ids, turn_id, end_id):
    """Which tokens belong to an observation, and how many observations have begun by
    each token, in rollout_batch's layout: ids [R, L] -> bool [R, L], long [R, L]."""
    position = torch.arange(ids.shape[-1]).expand_as(ids)

    def latest_before(marker):
        """Where the latest `marker` token strictly before each token is (-1: none)."""
        latest = torch.where(ids == marker, position, -1).cummax(-1).values
        return torch.cat([torch.full_like(latest[..., :1], -1), latest[..., :-1]], -1)

    opened = latest_before(turn_id)              # the <turn> that began this call
    # a call: at most MAX_CALL_TOKENS tokens after a <turn>, up to its own <end>
    call = ((position - opened <= arl.MAX_CALL_TOKENS)
            & (latest_before(end_id) <= opened))
    observed = (opened >= 0) & ~call
    begins = observed & ~torch.cat([torch.zeros_like(observed[..., :1]),
                                    observed[..., :-1]], -1)
    return observed, begins.long().cumsum(-1)


def forgotten(ids, keep, turn_id, end_id, query_pos=None):
    """Which keys each query may not see: observations that began keep or more
    observations before it. ids [R, L] -> bool [R, Q, L], queries every position or
    query_pos [R, Q]."""
    observed, count = observation_clock(ids, turn_id, end_id)
    query_count = count if query_pos is None else count.gather(1, query_pos)
    age = query_count[:, :, None] - count[:, None, :]
    return observed[:, None, :] & (age >= keep)


class ForgetfulAgent(arl.TinyAgent):
    """TinyAgent whose tokens see the issue, every call, and only the observations of
    the last `keep` turns."""

    def __init__(self, vocab_size, keep=1, turn_id=arl.SPECIALS.index('<turn>'),
                 end_id=arl.SPECIALS.index('<end>'), **sizes):
        super().__init__(vocab_size, **sizes)
        if keep < 1:
            raise ValueError(f'keep must be at least 1 observation, got {keep!r}')
        self.keep, self.turn_id, self.end_id = keep, turn_id, end_id

    def attention_biases(self, ids, buckets):
        """The causal mask plus forgotten(), one [rows, 1, T, T] bias per bucket."""
        biases, start = [], 0
        for rows, T in buckets:
            hidden = forgotten(ids[start:start + rows * T].view(rows, T), self.keep,
                               self.turn_id, self.end_id)
            future = torch.ones(T, T, dtype=torch.bool).triu(1)
            bias = torch.zeros(hidden.shape, dtype=self.head.weight.dtype)
            biases.append(bias.masked_fill_(hidden | future, float('-inf'))[:, None])
            start += rows * T
        return biases

    def decoder(self, batch_size):
        """_ForgetfulLockstep: cached sampling under the same mask."""
        return _ForgetfulLockstep(self, batch_size)


class _ForgetfulLockstep(arl.agent._Lockstep):
    """The cached decoder of a ForgetfulAgent: keeps each row's tokens and hides the
    observations that have scrolled out."""

    def __init__(self, model, batch_size):
        super().__init__(model, batch_size)
        self.history = torch.zeros(batch_size, model.max_len, dtype=torch.long)

    def _layout(self, rows, chunks):
        new = super()._layout(rows, chunks)
        for b in rows:
            start = self.lengths[b]
            self.history[b, start:start + len(chunks[b])] = torch.tensor(chunks[b])
        model = self.model
        hidden = forgotten(self.history[new.line_rows, :new.span], model.keep,
                           model.turn_id, model.end_id, new.query_pos)
        new.bias = new.bias.masked_fill(hidden[:, None], float('-inf'))
        return new


def with_memory(model, keep, tok):
    """A ForgetfulAgent with model's weights that keeps `keep` observations."""
    block = model.blocks[0]
    forgetful = ForgetfulAgent(model.embed.num_embeddings, keep, tok.turn_id,
                               tok.end_id, d_model=model.embed.embedding_dim,
                               n_layers=len(model.blocks), n_heads=block.n_heads,
                               d_ff=block.mlp[0].out_features, max_len=model.max_len)
    forgetful.load_state_dict(model.state_dict())
    return forgetful.train(model.training)
