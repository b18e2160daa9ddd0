"""The search's opening: a new study's baseline and probe, or what an earlier run left.

A new study opens with the user's own settings (the baseline: a script's are learnt from this
first trial), then ``num_workers=0`` and ``1`` and the replay (see :mod:`loadertune.search.probe`),
which give the space, the estimates and the seeds; all of it is recorded in the study. A study an
earlier run left is resumed from its space, estimates and values, and probes nothing again.

Each trial of the opening is kept in the study as soon as it ends, with what the runner learnt
from it (:meth:`~loadertune.search.study.StudyLog.keep_opening`), and again when the search is
interrupted: a run stopped during the probe (Ctrl-C, SIGTERM, or worse) leaves them to the next,
which measures only the probe's trials still missing, and no run of the study measures its
baseline twice. The kept trials are not taken when they no longer describe the workload: the
script changed since, or the baseline asked for is another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from loadertune.config import Config
from loadertune.errors import LoadertuneError
from loadertune.hardware import Hardware
from loadertune.search import plan
from loadertune.search.ledger import Ledger
from loadertune.search.outcome import Observer
from loadertune.search.probe import Estimates, estimate, space_for
from loadertune.search.settings import SearchSettings
from loadertune.search.space import SearchSpace
from loadertune.search.study import Previous, StudyLog
from loadertune.trials import TrialResult, TrialRunner

REPLAY_LOAD_S = 1.0  # the replay's batch may take this long to load
OPENING_PHASES = ("baseline", "probe", "replay")


class Measure(Protocol):
    """The search's way of running trials in turn (``Search._measure_many``)."""

    def __call__(
        self,
        planned: Sequence[tuple[Config | None, str]],
        *,
        go_on: Callable[[TrialResult], bool] | None = None,
    ) -> list[TrialResult]: ...


