"""Trials of a distributed script: every trial under torch's own launcher, N ranks, one result.

``loadertune search --nproc-per-node N train.py`` runs each trial as ``torchrun --standalone
--nproc-per-node N`` would (:mod:`loadertune.trials.script.launch`), each rank in a trial process
of its own (:mod:`loadertune.trials.inside.child`) with the trial's setting applied to its loader.
Each rank connects to a socket of this trial (the launcher passes no descriptors), says which rank
it is, and reports its own measurement; its window full, a rank goes on training unmeasured, so that
the others, waiting for it in their collectives, fill theirs. When every rank has reported, the
trial's result is the node's: the slowest rank's rate times the ranks (in data-parallel training
every step waits for the slowest rank), checked rank by rank against the setting it ran.

However the trial ends, every rank's session (each rank is a session leader, with its DataLoader
workers in its group) and the launcher's are killed before ``run`` returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from loadertune.errors import ConfigError
from loadertune.trials.channel import Channel, Listener
from loadertune.trials.contract import TrialRequest, TrialResult
from loadertune.trials.inside.child import SPEC_ENV
from loadertune.trials.script import verify
from loadertune.trials.script.launch import PARENT_ENV
from loadertune.trials.script.processes import Launch, Trial, exited, kill_group
from loadertune.trials.script.runner import ScriptRunner

MAX_RANKS = 64


class _Ranks:
    """The channels of a trial's ranks; sending goes to every rank (a prune stops them all)."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.chans: list[Channel] = []
        self.rank_of: dict[int, int] = {}  # id(channel) -> rank
        self.pids: dict[int, int] = {}  # rank -> pid
        self.results: dict[int, dict[str, Any]] = {}  # rank -> its ResultMsg
        self.ended: dict[int, dict[str, Any]] = {}  # rank -> its EndedMsg

    def send(self, msg: dict[str, Any]) -> bool:
        return all([chan.send(msg) for chan in self.chans])

    def close(self) -> None:
        for chan in self.chans:
            chan.close()
        self.listener.close()


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The node's result from each rank's: the slowest rank's measurement, its rates times the
    ranks, the samples of all, the latest first batch; each rank's ``ran`` kept."""
    n = len(results)
    slowest = min(results, key=lambda r: r["measurement"]["samples_per_s"])
    m = dict(slowest["measurement"])
    m["samples_per_s"] = n * m["samples_per_s"]
    m["sub_window_samples_per_s"] = [n * rate for rate in m["sub_window_samples_per_s"]]
    m["n_samples"] = sum(r["measurement"]["n_samples"] for r in results)
    m["first_batch_s"] = max(r["measurement"]["first_batch_s"] for r in results)
    m["complete"] = all(r["measurement"]["complete"] for r in results)
    m["stopped_early"] = any(r["measurement"]["stopped_early"] for r in results)
    ranks = sorted((r["ran"] for r in results), key=lambda ran: ran.get("rank") or 0)
    return {
        **slowest,
        "measurement": m,
        "complete": all(r["complete"] for r in results),
        "ran": {**slowest["ran"], "ranks": ranks},
    }


