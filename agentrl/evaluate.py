"""``python -m agentrl.evaluate RUN``: the command of ``agentrl.evaluation`` (see there).

Only a command: importing this module would put it in the place of the function
``arl.evaluate``, so an import is refused; import ``agentrl.evaluation`` instead.
"""
import sys

if __name__ != '__main__':
    raise ImportError("agentrl.evaluate is the command `python -m agentrl.evaluate`; import "
                      "agentrl.evaluation for its functions (importing agentrl.evaluate "
                      "would hide the function arl.evaluate)")

from agentrl.evaluation import main  # noqa: E402

sys.exit(main())
