"""What a search hands back, and who may listen while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from loadertune.config import Config
from loadertune.search.confirm import Confirmation
from loadertune.search.probe import Estimates
from loadertune.search.settings import SearchSettings
from loadertune.search.space import SearchSpace
from loadertune.trials import TrialResult


class Observer(Protocol):
    """Hears the search as it goes (the live view in :mod:`loadertune.report`)."""

    def search_started(self, deadline: float, budget_s: float) -> None: ...
    def phase(self, name: str) -> None: ...
    def trial_started(self, config: Config | None, phase: str) -> None: ...
    def trial_finished(self, result: TrialResult, best: TrialResult | None) -> None: ...
    def note(self, text: str) -> None: ...  # what the search learnt, in a line


@dataclass
class SearchOutcome:
    """Everything a search found; :mod:`loadertune.api` turns it into a Recommendation."""

    baseline: Config
    winner: Config
    trials: list[TrialResult]
    confirmation: Confirmation | None
    estimates: Estimates | None
    space: SearchSpace
    stop_reason: str
    settings: SearchSettings
    storage: str  # the settings' storage URL, or the default one it resolved to
    elapsed_s: float
    n_previous_trials: int
    user_batch_size: int
    values: dict[Config, float] = field(default_factory=dict)  # best search value per setting
    study_started: str | None = None  # when the study was created (``StudyLog.started``)

    @property
    def study_name(self) -> str:
        return self.settings.study

    @property
    def winner_estimates(self) -> Estimates | None:
        """The probe's estimates at the winner's batch size (its step's ceiling is its own)."""
        return self.estimates.at(self.winner.batch_size) if self.estimates else None

    def results_for(self, config: Config) -> list[TrialResult]:
        """The measurements that speak for ``config``: its confirmation rounds, else its trials.
        A round the search's deadline cut (skipped) is none: a baseline whose only round was
        cut is described by its own trial, not left without figures or a speed-up."""
        rounds = self.confirmation.results.get(config, []) if self.confirmation else []
        return [r for r in rounds if r.skipped is None] or [
            t
            for t in self.trials
            if t.config == config and t.phase != "replay" and t.skipped is None
        ]

    def value(self, config: Config) -> float | None:
        """The confirmed median when there is one, else the search's figure."""
        if self.confirmation is not None and self.confirmation.median(config) is not None:
            return self.confirmation.median(config)
        return self.values.get(config)

    def best_at_batch_size(self, batch_size: int) -> Config | None:
        candidates = [
            c
            for c in {*self.values, *(self.confirmation.values if self.confirmation else {})}
            if c.batch_size == batch_size and self.value(c) is not None
        ]
        return max(candidates, key=lambda c: self.value(c) or 0.0) if candidates else None
