"""A real Ray cluster of two nodes, both started with `ray start` on this machine, token
authentication on (RAY_AUTH_MODE=token): the sweep command refuses it cleanly without the token
and before writing anything, and with the token its runs equal an in-process sweep's file for
file. Run in the xdist group of the other Ray tests: `ray stop` ends every Ray process here."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip('ray')
from agentrl import plumbing, sweep  # noqa: E402

pytestmark = pytest.mark.xdist_group('ray')
REPO = Path(__file__).resolve().parents[1]
ARGS = ['--presets', 'default', '--seeds', '0', '1', '2', '--steps', '1', '--no-progress']
RUN_FILES = ('history.json', 'config.json', 'eval.json', 'policy.pt', 'curves.png')


def cli(out, *extra, auth=True):
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED='0')
    env.pop('RAY_AUTH_MODE', None)
    if auth:
        env['RAY_AUTH_MODE'] = 'token'
    return subprocess.run([sys.executable, '-m', 'agentrl.sweep', '--out', str(out), *ARGS,
                           *extra], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=600)


@pytest.fixture(scope='module')
def cluster():
    with plumbing.local_cluster(nodes=2, cpus_per_node=1) as address:
        yield address


def test_without_the_token_the_sweep_exits_2_naming_the_fix_and_writes_nothing(cluster,
                                                                              tmp_path):
    done = cli(tmp_path / 'sweep', '--ray', cluster, auth=False)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith('usage:') is False and 'RAY_AUTH_MODE=token' in last
    assert 'Traceback' not in done.stderr
    assert not (tmp_path / 'sweep').exists()


def test_a_sweep_on_two_nodes_equals_one_in_process(cluster, tmp_path):
    on_cluster = cli(tmp_path / 'cluster', '--ray', cluster)
    assert on_cluster.returncode == 0, on_cluster.stderr
    assert sweep.main(['--out', str(tmp_path / 'here'), *ARGS, '--processes', '1']) == 0
    for seed in (0, 1, 2):
        for name in RUN_FILES:
            run = f'default-seed{seed}/{name}'
            assert ((tmp_path / 'cluster' / run).read_bytes()
                    == (tmp_path / 'here' / run).read_bytes()), run


def test_auto_without_a_cluster_is_a_clean_error(tmp_path):
    subprocess.run(['ray', 'stop', '--force'], capture_output=True, timeout=120)
    done = cli(tmp_path / 'sweep', '--ray', 'auto')
    assert done.returncode == 2, done.stderr
    assert 'no Ray cluster runs on this node' in done.stderr
    assert not (tmp_path / 'sweep').exists()
