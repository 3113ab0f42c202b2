"""Read the logs of real trainers (TRL, verl, OpenRLHF) as chapter 19's run histories.

    python -m agentrl.diagnose out/trainer_state.json           # TRL
    python -m agentrl.diagnose metrics.jsonl --trainer verl     # verl's file logger
    python -m agentrl.diagnose history.csv                      # a wandb export

A reader turns a trainer's log into the book's history format (a list of per-step dicts
with the keys of `train_rl`'s records), through one mapping table per trainer that maps
a metric only where its meaning is the book key's. The checks of `agentrl.debugging`
(chapter 19) then run on the keys the log holds; `runnable_checks` says which cannot run
and what they lack. The metric names follow the trainer releases the book pins
(`arl.TRAINER_VERSIONS`: TRL 1.16.0, verl 0.8.0, OpenRLHF 0.11.2).

A trainer logs one record per logging interval, not per optimizer step: a check's
"steps" are then logged records (TRL's `logging_steps`). This module is hand-written
(not tangled from a chapter).
"""
import argparse
import ast
import csv
import json
import math
import re
import sys
import textwrap
from pathlib import Path

TRAINERS = ('trl', 'verl', 'openrlhf')
FORMATS = ('trainer_state.json (TRL)', '.json (a list of records)', '.jsonl', '.csv',
           '.log or .txt (verl or OpenRLHF console output)')

# trainer metric -> book key, only where the meaning is the book's; when two metrics map
# to one key, the first the record holds wins. What is close but not the same is said.
TRL_KEYS = {
    # share of completion tokens whose clip binds (low: ratio < 1 - epsilon with A < 0,
    # high: ratio > 1 + epsilon_high with A > 0): the book's clip fractions exactly
    'clip_ratio/region_mean': 'clip_frac',
    'clip_ratio/high_mean': 'clip_high_frac',
    'clip_ratio/low_mean': 'clip_low_frac',
    'grad_norm': 'grad_norm',               # transformers: the logging step's last norm
    'entropy': 'entropy',
    'reward': 'reward',                     # mean of the summed reward functions
    # share of completions in groups with equal rewards = share of such groups (groups
    # have one size); with scale_rewards='batch' it is whether the whole batch is equal
    'frac_reward_zero_std': 'zero_adv_frac',
    # KL to the reference model (k3, logged only when beta > 0): never approx_kl, the
    # step size old -> new. TRL logs no approx KL of its own.
    'kl': 'kl_ref',
}
# not mapped: completions/mean_length (with tools it counts their output tokens too; the
# book's length counts the policy's tokens only).
VERL_KEYS = {
    # share of response tokens whose clip binds, without the dual-clip bound (that is
    # actor/pg_clipfrac_lower, which is NOT the book's clip_low_frac)
    'actor/pg_clipfrac': 'clip_frac',
    # mean of log pi_old - log pi (k1) over response tokens: the same KL old -> new as
    # the book's approx_kl, by another estimator (k3 in the book, never negative)
    'actor/ppo_kl': 'approx_kl',
    'actor/grad_norm': 'grad_norm',
    # entropy of pi_old on the batch, before the update (the book's: during the update)
    'actor/entropy': 'entropy',
    'critic/score/mean': 'reward',          # before a KL penalty (critic/rewards/mean)
    'actor/kl_loss': 'kl_ref',              # KL to the reference, in the loss
    'actor/reward_kl_penalty': 'kl_ref',    # KL to the reference, in the reward
}
# not mapped: response_length/mean (multi-turn responses hold tool output tokens),
# num_turns/mean (counts messages: 2 for one turn), val-core/* (held-out, per source).
OPENRLHF_KEYS = {
    'ppo_clip_ratio': 'clip_frac',          # share of action tokens whose clip binds
    # mean of log pi_old - log pi (k1): the book's approx_kl by another estimator
    'ppo_kl': 'approx_kl',
    'actor_grad_norm': 'grad_norm',         # the update's last optimizer step's norm
    'reward': 'reward',                     # after length penalties, as the book's
    'kl': 'kl_ref',                         # KL to the reference (reward or loss)
}
# not mapped: entropy_loss (scaled like the loss by the step's token count, not a mean
# per token), response_length (see verl), dynamic_filtering_pass_rate (the share of
# prompts dynamic filtering kept, in percent: not the book's pass_rate).
KEYS = {'trl': TRL_KEYS, 'verl': VERL_KEYS, 'openrlhf': OPENRLHF_KEYS}
# metrics only one trainer logs: they tell which trainer wrote a log
MARKERS = {
    'trl': {'clip_ratio/region_mean', 'frac_reward_zero_std', 'reward_std',
            'completions/mean_length', 'num_tokens'},
    'verl': {'actor/pg_clipfrac', 'actor/ppo_kl', 'actor/grad_norm',
             'critic/score/mean', 'training/global_step', 'response_length/mean'},
    'openrlhf': {'ppo_clip_ratio', 'ppo_kl', 'actor_grad_norm', 'actor_lr',
                 'rollout/reward_mean'},
}
STEP_KEYS = ('step', 'global_step', 'training/global_step', '_step', 'Step')
# TRL samples once every steps_per_generation optimizer steps and logs the rewards only
# then; the steps in between train on slices of that generation and carry its values
CARRIED = {'trl': ('reward', 'zero_adv_frac')}

