"""The one place that defines how chapter kernels run, for recording (tools/record.py) and for
checking (tools/check.py, nbval). Both start the kernel the same way (nbval's "current env"
kernel: this Python, ``-m ipykernel_launcher``), in the same directory (``book/recorded``, where
nbval starts it: the directory of the notebook) and with the same environment below.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CELL_TIMEOUT = 1800          # seconds per cell, for record and nbval alike
DEFAULT_THREADS = "1"        # torch/OpenMP threads in chapter kernels (override: AGENTRL_THREADS);
                             # 1 thread: as fast as 2 for this tiny model, and two chapters can be
                             # checked in parallel on a 2-core machine


def kernel_env(root: Path = REPO, base: dict | None = None) -> dict[str, str]:
    """Environment for a chapter kernel of the book at ``root``.

    - PYTHONPATH starts with ``root`` so ``import agentrl`` is the freshly tangled package of
      that book (for this repo it is the same directory as the editable install);
    - a fixed thread count, since float reductions depend on it;
    - a fixed hash seed; progress bars (tqdm) off, so they never reach compared outputs.
    """
    env = dict(os.environ if base is None else base)
    root = str(Path(root).resolve())
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p and p != root])
    threads = env.get("AGENTRL_THREADS", DEFAULT_THREADS)
    env["AGENTRL_THREADS"] = threads
    env["OMP_NUM_THREADS"] = threads
    env["MKL_NUM_THREADS"] = threads
    env["PYTHONHASHSEED"] = "0"
    env["TQDM_DISABLE"] = "1"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    env.pop("MPLBACKEND", None)   # the kernel's inline backend, as in Jupyter
    return env
