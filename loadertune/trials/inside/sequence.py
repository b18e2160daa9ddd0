"""A script's trial process running many trials in turn: its side of the conversation.

The search sends the first setting in the process's spec and each further one as a
:class:`~loadertune.trials.messages.RunMsg`; :class:`ChannelConductor` hands them to the
:class:`~loadertune.trials.hotswap.swap.HotSwap` under the script's loop and sends each result back.
Lock-step: after a result the script's loop waits until the search has taken its snapshot of the
workers (:class:`~loadertune.trials.messages.ReleaseMsg`), then until it sends the next setting.
The search's own work (recording the result, choosing what is next) thus never runs during a
measured window, and no data is consumed unmeasured: a script has only so many epochs to give.

A failure is not handled here: the loader's exception reaches the script, the trial process
reports it (:mod:`loadertune.trials.inside.child`) and the search starts a fresh process for the
rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from loadertune.config import Config
from loadertune.measure.meter import Measurement, Sink
from loadertune.trials import cuda, messages
from loadertune.trials.channel import Channel
from loadertune.trials.contract import window_for
from loadertune.trials.hotswap.steps import Outcome, Step


def result_message(
    m: Measurement,
    *,
    complete: bool,
    bytes_per_sample: float | None,
    transfer: dict[str, float] | None,
    epoch_samples: int | None,
    ran: dict[str, Any],
    rank: int | None = None,
    epochs_begun: int | None = None,
) -> messages.ResultMsg:
    """A trial's result, with this process's CUDA facts; ``ran``: what its loader really ran
    with (checked by the search: :mod:`loadertune.trials.script.verify`)."""
    peak_alloc, peak_reserved = cuda.cuda_peaks()
    return messages.ResultMsg(
        t="result",
        measurement=m.to_dict(),
        complete=complete,
        cuda_peak_allocated=peak_alloc,
        cuda_peak_reserved=peak_reserved,
        cuda_device=cuda.cuda_bus_id(),
        cuda_capacity=cuda.cuda_capacity(),
        bytes_per_sample=bytes_per_sample,
        transfer=transfer,
        epoch_samples=epoch_samples,
        epochs_begun=epochs_begun,
        ran={**ran, "pid": os.getpid(), "rank": rank},
    )


class ChannelSink:
    """The meter's sink in a trial process: events and progress go to the parent."""

    def __init__(self, chan: Channel) -> None:
        self._chan = chan
        self.stop = False

    def event(self, name: str) -> None:
        bus_id = cuda.cuda_bus_id() if name == "window_start" else None
        self._chan.send(messages.EventMsg(t="event", name=name, bus_id=bus_id))

    def progress(self, index: int, samples_per_s: float) -> bool:
        self._chan.send(messages.ProgressMsg(t="progress", i=index, rate=samples_per_s))
        self.stop = self.stop or any(m.get("t") == "stop" for m in self._chan.drain())
        return not self.stop


class ChannelConductor:
    """Takes settings from the search, one at a time, and reports each one's result.

    Args:
        chan: the channel to the search.
        first: the first trial (the spec's ``overrides``, ``phase``, ``window_s``,
            ``worker_timeout_s``); None: the first comes as a RunMsg (the process's first trial
            ran otherwise).
        own: the script's own settings (a trial without overrides runs them).
        own_batch_size: the batch size the script gave (a setting that yields no batch at
            another one is the search's choice, not the script's bug).
        make_sink: a fresh meter sink per trial (events and progress to the search).
        bytes_per_sample: what the trial process knows of a sample's size.
        epoch_scale: an epoch's samples as the script takes them, from the loader's (a loop
            that breaks early takes fewer: :class:`~loadertune.trials.inside.epochs.EpochLengths`).
        epochs_begun: the tuned loader's epochs this process has begun, for each result (the
            search learns how many a launch holds: ``ScriptRunner``).
    """

    def __init__(
        self,
        chan: Channel,
        first: Mapping[str, Any] | None,
        *,
        own: Config,
        own_batch_size: int,
        make_sink: Callable[[], Sink],
        bytes_per_sample: float | None = None,
        epoch_scale: Callable[[int | None], int | None] = lambda n: n,
        epochs_begun: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._chan = chan
        self._first: Mapping[str, Any] | None = first
        self.own = own
        self.own_batch_size = own_batch_size
        self._make_sink = make_sink
        self.bytes_per_sample = bytes_per_sample
        self._epoch_scale = epoch_scale
        self._epochs_begun = epochs_begun
        self.step: Step | None = None

    def next_step(self) -> Step:
        spec = self._first if self._first is not None else self._wait("run")
        self._first = None
        config = Config.from_kwargs(spec["overrides"]) if spec.get("overrides") else self.own
        cuda.reset_cuda_peaks()  # each trial's peak is its own
        self.step = Step(
            config,
            window_for(
                config, window_s=spec["window_s"], whole_epoch=spec.get("whole_epoch", False)
            ),
            phase=spec["phase"],
            sink=self._make_sink(),
            worker_timeout_s=spec["worker_timeout_s"],
        )
        return self.step

    def finished(self, outcome: Outcome) -> bool:
        if outcome.no_batches is not None:
            own = outcome.step.config.batch_size == self.own_batch_size
            self._chan.send(
                messages.NoBatchesMsg(t="no_batches", why=outcome.no_batches, own_batch_size=own)
            )
        elif outcome.measurement is not None:
            self.bytes_per_sample = outcome.bytes_per_sample or self.bytes_per_sample
            self._chan.send(
                result_message(
                    outcome.measurement,
                    complete=True,
                    bytes_per_sample=self.bytes_per_sample,
                    transfer=outcome.transfer,
                    epoch_samples=self._epoch_scale(outcome.epoch_samples),
                    ran=outcome.ran,
                    epochs_begun=self._epochs_begun(),
                )
            )
        self.wait_release()
        return False  # the setting's workers stop now

    def wait_release(self) -> None:
        """Until the search has taken its snapshot of this setting's processes (its
        :class:`~loadertune.trials.messages.ReleaseMsg`, sent after every complete result): the
        setting's workers must still be there for it to count them."""
        self._wait("release")

    def _wait(self, kind: str) -> dict[str, Any]:
        """The search's next message of ``kind`` (a late "stop" is dropped); the process ends
        when the search has gone."""
        while True:
            msg = self._chan.recv(timeout=None)
            if msg is None:
                os._exit(0)
            if msg.get("t") == kind:
                return msg
