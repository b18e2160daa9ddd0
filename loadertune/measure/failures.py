"""Recognise why a trial failed, from what the DataLoader and the OS leave behind.

Each failure gets a short machine-readable ``kind`` (the value of ``trial.error``), one line for
the user and the fix. A failure is either *tuning data* (this setting is bad; the search goes on)
or a *user bug* (the dataset, the step or the script fails whatever the setting; the search stops
and shows the traceback). The texts matched here are the ones torch prints; see
``tests/test_failures.py`` for each one produced for real.
"""

from __future__ import annotations

import re
import signal
import traceback
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from loadertune.units import GIB


class FailureKind(str, Enum):
    """The short, machine-readable cause of a failure: the value of ``trial.error``.

    A ``str``: a member equals its value (``FailureKind.OOM == "oom"``), and ``json.dumps``,
    ``str()`` and f-strings write the plain value.
    """

    # From what torch and the OS report about the loader and its workers
    SHM_EXHAUSTED = "shm_exhausted"
    WORKER_KILLED = "worker_killed"
    TOO_MANY_FILES = "too_many_files"
    TIMEOUT = "timeout"
    CUDA_IN_FORK = "cuda_in_fork"
    OOM = "oom"
    HOST_OOM = "host_oom"
    PICKLE_ERROR = "pickle_error"
    PIN_MEMORY_THREAD = "pin_memory_thread"
    WORKER_CRASHED = "worker_crashed"
    # The user's own code raised (user bugs)
    DATASET_ERROR = "dataset_error"
    # ... with one setting only: the last good setting loaded the batch (a live run's check)
    DATASET_ERROR_WITH_SETTING = "dataset_error_with_setting"
    STEP_ERROR = "step_error"
    SCRIPT_ERROR = "script_error"
    # Seen by the runners and their supervisor
    MEMORY_BUDGET = "memory_budget"
    TRIAL_CRASHED = "trial_crashed"
    NO_BATCHES = "no_batches"
    NO_LOADER = "no_loader"
    SCRIPT_ENDED = "script_ended"
    NOT_APPLIED = "not_applied"  # the loader ran with other settings than the trial's
    # The user's step or script raised while it received a batch size the search chose
    BATCH_SIZE_REJECTED = "batch_size_rejected"
    # The search's deadline came mid-trial (``Limits.ends_by``): no fault of the setting, and
    # never recorded as one; the runner records the trial as skipped (see ``BaseRunner.run``)
    CUT = "cut"

    def __str__(self) -> str:
        return self.value


# Kinds that mean "this setting asks for too much"; a larger setting would fail the same way.
RESOURCE_KINDS = frozenset(
    {
        FailureKind.WORKER_KILLED,
        FailureKind.SHM_EXHAUSTED,
        FailureKind.TOO_MANY_FILES,
        FailureKind.OOM,
        FailureKind.HOST_OOM,
        FailureKind.MEMORY_BUDGET,
    }
)


@dataclass(frozen=True)
class Failure:
    """Why a trial failed.

    Attributes:
        kind: short cause, a :class:`FailureKind` (``"worker_killed"``, ``"timeout"``, ``"oom"``,
            ``"dataset_error"``...); a plain string with the same value works the same.
        message: one line saying what happened.
        advice: what to do about it.
        user_bug: True when no DataLoader setting can fix it; the search stops and shows ``detail``.
        detail: the traceback or output behind it, as text.
    """

    kind: str
    message: str
    advice: str
    user_bug: bool = False
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "message": self.message,
            "advice": self.advice,
            "user_bug": self.user_bug,
            "detail": self.detail,
        }


HANG_ADVICE = (  # a hung worker or step
    "use the 'spawn' or 'forkserver' start method, set OMP_NUM_THREADS=1 and "
    "cv2.setNumThreads(0) in worker_init_fn, and check the dataset for locks or network waits"
)
_HOST_OOM_ADVICE = "use fewer workers, a smaller prefetch_factor or a smaller batch size"


class _Pattern(NamedTuple):
    kind: FailureKind
    regex: str
    message: str
    advice: str