class Opening:
    """A search's opening; see the module docstring.

    Args:
        runner: runs trials of the workload.
        hardware: this machine.
        baseline: the user's own settings; None when only the first trial can tell them.
        batch_sizes: the batch sizes to consider (the baseline's is added).
        settings: budget and policy.
        ledger: the search's ledger, which hears every trial.
        measure: runs trials (the search's, which learns from each).
        fits: whether ``n`` more trials fit in what is left of the budget.
        trial_fits: whether ``n`` trials as long as one of this setting, at this rate
            (samples/s), fit in it.
        observer: hears progress (None: silent).
    """

    def __init__(
        self,
        runner: TrialRunner,
        *,
        hardware: Hardware,
        baseline: Config | None,
        batch_sizes: Sequence[int],
        settings: SearchSettings,
        ledger: Ledger,
        measure: Measure,
        fits: Callable[[int], bool],
        trial_fits: Callable[[Config, float, int], bool],
        observer: Observer | None = None,
    ) -> None:
        self.runner = runner
        self.hw = hardware
        self.known = baseline  # the baseline, once known
        self._batch_sizes = tuple(batch_sizes)
        self.settings = settings
        self.ledger = ledger
        self._measure_many = measure
        self._fits = fits
        self._trial_fits = trial_fits
        self.observer = observer
        self.memory_budget: int | None = None
        self._log: StudyLog | None = None
        self._kept: list[TrialResult] = []  # the opening's trials an earlier run kept, taken
        self._n_written = 0  # the opening's trials last written to the study

    @property
    def baseline(self) -> Config:
        if self.known is None:
            raise RuntimeError("the baseline is known after the first trial")
        return self.known

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({*self._batch_sizes, self.baseline.batch_size}))

    def open(self, log: StudyLog) -> tuple[SearchSpace, Estimates | None]:
        """The space and estimates to explore: a new study's probe (less what an interrupted
        run kept of it), or an earlier run's."""
        self._log = log
        self._take_kept(log)
        previous = log.previous()
        return self._start(log) if previous is None else self._resume(previous)

    def keep(self) -> None:
        """Keep the opening's trials so far in the study (each one as it ends; and on Ctrl-C,
        which may come between a trial's end and its keeping)."""
        trials = [t for t in self.ledger.trials if t.phase in OPENING_PHASES]
        if self._log is not None and len(trials) != self._n_written:
            self._log.keep_opening(trials, self.runner.state())
            self._n_written = len(trials)

    def _kept_one(self, result: TrialResult) -> bool:
        self.keep()
        return True

    def _take_kept(self, log: StudyLog) -> None:
        """Take back the opening's trials an earlier run kept, when they describe this workload
        still: a baseline that measured the settings asked for, and a runner that takes its
        state back (a script and its own modules unchanged since)."""
        kept, state = log.kept_opening()
        base = next((t for t in kept if t.phase == "baseline"), None)
        if base is None or not base.ok or self.known not in (None, base.config):
            return
        if not self.runner.restore(state):
            if self.observer:
                self.observer.note(
                    "the script, or a module of its own that it imports, changed since the "
                    "earlier run of the study: "
                    "its baseline and probe, kept from that run, are measured again"
                )
            return
        self._kept = kept
        self._n_written = len(kept)
        for result in kept:
            self.ledger.add_kept(result)
        if self.observer:
            phases = ", ".join(f"{t.phase} {t.config.label()}" for t in kept)
            self.observer.note(f"kept from an earlier run of the study, not run again: {phases}")
        self._learn_baseline(base)

    def _kept_trial(self, phase: str, config: Config | None = None) -> TrialResult | None:
        return next(
            (t for t in self._kept if t.phase == phase and config in (None, t.config)), None
        )

    def _measure(self, config: Config | None, phase: str) -> TrialResult:
        return self._measure_many([(config, phase)], go_on=self._kept_one)[0]

    def _measure_baseline(self) -> TrialResult:
        """Measure the user's settings; a script's are learnt from this first trial."""
        base = self._measure(self.known, "baseline")
        if self.known is None and "loader" not in base.extra:
            why = base.failure.message if base.failure else "it reported no loader"
            raise LoadertuneError(f"could not measure the workload's own settings: {why}")
        self._learn_baseline(base)
        return base

    def _learn_baseline(self, base: TrialResult) -> None:
        """The user's settings, where only the baseline's trial tells them (a script's)."""
        if self.known is not None:
            return
        self.known = base.config
        if self.observer and self.runner.target_note:
            self.observer.note(self.runner.target_note)
        fixed = self.runner.batch_size_fixed
        if fixed and len(self.batch_sizes) > 1:
            self._batch_sizes = ()
            if self.observer:
                self.observer.note(f"batch size left out of the search: {fixed}")

    def _leave_out_past_the_epoch(self, epoch_samples: int | None) -> None:
        """Batch sizes offered above the samples of an epoch (``--batch-sizes 100000`` on 384
        samples) make one short batch an epoch, or none with ``drop_last``: left out, and said
        (they had sat in the space, never tried and never mentioned)."""
        if not epoch_samples:
            return
        past = [b for b in self._batch_sizes if b > epoch_samples and b != self.baseline.batch_size]
        if not past:
            return
        self._batch_sizes = tuple(b for b in self._batch_sizes if b not in past)
        if self.observer:
            sizes = ", ".join(map(str, past))
            self.observer.note(
                f"batch size {sizes} left out of the search: an epoch holds {epoch_samples} samples"
            )

    def _probe(
        self,
    ) -> tuple[TrialResult, TrialResult | None, TrialResult | None, TrialResult | None]:
        """Baseline, num_workers=0 and 1 at the smallest batch offered, and the replay (see
        :meth:`_replay_batch`); with several batch sizes, a second replay at another (see
        :meth:`_second_replay_batch`).

        Only the baseline must succeed; a failed probe or replay, or one that does not fit in
        the budget left, leaves the estimates out (the search goes on without its seeds and
        ceilings) rather than ending the search.
        """
        base = self._kept_trial("baseline") or self._measure_baseline()
        self._leave_out_past_the_epoch(base.epoch_samples)
        # The probe's figures are per sample: at the smallest batch offered its trials take the
        # least time (slow loading at a large batch takes seconds a batch).
        bs = min(self.batch_sizes)
        w0 = base if self.baseline.num_workers == 0 else None  # pinned or not: the same loading
        if w0 is None:
            w0 = self._kept_trial("probe", Config(bs))
        if w0 is None:
            if not self._trial_fits(Config(bs), _in_process_floor(base), 1):
                return base, None, None, None
            w0 = self._measure(Config(bs), "probe")
        cap = self.settings.max_workers
        # One worker tells a worker's memory and hand-over cost; a baseline with workers told
        # both already, and a tight budget keeps its trials for the exploration: the probe
        # runs where it and the first explored settings, each as long, fit.
        one = Config(bs, 1, 2, False, False)
        w1 = self._kept_trial("probe", one) or (base if self.baseline.num_workers else None)
        with_w1 = (
            w1 is None
            and (cap is None or cap >= 1)
            and self.baseline.num_workers == 0
            and self._fits(2 + plan.MIN_EXPLORED)
            and self._trial_fits(one, w0.samples_per_s or 0.0, 1 + plan.MIN_EXPLORED)
        )
        planned: list[tuple[Config, str]] = []
        kept = {t.config: t for t in self._kept if t.phase == "replay"}
        first = second = None
        if w0.ok and self.runner.replays and (kept or self._fits(int(with_w1) + 1)):
            first = self._replay_batch(w0)
            if Config(first) not in kept:
                planned.append((Config(first), "replay"))
            second = self._second_replay_batch(w0, first)
            fits = self._fits(len(planned) + int(with_w1) + 2)
            if second is not None and Config(second) not in kept and fits:
                planned.append((Config(second), "replay"))
        if with_w1:
            planned.append((one, "probe"))
        ran = self._measure_many(planned, go_on=self._kept_one) if planned else []
        w1 = next((r for r in ran if r.phase == "probe"), w1)
        asked = [config for config, phase in planned if phase == "replay"]
        done = [r for r in ran if r.phase == "replay"]  # fewer when the batch stopped early
        replays = {**kept, **dict(zip(asked, done, strict=False))}
        replay = replays.get(Config(first)) if first is not None else None
        replay2 = replays.get(Config(second)) if second is not None else None
        while (
            first is not None
            and second is not None
            and replay2 is not None
            and _out_of_gpu_memory(replay2)
            and (lower := self._below_oom(w0, first, second)) is not None
            and self._fits(2)
        ):
            # The second replay's batch ran out of GPU memory: the step's cost per batch is
            # still unknown, and the largest batch that fits is the far end a batch-size search
            # must measure. Replays are short: the next size down, again.
            second = lower
            replay2 = self._measure(Config(second), "replay")
        return w0, (w1 if w1 is not None and w1.ok else None), replay, replay2

    def _below_oom(self, w0: TrialResult, first: int, failed: int) -> int | None:
        """The largest batch size offered below ``failed`` (which ran out of GPU memory) that
        loads in :data:`REPLAY_LOAD_S`, if it is above ``first`` (the first replay's)."""
        return max((b for b in self._quick_to_load(w0) if first < b < failed), default=None)

    def _quick_to_load(self, w0: TrialResult) -> list[int]:
        """The batch sizes offered whose one batch loads in :data:`REPLAY_LOAD_S` in the main
        process (at the ``num_workers=0`` trial's cost per sample)."""
        load_s = _load_s_per_sample(w0)
        return [b for b in self.batch_sizes if b * load_s <= REPLAY_LOAD_S]

    def _replay_batch(self, w0: TrialResult) -> int:
        """The batch size the replay runs at: the user's, where the consumer's ceiling matters;
        but its one batch is loaded in the main process first, and at a large batch of slow
        samples that takes seconds of the budget: then the largest batch offered below the
        user's that loads in :data:`REPLAY_LOAD_S` (the smallest at worst). The ceiling it gives
        is then low for the larger batches, which the search measures anyway."""
        user = self.baseline.batch_size
        quick = [b for b in self._quick_to_load(w0) if b <= user]
        return max(quick, default=min(self.batch_sizes))

    def _second_replay_batch(self, w0: TrialResult, first: int) -> int | None:
        """With several batch sizes offered, the batch size of a second replay: the largest
        offered that loads in :data:`REPLAY_LOAD_S`, or else the smallest, if it is not
        ``first``. Two batch sizes tell the step's fixed cost per batch, and so its rate at
        every batch size (the step's rate per sample grows with the batch when it has one)."""
        if len(self.batch_sizes) < 2:
            return None
        second = max(self._quick_to_load(w0), default=min(self.batch_sizes))
        if second == first:
            second = min(self.batch_sizes)
        return None if second == first else second

    def _build_space(
        self, w0: TrialResult, w1: TrialResult | None, replay: TrialResult | None
    ) -> SearchSpace:
        return space_for(
            w0,
            w1,
            replay,
            hw=self.hw,
            settings=self.settings,
            batch_sizes=self.batch_sizes,
            uses_cuda=self.runner.uses_cuda,
            # a loader created again at each epoch keeps no workers between epochs
            epoch_samples=None if self.runner.loader_recreated else self.runner.epoch_samples,
            bytes_per_sample=self.runner.bytes_per_sample,
            persistent_workers=self.baseline.persistent_workers,
            ram_budget_bytes=self.memory_budget,
        )

    def _start(self, log: StudyLog) -> tuple[SearchSpace, Estimates | None]:
        """A new study: probe, build the space, estimate, and record it all."""
        if self.observer:
            self.observer.phase("probe")
        w0, w1, replay, replay2 = self._probe()
        space = self._build_space(w0, w1, replay)
        est = (
            estimate(
                w0=w0,
                w1=w1,
                replay=replay,
                usable_cpus=self.hw.usable_cpus,
                max_workers=space.max_workers,
                pinned=True in space.pin_memory,
                replay2=replay2,
            )
            if w0.ok and replay is not None and replay.ok
            else None
        )
        log.save_probe(space, est, self.baseline)
        for result in self.ledger.trials:
            if result.phase in ("baseline", "probe"):
                log.record(space, result)
        return space, est

    def _resume(self, previous: Previous) -> tuple[SearchSpace, Estimates | None]:
        """An earlier run's study: its space, estimates and values, and no probe again."""
        self.ledger.add_previous(previous)
        if self.known is None:
            self._measure_baseline()
        space = dataclasses.replace(
            previous.space,
            batch_sizes=tuple(sorted({*previous.space.batch_sizes, *self.batch_sizes})),
        )
        return space, previous.estimates


def _out_of_gpu_memory(result: TrialResult) -> bool:
    return result.failure is not None and result.failure.kind == "oom"


def _load_s_per_sample(w0: TrialResult) -> float:
    """Seconds to load a sample in the main process, from the ``num_workers=0`` trial (0 when
    it measured nothing)."""
    m = w0.measurement
    if m is None or not m.n_samples:
        return 0.0
    return m.window_s * m.blocked_fraction / m.n_samples


def _in_process_floor(base: TrialResult) -> float:
    """The least a loop that loads in its own process should make, from the baseline's rate
    ``R`` with ``n`` workers (0 when it has none): each worker loads at ``R / n`` or more and
    the step runs at ``R`` or more, so both in one process make ``R / (n + 1)`` or more."""
    if not base.ok or base.measurement is None:
        return 0.0
    return base.measurement.samples_per_s / (base.config.num_workers + 1)
