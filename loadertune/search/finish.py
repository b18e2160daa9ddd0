"""The end of a search: the finalists, the confirmation's rounds, and the winner.

A mixin of :class:`~loadertune.search.driver.Search` (it reads the search's ledger, settings,
clock and opening); the rounds themselves are :func:`loadertune.search.confirm.confirm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from loadertune.config import Config
from loadertune.search import plan
from loadertune.search.confirm import Confirmation, confirm, simplest_close
from loadertune.search.timing import TrialTiming

if TYPE_CHECKING:
    from loadertune.search.opening import Opening
    from loadertune.search.space import SearchSpace
    from loadertune.search.study import StudyLog
    from loadertune.trials import TrialResult


class Finish(TrialTiming):
    """The search's confirmation phase (see the module docstring)."""

    # What the search (driver.Search) provides; declared for the type checker only.
    opening: Opening
    clock: Callable[[], float]
    _deadline: float
    _may_pick: Callable[[Config], bool]
    _batch_allowed: Callable[[Config], bool]
    _measure_many: Callable[..., list[TrialResult]]

    if TYPE_CHECKING:

        @property
        def baseline(self) -> Config: ...

    def _confirm_cost(self) -> float:
        """Seconds to keep for the confirmation (see :func:`plan.confirm_cost`)."""
        return plan.confirm_cost(
            self.ledger.values,
            self._finalists(),
            baseline=self.opening.known,
            n_explored=self.ledger.n_explored,
            trial_wall_s=self._typical_wall(),
            walls=self.ledger.walls(),
            rounds=min(2, self.settings.confirm_rounds),
            budget_s=self.settings.budget_s,
        )

    def _finalists(self) -> list[Config]:
        return plan.finalists(
            self.ledger.values,
            n=self.settings.finalists,
            user_batch_size=self.baseline.batch_size,
            may_win=self._may_pick,
        )

    def _confirm(
        self, log: StudyLog, space: SearchSpace, *, baseline_only: bool = False
    ) -> Confirmation | None:
        finalists = [] if baseline_only else self._finalists()
        wall, walls = self._typical_wall(), self.ledger.walls()

        def round_s(finalists: list[Config]) -> float:  # a slow baseline's own time counts
            configs = dict.fromkeys([*finalists, self.baseline])
            return sum(max(wall, walls.get(c, 0.0)) for c in configs)

        # When a round of every finalist does not fit, the last ones (the least promising)
        # are left out, rather than the confirmation: one lucky figure must not decide.
        while len(finalists) > 1 and round_s(finalists) > self._remaining():
            finalists = finalists[:-1]
        # Rounds go on while time is left: the budget the exploration did not use decides more.
        rounds = self.settings.confirm_rounds if round_s(finalists) <= self._remaining() else 0
        # The winner must have figures from this run: a resumed search's leader measured only
        # in an earlier run is measured once even past the deadline.
        unmeasured = bool(finalists) and not any(
            t.config == finalists[0] for t in self.ledger.trials
        )
        if rounds < 1 and not unmeasured:
            return None
        uncut = [finalists[0]] if unmeasured else []  # its first trial only

        def run_in_turn(
            configs: Sequence[Config], on_result: Callable[[TrialResult], bool]
        ) -> None:
            def recorded(result: TrialResult) -> bool:
                log.record(space, result)
                return on_result(result)

            first = uncut.pop() if uncut and configs[0] == uncut[0] else None
            self._measure_many([(c, "confirm") for c in configs], go_on=recorded, uncut=first)

        # The rounds' figures pool with this run's earlier ones measured the same way; one
        # measured otherwise stands in only until the rounds measure its setting.
        prior, stand_in = self.ledger.samples_of_kind(
            {c: self._window(c, "confirm").whole_epoch for c in [*finalists, self.baseline]}
        )
        return confirm(
            run_in_turn,
            finalists,
            self.baseline,
            rounds=max(1, rounds),
            deadline=self._deadline,
            trial_wall_s=wall,
            walls=walls,
            measure_first=unmeasured,
            prior=prior,
            stand_in=stand_in,
            prior_sub_windows=self.ledger.sub_windows(),
            live=self.settings.live,
            clock=self.clock,
        )

    def _live_choice(self, winner: Config, confirmation: Confirmation | None) -> Config:
        """On a live run the baseline is the setting running: the winner replaces it only when
        this run's rates say it is faster often enough (:func:`plan.switch_pays`)."""
        if winner == self.baseline or self.baseline not in self.ledger.values:
            return winner
        subs = self.ledger.sub_windows()
        rates = confirmation.sub_window_rates if confirmation else lambda c: subs.get(c, [])
        return winner if plan.switch_pays(rates(winner), rates(self.baseline)) else self.baseline

    def _best_not_failed(self, confirmation: Confirmation | None) -> Config | None:
        """Without a winner from the rounds: the best exploration figure of a setting that did
        not fail every round it ran there (one that did is no pick, whatever it measured
        before), or within 2% of it the simplest; None when no such setting has a figure."""
        failed = (
            {c for c in confirmation.results if confirmation.failed_here(c)}
            if confirmation
            else set()
        )
        values = {
            c: v
            for c, v in self.ledger.values.items()
            if c not in failed and self._batch_allowed(c)
        }
        return simplest_close(values, self.baseline) if values else None