# the record keys each check of debugging.CHECKS reads (see its source), the config
# fields it needs, and the keys it reads on every record rather than where present
CHECK_KEYS = {
    'check_non_finite': (),                 # reads every key a record holds
    'check_mask_mismatch': ('mask_mismatch',),
    'check_logp_gap': ('start_logp_gap',),
    'check_loss_tokens': ('loss_token_ratio',),
    'check_clip_inert': ('approx_kl', 'ratio_min', 'ratio_max'),
    'check_no_gradient': ('zero_adv_frac', 'grad_norm'),
    'check_large_steps': ('approx_kl',),
    'check_clipping': ('clip_frac',),
    'check_pass_fell': ('pass_rate',),
    'check_collapse': ('zero_adv_frac', 'pass_rate'),
    'check_turn_limit': ('turns',),
    'check_malformed': ('malformed',),
}
CHECK_CONFIG = {'check_clip_inert': ('epochs', 'minibatches'),
                'check_turn_limit': ('max_turns',)}
EVERY_STEP = ('pass_rate', 'zero_adv_frac', 'turns', 'malformed')

VERL_CONSOLE = re.compile(r'\bstep:(\d+) - (.*)$')
OPENRLHF_CONSOLE = re.compile(r'Global step (\d+): (\{.*\})\s*$')
NUMPY_REPR = re.compile(r'^np\.\w+\((.*)\)$')          # pprint of a numpy scalar


def _number(value, finite=True):
    """value as a float, or None for text, booleans and None, and for NaN and
    infinities unless finite is False (a metric's NaN is kept for diagnose to report;
    a step's is no step)."""
    if isinstance(value, str):
        match = NUMPY_REPR.match(value.strip())
        try:
            value = float(match.group(1) if match else value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) or not finite else None


def _flat(record):
    """One raw record with verl's file-logger nesting undone and 'train/' stripped."""
    if set(record) == {'step', 'data'} and isinstance(record['data'], dict):
        record = dict(record['data'], step=record['step'])
    return {key.removeprefix('train/'): value for key, value in record.items()}


def _read_json(path):
    """The records of a TRL trainer_state.json or of a JSON list -> (records, 'trl' or
    None)."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get('log_history'), list):
        return data['log_history'], 'trl'
    if isinstance(data, list):
        return data, None
    raise ValueError(f'{path} is neither a trainer_state.json (a dict with '
                     f'log_history) nor a list of records: got a JSON '
                     f'{type(data).__name__}')


def _read_jsonl(path):
    """The records of a JSON-lines file (blank lines skipped)."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f'{path}:{number} is not JSON: {error}') from None
    return records


def _read_csv(path):
    """The rows of a CSV file with a header line, a column per metric (as a wandb
    history export has them)."""
    with path.open(newline='') as handle:
        return list(csv.DictReader(handle))


def _read_console(path):
    """The records in verl's 'step:N - key:value' or OpenRLHF's 'Global step N: {...}'
    console lines; other lines are skipped."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if found := VERL_CONSOLE.search(line):
            pairs = (item.rpartition(':') for item in found.group(2).split(' - '))
            records.append(dict({k: v for k, _, v in pairs}, step=found.group(1)))
        elif found := OPENRLHF_CONSOLE.search(line):
            # NaN and infinities as strings, which _number reads back as floats
            text = re.sub(r"(-?\b(?:nan|inf)\b)", r"'\1'", found.group(2))
            try:
                records.append(dict(ast.literal_eval(text), step=found.group(1)))
            except (ValueError, SyntaxError):
                raise ValueError(f'{path}:{number}: cannot read the dict after '
                                 f"'Global step'") from None
    return records


def read_records(path):
    """The raw records of a log file, in file order -> (records, trainer the format
    implies or None)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f'{path}: no such file')
    if path.suffix not in READERS:
        raise ValueError(f'{path}: cannot read a {path.suffix or "suffix-less"} file; '
                         f'accepted: {", ".join(FORMATS)}')
    try:
        found = READERS[path.suffix](path)
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f'{path}: cannot read it: {error}') from None
    except json.JSONDecodeError as error:
        raise ValueError(f'{path} is not valid JSON: {error}') from None
    records, trainer = found if isinstance(found, tuple) else (found, None)
    if not records:
        raise ValueError(f'{path} holds no log records')
    if not all(isinstance(r, dict) for r in records):
        raise ValueError(f'{path}: every record must be a JSON object of metrics')
    return [_flat(r) for r in records], trainer


