"""Trials: measure one setting of one workload, and come back with a result whatever happens.

The search sees only the runner protocol and its result types (exported here); the runners
themselves (:mod:`loadertune.trials.inline`, :mod:`loadertune.trials.script.runner`) are imported
where they are chosen, since they pull in torch's DataLoader machinery. A setting travels
``Config`` → ``runner.run(config)`` → :func:`loadertune.trials.loader.apply_settings` → the
``DataLoader``'s keyword arguments (in this process, or in the script's trial process through
:mod:`loadertune.trials.inside.patch`).
"""

from loadertune.trials.contract import (
    Limits,
    ShouldStop,
    TrialRequest,
    TrialResult,
    TrialRunner,
    window_for,
)

__all__ = ["Limits", "ShouldStop", "TrialRequest", "TrialResult", "TrialRunner", "window_for"]
