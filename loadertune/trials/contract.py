"""What a trial runner takes (a setting, a window, limits) and gives back (a result).

Two runners execute trials: :class:`loadertune.trials.inline.InlineRunner` (a dataset and a step
in this process, for ``tune_loader``) and :class:`loadertune.trials.script.runner.ScriptRunner` (an
unmodified training script in its own process group, many settings per process where the loader
allows it). A runner measures one setting (``run``) or several in turn (``run_many``: the same,
one at a time, unless a runner has something better to do with a known sequence). Both report
to a
:class:`~loadertune.trials.supervisor.Supervisor`, which samples
the process tree, enforces the start-up limit, the hang limit, the trial deadline and the host
memory budget, and forwards sub-window rates to the search for pruning. A trial never raises for a
bad setting: it returns a :class:`TrialResult` with a ``failure``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loadertune.config import Config
from loadertune.errors import UserCodeError
from loadertune.measure.failures import Failure, FailureKind
from loadertune.measure.meter import Measurement, WindowSpec
from loadertune.measure.resources import ResourceUsage

ShouldStop = Callable[[int, float], bool]  # (sub-window index, running samples/s) -> prune?


@dataclass
class Limits:
    """When a running trial is stopped.

    Attributes:
        timeout_s: the whole trial, start to end.
        startup_s: from start to the first batch (worker start-up, script import, CUDA init).
        hang_s: with no sign of progress after the first batch.
        memory_budget_bytes: PSS of the process tree; None for no limit.
        rest_s: how long the loader may rest between two of its epochs in a trial (the loop
            is elsewhere: validation); None: ``hang_s``. A whole-epoch trial begun mid-epoch
            always waits for the next epoch, which comes after such a rest.
        ends_by: a ``time.monotonic()`` value, the search's deadline: a trial still running
            then is stopped and recorded as skipped (:func:`cut`), neither a failure of its
            setting nor a rate. None: no deadline.
    """

    timeout_s: float = 60.0
    startup_s: float = 30.0
    hang_s: float = 10.0
    memory_budget_bytes: int | None = None
    rest_s: float | None = None
    ends_by: float | None = None

    @property
    def worker_timeout_s(self) -> float:
        """The ``timeout`` a trial's DataLoader gets (a hung worker becomes an error in
        ``next()``): it bounds every wait for a batch, the first of an epoch included, which
        waits for the workers to start. Under ``spawn`` or ``forkserver`` (Python 3.14's
        default) each worker imports torch and the script again, which can take several
        seconds on a small machine, longer than ``hang_s``. So it is the start-up limit where
        that is the longer; a hang after the first batch is still caught at ``hang_s`` by the
        supervisor where one watches the trial."""
        return max(self.hang_s, self.startup_s)


@dataclass
class TrialResult:
    """What one trial measured, or why it failed.

    ``params``, ``samples_per_s`` and ``error`` are the fields other tools read.
    """

    config: Config
    phase: str = "search"  # "probe", "baseline", "search", "confirm", "replay"
    measurement: Measurement | None = None
    resources: ResourceUsage | None = None
    failure: Failure | None = None
    pruned: bool = False
    skipped: str | None = None  # the reason a setting was not run (never tried)
    wall_s: float = 0.0  # what the trial cost, start-up and teardown included
    epoch_samples: int | None = None
    cuda_peak_allocated_bytes: int | None = None
    cuda_peak_reserved_bytes: int | None = None
    cuda_device: str | None = None  # PCI bus id of the device the step used
    cuda_capacity_bytes: int | None = None  # free GPU memory + this process's reserved, at the end
    transfer: dict[str, float] | None = None  # replay only: host-to-device rates of one batch
    number: int | None = None  # the Optuna trial number, when the search recorded it
    bytes_per_sample: float | None = None
    orphans_killed: int = 0
    kept: bool = False  # measured by an earlier run of the search's study, not by this one
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, Any]:
        return self.config.loader_kwargs()

    @property
    def ok(self) -> bool:
        return self.failure is None and self.skipped is None and self.measurement is not None

    @property
    def status(self) -> str:
        if self.skipped is not None:
            return "skipped"
        if self.failure is not None:
            return "failed"
        return "pruned" if self.pruned else "ok"

    @property
    def error(self) -> str | None:
        """None, or the failure's short kind (``"worker_killed"``, ``"timeout"``, ``"oom"``...)."""
        return self.failure.kind if self.failure is not None else None

    @property
    def samples_per_s(self) -> float | None:
        """Steady-state samples/s over the window (None if the trial failed or was not run)."""
        if self.failure is not None or self.measurement is None:
            return None
        return self.measurement.samples_per_s

    @property
    def epoch_startup_s(self) -> float:
        """Seconds each epoch spends before its first batch with this setting.

        Measured on a re-entry (``iter(loader)`` again) when the trial did one; otherwise the
        first batch's wait, which non-persistent workers pay at every epoch.
        """
        m = self.measurement
        if m is None or self.config.num_workers == 0:
            return 0.0
        if m.reentry_s:
            return statistics.median(m.reentry_s)
        return 0.0 if self.config.persistent_workers else m.first_batch_s

    @property
    def epoch_samples_per_s(self) -> float | None:
        """Samples/s over a whole epoch, start-up included: what the search maximises.

        Equal to :attr:`samples_per_s` when the epoch length is unknown.
        """
        rate = self.samples_per_s
        if rate is None or rate <= 0 or not self.epoch_samples:
            return rate
        return self.epoch_samples / (self.epoch_samples / rate + self.epoch_startup_s)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (for Optuna's user attributes and the recommendation file)."""
        return {
            "params": self.params,
            "phase": self.phase,
            "status": self.status,
            "samples_per_s": self.samples_per_s,
            "epoch_samples_per_s": self.epoch_samples_per_s,
            "epoch_startup_s": self.epoch_startup_s if self.measurement else None,
            "error": self.error,
            "failure": self.failure.to_dict() if self.failure else None,
            "skipped": self.skipped,
            "low_confidence": self.measurement.low_confidence if self.measurement else None,
            "whole_epoch": self.measurement.whole_epoch if self.measurement else None,
            "measurement": self.measurement.to_dict() if self.measurement else None,
            "resources": self.resources.to_dict() if self.resources else None,
            "wall_s": self.wall_s,
            "cuda_peak_allocated_bytes": self.cuda_peak_allocated_bytes,
            "cuda_peak_reserved_bytes": self.cuda_peak_reserved_bytes,
            "cuda_capacity_bytes": self.cuda_capacity_bytes,
            "transfer": self.transfer,
            "bytes_per_sample": self.bytes_per_sample,
            "orphans_killed": self.orphans_killed,
            "number": self.number,
            "ran": self.extra.get("ran"),  # script trials: what the loader really ran with
            "pids": self.extra.get("pids"),  # script trials: the processes of its loop
            "epoch_samples": self.epoch_samples,
            "cuda_device": self.cuda_device,
            "kept": self.kept,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        """The result :meth:`to_dict` wrote (how a search's study keeps its probe's trials)."""
        failure = data.get("failure")
        if failure:
            kind = failure["kind"]
            kind = FailureKind(kind) if kind in FailureKind._value2member_map_ else kind
            failure = Failure(**{**failure, "kind": kind})
        measurement, resources = data.get("measurement"), data.get("resources")
        return cls(
            Config.from_kwargs(data["params"]),
            phase=data["phase"],
            measurement=Measurement.from_dict(measurement) if measurement else None,
            resources=ResourceUsage.from_dict(resources) if resources else None,
            failure=failure or None,
            pruned=data["status"] == "pruned",
            skipped=data.get("skipped"),
            wall_s=data.get("wall_s") or 0.0,
            epoch_samples=data.get("epoch_samples"),
            cuda_peak_allocated_bytes=data.get("cuda_peak_allocated_bytes"),
            cuda_peak_reserved_bytes=data.get("cuda_peak_reserved_bytes"),
            cuda_device=data.get("cuda_device"),
            cuda_capacity_bytes=data.get("cuda_capacity_bytes"),
            transfer=data.get("transfer"),
            number=data.get("number"),
            bytes_per_sample=data.get("bytes_per_sample"),
            orphans_killed=data.get("orphans_killed") or 0,
            kept=bool(data.get("kept")),
            extra={key: data[key] for key in ("ran", "pids") if data.get(key)},
        )


class TrialRunner(Protocol):
    """Runs trials for one workload, as the search asks: several settings in turn
    (:meth:`run_many`). ``epoch_samples`` is None when the length is unknown. Every runner is a
    :class:`BaseRunner`, which also measures one setting alone (:meth:`BaseRunner.run`)."""

    epoch_samples: int | None  # samples per epoch at the baseline's batch size; None if unknown
    uses_cuda: bool  # pin_memory is worth searching
    in_process: bool  # trials run in this process (their memory budget sits on top of ours)
    replays: bool  # can replay one batch through the step (phase "replay")
    bytes_per_sample: float | None  # size of one collated sample, once a trial has seen one
    batch_size_fixed: str | None  # why the batch size cannot be changed (None: it can)
    loader_recreated: bool  # the loader is created again at each epoch (persistence is moot)
    target_note: str | None  # which loader is tuned, in a line, once the first trial knows

    @property
    def user_error(self) -> type[UserCodeError]:
        """The exception raised when the user's own code fails."""

    def state(self) -> dict[str, Any]:
        """What the trials so far taught the runner (a script's loader, a sample's size), as
        plain data: a search keeps it in its study with its probe's trials."""

    def restore(self, state: Mapping[str, Any]) -> bool:
        """Take back what :meth:`state` gave (a resumed search, which runs no baseline again);
        False when it no longer holds (the script changed since), and nothing was taken."""

    def run_many(
        self,
        requests: Sequence[tuple[Config | None, TrialRequest]],
        on_result: OnResult | None = None,
    ) -> list[TrialResult]:
        """Measure several settings in turn; ``on_result`` hears each result as it comes and
        returns False to stop there. Returns the results of the trials that ran."""

    def close(self) -> None:
        """Release what the runner holds (nothing of a trial may be left by then)."""

    def when_idle(self, work: Callable[[], None]) -> None:
        """Do ``work`` (writing the study) where it slows no training down."""


@dataclass(frozen=True)
class TrialRequest:
    """What one :meth:`TrialRunner.run` call asks for besides the setting."""

    window: WindowSpec
    limits: Limits
    phase: str = "search"
    should_stop: ShouldStop | None = None


OnResult = Callable[[TrialResult], bool]  # one trial's result -> go on with the next?


def cut(result: TrialResult) -> TrialResult:
    """``result``, skipped when the search's deadline stopped it (``Limits.ends_by``): what
    its window had measured is no rate of its setting, and the stop no failure of it."""
    if result.failure is not None and result.failure.kind == FailureKind.CUT:
        result.skipped, result.failure, result.measurement = result.failure.message, None, None
    return result


def empty_window(result: TrialResult) -> TrialResult:
    """``result``, failed when its window received no sample: a rate of 0 is no measurement
    (a script behind a thread prefetcher can leave a window empty), and recorded as "ok" the
    search would take it for the slowest setting of all."""
    m = result.measurement
    if result.failure is None and m is not None and not m.samples_per_s > 0:
        result.failure = Failure(
            FailureKind.TRIAL_CRASHED,
            f"the measured window received no batch in {m.window_s:.2f} s: no rate to record",
            "if it repeats, run the script once with these settings to see what its loop does",
        )
    return result


class BaseRunner:
    """What both runners do around a trial: time the whole of it (start-up and teardown
    included) and pass on what they know of a sample's size. A runner implements
    :meth:`_trial`; see :class:`TrialRunner` for the rest."""

    bytes_per_sample: float | None = None
    replays = True
    batch_size_fixed: str | None = None
    loader_recreated = False
    target_note: str | None = None

    def run(
        self,
        config: Config | None,
        *,
        window: WindowSpec,
        limits: Limits,
        phase: str = "search",
        should_stop: ShouldStop | None = None,
    ) -> TrialResult:
        """Measure ``config`` (None: the workload's own settings). ``phase="replay"`` replays one
        cached batch through the step instead of loading."""
        t0 = time.perf_counter()
        request = TrialRequest(window, limits, phase, should_stop)
        result = empty_window(cut(self._trial(config, request)))
        result.bytes_per_sample = self.bytes_per_sample
        result.wall_s = time.perf_counter() - t0
        return result

    def state(self) -> dict[str, Any]:
        """See :meth:`TrialRunner.state`."""
        return {"bytes_per_sample": self.bytes_per_sample}

    def restore(self, state: Mapping[str, Any]) -> bool:
        """See :meth:`TrialRunner.restore`."""
        self.bytes_per_sample = self.bytes_per_sample or state.get("bytes_per_sample")
        return True

    def run_many(
        self,
        requests: Sequence[tuple[Config | None, TrialRequest]],
        on_result: OnResult | None = None,
    ) -> list[TrialResult]:
        """See :meth:`TrialRunner.run_many`: here, one :meth:`run` after the other."""
        results = []
        for config, request in requests:
            result = self.run(
                config,
                window=request.window,
                limits=request.limits,
                phase=request.phase,
                should_stop=request.should_stop,
            )
            results.append(result)
            if on_result is not None and not on_result(result):
                break
        return results

    def when_idle(self, work: Callable[[], None]) -> None:
        """See :meth:`TrialRunner.when_idle`: here at once (the trials are over)."""
        work()

    def _trial(self, config: Config | None, request: TrialRequest) -> TrialResult:
        raise NotImplementedError


def window_for(
    config: Config, *, window_s: float, min_warmup: int | None = None, whole_epoch: bool = False
) -> WindowSpec:
    """A window after a warm-up of one round of the workers (a batch from each) and one more,
    or sooner when the buffer is found empty after every worker has delivered a batch; it holds
    whole rounds of the workers, at least one.

    A trial's workers start afresh, so its buffer starts empty: at most the first round is
    ahead of the loop (the workers made it side by side while the loop waited for its first
    batch). Draining every batch in flight (``workers x prefetch_factor``) costs a
    compute-bound trial many steps and measures no truer. Shorter is biased low: the first
    round, made while every worker starts at once, is slow. ``python scripts/bench_warmup.py``
    compares these warm-ups against a long one.

    Without workers (loading in the loop's own process) there is no buffer to drain: one batch
    of warm-up after the first (``min_warmup`` None: 1 without workers, 2 with), in the trial
    process as in the search's plan, so that a slow baseline's trial takes the time the
    search budgeted for it.

    ``whole_epoch``: the window is an epoch, start to end, expected to take ``window_s``
    (:class:`~loadertune.measure.window.WindowSpec`)."""
    workers = config.num_workers
    if min_warmup is None:
        min_warmup = 2 if workers else 1
    if whole_epoch:
        return WindowSpec(
            warmup_batches=0,
            window_s=window_s,
            round_batches=max(1, workers),
            min_window_batches=1,
            whole_epoch=True,
        )
    return WindowSpec(
        warmup_batches=max(min_warmup, workers + 1),
        window_s=window_s,
        settled_after=max(min_warmup, workers),
        round_batches=max(1, workers),
        min_window_batches=max(4, workers),
    )
