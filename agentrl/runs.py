"""Files a run writes, written so that a crash never leaves a partial file taken as whole.

Every file goes to a temporary name in its own folder, is flushed and fsynced, then renamed over
its final name, and the folder is fsynced, so after a power loss a name holds the old contents or
the new, never an empty or half-written file. A run folder is built as ``.<name>.partial`` and
renamed into place only once every file in it is durable; ``finished`` still trusts a run folder
only if its JSON files parse and its ``config.json`` names the run it should be. ``locked`` keeps
two writers out of one folder.

This module is hand-written (not tangled from a chapter); ``agentrl.train`` and ``agentrl.sweep``
use it.
"""
import contextlib
import json
import os
import shutil
from pathlib import Path


def _plain(value):
    """value as JSON can hold it: numbers, strings, None; a function by its name."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if callable(value):
        return getattr(value, '__name__', repr(value))
    try:
        return float(value)                          # a tensor or numpy scalar
    except (TypeError, ValueError):
        return repr(value)


def to_json(obj):
    """obj as indented JSON text, ending in a newline (functions by name, tensors as floats)."""
    return json.dumps(_plain(obj), indent=1) + '\n'


def fsync_dir(folder):
    """Make folder's entries (new names, renames) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(path, data):
    """Write bytes or text to path and fsync it (path is a new, private name)."""
    with open(path, 'wb') as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path, data):
    """Replace path by bytes or text, whole or not at all, durably."""
    path = Path(path)
    part = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
    try:
        _write_durable(part, data)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    fsync_dir(path.parent)


def publish_dir(final, files):
    """Create the folder final holding files ({name: bytes, text, or a function writing
    to the path it is given}), all or nothing: an older final is replaced."""
    final = Path(final)
    partial = final.with_name(f'.{final.name}.partial')
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, content in files.items():
        if callable(content):
            content(partial / name)
            with open(partial / name, 'rb+') as f:
                os.fsync(f.fileno())
        else:
            _write_durable(partial / name, content)
    fsync_dir(partial)
    if final.exists():                               # a stale or unfinished run: set it aside
        stale = final.with_name(f'.{final.name}.stale')
        shutil.rmtree(stale, ignore_errors=True)
        os.rename(final, stale)
        shutil.rmtree(stale)
    os.rename(partial, final)
    fsync_dir(final.parent)
    return final


def read_json(path):
    """The JSON in path, or None if it is missing, empty or does not parse."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def finished(folder, names, expect):
    """Whether folder is a whole run: every JSON file in names parses and config.json holds
    every key: value of expect."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    loaded = {name: read_json(folder / name) for name in names}
    if any(value is None for value in loaded.values()):
        return False
    config = loaded.get('config.json', read_json(folder / 'config.json'))
    return isinstance(config, dict) and all(config.get(k) == v for k, v in expect.items())


def clean_stale(folder):
    """Remove what interrupted writers left in folder: temporary files and partial or
    set-aside run folders (call it holding folder's lock)."""
    for path in Path(folder).glob('.*'):
        if path.name.endswith('.tmp') and path.is_file():
            path.unlink(missing_ok=True)
        elif path.name.endswith(('.partial', '.stale')) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


class FolderInUse(RuntimeError):
    """Another process holds the lock of a run or sweep folder."""


def lock_path(out):
    """The lock file beside the run folder `out` (the folder itself is replaced whole)."""
    out = Path(out)
    return out.with_name(f'.{out.name}.lock')


@contextlib.contextmanager
def locked(folder):
    """Hold folder/.lock (created with folder) for the block; FolderInUse if another process
    holds it. The lock is the kernel's (flock): it ends with its process, even on SIGKILL."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with locked_file(folder / '.lock', folder):
        yield folder


@contextlib.contextmanager
def locked_file(path, what=None):
    """Hold the flock of the file `path` (created, and removed at the end) for the block;
    FolderInUse, naming `what` (default: the folder path locks), if another process holds
    it. A process killed while holding it leaves the file, unlocked: the next one takes it."""
    import fcntl
    path = Path(path)
    what = what if what is not None else path.with_name(path.name[1:].removesuffix('.lock'))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors='replace').strip() or 'unknown'
            raise FolderInUse(f'{str(what)!r} is being written by another process '
                              f'(pid {holder}); wait for it to end or choose another '
                              f'folder') from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:                                 # its holder removed it as we opened it
            raise FolderInUse(f'{str(what)!r} was being written by another process a '
                              f'moment ago; run again')
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)             # removed while held: no stale lock file
    finally:
        os.close(fd)                                 # closing releases the flock


RUN_FILES = ('history.json', 'config.json', 'eval.json', 'policy.pt', 'curves.png')
CURVES = (('reward', 'training reward'), ('reads', 'reads per episode'),
          ('edits', 'edits per episode'))
SMOOTHING = 5                                         # steps in the curves' moving average


def run_config(cfg, variant, base, base_seed, steps, eval_every):
    """config.json of a run: the RLConfig's fields and how the run was made."""
    import dataclasses
    return dict(dataclasses.asdict(cfg), variant=variant, base=base, base_seed=base_seed,
                steps=steps, eval_every=eval_every)


