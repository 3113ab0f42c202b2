# Generated from the chapters of book/ (in _toc.yml order) by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.

"""agentrl: the library of the book *Agent RL*, tangled from its chapters.

Every public name saved by a chapter is available as ``arl.<name>`` after
``import agentrl as arl``.
"""

__version__ = '0.1.0'

from .essentials import *  # book/02-rl-essentials.md
from .lm import *  # book/03-language-models-as-policies.md
from .gym import *  # book/04-bugfix-gym.md
from .agent import *  # book/05-tiny-agent.md
from .policy_gradient import *  # book/06-policy-gradient.md
from .advantages import *  # book/07-advantages-and-credit.md
from .ppo import *  # book/08-ppo.md
from .grpo import *  # book/09-grpo.md
from .regularization import *  # book/10-kl-entropy-regularization.md
from .rewards import *  # book/11-rewards-and-verifiers.md
from .horizons import *  # book/12-multi-turn-and-long-horizons.md
from .observations import *  # book/13-tools-and-observations.md
from .scaling import *  # book/14-scaling-and-efficiency.md
from .translations import *  # book/14-scaling-and-efficiency.md
from .offpolicy import *  # book/15-off-policy-and-async.md
from .warmstart import *  # book/16-warm-starts-and-distillation.md
from .evalstats import *  # book/17-evaluation.md
from .preferences import *  # book/18-reward-models-and-preferences.md
from .debugging import *  # book/19-debugging-rl-runs.md
from .frontier import *  # book/20-frontier.md
from .hf import *  # book/21-real-model.md