# Tried in order against the exception text.
_PATTERNS: list[_Pattern] = [
    _Pattern(
        FailureKind.SHM_EXHAUSTED,
        r"killed by signal: Bus error|out of shared memory|No space left on device",
        "a DataLoader worker ran out of shared memory (/dev/shm)",
        "raise the shared memory limit (docker run --shm-size=8g), or use fewer workers or a "
        "smaller prefetch_factor",
    ),
    _Pattern(
        FailureKind.WORKER_KILLED,
        r"killed by signal: Killed",
        "a DataLoader worker was killed (SIGKILL), most likely by the out-of-memory killer",
        "use fewer workers or a smaller prefetch_factor; keep the dataset's samples in numpy "
        "arrays or tensors rather than Python lists and dicts (copy-on-read)",
    ),
    _Pattern(
        FailureKind.TOO_MANY_FILES,
        r"Too many open files|received 0 items of ancdata",
        "the process ran out of file descriptors",
        "raise the limit (ulimit -n 65536), or call "
        "torch.multiprocessing.set_sharing_strategy('file_system')",
    ),
    _Pattern(
        FailureKind.TIMEOUT,
        r"DataLoader timed out after",
        "no batch arrived in time: a worker hung or deadlocked",
        HANG_ADVICE,
    ),
    _Pattern(
        FailureKind.CUDA_IN_FORK,
        r"Cannot re-initialize CUDA in forked subprocess",
        "the dataset uses CUDA inside a forked DataLoader worker",
        "keep CUDA out of the dataset (move tensors to the GPU in the training step), or pass "
        "multiprocessing_context='spawn'",
    ),
    _Pattern(
        FailureKind.OOM,
        r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED",
        "the GPU ran out of memory",
        "use a smaller batch size (or AMP); each trial that hits this is recorded and skipped",
    ),
    _Pattern(
        FailureKind.HOST_OOM,
        r"\bMemoryError\b",  # \b: not OutOfMemoryError; a worker's is re-raised as this
        "a process ran out of host memory (MemoryError)",
        _HOST_OOM_ADVICE,
    ),
    _Pattern(
        FailureKind.PICKLE_ERROR,
        r"Can't pickle|[Cc]annot pickle|PicklingError|Can't get local object|"
        r"Can't get attribute .* on <module '__main__'",
        "the dataset (or collate_fn, worker_init_fn) cannot be sent to worker processes: it does "
        "not pickle, which the spawn and forkserver start methods need",
        "define them at module level, without lambdas or open handles; or pass "
        "multiprocessing_context='fork' (not on macOS)",
    ),
    _Pattern(
        FailureKind.PIN_MEMORY_THREAD,
        r"Pin memory thread exited unexpectedly",
        "the pin-memory thread died",
        "set pin_memory=False",
    ),
    _Pattern(
        FailureKind.WORKER_CRASHED,
        r"killed by signal|exited unexpectedly",
        "a DataLoader worker died unexpectedly",
        "run once with num_workers=0 to see the dataset's own error; then fewer workers",
    ),
]

_WORKER_WRAP = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")


def raised_in_worker(text: str) -> bool:
    """Whether ``text`` is DataLoader's report of an exception the dataset (or collate_fn)
    raised inside a worker ("Caught X in DataLoader worker process N"), not a worker's death."""
    return _WORKER_WRAP.search(text) is not None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def classify_text(text: str, *, where: str, detail: str = "", num_workers: int = 0) -> Failure:
    """Classify an error from its text.

    Args:
        text: the exception's message (``str(exc)``), or a process's last output.
        where: ``"loader"`` when it was raised by ``next()`` on the DataLoader, ``"step"`` when by
            the user's step, ``"script"`` when by a script outside both.
        detail: the full traceback, kept for the user.
        num_workers: the trial's workers. With workers, the dataset's own exceptions arrive
            wrapped ("Caught X in DataLoader worker N"); anything else from ``next()`` comes from
            the hand-over between processes (an ``EOFError`` when a worker's end broke), which
            is tuning data, not a dataset bug.
    """
    for kind, regex, message, advice in _PATTERNS:
        if re.search(regex, text):
            return Failure(kind, message, advice, detail=detail or text)
    if where == "loader":
        wrapped = _WORKER_WRAP.search(text)
        if wrapped is None and num_workers > 0:
            first = text.strip().splitlines()[0] if text.strip() else "an exception"
            return Failure(
                FailureKind.WORKER_CRASHED,
                f"receiving a batch from the DataLoader workers failed ({first[:120]})",
                "a worker died or ran out of a resource; fewer workers or a smaller "
                "prefetch_factor, and check `ulimit -n` and /dev/shm",
                detail=detail or text,
            )
        origin = (
            f"{wrapped.group(1)} in DataLoader worker {wrapped.group(2)}" if wrapped else "an error"
        )
        return Failure(
            FailureKind.DATASET_ERROR,
            f"the dataset raised {origin}; this is a bug in the dataset, not a tuning problem",
            "fix the dataset where the traceback below points (num_workers=0 makes it easier "
            "to debug)",
            user_bug=True,
            detail=detail or text,
        )
    first = text.strip().splitlines()[-1] if text.strip() else "an exception"
    return Failure(
        FailureKind(f"{where}_error"),  # step_error, script_error
        f"the training {where} raised: {first[:200]}",
        f"fix the {where}; the traceback is below",
        user_bug=True,
        detail=detail or text,
    )


