"""The search: probe, seed, explore with Optuna, confirm.

1. **Probe**: the user's own settings (the baseline), ``num_workers=0`` and ``1`` at the user's
   batch size, and a replay of one cached batch through the step. :mod:`loadertune.search.probe`
   turns them into per-sample costs, ceilings and the settings worth trying first.
2. **Space** from the machine and the probe (:mod:`loadertune.search.space`).
3. **Explore**: the seeds are enqueued, then Optuna's TPE (multivariate, over the conditional
   space) proposes settings. A trial whose running rate falls clearly below the best so far is
   stopped mid-window (pruned); a setting already measured is not run again; a setting at least
   as demanding as one that ran out of memory, shared memory or file descriptors is not tried.
   Exploration stops at the budget, at ``n_trials``, when nothing has improved for ``patience``
   trials, when the space is exhausted, or when the best sits at the estimated ceiling.
4. **Confirm**: finalists and baseline re-measured side by side (:mod:`loadertune.search.confirm`).

A trial of the exploration or the confirmation still running at the deadline is stopped there
and recorded as skipped, neither a rate nor a failure of its setting (``Limits.ends_by``).

The study persists in an Optuna storage (SQLite in the user's cache directory by default), so an
interrupted search resumes and its history can be read with Optuna's own tools. Only
:mod:`loadertune.search.study` imports Optuna.
"""

from loadertune.search.driver import Search
from loadertune.search.frontier import Frontier, dominated
from loadertune.search.outcome import Observer, SearchOutcome
from loadertune.search.settings import SearchSettings, default_storage

__all__ = [
    "Frontier",
    "Observer",
    "Search",
    "SearchOutcome",
    "SearchSettings",
    "default_storage",
    "dominated",
]
