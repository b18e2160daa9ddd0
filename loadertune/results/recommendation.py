"""The answer of a search (:class:`Recommendation`): the settings to use and the evidence,
built from a search's outcome, and its entry in the recommendation file."""

from __future__ import annotations

import datetime as _dt
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from loadertune.errors import SearchInterrupted
from loadertune.hardware import Hardware
from loadertune.results import analysis, store
from loadertune.search import SearchOutcome
from loadertune.trials import TrialResult


def interrupted_as_it_finished(outcome: SearchOutcome) -> SearchInterrupted:
    """Ctrl-C or SIGTERM once the search was over, as it was being written up: what an
    interrupted search says, with the winner's figures as the best setting so far."""
    figures = _figures(outcome.results_for(outcome.winner))
    return SearchInterrupted.kept(
        study_name=outcome.study_name,
        storage=outcome.storage,
        n_complete=sum(t.ok for t in outcome.trials),
        best={"loader_kwargs": outcome.winner.loader_kwargs(), **figures} if figures else None,
        when=" as it finished",
        fresh=not outcome.settings.resume,
    )


def _figures(results: list[TrialResult]) -> dict[str, Any] | None:
    """Medians over a setting's measurements, and each round, for the report and the file."""
    ok = [r for r in results if r.ok and r.measurement is not None and not r.pruned]
    if not ok:
        return None
    rates = [r.samples_per_s or 0.0 for r in ok]
    epoch = [r.epoch_samples_per_s or 0.0 for r in ok]
    out: dict[str, Any] = {
        "samples_per_s": statistics.median(rates),
        "epoch_samples_per_s": statistics.median(epoch),
        "rounds_samples_per_s": rates,
        "spread": (max(rates) - min(rates)) / statistics.median(rates)
        if len(rates) > 1
        else ok[0].measurement.spread
        if ok[0].measurement
        else None,
        "blocked_fraction": statistics.median(
            r.measurement.blocked_fraction for r in ok if r.measurement
        ),
        "first_batch_s": statistics.median(
            r.measurement.first_batch_s for r in ok if r.measurement
        ),
        "epoch_startup_s": statistics.median(r.epoch_startup_s for r in ok),
    }
    res = [r.resources for r in ok if r.resources is not None]
    if res:

        def med(values: list[float | int | None]) -> float | None:
            vals = [v for v in values if v is not None]
            return statistics.median(vals) if vals else None

        out["cpu_percent_main"] = med([u.cpu_percent_main for u in res])
        out["cpu_percent_workers"] = med([u.cpu_percent_workers for u in res])
        out["pss_bytes"] = med([u.pss_bytes for u in res])
        out["worker_pss_bytes"] = med([u.worker_pss_bytes for u in res])
        out["gpu_util_mean"] = med([u.gpu_util_mean for u in res])
    peaks = [r.cuda_peak_reserved_bytes for r in ok if r.cuda_peak_reserved_bytes]
    if peaks:
        out["cuda_peak_reserved_bytes"] = max(peaks)
    return out


@dataclass
class Recommendation:
    """The answer of a search: settings to use on this machine, and the evidence.

    Attributes:
        loader_kwargs: keyword arguments for ``DataLoader`` (``num_workers``, ``batch_size``,
            ``prefetch_factor``, ``pin_memory``, ``persistent_workers``).
        samples_per_s: the winner's confirmed steady-state rate (median of the final rounds).
        baseline_kwargs: the user's own settings, measured beside the winner.
        baseline_samples_per_s: their confirmed rate.
        speedup: winner over baseline, by epoch rate (start-up included), or None.
        within_noise: True when the winner does not clearly beat the baseline.
        unconfirmed: True when nothing could compare them (no final rounds of the winner, and
            one short window of one of them): ``within_noise`` is then unknown, not shown.
        best_at_batch_size: the best setting at the user's own batch size, with its rate (the
            overall winner may use another batch size; the learning rate then usually needs
            scaling with it).
        trials: one record per trial of this call (``params``, ``samples_per_s``, ``error``...).
        diagnosis: the bottleneck and ceilings (see ``loadertune.results.analysis``); the keys
            ``"bottleneck"`` and ``"ceiling_samples_per_s"`` are stable.
        hardware: the machine it was measured on.
        search: study name, storage, why the search stopped, time spent.
        workload: what was tuned (dataset or script, and which loader).
        epoch_samples: samples per epoch of the winner's loader; None where its length is
            unknown (then "per epoch" figures are the steady rate, start-up left out).
        between_epochs_s: the loop's time between an epoch's end and the next (validation,
            logging, checkpoints), the median of what the trials saw; None if none saw one.
            No loader setting changes it, so the run's own speed-up is smaller than the
            epochs' (the summary says by how much).
    """

    loader_kwargs: dict[str, Any]
    samples_per_s: float | None
    baseline_kwargs: dict[str, Any]
    baseline_samples_per_s: float | None
    speedup: float | None
    within_noise: bool
    best_at_batch_size: dict[str, Any] | None
    trials: list[TrialResult]
    diagnosis: dict[str, Any]
    hardware: Hardware
    search: dict[str, Any]
    workload: dict[str, Any] = field(default_factory=dict)
    winner: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    epoch_samples: int | None = None
    between_epochs_s: float | None = None
    unconfirmed: bool = False
    measured_at: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    )

    def to_entry(self) -> dict[str, Any]:
        """This recommendation as an entry of the recommendation file."""
        return {
            "loader_kwargs": self.loader_kwargs,
            "samples_per_s": self.samples_per_s,
            "speedup": self.speedup,
            "within_noise": self.within_noise,
            "unconfirmed": self.unconfirmed,
            "winner": self.winner,
            "baseline": {"loader_kwargs": self.baseline_kwargs, **(self.baseline or {})},
            "best_at_batch_size": self.best_at_batch_size,
            "epoch_samples": self.epoch_samples,
            "between_epochs_s": self.between_epochs_s,
            "diagnosis": self.diagnosis,
            "workload": self.workload,
            "hardware": self.hardware.to_dict(),
            "measured_at": self.measured_at,
            "versions": self.hardware.versions,
            "search": self.search,
            "trials": [t.to_dict() | {"measurement": None, "resources": None} for t in self.trials],
        }

    def save(self, path: str | os.PathLike[str] = "loadertune.json", *, force: bool = False) -> str:
        """Merge this machine's entry into ``path`` (atomically, under a lock); return the path."""
        return str(store.save_entry(path, self.hardware.key, self.to_entry(), force=force))