def at_another_batch_size(failure: Failure, batch_size: int, own: int) -> Failure:
    """``failure`` seen in a trial of ``batch_size`` when the user's own is ``own``: the user's
    step or script raising there is that batch size's failure, not a bug of theirs. Code may
    assume its own batch size (a ``view(64, -1)``, a statistic over a fixed batch, a schedule
    sized by the loader's length), which is no reason to stop the search; the search leaves the
    batch size out and goes on. The same error at the user's own batch size is their bug."""
    code = {FailureKind.STEP_ERROR, FailureKind.SCRIPT_ERROR}
    if batch_size == own or failure.kind not in code or not failure.user_bug:
        return failure
    return Failure(
        FailureKind.BATCH_SIZE_REJECTED,
        f"{failure.message} (with batch size {batch_size}; its own is {own})",
        f"the training code fails with batch size {batch_size} (does it assume {own}?): "
        "the search leaves that batch size out; see the traceback",
        detail=failure.detail,
    )


def with_this_setting_only(failure: Failure, loaded_with: str) -> Failure:
    """``failure``, the dataset's error for a batch that the setting ``loaded_with`` (a label)
    loaded: this setting's failure, not a bug of the data's. A dataset may hold state that does
    not survive the workers' start (an open file or connection, a handle made in the main
    process); the search leaves the setting out and goes on."""
    if failure.kind != FailureKind.DATASET_ERROR:
        return failure
    return Failure(
        FailureKind.DATASET_ERROR_WITH_SETTING,
        failure.message.replace(
            "; this is a bug in the dataset, not a tuning problem",
            f" with this setting only: the same batch loads with {loaded_with}",
        ),
        "the dataset fails with this setting: does it hold state that does not survive the "
        "workers' start (an open file, a connection)? Open it in each worker (on first use, or "
        "in worker_init_fn); see the traceback",
        detail=failure.detail,
    )


def signal_text(signum: int) -> str:
    """What torch says of a worker killed by ``signum`` ("killed by signal: Killed")."""
    names = {
        signal.SIGKILL: "Killed",
        signal.SIGBUS: "Bus error",
        signal.SIGSEGV: "Segmentation fault",
    }
    return f"killed by signal: {names.get(signal.Signals(signum), _signal_name(signum))}"


