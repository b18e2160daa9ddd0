"""Watch a running trial from the parent's side: sample its processes, and say when to stop it.

Used by both runners: :class:`Supervisor` is the meter's sink (events and sub-window rates), and
the runner's own loop asks :meth:`Supervisor.expired` often; a failure returned there ends the
trial as that failure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from loadertune.measure import failures
from loadertune.measure.failures import Failure, FailureKind
from loadertune.measure.resources import ResourceSampler, ResourceUsage, process_tree
from loadertune.trials import leftovers
from loadertune.trials.contract import Limits, ShouldStop

# Causes vague enough that what the sampler saw may name a sharper one
_VAGUE = frozenset({FailureKind.TIMEOUT, FailureKind.WORKER_CRASHED, FailureKind.TRIAL_CRASHED})


class Supervisor:
    """Hears a running trial (it is the meter's sink), samples it, and says when to stop it.

    Used from the runner's own loop: call :meth:`expired` often; when it returns a failure, stop
    the trial and record that failure.

    A loader whose epoch ended inside the window (the meter's ``rest``) and is not iterated
    again within ``limits.rest_s`` (``hang_s`` unless set) ends the trial as
    :func:`~loadertune.measure.failures.rested` (a trial cannot wait for a loader used that
    seldom), unless ``rests_fail`` is False: a real training run
    (:mod:`loadertune.trials.hotswap.live_runner`) is not stopped for its validation.

    ``find_gpu`` names the NVML index of the trial's GPU, asked at the window's start while none
    is known (a trial in this process may be the first to use CUDA).
    """

    def __init__(
        self,
        root_pid: int,
        *,
        limits: Limits,
        should_stop: ShouldStop | None = None,
        gpu_index: int | None = None,
        find_gpu: Callable[[], int | None] | None = None,
        rests_fail: bool = True,
    ) -> None:
        self.limits = limits
        self.rests_fail = rests_fail
        self._should_stop = should_stop
        self._find_gpu = find_gpu
        self.sampler = ResourceSampler(
            root_pid, budget_bytes=limits.memory_budget_bytes, gpu_index=gpu_index
        )
        self.t_start = time.monotonic()
        self.last_sign = self.t_start
        self.resting_since: float | None = None  # the loader's epoch ended; no new one yet
        self.loader_name = "the tuned DataLoader"  # for messages; the runner names it
        self.workers: int | None = None  # the trial's workers, for messages; None: unknown
        self.started = False  # the first batch arrived
        self.pruned = False
        self._present: set[int] = set()  # the processes of the tree before the trial

    def __enter__(self) -> Supervisor:
        self._present = {p.pid for p in process_tree(self.sampler.root)}
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop sampling, and remove what the trial's dead processes left in shared memory and
        ``/tmp`` (a worker the OOM killer ended mid-batch: :mod:`loadertune.trials.leftovers`);
        processes there before the trial are not the trial's."""
        self.sampler.__exit__(*exc)
        leftovers.remove_leftovers(self.sampler.seen_pids - self._present)

    # -- the meter's sink ------------------------------------------------------------------------

    def event(self, name: str) -> None:
        self.last_sign = time.monotonic()
        self.resting_since = self.last_sign if name == "rest" else None
        if name == "first_batch":
            self.started = True
        elif name == "window_start":
            if self.sampler.gpu_index is None and self._find_gpu is not None:
                self.sampler.gpu_index = self._find_gpu()
            self.sampler.window_started()

    def progress(self, index: int, samples_per_s: float) -> bool:
        self.last_sign = time.monotonic()
        self.resting_since = None
        if self._should_stop is not None and self._should_stop(index, samples_per_s):
            self.pruned = True
            return False
        return True

    # -- decisions -------------------------------------------------------------------------------

    def window_ended(self, window_s: float | None = None) -> ResourceUsage:
        """Take the end-of-window snapshot; call while the workers are still alive
        (``window_s``: see :meth:`ResourceSampler.window_ended`)."""
        return self.sampler.window_ended(window_s)

    def usage_so_far(self) -> ResourceUsage:
        """What the sampler saw of a trial that ended without a window's end: peaks, and the
        tree's memory when it crossed the budget."""
        return self.sampler.usage

    def explain(self, failure: Failure, output: str = "") -> Failure:
        """A sharper cause for a vague failure, from what the sampler saw.

        A worker that runs out of file descriptors dies in its feeder thread and the loop just
        waits: the hang is really "too many open files" when the tree came near RLIMIT_NOFILE or
        the trial's output says so.
        """
        if failure.kind not in _VAGUE:
            return failure
        usage = self.sampler.usage
        near_limit = bool(usage.open_files_limit) and usage.max_open_files >= 0.9 * (
            usage.open_files_limit or 0
        )
        if near_limit or "Too many open files" in output:
            found = failures.classify_text(
                "Too many open files", where="loader", detail=failure.detail or output
            )
            return dataclasses.replace(
                found,
                message=f"{found.message} ({usage.max_open_files} "
                f"open of a limit of {usage.open_files_limit})",
            )
        return failure

    def expired(self) -> Failure | None:
        """The reason to stop the trial now, or None."""
        now = time.monotonic()
        lim = self.limits
        if self.sampler.budget_hit is not None and lim.memory_budget_bytes is not None:
            return failures.memory_budget(self.sampler.budget_hit, lim.memory_budget_bytes)
        if lim.ends_by is not None and now > lim.ends_by:
            return Failure(
                FailureKind.CUT,
                f"stopped at the search's deadline, {now - self.t_start:.0f} s into the trial",
                "a larger budget (--budget, budget_s=) gives such a setting time to be measured",
            )
        if now - self.t_start > lim.timeout_s:
            return Failure(
                FailureKind.TIMEOUT,
                f"the trial ran past its limit of {lim.timeout_s:.0f} s",
                "a slower setting or a hang; see the next trials",
            )
        if not self.started and now - self.t_start > lim.startup_s:
            return Failure(
                FailureKind.TIMEOUT,
                f"no batch within {lim.startup_s:.0f} s of the start: the "
                "workers did not start or the first batch hung",
                failures.HANG_ADVICE,
            )
        if self.resting_since is not None:  # the loop is elsewhere (validation)
            rest_s = lim.hang_s if lim.rest_s is None else lim.rest_s
            if self.rests_fail and now - self.resting_since > rest_s:
                return failures.rested(rest_s, self.loader_name)
            return None  # a real run's trial waits for it; a trial's, up to rest_s
        if self.started and now - self.last_sign > lim.hang_s:
            return failures.hang(lim.hang_s, self.workers)
        return None
