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
import math
import os
import time
from collections.abc import Callable, Sequence

from loadertune.config import Config
from loadertune.errors import LoadertuneError, UserCodeError
from loadertune.hardware import Hardware
from loadertune.measure import failures
from loadertune.measure.resources import tree_pss
from loadertune.measure.window import WindowSpec
from loadertune.search import plan
from loadertune.search.agenda import Agenda
from loadertune.search.confirm import Confirmation, confirm, simplest_close
from loadertune.search.ledger import Ledger
from loadertune.search.limits import limits_for, overhead_s, short_epoch_s, typical_wall
from loadertune.search.opening import Opening
from loadertune.search.outcome import Observer, SearchOutcome
from loadertune.search.probe import Estimates, seed_configs
from loadertune.search.settings import SearchSettings, storage_or_fallback
from loadertune.search.space import SearchSpace
from loadertune.search.stop import loader_keeps_up
from loadertune.search.study import StudyLog, quiet_optuna
from loadertune.trials import Limits, TrialRequest, TrialResult, TrialRunner, window_for

# A best explored rate this many times a ceiling refutes the ceiling: the best of a few trials
# at a ceiling, each 5-30% off, reads up to about 1.5 times it.
CEILING_REFUTED = 1.6


class Search:
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
        self.storage = settings.storage or storage_or_fallback(observer and observer.note)
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

    def _typical_wall(self) -> float:
        """The typical trial's wall, the user's own settings' left out: one slow baseline is
        no sample of what the search runs. Before any other trial: theirs, or when longer, a
        window and the run's overhead per trial (a script's launch). Each setting's own time is
        checked where it is chosen (:meth:`_past_the_budget`, :meth:`_trial_fits`)."""
        trials = self.ledger.trials
        others = [t for t in trials if t.phase != "baseline"]
        default = self.settings.trial_window_s + 1.0 + overhead_s(trials)
        if not any(t.ok and t.phase != "replay" for t in others):
            return min(default, typical_wall(trials, default_s=default))
        return typical_wall(others, default_s=default)

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

    def _short_epoch_s(self, config: Config | None) -> float | None:
        """An epoch's time when ``config``'s epochs are short enough to measure whole: at the
        best rate so far, or at ``config``'s own when this run measured it slower (a slow
        baseline's whole epoch could take minutes where the best's takes a second) or, with no
        workers, when the probe says it is (twice its figure, at most: see
        :meth:`_in_process_ceiling`)."""
        if self.settings.live or not self.runner.epoch_samples:
            return None
        rate = self.ledger.robust_best()
        own = self.ledger.samples.get(config) if config is not None else None
        if own:
            rate = min(rate, max(own))
        elif config is not None and not config.num_workers:
            rate = min(rate, self._in_process_ceiling(config, self._est))
        return short_epoch_s(
            self.ledger.trials,
            epoch_samples=self.runner.epoch_samples,
            rate=rate,
            default_wall_s=self.settings.trial_window_s + 1.0,
        )

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

    def _fits(self, n: int = 1) -> bool:
        """``n`` more trials fit in what is left of the budget (as long as the typical one)."""
        return self._remaining() >= n * self._typical_wall()

    def _trial_fits(self, config: Config, rate: float, n: int = 1) -> bool:
        """``n`` trials as long as one of ``config`` fit in what is left of the budget, judged
        by its own expected time at ``rate`` samples/s (:func:`plan.trial_s`, plus the run's
        overhead per trial), not by the run's typical trial: trials differ thirtyfold. Without
        a rate, the typical trial decides."""
        if rate <= 0:
            return self._fits(n)
        return self._remaining() >= n * self._expected_s(config, rate, "probe")

    def _expected_s(
        self,
        config: Config,
        rate: float,
        phase: str = "search",
        *,
        loader_bound: bool = True,
        overhead: bool = True,
    ) -> float:
        """What a trial of ``config`` at ``rate`` samples/s is expected to take: its own
        (:func:`plan.trial_s`) and, with ``overhead``, the run's overhead per trial. A whole
        epoch's window lasts the epoch at ``rate``, not at the best so far's (a slow best would
        time every faster setting's epoch as long as its own)."""
        window = self._window(config, phase)
        if window.whole_epoch and rate > 0 and self.runner.epoch_samples:
            window = dataclasses.replace(window, window_s=self.runner.epoch_samples / rate)
        own = plan.trial_s(config, window, rate, loader_bound=loader_bound)
        return own + overhead_s(self.ledger.trials) if overhead else own

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

    def _past_the_budget(self, config: Config, est: Estimates | None = None) -> str | None:
        """Why ``config``'s trial would not end within the budget (the confirmation's time kept
        aside), or None. The trial's own expected time decides (:func:`plan.trial_s` and the
        run's overhead per trial), not the typical trial's, which may be a slow setting's: it
        must receive its first batch, its warm-up and its window, which at a large batch or
        with many workers can take many seconds. The rate is the highest of the best so far,
        half what the probe's estimates predict for ``config``, and what its workers make at
        the best pace per worker measured (up to the prediction; without estimates, that pace
        alone): many workers are tried because they are expected to be that much faster, and
        judging their batches by a slow best would skip every setting that could beat it.
        Half, not all, of a prediction: storage that serves few requests at once, which the
        probe cannot see, can make many workers far slower than predicted (such a trial is
        also cut at the deadline: ``Limits.ends_by``).

        Before any setting has been explored, a trial is judged at the whole prediction and
        without the run's overhead per trial, which is then the baseline's (in a script, the
        launch's start, which a hot-swapped trial does not pay): a setting skipped then ends
        the search at the baseline for certain, one that runs long is cut at the deadline,
        where the budget ends anyway."""
        rate = self.ledger.robust_best()
        loader_bound = True  # unknown: the shorter warm-up, so that no setting is skipped wrongly
        explored = self.ledger.n_explored > 0
        if est is not None:
            at = est.at(config.batch_size)
            predicted = at.predicted_samples_per_s(config.num_workers)
            if config.num_workers:
                share = 0.5 if explored else 1.0
                rate = max(rate, share * predicted, min(predicted, self._workers_pace(config)))
                # The workers set the pace only below every other ceiling; at the step's or the
                # CPUs' the buffer stays full and the whole warm-up drains it.
                loader_bound = predicted < 0.95 * at.hard_ceiling
            else:
                rate = min(rate, self._in_process_ceiling(config, est))
        elif config.num_workers:
            rate = max(rate, self._workers_pace(config))
        # its own expected time: the run's typical trial may be a slow setting's
        needed = (
            self._expected_s(config, rate, loader_bound=loader_bound, overhead=explored)
            if rate > 0
            else self._typical_wall()
        )
        if self._remaining() - self._confirm_cost() >= needed:
            return None
        return f"a trial would take about {needed:.0f} s, more than the budget has left"

    def _workers_pace(self, config: Config) -> float:
        """``config``'s workers at the most samples/s a worker made in a setting measured with
        workers (0: none yet): what times a setting of more workers without the probe's
        estimates (a slow best's rate would time it far too long), and with them up to their
        prediction."""
        pace = max(
            (v / c.num_workers for c, v in self.ledger.values.items() if c.num_workers),
            default=0.0,
        )
        return config.num_workers * pace

    @staticmethod
    def _in_process_ceiling(config: Config, est: Estimates | None) -> float:
        """The most a trial of ``config`` without workers is expected to make, for its time:
        twice the probe's model of it (loading and step take turns in one process; no worker
        count lifts it), rather than the best's rate, which may be far above it."""
        if est is None:
            return math.inf
        return 2 * est.at(config.batch_size).predicted_samples_per_s(0)

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
        # Rounds go on while a finalist may still win and time is left (``confirm`` leaves out
        # the settings clearly behind): the budget the exploration did not use decides more.
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