def build_recommendation(
    outcome: SearchOutcome, hw: Hardware, *, workload: dict[str, Any], hide_batch_size: bool = False
) -> Recommendation:
    """Turn a search's outcome into a Recommendation."""
    winner, base = outcome.winner, outcome.baseline
    win_fig = _figures(outcome.results_for(winner))
    base_fig = _figures(outcome.results_for(base))
    kwargs, base_kwargs = winner.loader_kwargs(), base.loader_kwargs()
    if hide_batch_size:  # a batch sampler decides: "bs=1" would be no batch size it makes
        kwargs.pop("batch_size")
        base_kwargs.pop("batch_size")
    speedup = None
    if win_fig and base_fig and base_fig["epoch_samples_per_s"]:
        speedup = win_fig["epoch_samples_per_s"] / base_fig["epoch_samples_per_s"]
    space = outcome.space
    return Recommendation(
        loader_kwargs=kwargs,
        samples_per_s=win_fig["samples_per_s"] if win_fig else None,
        baseline_kwargs=base_kwargs,
        baseline_samples_per_s=base_fig["samples_per_s"] if base_fig else None,
        speedup=speedup,
        within_noise=not analysis.clearly_better(outcome, hw),
        unconfirmed=analysis.unconfirmed(outcome),
        best_at_batch_size=_best_at_batch_size(outcome, hide_batch_size=hide_batch_size),
        trials=outcome.trials,
        diagnosis=analysis.analyze(outcome, hw),
        hardware=hw,
        search={
            "study_name": outcome.study_name,
            "study_started": outcome.study_started,
            "storage": outcome.storage,
            "stop_reason": outcome.stop_reason,
            # what the stop rules read: the best rate the exploration measured (earlier runs of
            # the study included), by epoch
            "best_explored_samples_per_s": max(outcome.values.values(), default=None),
            "elapsed_s": outcome.elapsed_s,
            "n_trials": len(outcome.trials),
            "n_previous_trials": outcome.n_previous_trials,
            "space": {
                "batch_sizes": list(space.batch_sizes),
                "max_workers": space.max_workers,
                "prefetch_factors": list(space.prefetch_factors),
                "pin_memory": list(space.pin_memory),
                "persistent_workers": list(space.persistent_workers),
                "limits": space.limits,
            },
        },
        workload=workload,
        winner=win_fig,
        baseline=base_fig,
        epoch_samples=next(
            (t.epoch_samples for t in outcome.results_for(winner) if t.epoch_samples), None
        ),
        between_epochs_s=_between_epochs_s(outcome.trials),
    )


def _best_at_batch_size(outcome: SearchOutcome, *, hide_batch_size: bool) -> dict[str, Any] | None:
    """The best setting at the user's batch size with its figures: this run's, or, for a
    setting only an earlier run of a resumed study measured, the rate the study holds of it
    (by epoch, as the search ranks settings), marked ``"earlier_run"``."""
    at_bs = outcome.best_at_batch_size(outcome.user_batch_size)
    if at_bs is None:
        return None
    kwargs = at_bs.loader_kwargs()
    if hide_batch_size:  # (not "batch_size: 1" either)
        kwargs.pop("batch_size")
    figures = _figures(outcome.results_for(at_bs))
    if figures is None:
        figures = {"epoch_samples_per_s": outcome.value(at_bs), "earlier_run": True}
    return {"loader_kwargs": kwargs, **figures}


def _between_epochs_s(trials: list[TrialResult]) -> float | None:
    """The median time the loop spent between two epochs of the tuned loader, over every rest
    this run's trials saw (a replay's loop is loadertune's, not the script's)."""
    rests = [
        r
        for t in trials
        if t.measurement is not None and not t.kept and t.phase != "replay"
        for r in t.measurement.rest_s
    ]
    return statistics.median(rests) if rests else None
