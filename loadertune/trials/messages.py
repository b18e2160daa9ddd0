"""The messages of a script trial, between the search and the trial process.

One :class:`~typing.TypedDict` per kind, told apart by ``"t"``: plain dicts of JSON values,
sent as JSON lines over a :class:`~loadertune.trials.channel.Channel`.

The trial process (:mod:`loadertune.trials.inside.child`) sends a :class:`LoaderMsg` when the script
first iterates the tuned loader, :class:`EventMsg` and :class:`ProgressMsg` while the meter
runs, and one of four ends: :class:`ResultMsg` (the window is full), :class:`FailureMsg` (the
script raised), :class:`NoBatchesMsg` (the loader yields no batch) or :class:`EndedMsg` (the
script ended first, after a partial :class:`ResultMsg` if the window had opened). The search
(:class:`loadertune.trials.script.runner.ScriptRunner`) sends :class:`StopMsg` to prune the trial.

When the loader can change setting mid-epoch (:mod:`loadertune.trials.hotswap.swap`; the
:class:`LoaderMsg` says whether), one process runs many trials in turn: after each complete
:class:`ResultMsg` the search sends :class:`ReleaseMsg` (it has taken its snapshot of the
workers, which may now stop), and :class:`RunMsg` when it wants the next setting measured; the
script's loop waits meanwhile. Any other end leaves the process to be replaced.

Both ends run the same loadertune: the search reads a message of kind ``t`` as that kind's type
without checking each field.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

# LoaderMsg's ``batch_size_fixed`` for a loader without automatic batching: its settings then
# say batch size 1, which is not what it yields.
NO_BATCHING = (
    "the loader has no automatic batching (batch_size=None): its dataset's items are the "
    "batches, and loadertune leaves them as they are"
)


class EventMsg(TypedDict):
    """A phase of the meter (``first_batch``, ``window_start``, ``window_end``) or ``beat``."""

    t: Literal["event"]
    name: str
    bus_id: str | None  # window_start: the PCI bus id of the CUDA device in use, if any


class ProgressMsg(TypedDict):
    """A sub-window ended; ``rate`` is the window's running samples/s."""

    t: Literal["progress"]
    i: int
    rate: float


class LoaderMsg(TypedDict):
    """The loader being tuned, as the script built it (settings applied)."""

    t: Literal["loader"]
    index: int  # order of creation, from 1
    call_site: str  # FILE:LINE of the user's own code that created it (or its origin)
    key: list[str]  # what identifies it from run to run (trials.identity)
    lines: list[str]  # the text of the key's user frames (LoaderRecord.lines)
    origin: int | None  # the loader it was rebuilt from (by a framework), if any
    chosen_by: str  # how the first trial found it: "--loader", "the optimizer", ...
    settings: dict[str, Any]  # Config.loader_kwargs() of the loader
    epoch_samples: int | None
    dataset: str  # module.QualifiedName of the dataset's class
    batch_sampler: bool  # a batch sampler decides the batch (batch_size is None)
    batch_size_fixed: str | None  # why its batch size cannot be changed, if it cannot
    cuda_available: bool
    warnings: list[str]
    one_setting_only: str | None  # why this loader cannot change setting mid-epoch; None: it can
    sources: list[str]  # the user's own modules imported by then (identity.user_sources)


class ResultMsg(TypedDict):
    """The window's measurement, and the CUDA facts of the trial process."""

    t: Literal["result"]
    measurement: dict[str, Any]  # Measurement.to_dict()
    complete: bool  # False: a partial window, followed by Ended
    cuda_peak_allocated: int | None
    cuda_peak_reserved: int | None
    cuda_device: str | None
    cuda_capacity: int | None
    bytes_per_sample: float | None
    transfer: dict[str, float] | None
    epoch_samples: int | None  # at this trial's batch size
    epochs_begun: int | None  # the tuned loader's epochs this process has begun (iter() calls)
    # What the loader really ran with: "settings" as built, "workers_started", the
    # "batch_lengths" seen, "loaders" (objects iterated: re-creations), "pid", "rank"
    ran: dict[str, Any]


class FailureMsg(TypedDict):
    """The script raised; the search classifies ``text``."""

    t: Literal["failure"]
    where: Literal["loader", "script"]  # "loader": raised by next() on the tuned loader
    num_workers: int
    text: str  # worker signals and the exception chain, as failures.classify_text reads them
    traceback: str


class NoBatchesMsg(TypedDict):
    """The tuned loader yields no batch at all; the trial is over."""

    t: Literal["no_batches"]
    why: str  # "drop_last=True with 10 samples < batch_size 16", "the dataset is empty (...)"
    own_batch_size: bool  # the script's own batch size (not one the search chose)


class EndedMsg(TypedDict):
    """The script ended (or exited) before the window was full."""

    t: Literal["ended"]
    how: str  # "the script ended", "the script exited with status N"
    iterated: bool  # the tuned loader was iterated
    created: list[str]  # the call site of each DataLoader the script created, in order
    epochs_begun: int | None  # the tuned loader's epochs this process began before its end


class HelloMsg(TypedDict):
    """A rank of a distributed trial connected (the first message on its channel)."""

    t: Literal["hello"]
    rank: int
    pid: int


class StopMsg(TypedDict):
    """From the search: stop measuring (the trial is pruned)."""

    t: Literal["stop"]


class ReleaseMsg(TypedDict):
    """From the search: the trial's result is recorded; its workers may stop."""

    t: Literal["release"]


class RunMsg(TypedDict):
    """From the search: measure this setting next, in the same process."""

    t: Literal["run"]
    overrides: dict[str, Any] | None  # Config.loader_kwargs(); None: the script's own settings
    phase: str
    window_s: float
    whole_epoch: bool  # the window is an epoch (WindowSpec.whole_epoch)
    worker_timeout_s: float  # the DataLoader's timeout (Limits.worker_timeout_s)


Message = (
    EventMsg
    | ProgressMsg
    | LoaderMsg
    | ResultMsg
    | FailureMsg
    | NoBatchesMsg
    | EndedMsg
    | StopMsg
    | ReleaseMsg
    | RunMsg
    | HelloMsg
)
STOP: StopMsg = {"t": "stop"}
RELEASE: ReleaseMsg = {"t": "release"}
