"""torch's own launcher (``torch.distributed.run``, what ``torchrun`` runs), dying with the
search: ``python -m loadertune.trials.script.launch TORCHRUN-ARGS``.

The launcher's agent starts each rank in a session of its own, and a SIGKILLed search runs no
code to end them: so the agent asks for SIGKILL when the search dies (``PR_SET_PDEATHSIG``), each
rank when the agent dies (:mod:`loadertune.trials.inside.child`), and each rank's DataLoader
workers when their rank dies (:class:`loadertune.trials.lifeline.DieWithTrial`).
"""

from __future__ import annotations

import os
import sys

from loadertune.trials import lifeline

PARENT_ENV = "LOADERTUNE_SEARCH_PID"


def main() -> None:
    lifeline.die_with_parent(int(os.environ.pop(PARENT_ENV)))
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:])


if __name__ == "__main__":
    main()
