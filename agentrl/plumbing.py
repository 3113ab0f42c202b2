"""Process plumbing for the chapters' saved code and cells: stderr redirection, quiet Ray
start-up, Ray addresses and the errors a cluster that refuses us gets (chapter 14), and a worker
pool kept open across many `train_many` calls (chapter 16), and spawn pools whose workers leave
Ctrl-C to their parent.

This module is hand-written (not tangled from a chapter): nothing in it teaches RL, so the
chapter's cells import it instead of showing it.
"""
import collections.abc
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import warnings

ADDRESS_FORMS = "'host:port', '[ipv6]:port', 'ray://host:port', 'auto' or None"
AUTH_FIX = ("the cluster uses token authentication (Ray 2.60's `ray start` turns it on when "
            "a token exists or RAY_AUTH_MODE=token): run with RAY_AUTH_MODE=token and the cluster's token in "
            "~/.ray/auth_token, in the file RAY_AUTH_TOKEN_PATH names, or in RAY_AUTH_TOKEN "
            "(`ray get-auth-token` on the head node prints it)")


@contextlib.contextmanager
def stderr_captured():
    """Inside the block the process's stderr (fd 2, C++ code too) goes to a temporary file;
    yields a function that returns what was written (so far, or in all after the block)."""
    sys.stderr.flush()
    saved, kept = os.dup(2), []
    with tempfile.TemporaryFile(mode='w+b') as sink:
        def said():
            if kept:
                return kept[0]
            return os.pread(sink.fileno(), 1 << 20, 0).decode(errors='replace')

        os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            kept.append(said())


@contextlib.contextmanager
def quiet_ray():
    """Import and start Ray without its notes (a tqdm warning and an INFO line in a notebook
    without ipywidgets) -> the ray module."""
    logging.getLogger('ray.widgets.util').setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        import ray
        yield ray


def split_address(address):
    """A Ray cluster address 'host:port', '[ipv6]:port' or 'ray://host:port' -> (host, port);
    ValueError naming the accepted forms otherwise."""
    rest = address[len('ray://'):] if address.startswith('ray://') else address
    if rest.startswith('['):
        host, _, port = rest[1:].partition(']:')
    else:
        host, _, port = rest.rpartition(':')
        if ':' in host:                              # a bare IPv6 address: ambiguous
            host = ''
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f'a Ray address is {ADDRESS_FORMS}, got {address!r}')
    return host, int(port)