READERS = {'.json': _read_json, '.jsonl': _read_jsonl, '.csv': _read_csv,
           '.log': _read_console, '.txt': _read_console}


def detect_trainer(records):
    """The trainer whose own metric names the records hold most of, or None on a tie."""
    seen = set().union(*records)
    counts = {name: len(MARKERS[name] & seen) for name in TRAINERS}
    best = max(counts.values())
    winners = [name for name, count in counts.items() if count == best]
    return winners[0] if best and len(winners) == 1 else None


def to_history(records, trainer):
    """Raw records -> the book's history: per step one dict of the book's keys, records
    of one step merged, steps in order, CARRIED keys carried forward; records without
    a mapped metric dropped."""
    table, merged = KEYS[trainer], {}
    for i, record in enumerate(records):
        mapped = {}
        for name, key in table.items():
            # a JSON null on a logged metric is a NaN or inf that the writer could not
            # spell (verl's file logger writes with orjson, which nulls them)
            value = (math.nan if name in record and record[name] is None
                     else _number(record.get(name), finite=False))
            if value is not None and key not in mapped:
                mapped[key] = value
        if not mapped:
            continue                    # an eval, summary or timing-only record
        step = next((s for k in STEP_KEYS if (s := _number(record.get(k))) is not None),
                    None)
        if step is None:
            raise ValueError(f'record {i} has metrics but no step (looked for '
                             f'{", ".join(STEP_KEYS)})')
        merged.setdefault(int(step), {}).update(mapped)
    history = [dict(step=step, **merged[step]) for step in sorted(merged)]
    for before, record in zip(history, history[1:]):
        for key in CARRIED.get(trainer, ()):
            if key in before and key not in record:
                record[key] = before[key]
    return history


def read_trainer_log(path, trainer=None):
    """A trainer's log -> (trainer, history); trainer None: told by format or keys."""
    if trainer is not None and trainer not in TRAINERS:
        raise ValueError(f'unknown trainer {trainer!r}; accepted: '
                         f'{", ".join(TRAINERS)}')
    records, implied = read_records(path)
    if trainer and implied and trainer != implied:
        raise ValueError(f'{path} is a {implied} log, not a {trainer} log')
    trainer = trainer or implied or detect_trainer(records)
    if trainer is None:
        raise ValueError(f'{path}: cannot tell which trainer wrote it; pass --trainer '
                         f'({", ".join(TRAINERS)})')
    history = to_history(records, trainer)
    if not history:
        seen = sorted(set().union(*records))
        raise ValueError(f'{path} holds none of the {trainer} metrics read here '
                         f'({", ".join(KEYS[trainer])}); its keys: '
                         f'{", ".join(seen[:8])}{" ..." if len(seen) > 8 else ""}')
    return trainer, history


def load_trainer_log(path, trainer=None):
    """A trainer's log (trainer_state.json, .jsonl, .csv, console .log) -> the book's
    history; trainer ('trl', 'verl', 'openrlhf') None: told by the format or keys."""
    return read_trainer_log(path, trainer)[1]


def _missing(history, name, cfg):
    """What the check called name lacks in history and cfg -> [description]."""
    if name not in CHECK_KEYS:
        return [f'its keys (trainer_logs.CHECK_KEYS does not list {name})']
    lacking = []
    for key in CHECK_KEYS[name]:
        count = sum(key in record for record in history)
        if count == 0:
            lacking.append(key)
        elif key in EVERY_STEP and count < len(history):
            lacking.append(f'{key} (on {count} of {len(history)} steps)')
    fields = [f for f in CHECK_CONFIG.get(name, ()) if f not in (cfg or {})]
    if fields:
        lacking.append(f"the run's config ({', '.join(fields)})")
    return lacking


