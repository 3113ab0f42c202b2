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


# What a record notes about the machine that ran it (tools/record.py appends this as a last,
# removed cell; tools/check.py runs it with the kernel's environment to learn where it is).
# Self-contained: the kernel cannot import tools/.
PROBE_CODE = r'''
import json as _j, os as _o, platform as _p, torch as _t
def _cpu():
    info = {}
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = info.get("model name") or _p.processor() or "unknown"
    if "cpu family" in info and "model" in info:
        model += f" (family {info['cpu family']}, model {info['model']})"
    return info.get("vendor_id") or _p.machine() or "unknown", model
_vendor, _model = _cpu()
print(_j.dumps({"torch": _t.__version__, "threads": _t.get_num_threads(),
                "cpu_capability": _t.backends.cpu.get_cpu_capability(),
                "cpu_vendor": _vendor, "cpu_model": _model,
                "mkl_cbwr": _o.environ.get("MKL_CBWR", ""),
                "python": _p.python_version()}))
'''

# A record compares exactly where all of these equal the record's (the CPU kind and the kernel
# settings that decide summation order); elsewhere the contract applies (tools/check.py).
KIND_FIELDS = ("cpu_vendor", "cpu_model", "cpu_capability", "mkl_cbwr", "torch", "threads")
# Records made before records named their CPU (2026-11) were stamped with the vendor the
# recording machine's notes give and cpu_model null ("not noted"); a null field is not compared,
# the vendor and capability always are.
ALWAYS_COMPARED = ("cpu_vendor", "cpu_capability")


def kind_mismatch(recorded: dict, here: dict) -> list[str]:
    """Fields of KIND_FIELDS in which a record's machine and this one differ ([]: same kind)."""
    out = []
    for k in KIND_FIELDS:
        if k in recorded and recorded[k] is None and k not in ALWAYS_COMPARED:
            continue
        if recorded.get(k) != here.get(k):
            out.append(f"{k}: recorded {recorded.get(k, '(not noted)')!r}, here {here.get(k)!r}")
    return out