def check_reachable(address, timeout=5.0):
    """Fail fast (ConnectionError) if nothing listens at a Ray address; ray.init would
    retry for minutes."""
    host, port = split_address(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        raise ConnectionError(f'cannot reach a Ray cluster at {address!r} ({error}); '
                              f'address=None starts a local Ray') from error


def join_failure(address, error, said):
    """The ConnectionError for a failed ray.init(address): what went wrong and the fix,
    from the exception and what Ray wrote to stderr meanwhile."""
    text = f'{type(error).__name__}: {error}\n{said}'
    if 'InvalidAuthToken' in text or 'AuthenticationError' in text:
        return ConnectionError(f'the Ray cluster at {address!r} refused this process: '
                               f'{AUTH_FIX}')
    if address == 'auto':
        return ConnectionError("no Ray cluster runs on this node ('auto' looks for one "
                               "started here with `ray start`); start one, give its "
                               "address, or use a local Ray (address None)")
    last = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return ConnectionError(f'cannot join the Ray cluster at {address!r}: {last}')


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_cluster(nodes=2, cpus_per_node=1, timeout=120):
    """A Ray cluster of `nodes` nodes on this machine, each started with `ray start` and
    token authentication on (RAY_AUTH_MODE=token) -> its 'host:port'. `ray stop` at the
    end stops every Ray process of this machine. On a machine with no token yet,
    `ray get-auth-token --generate` first writes one to ~/.ray/auth_token."""
    import subprocess
    address = f'127.0.0.1:{_free_port()}'
    env = dict(os.environ, RAY_AUTH_MODE='token', RAY_USAGE_STATS_ENABLED='0')
    if not {'RAY_AUTH_TOKEN', 'RAY_AUTH_TOKEN_PATH'} & set(os.environ):
        subprocess.run(['ray', 'get-auth-token', '--generate'], env=env, check=True,
                       capture_output=True, timeout=timeout)
    common = ['--num-cpus', str(cpus_per_node), '--node-ip-address', '127.0.0.1',
              '--disable-usage-stats']
    try:
        subprocess.run(['ray', 'start', '--head', '--port', address.split(':')[1],
                        '--include-dashboard', 'false', *common], env=env, check=True,
                       capture_output=True, timeout=timeout)
        for _ in range(nodes - 1):
            subprocess.run(['ray', 'start', '--address', address, *common], env=env,
                           check=True, capture_output=True, timeout=timeout)
        yield address
    finally:
        subprocess.run(['ray', 'stop', '--force'], capture_output=True, timeout=timeout)


def quiet_transformers():
    """Set up transformers, datasets and TRL for a notebook: offline (everything is built
    locally), errors only, no progress bars, and no FutureWarning about renamed options TRL
    still passes -> the trl module."""
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import datasets
    import transformers
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    warnings.simplefilter('ignore', FutureWarning)
    import trl
    return trl


@contextlib.contextmanager
def sigint_left_to_parent():
    """Processes started inside the block begin with SIGINT ignored, so a Ctrl-C sent to the
    whole process group while they are still importing prints no traceback from each (CPython
    installs its KeyboardInterrupt handler only where SIGINT is at its default). Meanwhile this
    thread holds SIGINT back and takes it after the block; one that another thread of this
    process takes during the block (a few milliseconds) is dropped: press Ctrl-C again.
    Outside the main thread, where handlers cannot be set, the block runs unchanged."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def spawn_pool(processes, initializer=None, initargs=()):
    """A multiprocessing spawn Pool of `processes` fresh interpreters that ignore SIGINT from
    their first instruction: the parent handles Ctrl-C and ends them."""
    import multiprocessing
    with sigint_left_to_parent():
        return multiprocessing.get_context('spawn').Pool(processes, initializer=initializer,
                                                         initargs=initargs)


def _importable(function):
    """Whether a spawned worker can find function by its module and name (a worker that
    cannot unpickle a job dies, and the pool then waits for that job forever)."""
    import importlib
    module = getattr(function, '__module__', None)
    if module is None or '<locals>' in getattr(function, '__qualname__', '<locals>'):
        return False
    if module == '__main__' and not hasattr(sys.modules['__main__'], '__file__'):
        return False                    # a notebook's or console's: no file to re-import
    try:
        return getattr(importlib.import_module(module), function.__name__) is function
    except (ImportError, AttributeError):
        return False


class WorkerPool:
    """A spawn pool of `processes` workers, each with `threads` torch threads, kept open
    for many calls. `pool(function, jobs)` queues [function(*job) for job in jobs] on the
    workers and returns at once a sequence of the results, which waits for them when
    read: the jobs of several calls made before their results are read run back to back,
    so two workers are not left half idle by three runs. Pass it as
    `train_many(..., executor=pool)`. A context manager; close() ends it."""

    def __init__(self, processes=2, threads=1):
        import torch
        if processes < 1 or threads < 1:
            raise ValueError(f'need processes >= 1 and threads >= 1, got {processes!r} '
                             f'and {threads!r}')
        self._pool = spawn_pool(processes, torch.set_num_threads, (threads,))

    def __call__(self, function, jobs):
        if not _importable(function):
            raise ValueError(f'WorkerPool runs functions a spawned worker can import: '
                             f'{function!r} is defined in {function.__module__}; pass one '
                             f'of a module (e.g. arl.{function.__name__} for saved code)')
        return _Pending(self._pool.starmap_async(function, jobs, chunksize=1))

    def close(self):
        """Wait for the queued jobs and end the workers."""
        self._pool.close()
        self._pool.join()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, trace):
        if kind is None:
            self.close()
        else:
            self._pool.terminate()
            self._pool.join()


class _Pending(collections.abc.Sequence):
    """The results of one WorkerPool call; reading any of them waits for all (a worker's
    exception is raised here)."""

    def __init__(self, result):
        self._result = result

    def __getitem__(self, index):
        return self._result.get()[index]

    def __len__(self):
        return len(self._result.get())