def curves_png(history, title, eval_samples, final=None):
    """The run's learning curves as PNG bytes: reward, reads and edits per step
    (SMOOTHING-step moving average, labelled), the held-out pass rate where training
    measured it, and final = (pass rate, episodes per task) of the run's last evaluation."""
    from matplotlib.figure import Figure             # not pyplot: no backend is touched
    from matplotlib.ticker import MaxNLocator
    from agentrl.grpo import smooth
    fig = Figure(figsize=(12, 3))
    axes = fig.subplots(1, len(CURVES) + 1)
    steps = [h['step'] for h in history]
    for ax, (key, label) in zip(axes, CURVES):
        ax.plot(steps, [h[key] for h in history], color='C0', alpha=0.3, label='per step')
        ax.plot(steps, smooth([h[key] for h in history], SMOOTHING), color='C0',
                label=f'{SMOOTHING}-step moving average')
        ax.set(xlabel='step', ylabel=label)
    axes[0].legend(fontsize=7)
    held = [(h['step'], h['eval_pass']) for h in history if 'eval_pass' in h]
    ax = axes[-1]
    if held:
        ax.plot(*zip(*held), marker='o', color='C1',
                label=f'during training, {eval_samples} per task')
    if final is not None:
        ax.plot([steps[-1]], [final[0]], marker='*', markersize=12, color='C3',
                linestyle='none', label=f'final, {final[1]} per task')
    ax.set(xlabel='step', ylabel='held-out pass rate', ylim=(0, 1),
           xlim=(-0.5, max(steps[-1], 1) + 0.5))
    ax.legend(fontsize=7)
    for each in axes:
        each.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return figure_png(fig)


def figure_png(fig):
    """A matplotlib figure as PNG bytes (100 dpi), for write_atomic or publish_dir."""
    import io
    buffer = io.BytesIO()
    fig.savefig(buffer, format='png', dpi=100)
    return buffer.getvalue()


def write_run(folder, model, tok, cfg, history, config, evaluation, title, eval_samples):
    """A run's folder, whole or not at all: history.json, config.json (run_config),
    eval.json (the final held-out evaluation), policy.pt (save_policy) and curves.png."""
    from agentrl import policies
    return publish_dir(folder, {
        'history.json': to_json(history), 'config.json': to_json(config),
        'eval.json': to_json(evaluation),
        'policy.pt': policies.policy_bytes(model, tok, cfg),
        'curves.png': curves_png(history, title, eval_samples,
                                 (evaluation['pass_rate'], evaluation['n_samples']))})


CHECKPOINT_FORMAT = 'agentrl-checkpoint/1'


def checkpoint_path(out):
    """Where the run folder `out` keeps its checkpoint until the run is written."""
    out = Path(out)
    return out.with_name(f'.{out.name}.checkpoint.pt')


def save_checkpoint(path, model, state, config):
    """Write train_rl's state (generator, optimizer, history, reference) and model's weights,
    with the run's config.json, to path, whole or not at all."""
    import io

    import torch
    from agentrl import policies
    ref = state.get('ref_model')
    record = dict(format=CHECKPOINT_FORMAT, config=_plain(config),
                  spec=policies.policy_spec(model), model=model.state_dict(),
                  optimizer=state['optimizer'].state_dict(),
                  generator=state['generator'].get_state(), history=state['history'],
                  ref_model=None if ref is None else ref.state_dict())
    buffer = io.BytesIO()
    torch.save(record, buffer)
    write_atomic(path, buffer.getvalue())


def load_checkpoint(path, config, ignore=()):
    """A checkpoint of the run whose config.json is `config` (keys in `ignore` may differ) ->
    its record; ValueError naming what differs if it is another run's, or if it is not a
    checkpoint."""
    import torch
    try:
        record = torch.load(path, weights_only=True)
    except Exception as error:
        raise ValueError(f'{str(path)!r} is not a readable checkpoint ({error})') from None
    if not isinstance(record, dict) or record.get('format') != CHECKPOINT_FORMAT:
        raise ValueError(f'{str(path)!r} is not a checkpoint of format {CHECKPOINT_FORMAT!r}')
    wanted = _plain(config)
    differ = [k for k in sorted(set(wanted) | set(record['config']))
              if k not in ignore and wanted.get(k) != record['config'].get(k)]
    if differ:
        raise ValueError(f'the checkpoint {str(path)!r} is of another run ('
                         + ', '.join(f"{k}: {record['config'].get(k)!r} there, "
                                     f"{wanted.get(k)!r} asked" for k in differ) + ')')
    return record