class _RankedLaunch(Launch):
    """A launch of torch's launcher and its ranks: one setting each (ranks never swap)."""

    @property
    def swaps(self) -> bool:
        return False

    def training_pids(self) -> list[int]:
        """Each rank's process that said hello, by rank (the launcher runs no loop)."""
        ranks: _Ranks = self.chan  # type: ignore[assignment]
        return [ranks.pids[rank] for rank in sorted(ranks.pids)]

    def close(self) -> int:
        """Kill every rank's session and the launcher's; how many were still alive."""
        ranks: _Ranks = self.chan  # type: ignore[assignment]
        groups = set(ranks.pids.values())
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error, OSError):
                    groups.add(os.getpgid(child.pid))
        ranks.close()
        survivors = sum(kill_group(group) for group in groups if group != self.proc.pid)
        survivors += kill_group(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return survivors


class RankedScriptRunner(ScriptRunner):
    """:class:`ScriptRunner` for a script that torch's launcher runs with ``nproc_per_node``
    ranks (see the module docstring). Takes ScriptRunner's arguments, and:

    Args:
        nproc_per_node: the ranks of each trial (``torchrun --nproc-per-node``).

    Each trial is a launch of its own (the ranks run one setting: no hot swap).
    """

    hot_swap = False

    def __init__(self, *args: Any, nproc_per_node: int, **kwargs: Any) -> None:
        if not isinstance(nproc_per_node, int) or not 1 <= nproc_per_node <= MAX_RANKS:
            raise ConfigError(
                f"nproc_per_node must be an int from 1 to {MAX_RANKS}, but got {nproc_per_node!r}."
            )
        super().__init__(*args, **kwargs)
        self.nproc_per_node = nproc_per_node

    def start_server(self) -> None:
        """Nothing: every launch starts torch's launcher, whose ranks are no forks of ours."""

    def _start(self, spec: dict[str, Any], request: TrialRequest) -> Launch:
        self.n_launches += 1
        folder = Path(self._logdir.name)
        log = folder / f"launch-{self.n_launches}.log"
        listener = Listener(str(folder / f"ranks-{time.monotonic_ns()}.sock"))
        env = {
            **os.environ,
            SPEC_ENV: json.dumps({**spec, "listen": listener.path}),
            PARENT_ENV: str(os.getpid()),
        }
        command = [
            self.python,
            "-m",
            "loadertune.trials.script.launch",
            "--standalone",
            f"--nproc-per-node={self.nproc_per_node}",
            "--module",
            "loadertune.trials.inside.child",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return _RankedLaunch(proc, _Ranks(listener), log)  # type: ignore[arg-type]

    def _supervise(self, trial: Trial) -> None:
        ranks: _Ranks = trial.chan  # type: ignore[assignment]
        while True:
            readable: list[Listener | Channel] = [
                ranks.listener,
                *[c for c in ranks.chans if not c.closed],
            ]
            ready, _, _ = select.select([r.fileno() for r in readable], [], [], 0.1)
            for source in readable:
                if source.fileno() not in ready:
                    continue
                if isinstance(source, Listener):
                    chan = source.accept(timeout=0)
                    if chan is not None:
                        ranks.chans.append(chan)
                    continue
                for msg in [source.recv(timeout=0), *source.drain()]:
                    if msg is not None and self._from_rank(msg, source, trial):
                        return
            if exited(
                trial,
                lambda: ((late, chan) for chan in ranks.chans for late in chan.drain()),
                lambda late, chan: self._from_rank(late, chan, trial),
            ):
                return
            expired = trial.sup.expired()
            if expired is not None:
                trial.result.failure = expired
                return

    def _from_rank(self, msg: dict[str, Any], chan: Channel, trial: Trial) -> bool:
        """Route one rank's message; True when the trial is over."""
        ranks: _Ranks = trial.chan  # type: ignore[assignment]
        kind = msg.get("t")
        if kind == "hello":
            ranks.rank_of[id(chan)] = int(msg["rank"])
            ranks.pids[int(msg["rank"])] = int(msg["pid"])
            trial.sup.sampler.main_pids.add(int(msg["pid"]))  # a main process, not a worker
            return False
        rank = ranks.rank_of.get(id(chan), -1)
        if kind == "result":
            ranks.results[rank] = msg
            if len(ranks.results) < self.nproc_per_node:
                return False
            done = self._on_result(combine(list(ranks.results.values())), trial)  # type: ignore[arg-type]
            return done or len(ranks.ended) == self.nproc_per_node
        if kind == "ended":
            ranks.ended[rank] = msg
            if rank in ranks.results and len(ranks.results) < self.nproc_per_node:
                return False  # its partial window waits for the others'
            return self._handle(msg, trial)
        if kind in ("failure", "no_batches") or rank == 0:
            return self._handle(msg, trial)
        return False  # another rank's loader, events and progress: rank 0 speaks for them

    def _on_loader(self, msg: Any, trial: Trial) -> bool:
        """Rank 0's loader; an epoch of the node holds every rank's share."""
        if msg["epoch_samples"]:
            msg = {**msg, "epoch_samples": msg["epoch_samples"] * self.nproc_per_node}
        return super()._on_loader(msg, trial)

    def _check_ran(self, ran: dict[str, Any], result: TrialResult) -> None:
        """Every rank must have run the setting, not only the slowest."""
        super()._check_ran(ran, result)
        if result.failure is not None or result.phase in ("baseline", "replay"):
            return
        for each in ran.get("ranks") or []:
            wrong = verify.mismatch(result.config, each, check_lengths=self._check_lengths)
            if wrong is not None:
                rank = each.get("rank")
                result.failure = verify.not_applied(result.config, f"rank {rank}: {wrong}")
                result.measurement = None
                return
