"""The search: measure the user's settings and a probe, seed from the probe's model, explore
(our queue ahead of Optuna's TPE), and confirm the finalists in interleaved rounds, where the
cheapest setting within the noise wins. ``docs/design.md`` is the whole search on one page.

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