def runnable_checks(history, cfg=None):
    """The checks of debugging.CHECKS the history's keys (and cfg, a dict) allow ->
    (checks, {name of each other check: [what it lacks]})."""
    from agentrl import debugging
    runnable, skipped = [], {}
    for check in debugging.CHECKS:
        lacking = _missing(history, check.__name__, cfg)
        if lacking:
            skipped[check.__name__] = lacking
        else:
            runnable.append(check)
    return runnable, skipped


def diagnose_history(history, cfg=None):
    """The runnable checks' findings on history -> ([Finding], {skipped: lacks})."""
    runnable, skipped = runnable_checks(history, cfg)
    findings = [found for check in runnable if (found := check(list(history), cfg))]
    return findings, skipped


def report_skipped(skipped, total, out=None, width=88):
    """Print how many checks ran and, per skipped check, what it lacks."""
    out = sys.stdout if out is None else out
    print(f'diagnose: ran {total - len(skipped)} of {total} checks; skipped '
          f'{len(skipped)} for want of:', file=out)
    for name, lacking in skipped.items():
        print(textwrap.fill(f'{name}: {", ".join(lacking)}', width,
                            initial_indent='    ', subsequent_indent='        '),
              file=out)


def _log_path(path):
    """The trainer log a command-line path names, or None for a run folder."""
    if path.is_dir():
        state = path / 'trainer_state.json'      # a TRL output or checkpoint folder
        run = (path / 'history.json').exists()
        return state if state.is_file() and not run else None
    return path if path.is_file() or path.suffix in READERS else None


def diagnose_path(name, trainer=None, ratio_level='token'):
    """Print the findings on a run folder or a trainer's log -> True when there are
    some; a ValueError when it is neither or no check can run. ratio_level tells a
    log's checks whether the run's ratio was per token or per sequence (GSPO)."""
    from agentrl import debugging
    path = _log_path(Path(name))
    if path is None:
        findings = debugging.diagnose_run(name)
        print(f'{name}:')
        debugging.report(findings)
        return bool(findings)
    trainer, history = read_trainer_log(path, trainer)
    findings, skipped = diagnose_history(history, {'ratio_level': ratio_level})
    if ratio_level == 'sequence' and 'check_clipping' not in skipped:
        skipped['check_clipping'] = ['a token-level ratio (--ratio-level sequence)']
    if len(skipped) == len(debugging.CHECKS) - 1:     # only the finiteness check ran
        lacks = '; '.join(f'{check}: {", ".join(v)}' for check, v in skipped.items())
        raise ValueError(f'{path}: no check can run on this {trainer} log ({lacks})')
    print(f'{path} ({trainer} log, {len(history)} steps):')
    debugging.report(findings)
    report_skipped(skipped, len(debugging.CHECKS))
    return bool(findings)


def diagnose_main(argv=None):
    """python -m agentrl.diagnose PATH ... [--trainer NAME]: print the findings on each
    run folder or trainer log -> exit status 0 (none), 1 (some) or 2 (unreadable)."""
    parser = argparse.ArgumentParser(
        prog='python -m agentrl.diagnose',
        description='Read finished runs (folders written by python -m agentrl.train) '
                    'or the logs of TRL, verl and OpenRLHF, and print what diagnose '
                    'finds.')
    parser.add_argument('paths', nargs='+', metavar='RUN_DIR_OR_LOG')
    parser.add_argument('--trainer', metavar='{' + ','.join(TRAINERS) + '}',
                        help='the trainer that wrote the logs (default: told by the '
                             'format or the metric names)')
    parser.add_argument('--ratio-level', metavar='{token,sequence}', default='token',
                        help="the logged run's importance ratio: 'sequence' for GSPO "
                             "(TRL importance_sampling_level='sequence', verl "
                             "loss_mode gspo), whose clip_frac counts sequences and "
                             "skips the clip check (default: token)")
    args = parser.parse_args(argv)
    status = 0
    try:
        if args.trainer is not None and args.trainer not in TRAINERS:
            raise ValueError(f'unknown --trainer {args.trainer!r}; accepted: '
                             f'{", ".join(TRAINERS)}')
        if args.ratio_level not in ('token', 'sequence'):
            raise ValueError(f'unknown --ratio-level {args.ratio_level!r}; accepted: '
                             f'token, sequence')
        for path in args.paths:
            status = max(status, int(diagnose_path(path, args.trainer,
                                                   args.ratio_level)))
    except ValueError as error:
        print(f'python -m agentrl.diagnose: error: {error}', file=sys.stderr)
        return 2
    return status
