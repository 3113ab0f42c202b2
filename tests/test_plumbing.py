"""agentrl.plumbing: Ray addresses in every accepted form, the errors a cluster that refuses us
gets, and stderr capture at the file-descriptor level."""
import os

import pytest

from agentrl import plumbing


@pytest.mark.parametrize('address, parts', [
    ('127.0.0.1:6379', ('127.0.0.1', 6379)), ('head.example:6379', ('head.example', 6379)),
    ('ray://10.0.0.1:10001', ('10.0.0.1', 10001)), ('[::1]:6379', ('::1', 6379)),
    ('ray://[fe80::1]:10001', ('fe80::1', 10001))])
def test_split_address_accepts_every_documented_form(address, parts):
    assert plumbing.split_address(address) == parts


@pytest.mark.parametrize('address', ['localhost', '::1:6379', 'h:0', 'h:70000', 'h:port',
                                     'ray://h', '[::1]', ':6379'])
def test_split_address_names_the_accepted_forms(address):
    with pytest.raises(ValueError, match=r"'host:port', '\[ipv6\]:port', 'ray://host:port'"):
        plumbing.split_address(address)


def test_a_refused_token_names_the_fix():
    error = plumbing.join_failure('1.2.3.4:6379', RuntimeError('Failed to connect to GCS'),
                                  'gcs_client.cc:210: ... InvalidAuthToken: missing')
    assert isinstance(error, ConnectionError)
    assert 'RAY_AUTH_MODE=token' in str(error) and 'ray get-auth-token' in str(error)


def test_auto_without_a_cluster_says_how_to_start_one():
    error = plumbing.join_failure('auto', ConnectionError('Could not find any running Ray'),
                                  '')
    assert 'ray start' in str(error) and 'address None' in str(error)


def test_stderr_captured_sees_writes_to_the_file_descriptor():
    with plumbing.stderr_captured() as said:
        os.write(2, b'from C++\n')
        assert said() == 'from C++\n'
    with plumbing.stderr_captured() as said:
        pass
    assert said() == ''


def _main_thread_only():
    import threading
    if threading.current_thread() is not threading.main_thread():
        pytest.skip('signal handlers can only be set in the main thread')


def test_spawn_pool_workers_start_with_ctrl_c_ignored_and_the_parent_keeps_its_handler():
    import signal
    _main_thread_only()
    before = signal.getsignal(signal.SIGINT)
    with plumbing.spawn_pool(2) as pool:
        assert signal.getsignal(signal.SIGINT) is before
        # no initializer: what the worker had when its interpreter started
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
        assert pool.apply(sum, ([1, 2],)) == 3
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_a_ctrl_c_to_this_thread_while_workers_start_is_taken_after_the_block():
    import signal
    import threading
    _main_thread_only()
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with plumbing.sigint_left_to_parent():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            reached.append('end of block')        # not interrupted inside the block
        for _ in range(10_000):                   # the interpreter checks for signals here
            pass
    assert reached == ['end of block']
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_worker_pool_refuses_functions_a_worker_cannot_import():
    """A job a spawned worker cannot unpickle kills the worker and the pool waits for it
    forever: WorkerPool refuses such a function at once, naming it (no process started)."""
    import agentrl as arl
    from agentrl.plumbing import WorkerPool, _importable

    def nested():
        return 0

    assert _importable(arl.pass_at_k) and _importable(arl.task_successes)
    assert not _importable(nested) and not _importable(lambda: 0)
    pool = WorkerPool.__new__(WorkerPool)            # no workers: the check comes first
    with pytest.raises(ValueError, match='nested'):
        pool(nested, [()])
