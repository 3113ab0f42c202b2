"""One behaviour-cloned base agent per check run, shared by every chapter kernel.

Most chapters start by cloning the same base agent (``arl.make_base_agent(tok)`` or
``arl.make_rl_base(tok)``): several seconds of one core each time. Chapter 5's
``make_base_agent`` keeps its results in the module dict ``agentrl.agent._BASE_CACHE``. During
``tools/check.py`` this file is an IPython startup file of every chapter kernel; it replaces
that dict by ``DiskBaseCache``, which also keeps each base agent as a file in the check run's
temporary folder ($AGENTRL_BASE_CACHE), so the first kernel that needs an agent clones it and
the others load it. A loaded agent is the same object, pickled and unpickled (same weights to
the bit, same mode), so every output is what cloning gives; the folder lives only as long as
the check run, so a change to the code can never meet an agent cloned by older code.
Records (tools/record.py) do not use it: each record clones its own.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

ENV = "AGENTRL_BASE_CACHE"


class DiskBaseCache(dict):
    """A dict of base agents that also reads and writes them as files in `folder`
    (written whole or not at all: a temporary file, then an atomic rename)."""

    def __init__(self, folder):
        super().__init__()
        self.folder = Path(folder)

    def path(self, key) -> Path:
        """The file of a key (tok.vocab, seed, kinds): a digest of its repr."""
        return self.folder / f"base-{hashlib.sha256(repr(key).encode()).hexdigest()[:32]}.pt"

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or self.path(key).is_file()

    def __getitem__(self, key):
        if not dict.__contains__(self, key):
            import torch
            try:
                model = torch.load(self.path(key), weights_only=False)
            except FileNotFoundError:
                raise KeyError(key) from None
            dict.__setitem__(self, key, model)
        return dict.__getitem__(self, key)

    def __setitem__(self, key, model) -> None:
        import torch
        dict.__setitem__(self, key, model)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save(model, tmp)
        os.replace(tmp, path)


def install() -> bool:
    """Replace agentrl.agent._BASE_CACHE by a DiskBaseCache in $AGENTRL_BASE_CACHE, if set
    -> whether it did."""
    folder = os.environ.get(ENV)
    if not folder:
        return False
    import agentrl.agent
    agentrl.agent._BASE_CACHE = DiskBaseCache(folder)
    return True


STARTUP = f"""# written by tools/check.py: every chapter kernel of one check run shares base agents
import sys as _sys
_sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import base_cache as _base_cache
_base_cache.install()
_sys.path.remove({str(Path(__file__).resolve().parent)!r})
del _sys, _base_cache
"""


def kernel_env(tmp: Path) -> dict[str, str]:
    """Environment entries that make every chapter kernel share base agents in tmp
    (an IPython profile whose startup file installs the cache)."""
    startup = Path(tmp) / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-agentrl-base-cache.py").write_text(STARTUP)
    return {"IPYTHONDIR": str(Path(tmp) / "ipython"), ENV: str(Path(tmp) / "base-agents")}
