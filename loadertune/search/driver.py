"""The search driver: open (:mod:`loadertune.search.opening`), seed, explore, confirm. See
:mod:`loadertune.search`.

Measurements are asked for in batches where the next few settings are known together (the
probe's trials after the baseline, the confirmation's interleaved rounds): the runner measures a
batch in turn (:meth:`~loadertune.trials.TrialRunner.run_many`), a script's runner in one
process, and the driver hears each result as it comes. The exploration asks for one setting at
a time: a script's runner keeps its process between calls anyway (one start-up for them all),
and TPE proposes best from every result so far; asking several before telling would propose
each without the others' results (``constant_liar`` only spreads them apart), and a climb the
agenda plans from one result would wait for the whole batch.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from loadertune.config import Config
from loadertune.errors import LoadertuneError, UserCodeError
from loadertune.hardware import Hardware
from loadertune.measure import failures
from loadertune.measure.resources import tree_pss
from loadertune.measure.window import WindowSpec
from loadertune.search.agenda import Agenda
from loadertune.search.finish import Finish
from loadertune.search.ledger import Ledger
from loadertune.search.limits import limits_for
from loadertune.search.opening import Opening
from loadertune.search.outcome import Observer, SearchOutcome
from loadertune.search.probe import Estimates
from loadertune.search.seeds import seed_configs
from loadertune.search.settings import SearchSettings, storage_or_fallback
from loadertune.search.space import SearchSpace
from loadertune.search.stop import loader_keeps_up
from loadertune.search.study import StudyLog, quiet_optuna
from loadertune.trials import Limits, TrialRequest, TrialResult, TrialRunner, window_for

# A best explored rate this many times a ceiling refutes the ceiling: the best of a few trials
# at a ceiling, each 5-30% off, reads up to about 1.5 times it.
CEILING_REFUTED = 1.6


class Search(Finish):
    """One search over one workload. See the module docstring.

    Args:
        runner: runs trials of the workload.
        hardware: this machine.
        baseline: the user's own settings (measured first, and re-measured at the end); None
            when only the first trial can tell them (a script's own loader).
        batch_sizes: the batch sizes to consider (the baseline's is added; empty: only it).
        settings: budget and policy.
        observer: hears progress (None: silent).
        clock: seconds on a monotonic clock (a simulation passes its own).
        own_pss: this process tree's PSS in bytes (in-process trials add to it).
    """

    def __init__(
        self,
        runner: TrialRunner,
        *,
        hardware: Hardware,
        baseline: Config | None,
        batch_sizes: Sequence[int],
        settings: SearchSettings,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
        own_pss: Callable[[], int] | None = None,
    ) -> None:
        self.runner = runner
        self.clock = clock
        self._own_pss = own_pss or (lambda: tree_pss(os.getpid()))
        self.hw = hardware
        self.settings = settings
        self.observer = observer
        self.storage = settings.storage or storage_or_fallback(observer.note if observer else None)
        self.ledger = Ledger(memory_margin=settings.memory_margin, min_gain=settings.min_gain)
        self.agenda = Agenda(self.ledger)
        self.opening = Opening(
            runner,
            hardware=hardware,
            baseline=baseline,
            batch_sizes=batch_sizes,
            settings=settings,
            ledger=self.ledger,
            measure=self._measure_many,
            fits=self._fits,
            trial_fits=self._trial_fits,
            observer=observer,
        )
        self._deadline = 0.0
        self._est: Estimates | None = None  # the opening's, once it has run
        self._memory_budget: int | None = None

    @property
    def baseline(self) -> Config:
        return self.opening.baseline

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.opening.batch_sizes

    # -- bookkeeping -----------------------------------------------------------------------------

    def _remaining(self) -> float:
        return self._deadline - self.clock()

    def _limits(self) -> Limits:
        return limits_for(
            self.ledger.trials,
            startup_timeout_s=self.settings.startup_timeout_s,
            default_wall_s=self.settings.trial_window_s + 1.0,
            memory_budget_bytes=self._memory_budget,
        )

    def _prune_rule(self, index: int, running: float) -> bool:
        """Stop a trial clearly below the best so far. "The best" is the median of the three
        best settings' rates (one lucky measurement must not prune everything after it), or on
        a live run the best itself: there a slower trial costs the training its time."""
        best = self.ledger.best_value if self.settings.live else self.ledger.robust_best()
        return index >= 1 and running < self.settings.prune_ratio * best

    def _window(self, config: Config | None, phase: str = "search") -> WindowSpec:
        # The opening's replay (one batch again and again) and probe (its steady rate per
        # sample: the estimates' input) are windows; the settings the search ranks, whole epochs.
        epoch_s = None if phase in ("replay", "probe") else self._short_epoch_s(config)
        if epoch_s is not None:
            return window_for(config or Config(1), window_s=epoch_s, whole_epoch=True)
        # Your settings (None) are unknown before their trial in a script: planned as loading
        # without workers; the trial process sizes the window for what it runs.
        return window_for(config or Config(1), window_s=self.settings.trial_window_s)

    def _request(
        self, config: Config | None, phase: str, prunable: bool, *, cut: bool = True
    ) -> TrialRequest:
        window, limits = self._window(config, phase), self._limits()
        if window.whole_epoch:  # it may wait out the loop's rest (validation) after an epoch
            limits = dataclasses.replace(limits, rest_s=limits.startup_s)
        if cut and phase in ("search", "confirm") and not self.settings.live:
            # A trial of the exploration or the confirmation ends with the budget, cut rather
            # than failed: one predicted to fit may run far longer (storage that serves few
            # requests at once, which the probe cannot see; a whole epoch begun mid-epoch).
            limits = dataclasses.replace(limits, ends_by=self._deadline)
        return TrialRequest(window, limits, phase, self._prune_rule if prunable else None)

    def _measure(self, config: Config | None, phase: str, *, prunable: bool = False) -> TrialResult:
        """Run one trial (``config=None``: the workload's own settings) and learn from it."""
        return self._measure_many([(config, phase)], prunable=prunable)[0]

    def _measure_many(
        self,
        planned: Sequence[tuple[Config | None, str]],
        *,
        prunable: bool = False,
        go_on: Callable[[TrialResult], bool] | None = None,
        uncut: Config | None = None,
    ) -> list[TrialResult]:
        """Run ``planned`` trials (setting, phase) in turn, learning from each as it comes;
        ``go_on(result)`` False stops the batch there. The limits are those known now; the
        trial of ``uncut`` goes on past the deadline."""
        requests = [
            (c, self._request(c, phase, prunable, cut=uncut is None or c != uncut))
            for c, phase in planned
        ]
        if self.observer:
            self.observer.trial_started(*planned[0])

        def learn(result: TrialResult) -> bool:
            if result.failure is not None and self.opening.known is not None:
                result.failure = failures.at_another_batch_size(
                    result.failure, result.config.batch_size, self.baseline.batch_size
                )
            self.ledger.add(result)
            if self.observer:
                self.observer.trial_finished(result, self.ledger.best)
            if result.failure is not None and result.failure.user_bug:
                raise self.runner.user_error(
                    result.failure.message,
                    kind=result.failure.kind,
                    detail=result.failure.detail,
                    advice=result.failure.advice,
                )
            more = go_on(result) if go_on is not None else True
            n = len(self.ledger.trials) - n_before
            if more and n < len(planned) and self.observer:
                self.observer.trial_started(*planned[n])
            return more

        n_before = len(self.ledger.trials)
        return self.runner.run_many(requests, learn)

    # -- phases ----------------------------------------------------------------------------------

    def _stop_reason(self, space_size: int, reserve_s: float) -> str | None:
        s = self.settings
        if self._remaining() - reserve_s < self._typical_wall():
            return "budget"
        if s.n_trials is not None and self.ledger.n_run >= s.n_trials:
            return "n_trials"
        if self.ledger.since_gain >= s.patience:
            return "no_improvement"
        if len(self.ledger.values) + len(self.ledger.frontier.failed) >= space_size:
            return "space_exhausted"
        return None

    def _pruned_already(self, config: Config) -> str | None:
        """A setting this run stopped mid-window as clearly behind is not run again (Optuna,
        which learns little from a pruned trial, proposes it again)."""
        pruned = any(
            t.pruned and t.config == config and not t.kept and t.phase == "search"
            for t in self.ledger.trials
        )
        return "stopped already as clearly behind the best" if pruned else None

    def _beats_baseline(self) -> bool:
        """A setting measured faster than the baseline by more than the noise (or the baseline
        has no figure to beat)."""
        base = self.ledger.values.get(self.baseline)
        return not base or self.ledger.best_value > base * (1 + self.settings.min_gain)

    def _explore(
        self, log: StudyLog, space: SearchSpace, est: Estimates | None
    ) -> tuple[str, SearchSpace]:
        """Ask Optuna for settings and measure them until a stop rule says enough; returns why
        it stopped and the space as it ended (narrowed where the runner fixed the batch size or
        saw the script create its loader again)."""
        space_size = len(space.configs())
        idle = 0  # consecutive proposals that ran nothing (duplicates, skips)
        while True:
            narrower = self._persistence_kept(self._batch_size_kept(space))
            if narrower is not space:
                space, space_size = narrower, len(narrower.configs())
            self.agenda.update(space)
            reason = self._stop_reason(space_size, self._confirm_cost())
            if reason:
                return reason, space
            if idle >= 50:
                return "no_new_proposals", space
            planned = self.agenda.next(space)
            if planned is not None:
                log.enqueue(planned)  # Optuna asks it next
            config = log.ask(space)
            skip = (
                space.rejects(config)
                or self.ledger.frontier.rules_out(config)
                or self._pruned_already(config)
                or self._past_the_budget(config, est)
            )
            if skip is not None:
                log.skip(skip)
                idle += 1
                continue
            if config in self.ledger.values:  # measured already: reuse the value
                log.duplicate(self.ledger.values[config])
                self.ledger.since_gain += 1
                idle += 1
                continue
            idle = 0
            log.tell(self._measure(config, "search", prunable=True))

    def _batch_size_kept(self, space: SearchSpace) -> SearchSpace:
        """``space`` at the baseline's batch size alone once the runner says the batch size
        can no longer change (a live run's script asked its loader's length mid-search)."""
        fixed = self.runner.batch_size_fixed
        if not fixed or space.batch_sizes == (self.baseline.batch_size,):
            return space
        if self.observer:
            self.observer.note(f"batch size left out of the search from now on: {fixed}")
        return dataclasses.replace(space, batch_sizes=(self.baseline.batch_size,))

    def _persistence_kept(self, space: SearchSpace) -> SearchSpace:
        """``space`` without persistent workers once the runner has seen the script create its
        loader again (a new one every epoch, whose workers die with it: a persistent setting
        measures the same as the other, and its trials are spent for nothing). A later trial
        may be the first to see it (epochs longer than the opening's trials); until then both
        ways are searched."""
        if not self.runner.loader_recreated or space.persistent_workers == (False,):
            return space
        if self.observer:
            self.observer.note(
                "persistent_workers left out of the search from now on: the script creates "
                "its DataLoader again (every epoch?), and no worker outlives its loader"
            )
        return dataclasses.replace(space, persistent_workers=(False,))

    def _batch_allowed(self, config: Config) -> bool:
        """At the baseline's batch size, or the runner still lets the batch size change."""
        return not self.runner.batch_size_fixed or config.batch_size == self.baseline.batch_size

    def _may_pick(self, config: Config) -> bool:
        return self._batch_allowed(config) and self.ledger.frontier.may_win(config)

    # -- the whole search --------------------------------------------------------------------------

    def run(self) -> SearchOutcome:
        t0 = self.clock()
        self._deadline = t0 + self.settings.budget_s
        # In-process trials share this process, whose memory is the user's: the budget is on top.
        own = self._own_pss() if self.runner.in_process else 0
        self._memory_budget = own + int(
            self.settings.memory_budget_fraction * self.hw.ram_budget_bytes
        )
        self.opening.memory_budget = self._memory_budget
        if self.observer:
            self.observer.search_started(self._deadline, self.settings.budget_s)
        with quiet_optuna():
            log = StudyLog(
                self.storage,
                self.settings.study,
                resume=self.settings.resume,
                seed=self.settings.seed,
                buffered=self.settings.live and not self.settings.resume,
            )
            try:
                return self._run(log, t0)
            except KeyboardInterrupt as exc:
                self.opening.keep()
                raise log.interrupted(self.ledger.best_figures()) from exc
            except UserCodeError as exc:
                log.abandon(exc.kind)
                raise
            finally:
                self.runner.when_idle(lambda: self._save_study(log))

    def _save_study(self, log: StudyLog) -> None:
        with quiet_optuna():  # (a live run's comes after the search, at the training's end)
            unsaved = log.save()
        if unsaved and self.observer:
            self.observer.note(unsaved)

    def _seed_and_explore(
        self, log: StudyLog, space: SearchSpace, est: Estimates | None
    ) -> tuple[str, SearchSpace]:
        """Stop at once when the loader keeps up; else enqueue the seeds and explore."""
        base = next((t for t in self.ledger.trials if t.phase == "baseline"), None)
        if len(space.batch_sizes) == 1 and loader_keeps_up(base, est):
            return "compute_bound", space  # nothing to gain: confirm the baseline and stop
        if self.observer:
            self.observer.phase("explore")
        # The batch sizes that ran out of GPU memory in the opening (a replay) are no seeds'
        # extremes: the largest that may fit is (its loading in-process, its own workers).
        fit = tuple(b for b in space.batch_sizes if self.ledger.frontier.may_win(Config(b)))
        seeds = (
            seed_configs(
                est,
                dataclasses.replace(space, batch_sizes=fit) if fit else space,
                batch_size=self.baseline.batch_size,
                epoch_length_known=bool(self.runner.epoch_samples),
                window_s=self.settings.trial_window_s,
            )
            if est
            else []
        )
        self.agenda.add_seeds(seeds)
        return self._explore(log, space, est)

    def _run(self, log: StudyLog, t0: float) -> SearchOutcome:
        space, est = self.opening.open(log)
        self._est = est
        reason, space = self._seed_and_explore(log, space, est)
        winner: Config | None
        if self.settings.live and not self._beats_baseline():
            # Nothing the run tried beat its own setting: rounds of slower settings would only
            # slow the training down. The run goes on with its own.
            confirmation, winner = None, self.baseline
        else:
            if self.observer:
                self.observer.phase("confirm")
            confirmation = self._confirm(log, space, baseline_only=reason == "compute_bound")
            winner = (confirmation.winner if confirmation else None) or self._best_not_failed(
                confirmation
            )
        if self.settings.live and winner is not None:
            winner = self._live_choice(winner, confirmation)
        if winner is None:
            causes = sorted({kind for _, kind in self.ledger.frontier.failed})
            ran = [t for t in self.ledger.trials if t.skipped is None and not t.kept]
            if [t.phase for t in ran] == ["baseline"] and ran[0].failure is not None:
                # One slow trial of the user's own settings took the whole budget.
                raise LoadertuneError(
                    f"your own settings failed ({ran[0].failure.kind}: {ran[0].failure.message}) "
                    "and took the whole budget, so no other setting could run: give a larger "
                    "--budget, or start the script from settings that reach their first "
                    "batches sooner (a smaller batch size, or fewer workers)"
                )
            raise LoadertuneError(
                f"every trial failed ({', '.join(causes) or 'no result'}); "
                "see the trial table for each cause and its fix"
            )
        return SearchOutcome(
            baseline=self.baseline,
            winner=winner,
            trials=self.ledger.trials,
            confirmation=confirmation,
            estimates=est,
            space=space,
            stop_reason=reason,
            settings=self.settings,
            storage=self.storage,
            elapsed_s=self.clock() - t0,
            n_previous_trials=log.n_at_start,
            user_batch_size=self.baseline.batch_size,
            values=dict(self.ledger.values),
            study_started=log.started,
        )