def chain_text(exc: BaseException) -> str:
    """The messages of ``exc`` and of the exceptions it was raised from (most specific last)."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 6:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


def classify_exception(
    exc: BaseException, *, where: str, worker_signals: tuple[int, ...] = (), num_workers: int = 0
) -> Failure:
    """Classify an exception raised inside a trial (see :func:`classify_text` for ``where`` and
    ``num_workers``).

    Args:
        worker_signals: signals that killed the loader's workers, from their exit codes. The
            message alone is not enough: when DataLoader's timeout poll notices a dead worker
            before its SIGCHLD handler does, it only says "exited unexpectedly".
    """
    detail = format_exception(exc)
    if isinstance(exc, MemoryError):
        return Failure(
            FailureKind.HOST_OOM,
            "the process ran out of host memory (MemoryError)",
            _HOST_OOM_ADVICE,
            detail=detail,
        )
    if isinstance(exc, OSError) and exc.errno == 24:  # EMFILE
        return classify_text("Too many open files", where=where, detail=detail)
    text = "\n".join([*(signal_text(s) for s in worker_signals), chain_text(exc)])
    return classify_text(text, where=where, detail=detail, num_workers=num_workers)


def _died_with_server(server_code: int, output: str) -> Failure:
    if server_code == -signal.SIGKILL:
        return Failure(
            FailureKind.HOST_OOM,
            "the fork server that started the trial process was killed (SIGKILL), most likely by "
            "the out-of-memory killer, and the trial process died with it",
            _HOST_OOM_ADVICE,
            detail=output,
        )
    how = f"died of {_signal_name(-server_code)}" if server_code < 0 else f"exited ({server_code})"
    return Failure(
        FailureKind.TRIAL_CRASHED,
        f"the fork server that started the trial process {how}, and the trial process died with it",
        "the next launch starts afresh; if this repeats, set LOADERTUNE_FORK_SERVER=0 (every "
        "launch a fresh interpreter) and report it",
        detail=output,
    )


def classify_exit(returncode: int, *, output: str = "", server_code: int | None = None) -> Failure:
    """Classify a trial process that ended without reporting a result. ``server_code``: the trial
    process was a fork of the search's fork server, which ended first (with that status), and it
    died with it: the server's end is the cause."""
    if server_code is not None:
        return _died_with_server(server_code, output)
    if returncode < 0:
        sig = -returncode
        if sig == signal.SIGKILL:
            return Failure(
                FailureKind.HOST_OOM,
                "the trial process was killed (SIGKILL), most likely by the out-of-memory killer",
                _HOST_OOM_ADVICE,
                detail=output,
            )
        if sig == signal.SIGBUS:
            return classify_text("killed by signal: Bus error", where="loader", detail=output)
        return Failure(
            FailureKind.TRIAL_CRASHED,
            f"the trial process died of {_signal_name(sig)}",
            "run the script once by hand with these settings to see the crash",
            detail=output,
        )
    if output:
        found = classify_text(output, where="script", detail=output)
        if not found.user_bug:
            return found
    return Failure(
        FailureKind.TRIAL_CRASHED,
        f"the trial process exited with status {returncode} without a result",
        "run the script once by hand with these settings",
        detail=output,
    )


def hang(seconds: float, workers: int | None = None) -> Failure:
    """The watchdog saw no progress for ``seconds`` (in a trial of ``workers`` workers: 0 loads
    in the main process, where no worker's start method or threads can be the cause)."""
    if workers == 0:
        return Failure(
            FailureKind.TIMEOUT,
            f"no progress for {seconds:.0f} s without workers: the dataset or the step hung, "
            "or one batch took that long",
            "check the dataset and the step for locks or network waits; other work on the "
            "machine slows every trial",
        )
    return Failure(
        FailureKind.TIMEOUT,
        f"no progress for {seconds:.0f} s: a worker or the step hung",
        HANG_ADVICE,
    )


def rested(seconds: float, loader: str = "the tuned DataLoader") -> Failure:
    """The tuned loader's epoch ended before its window did, and the script had not iterated
    it again ``seconds`` later: a loader used this seldom (a validation loader between training
    epochs) cannot fill a window in a trial's time. Every setting would do the same: it stops."""
    advice = (
        "tune the loader the training loop iterates (leave out --loader, or name that one), "
        "or run the script with less work between its passes over this loader"
    )
    return Failure(
        FailureKind.TIMEOUT,
        f"{loader} went unused for {seconds:.0f} s after one of its epochs, before its "
        "measured window was full: the script iterates it too seldom to be measured (a "
        "validation loader between training epochs?)",
        advice,
        user_bug=True,
    )


def memory_budget(used_bytes: int, budget_bytes: int) -> Failure:
    """The process tree's memory crossed the budget; the trial was stopped before the OOM killer."""
    return Failure(
        FailureKind.MEMORY_BUDGET,
        f"host memory of the trial reached {used_bytes / GIB:.1f} GiB, over the budget "
        f"of {budget_bytes / GIB:.1f} GiB",
        "use fewer workers or a smaller prefetch "
        "factor, or raise the budget (memory_budget_fraction=)",
    )
