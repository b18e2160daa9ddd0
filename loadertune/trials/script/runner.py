"""Run trials of an unmodified training script, many in one process where the loader allows it.

A *launch* starts ``python -m loadertune.trials.inside.child`` in a new session (so it and every
DataLoader worker it starts share one process group, away from the terminal's Ctrl-C), or forks
it from the search's fork server, which has imported torch and the script's installed packages
once (:mod:`loadertune.trials.script.forkserver`), and tells it the setting over a
:class:`~loadertune.trials.channel.Channel`; each trial is supervised from here: resource
sampling, deadlines, the memory budget and pruning run in this process.

When the loader can change setting mid-epoch (:mod:`loadertune.trials.hotswap.swap`), a launch stays
up after a trial that ended well (measured, or pruned): the next ``run`` sends its setting to the
same process, whose script goes on from the batch it had reached, and pays no start-up again. A
launch is replaced only when it must be:

- the trial failed: a killed worker, a hang, an out-of-memory error, the memory budget or the
  trial's deadline may have poisoned the process (torch's allocator fragmented, a worker's
  shared memory left behind, a thread stuck), and the process was killed for most of them;
- the script ended (it has no more epochs to give); a setting that had not received a single
  batch then is run again in a fresh launch;
- the loader cannot change setting mid-epoch (the :class:`~loadertune.trials.messages.LoaderMsg`
  says why), is created again at each epoch, or was found while the first trial ran (the loader
  that feeds the optimizer: :mod:`loadertune.trials.inside.target`): one setting per process, as it
  is built. The next launch names it by its key, and may swap;
- the loader was built with a batch sampler, whose batches a hot swap keeps, and the trial asks
  for another batch size: a fresh launch builds it with a batch sampler of that size.

Every result says what its loader really ran with (``ran``), a hot-swapped setting's too: a
trial that did not run its setting fails as ``not_applied``
(:mod:`loadertune.trials.script.verify`). However a launch ends, its whole group is killed
(:mod:`loadertune.trials.script.processes`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loadertune.config import Config
from loadertune.errors import ScriptError
from loadertune.measure import nvml
from loadertune.measure.failures import Failure, FailureKind
from loadertune.measure.meter import Measurement, WindowSpec
from loadertune.trials import leftovers, messages
from loadertune.trials.contract import BaseRunner, TrialRequest, TrialResult
from loadertune.trials.script import reported, tuned_loader, verify
from loadertune.trials.script.forkserver import ForkServer
from loadertune.trials.script.processes import (
    Launch,
    Trial,
    check_script,
    exited,
    kill_group,
    start_child,
    tail,
)
from loadertune.trials.supervisor import Supervisor

__all__ = ["ScriptRunner", "check_script", "kill_group"]


def _enough_without_workers(config: Config | None, window: WindowSpec, m: Measurement) -> bool:
    """A window the script's end cut short still measures a setting without workers when it
    held its minimum of batches and half its time: no buffer was ahead of the loop to drain in a
    burst. A script whose whole run is shorter than a window (a replay of a tiny step,
    ``tests/scripts/one_cycle.py``) would otherwise be measured again in every launch."""
    return (
        config is not None
        and config.num_workers == 0
        and not window.whole_epoch
        and m.n_batches >= window.min_window_batches
        and m.window_s >= window.window_s / 2
    )


class ScriptRunner(BaseRunner):
    """Trials of ``python SCRIPT ARGS``; see the module docstring.

    Args:
        script: the training script.
        args: its arguments.
        loader: which loader to tune: its order of creation (1 = first created), ``"FILE:LINE"``
            where it is created, or None for the first loader the script iterates.
        python: the interpreter to run it with.
        fork_server: start each launch as a fork of a process that has imported torch once
            (:mod:`loadertune.trials.script.forkserver`) rather than as a fresh interpreter; None:
            yes, unless ``$LOADERTUNE_FORK_SERVER`` is ``0``.
    """

    in_process = False
    user_error = ScriptError
    hot_swap = True  # a launch may run many settings (see the module docstring)

    def __init__(
        self,
        script: str | os.PathLike[str],
        args: list[str] | tuple[str, ...] = (),
        *,
        loader: int | str | None = None,
        python: str = sys.executable,
        fork_server: bool | None = None,
    ) -> None:
        self.script = str(check_script(script))
        self.args = list(args)
        self.python = python
        if fork_server is None:
            fork_server = os.environ.get("LOADERTUNE_FORK_SERVER", "1") != "0"
        self.fork_server = fork_server
        self._server: ForkServer | None = None
        self.selector = tuned_loader.selector(loader)
        self.uses_cuda = False
        self.epoch_samples: int | None = None
        self.bytes_per_sample: float | None = None
        self.loader_info: dict[str, Any] | None = None
        self._code_sha1: str | None = None  # the script's and its modules' (see state)
        self.batch_size_fixed: str | None = None  # why the batch size cannot be searched
        self.loader_recreated = False
        self._check_lengths = False  # batch lengths tell the batch size (see trials.script.verify)
        self._logdir = tempfile.TemporaryDirectory(prefix=f"{leftovers.LOG_PREFIX}{os.getpid()}-")
        self._launch: Launch | None = None
        self.n_launches = 0
        # the tuned loader's epochs in a launch whose script ran to its end (the most seen)
        self.launch_epochs: int | None = None
        self._handlers: dict[str, Callable[[Any, Trial], bool]] = {
            "event": self._on_event,
            "progress": self._on_progress,
            "loader": self._on_loader,
            "result": self._on_result,
            "failure": self._on_failure,
            "no_batches": self._on_no_batches,
            "ended": self._on_ended,
            "hello": self._on_hello,
        }

    def _trial(self, config: Config | None, request: TrialRequest) -> TrialResult:
        """One trial; ``config=None`` runs the script's own settings (the baseline), which also
        finds the loader to tune when no ``loader=`` was given."""
        if config is not None and self.loader_info is None and not self.selector:
            raise RuntimeError("run the baseline (config=None) first: it finds the loader to tune")
        launch = self._launch
        if launch is not None and (
            launch.proc.poll() is not None
            or self._batches_fixed(launch, config)
            or self._in_last_epoch(launch, request)
        ):
            self._end_launch()
            launch = None
        fresh = launch is None
        trial_spec = self._trial_spec(config, request)
        if launch is None:
            launch = self._launch = self._start(self._launch_spec(trial_spec), request)
        else:
            launch.chan.send({"t": "run", **trial_spec})  # a messages.RunMsg
        launch.n_trials += 1
        result = TrialResult(config or Config(1), phase=request.phase)
        sup = Supervisor(launch.proc.pid, limits=request.limits, should_stop=request.should_stop)
        sup.workers = None if config is None else config.num_workers
        trial = Trial(launch, sup, result, own=config is None)
        if launch.loader is not None:
            self._on_loader(launch.loader, trial)  # said once per launch
        try:
            with sup:
                self._supervise(trial)
        finally:
            # Whatever the outcome, where it ran: a trial the deadline cut or that failed made
            # batches there too, and has no ``ran`` to say so.
            result.extra["pids"] = launch.training_pids()
            if not (trial.reusable and launch.swaps):
                result.orphans_killed = self._end_launch()
        m = result.measurement
        cut_short = (
            m is not None
            and not m.complete
            and not m.stopped_early  # (not pruned)
            and not _enough_without_workers(config, request.window, m)
        )
        ended = result.failure is not None and result.failure.kind == FailureKind.SCRIPT_ENDED
        if not fresh and (ended or (cut_short and result.failure is None)):
            # The script ran out of epochs before this setting's window was full (it ran others
            # before in this launch): not its fault, and a few batches right after the workers
            # started, as many as the buffer held, would measure a burst, not the rate.
            pid = (result.extra.get("ran") or {}).get("pid", launch.proc.pid)
            again = self._trial(config, request)
            # Where else this setting ran: its batches are there too (said by ``pids`` however
            # the second try ended, and by ``ran`` where it measured).
            again.extra["pids"] = [*again.extra.get("pids", []), *result.extra["pids"]]
            ran = again.extra.get("ran")
            if ran is not None:
                ran["cut_short_pids"] = [*ran.get("cut_short_pids", []), pid]
            return again
        if result.failure is not None:
            result.failure = sup.explain(result.failure, output=tail(launch.log))
            result.resources = result.resources or sup.usage_so_far()
        if config is None and launch.loader is None:  # its batch size is not Config(1)'s either
            result.extra["settings_unknown"] = True
        elif self.batch_size_fixed:  # the loader's batching decides, whatever Config says
            result.extra["batch_size_fixed"] = True
        return result

    def _in_last_epoch(self, launch: Launch, request: TrialRequest) -> bool:
        """A whole-epoch trial would begin in the launch's last epoch: its window, an epoch's
        batches, cannot end before the script does (begun mid-epoch, it runs across the
        epoch's end; at the epoch's end, there is no epoch left). Cut at the script's end, it
        would be measured again in a fresh launch; it starts in one now. How many epochs a
        launch holds is learnt from one whose script ended (a script's ``--epochs``)."""
        return (
            request.window.whole_epoch
            and self.launch_epochs is not None
            and launch.epochs_begun is not None
            and launch.epochs_begun >= self.launch_epochs
        )

    def _batches_fixed(self, launch: Launch, config: Config | None) -> bool:
        """The launch cannot run ``config``'s batch size: its loader was built with a batch
        sampler, whose batches a hot swap keeps (:mod:`loadertune.trials.hotswap.swap`); a fresh
        launch builds the loader with a batch sampler of the new size."""
        if launch.loader is None or not launch.loader["batch_sampler"] or not self.loader_info:
            return False
        own = self.loader_info["settings"]["batch_size"]
        wanted = config.batch_size if config is not None else own
        return launch.batch_size is not None and wanted != launch.batch_size

    def _trial_spec(self, config: Config | None, request: TrialRequest) -> dict[str, Any]:
        return {
            "overrides": config.loader_kwargs() if config else None,
            "phase": request.phase,
            "window_s": request.window.window_s,
            "whole_epoch": request.window.whole_epoch,
            "worker_timeout_s": request.limits.worker_timeout_s,
        }

    def _launch_spec(self, trial: dict[str, Any]) -> dict[str, Any]:
        """A fresh launch's spec, given its first trial. After the first trial: the loader it
        found (by key: its re-creations, its copies) and the script's own settings (what a
        baseline runs in a launch whose loader was built with another setting)."""
        info = self.loader_info
        return {
            "script": self.script,
            "args": self.args,
            "parent_pid": os.getpid(),
            # many settings per process, unless the loader is created again at each epoch
            "hot_swap": self.hot_swap and not self.loader_recreated,
            **trial,
            **((info and {"key": info["key"], "own": info["settings"]}) or self.selector),
        }

    def start_server(self) -> None:
        """Start the fork server now, rather than at the first trial: its imports (torch, the
        script's packages: a few seconds) then run while the search sets up (the study, its
        storage), on another CPU. Nothing without ``fork_server``; the runner's
        :meth:`close` stops it."""
        server = self._server
        if self.fork_server and (server is None or (not server.alive and server.preload)):
            # A server that could not fork after importing the script's packages (a thread, or
            # CUDA: see forkserver) is started again with torch alone, once.
            preload = self.script if server is None else None
            log = Path(self._logdir.name) / f"forkserver-{2 if server else 1}.log"
            self._server = ForkServer(self.python, log, preload=preload)

    def _start(self, spec: dict[str, Any], request: TrialRequest) -> Launch:
        """A fresh trial process, given its spec (:func:`.processes.start_child`)."""
        self.n_launches += 1
        self.start_server()
        log = Path(self._logdir.name) / f"launch-{self.n_launches}.log"
        return start_child(self.python, spec, log, self._server, startup_s=request.limits.startup_s)

    def _end_launch(self) -> int:
        """Kill the launch (if any); how many of its processes were still alive."""
        launch, self._launch = self._launch, None
        return launch.close() if launch is not None else 0

    def _supervise(self, trial: Trial) -> None:
        while True:
            msg = trial.chan.recv(timeout=0.1)
            if msg is not None:
                if self._handle(msg, trial):
                    return
                continue
            if exited(
                trial,
                lambda: ((late, trial.chan) for late in trial.chan.drain()),
                lambda late, _chan: self._handle(late, trial),
            ):
                return
            expired = trial.sup.expired()
            if expired is not None:
                if (
                    not trial.sup.started
                    and trial.result.extra.get("loader") is None
                    and expired.kind == FailureKind.TIMEOUT
                ):
                    expired = Failure(
                        FailureKind.NO_LOADER,
                        "the script did not iterate a DataLoader within "
                        f"{trial.sup.limits.startup_s:.0f} s",
                        "if it is slow to start, give a "
                        "larger --budget; check that it iterates a DataLoader at all",
                        user_bug=True,
                        detail=tail(trial.log),
                    )
                trial.result.failure = expired
                return

    # -- the trial process's messages (see loadertune.trials.messages) ---------------------------

    def _handle(self, msg: dict[str, Any], trial: Trial) -> bool:
        """Act on one message; True when the trial is over. Unknown kinds are ignored."""
        handler = self._handlers.get(msg.get("t", ""))
        return handler(msg, trial) if handler is not None else False

    def _on_event(self, msg: messages.EventMsg, trial: Trial) -> bool:
        trial.sup.event(msg["name"])
        if msg["name"] == "window_start" and msg["bus_id"]:
            trial.sup.sampler.gpu_index = nvml.index_for_bus_id(msg["bus_id"])
        return False

    def _on_hello(self, msg: messages.HelloMsg, trial: Trial) -> bool:
        return False  # only ranks of a distributed trial say hello (trials.ranks)

    def _on_progress(self, msg: messages.ProgressMsg, trial: Trial) -> bool:
        if not trial.sup.progress(int(msg["i"]), float(msg["rate"])):
            trial.chan.send(messages.STOP)
        return False

    def _on_loader(self, msg: messages.LoaderMsg, trial: Trial) -> bool:
        result = trial.result
        trial.launch.loader = msg
        result.extra["loader"] = msg
        trial.sup.loader_name = f"the tuned DataLoader #{msg['index']} at {msg['call_site']}"
        info = self.loader_info if self.loader_info is not None else self._learn_loader(msg)
        if trial.own or result.phase == "baseline":  # also in a launch built otherwise
            result.config = Config.from_kwargs(info["settings"])
        result.extra["warnings"] = list(msg["warnings"])
        result.epoch_samples = msg["epoch_samples"]
        self.epoch_samples = self.epoch_samples or result.epoch_samples
        return False

    def _learn_loader(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """The loader to tune, as the first trial found it."""
        info = self.loader_info = dict(msg)
        self._code_sha1 = tuned_loader.code_digest(self.script, msg)  # the code as it was measured
        self.uses_cuda = msg["cuda_available"]
        self.batch_size_fixed = msg["batch_size_fixed"]
        self.target_note = tuned_loader.target_note(msg)
        return info

    def state(self) -> dict[str, Any]:
        """See :meth:`~loadertune.trials.TrialRunner.state`: the loader the first trial found
        (by its key, so a resumed search names it without a baseline first), and the script's
        digest with its own modules' (those it had imported when the loader was found), as the
        key is only good for the code as it was."""
        return {
            **super().state(),
            "code_sha1": self._code_sha1,
            "loader": self.loader_info,
            "epoch_samples": self.epoch_samples,
            "loader_recreated": self.loader_recreated,
            "check_lengths": self._check_lengths,
        }

    def restore(self, state: Mapping[str, Any]) -> bool:
        """See :meth:`~loadertune.trials.TrialRunner.restore`."""
        loader = state.get("loader")
        if not loader or state.get("code_sha1") != tuned_loader.code_digest(self.script, loader):
            return False  # the script or a module of its own changed (or an older state)
        super().restore(state)
        self._learn_loader(state["loader"])
        self.epoch_samples = state.get("epoch_samples")
        self.loader_recreated = bool(state.get("loader_recreated"))
        self._check_lengths = bool(state.get("check_lengths"))
        return True

    def _on_result(self, msg: messages.ResultMsg, trial: Trial) -> bool:
        result = trial.result
        result.measurement = Measurement.from_dict(msg["measurement"])
        result.resources = trial.sup.window_ended(result.measurement.window_s)
        result.pruned = trial.sup.pruned
        result.cuda_peak_allocated_bytes = msg["cuda_peak_allocated"]
        result.cuda_peak_reserved_bytes = msg["cuda_peak_reserved"]
        result.cuda_device = msg["cuda_device"]
        result.cuda_capacity_bytes = msg["cuda_capacity"]
        result.transfer = msg["transfer"]
        trial.launch.epochs_begun = msg.get("epochs_begun")
        result.epoch_samples = msg.get("epoch_samples") or result.epoch_samples
        known = self.epoch_samples
        if result.epoch_samples and (known is None or result.epoch_samples < known):
            # the script's loop ends its epochs early, or a batch sampler's batches told it
            self.epoch_samples = result.epoch_samples
        self.bytes_per_sample = msg["bytes_per_sample"] or self.bytes_per_sample
        self._check_ran(msg["ran"], result)
        if result.failure is not None:
            return True  # not its setting: the launch is replaced
        if msg["complete"] and trial.launch.swaps:
            trial.chan.send(messages.RELEASE)  # snapshot taken: the setting's workers may stop
            trial.reusable = not self.loader_recreated
        return msg["complete"]  # a partial result is followed by "ended"

    def _check_ran(self, ran: dict[str, Any], result: TrialResult) -> None:
        """Record what the loader ran with; a trial that did not run its setting fails."""
        result.extra["ran"] = ran
        if self._launch is not None and (ran.get("settings") or {}).get("batch_size"):
            self._launch.batch_size = ran["settings"]["batch_size"]
        self.loader_recreated = self.loader_recreated or (ran.get("loaders") or 0) > 1
        if result.phase == "baseline":
            self._check_lengths = verify.lengths_show_batch_size(ran)
            return
        if result.phase == "replay":
            return  # one cached batch, no loading
        wrong = verify.mismatch(result.config, ran, check_lengths=self._check_lengths)
        if wrong is not None:
            result.failure = verify.not_applied(result.config, wrong)
            result.measurement = None

    def _on_failure(self, msg: messages.FailureMsg, trial: Trial) -> bool:
        trial.result.failure = reported.raised(msg, tail(trial.log))
        return True

    def _on_no_batches(self, msg: messages.NoBatchesMsg, trial: Trial) -> bool:
        trial.result.failure = reported.no_batches(msg, tail(trial.log))
        return True

    def _on_ended(self, msg: messages.EndedMsg, trial: Trial) -> bool:
        epochs = msg.get("epochs_begun")
        if epochs:
            self.launch_epochs = max(self.launch_epochs or 0, epochs)
        if trial.result.measurement is None:
            trial.result.failure = reported.ended(msg, self.selector, tail(trial.log))
        return True

    def close(self) -> None:
        self._end_launch()
        if self._server is not None:
            self._server.close()
            self._server = None
        self._logdir.cleanup()
