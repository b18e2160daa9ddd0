"""The verdict of a search in plain lines (speed-up, ceiling, why it stopped, warnings,
advice), and the summary printed at its end: tables (:mod:`loadertune.view.tables`) and lines."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console

from loadertune.config import Config
from loadertune.search import plan
from loadertune.search.driver import CEILING_REFUTED
from loadertune.trials.inside.identity import target_line
from loadertune.view.console import plain_console, rate_text
from loadertune.view.tables import summary_table, trials_table

if TYPE_CHECKING:
    from loadertune.results.recommendation import Recommendation


_STAGE_NAMES = {
    "consumer": "your step",
    "loader": "the loader",
    "cpu": "the CPUs, which loading and your step share",
    "transfer": "the host-to-device copy",
    "main_process": "loading in the training process itself (num_workers=0), which beats "
    "handing batches over from workers here",
}

CEILING_EXCEEDED = 105.0  # percent of the estimated ceiling beyond which noise does not explain it


def _ceiling_refuted(
    entry: Mapping[str, Any], diag: Mapping[str, Any], ceiling: float
) -> str | None:
    """Why the run itself refutes the estimated ceiling, in words, or None where nothing it
    measured does: the winner's median clearly above it (:data:`CEILING_EXCEEDED`), or a trial
    of the search far above it though the winner's median stays under. The best of several
    noisy trials reads above a true ceiling by more than a median does, so that bar is the
    search's own (:data:`CEILING_REFUTED` times it). The estimate rests on the probe's
    per-sample figures at one batch size and worker count: a winner elsewhere (in-process at a
    larger batch, whose fixed fetch cost a batch spreads thinner) can beat it, and on a busy
    machine it can be far too low. A figure the run refutes is then not printed at all."""
    percent = diag.get("percent_of_ceiling")
    if percent is not None and percent > CEILING_EXCEEDED:
        return "the probe's figures did not hold for the winner's setting"
    best = (entry.get("search") or {}).get("best_explored_samples_per_s")
    if isinstance(best, (int, float)) and best > CEILING_REFUTED * ceiling:
        return (
            f"a trial of the search measured {best:,.0f} samples/s, far beyond what the "
            "probe's figures allowed"
        )
    return None


# Why the exploration stopped (``search.stop_reason``), in words; "at_ceiling" is said with
# its figures by _stop_words.
_STOP_REASONS = {
    "budget": "what was left of the budget held no further trial beside the final rounds",
    "n_trials": "the cap on trials (--trials) was reached",
    "no_improvement": "the last trials brought no gain beyond the noise",
    "space_exhausted": "every setting of the space was measured",
    "compute_bound": "your settings already keep up (the loop almost never waited for data)",
    "no_new_proposals": "the sampler proposed no setting that was not measured already",
    "interrupted": "it was interrupted",
    "run_ended": "the training run ended first (loadertune run --tune)",
}


def _stop_words(entry: Mapping[str, Any]) -> str:
    """Why the exploration stopped, true beside the ceiling line: the rule compares the best
    rate the exploration measured with the ceiling no worker count can lift, and the ceiling
    line compares the winner's median over its final rounds with the estimated ceiling; on a
    noisy machine the first can reach the ceiling while the second does not."""
    s = entry.get("search") or {}
    reason = s.get("stop_reason")
    if reason == "budget":
        rounds = [t for t in entry.get("trials") or [] if t.get("phase") == "confirm"]
        if not any(t.get("status") == "ok" for t in rounds):
            # (no final round ran, or none ran to its end: do not speak of rounds that
            # never ran)
            return "the budget ran out before any final round measured the finalists"
    if reason != "at_ceiling":
        return _STOP_REASONS.get(reason or "", reason or "unknown")
    best = s.get("best_explored_samples_per_s")
    words = "the best trial reached the estimated ceiling no worker count can lift"
    if best:
        words = (
            f"the best trial measured {best:,.0f} samples/s, at the estimated ceiling no "
            "worker count can lift"
        )
    percent = (entry.get("diagnosis") or {}).get("percent_of_ceiling")
    if percent is not None and percent < 90:
        words += "; the final rounds measured the winner lower"
    return words


def _budget_too_short(entry: Mapping[str, Any]) -> str | None:
    """When the budget ran out before the search explored what it needs to rank anything (its
    first :data:`~loadertune.search.plan.MIN_EXPLORED` settings beyond the opening), say so and
    what budget would do: with seconds-long batches, one trial of many workers can take a minute,
    and the pick is then little more than your own settings."""
    s = entry.get("search") or {}
    trials = [t for t in entry.get("trials") or [] if isinstance(t, Mapping)]
    timed = [
        (t.get("phase"), t["wall_s"])
        for t in trials
        if isinstance(t.get("wall_s"), float) and t["wall_s"] > 0
    ]
    walls = [w for _, w in timed]
    explored = sum(t.get("phase") == "search" for t in trials)
    if s.get("stop_reason") != "budget" or explored >= plan.MIN_EXPLORED or not walls:
        return None
    opening = sum(w for phase, w in timed if phase != "search")
    room = opening + 10 * statistics.median(walls)
    suggest = 60 * math.ceil(room / 60)
    if suggest <= (s.get("elapsed_s") or 0.0):
        return None
    return (
        f"the budget ran out after {explored} setting{'s' if explored != 1 else ''} beyond your "
        f"own and the probe (its trials took {min(walls):.0f}-{max(walls):.0f} s each): "
        f"a budget of about {suggest} s (--budget, or budget_s=) gives room for ten"
    )


def _baseline_kwargs(entry: Mapping[str, Any]) -> object:
    baseline = entry.get("baseline")
    return baseline.get("loader_kwargs") if isinstance(baseline, dict) else None


def _batch_size(kwargs: object) -> object:
    return kwargs.get("batch_size") if isinstance(kwargs, dict) else None


# The time between epochs is worth a word once it is this share of the winner's epoch.
BETWEEN_EPOCHS_SHARE = 0.05


def _end_to_end(entry: Mapping[str, Any]) -> str | None:
    """The speed-up on the run's own time per epoch, in words: each epoch's time at its epoch
    rate plus the time the loop spends between epochs (validation, logging), which no loader
    setting changes, so a script with a long validation after each short epoch gains far less
    end to end than per epoch. None where that time is unknown or small beside the winner's
    epoch, or where it hardly moves the figure."""
    n, rest = entry.get("epoch_samples"), entry.get("between_epochs_s")
    win = (entry.get("winner") or {}).get("epoch_samples_per_s")
    base = (entry.get("baseline") or {}).get("epoch_samples_per_s")
    if not (n and isinstance(rest, float) and win and base):
        return None
    whole = (n / base + rest) / (n / win + rest)
    if rest < BETWEEN_EPOCHS_SHARE * n / win or abs(whole - win / base) < 0.05:
        return None
    return (
        f"about {whole:.2f}x per epoch of your run, with the {rest:.2f} s your script spends "
        "between epochs (validation, logging), which no loader setting changes"
    )


def noise_words(entry: Mapping[str, Any]) -> str:
    """What noise lets the speed-up say, in a few words for a one-line summary: "within the
    noise", "not confirmed", or "" (clearly faster)."""
    if entry.get("unconfirmed"):
        return "not confirmed"
    return "within the noise" if entry.get("within_noise") else ""


def summary_lines(rec: Recommendation | Mapping[str, Any]) -> list[str]:
    """The verdict in plain lines, from a Recommendation or a file entry. Total: any optional
    part may be missing (a resumed search whose winner was measured only in an earlier run, a
    partial entry, an old file)."""
    entry = rec if isinstance(rec, Mapping) else rec.to_entry()
    diag = entry.get("diagnosis") or {}
    workload = entry.get("workload") or {}
    fixed = workload.get("batch_size_fixed")
    lines = [
        _tuned_line(entry),
        f"batch size left out of the search: {fixed}" if fixed else None,
        *_speedup_lines(entry),
        _ceiling_line(entry, diag),
        _best_at_batch_size_line(entry),
        _search_line(entry),
        _budget_too_short(entry),
        *(f"warning: {warning}" for warning in diag.get("warnings") or []),
        *(f"advice: {advice}" for advice in diag.get("advice") or []),
    ]
    return [line for line in lines if line]


def _verdict(entry: Mapping[str, Any], speedup: float) -> str:
    """What the speed-up means beside the noise, in words."""
    if not entry.get("within_noise"):
        return "clearly faster than your settings"
    if entry.get("unconfirmed"):
        return (
            "not confirmed: no time was left to measure the two side by side, and figures "
            "from different moments tell too little"
        )
    if speedup < 1:
        # It led over the whole search (the rounds and the exploration's figures pooled),
        # not in the rounds alone. The pooled figures rank the two better than the rounds:
        # in simulated searches such a winner is mostly the faster of the two, and keeping
        # the baseline puts more picks below 0.95 of the best (README, "Within the noise,
        # the winner is saved").
        return (
            "within the noise of your settings: behind them side by side, ahead over the "
            "whole search, which holds more figures; the winner is saved"
        )
    if entry.get("loader_kwargs") == _baseline_kwargs(entry):
        return "within the noise: your settings are the best found; keep them"
    if _batch_size(entry.get("loader_kwargs")) != _batch_size(_baseline_kwargs(entry)):
        # not for free: a batch size of its own asks the learning rate to change with it
        return (
            "within the noise of your settings, at another batch size: keeping yours "
            "loses nothing (the best setting at it is below; `loadertune run` applies that "
            "one, and in code `rec.best_at_batch_size` holds it)"
        )
    return "within the noise of your settings, but ahead of them: take the winner, for free"


def _speedup_lines(entry: Mapping[str, Any]) -> list[str]:
    """The speed-up per epoch with its verdict, and end to end where that differs."""
    speedup = entry.get("speedup")
    if speedup is None:
        return []
    verdict = _verdict(entry, speedup)
    if "epoch_samples" not in entry or entry["epoch_samples"]:  # (an older file: not said)
        line = f"speed-up {speedup:.2f}x per epoch ({verdict})"
    else:  # an epoch of unknown length: its start-up is not in the rate
        line = (
            f"speed-up {speedup:.2f}x in the steady rate ({verdict}; the epoch's length is "
            "unknown, so the workers' start-up at each epoch is left out)"
        )
    whole = _end_to_end(entry)
    return [line, whole] if whole else [line]


def _ceiling_line(entry: Mapping[str, Any], diag: Mapping[str, Any]) -> str | None:
    """The estimated ceiling, what limits it, and how near the winner comes."""
    ceiling = diag.get("ceiling_samples_per_s")
    if not ceiling:
        return None
    refuted = _ceiling_refuted(entry, diag, ceiling)
    if refuted:  # (the JSON keeps the estimate and the percent; the summary prints neither)
        return f"ceiling: none estimated ({refuted})"
    stage = str((diag.get("ceilings") or {}).get("limiting_stage") or "")
    name = _STAGE_NAMES.get(stage, stage or "an unknown stage")
    if stage == "consumer" and (diag.get("ceilings") or {}).get("step_floored"):
        # the replay ran slower than a loop that also loaded: the step's own rate is unknown
        name += ", at least as fast as a loop measured, which is all the probe could tell"
    line = f"estimated ceiling {ceiling:,.0f} samples/s (limited by {name})"
    percent = diag.get("percent_of_ceiling")
    if percent is not None:
        line += f"; the winner's median rate reaches {percent:.0f}% of it"
    return line


def _best_at_batch_size_line(entry: Mapping[str, Any]) -> str | None:
    """The best setting at the user's batch size, where the winner changes it."""
    at_bs = entry.get("best_at_batch_size")
    at_bs_kwargs = (at_bs or {}).get("loader_kwargs") or {}
    kwargs = entry.get("loader_kwargs") or {}
    if (
        at_bs_kwargs.get("batch_size") is None
        or "batch_size" not in kwargs
        or at_bs_kwargs["batch_size"] == kwargs["batch_size"]
    ):
        return None
    # your own settings, where nothing else at your batch size beat them: say so, or the
    # baseline itself reads as a setting the search found
    own = " (your own settings)" if at_bs_kwargs == _baseline_kwargs(entry) else ""
    return (
        f"best at your batch size: {Config.from_kwargs(at_bs_kwargs).label()}{own} "
        f"{_at_batch_size_figure(at_bs or {}, at_bs_kwargs, entry)}; "
        "the winner changes the batch size, so scale the learning rate with it (linearly "
        "or by its square root)"
    )


def _at_batch_size_figure(
    at_bs: Mapping[str, Any], kwargs: Mapping[str, Any], entry: Mapping[str, Any]
) -> str:
    """The rate of the best setting at the user's batch size, in words: this run's steady
    rate; or, for a setting only an earlier run of a resumed study measured, the epoch rate the
    study holds; never a dash where a number should stand."""
    rate = at_bs.get("samples_per_s")
    if isinstance(rate, (int, float)):
        return f"{rate_text(rate)} samples/s{_at_batch_size_note(entry, kwargs, rate)}"
    epoch = at_bs.get("epoch_samples_per_s")
    if not at_bs.get("earlier_run"):
        return "(no figure of it in this run)"
    if isinstance(epoch, (int, float)) and epoch > 0:
        return f"{rate_text(epoch)} samples/s per epoch, measured in an earlier run of the study"
    return "(measured in an earlier run of the study)"


def _search_line(entry: Mapping[str, Any]) -> str:
    """How many trials in how long, why the search stopped, and the study it resumed."""
    s = entry.get("search") or {}
    elapsed = s.get("elapsed_s")
    head = f"{s.get('n_trials', len(entry.get('trials') or []))} trials"
    if elapsed is not None:
        head += f" in {elapsed:.0f} s"
    head += f", stopped: {_stop_words(entry)}"
    earlier = s.get("n_previous_trials")
    if isinstance(earlier, int) and earlier > 0:  # their figures count; they are not run again
        head += f"; resumed a study of {earlier} trials from earlier runs"
    if s.get("study_name"):
        head += f"; study {s['study_name']!r} in {s.get('storage') or 'an unknown storage'}"
    return head


def _tuned_line(entry: Mapping[str, Any]) -> str | None:
    """Which loader of a script was tuned (see
    :func:`loadertune.trials.inside.identity.target_line`)."""
    w = entry.get("workload") or {}
    if w.get("kind") != "script" or not w.get("call_site"):
        return None
    return "tuned: " + target_line(
        index=w.get("loader_index"),
        call_site=w["call_site"],
        dataset=w.get("dataset"),
        batch_size=_batch_size(_baseline_kwargs(entry))
        or ("its batch sampler's" if w.get("batch_size_fixed") else None),
        chosen_by=w.get("chosen_by"),
        rebuilt=bool(w.get("rebuilt_by_framework")),
        recreated=bool(w.get("recreated_each_epoch")),
        key=w.get("key") or (),
    )


def _at_batch_size_note(
    entry: Mapping[str, Any], kwargs: Mapping[str, Any], rate: float | None
) -> str:
    """Why the best at the user's batch size is not the winner though its figure here is higher
    (one lucky search figure; or, side by side, the rounds' figure, where the winner was chosen
    on every figure of the search pooled)."""
    winner_rate = entry.get("samples_per_s")
    if not rate or not winner_rate or rate < winner_rate:
        return ""
    confirmed = any(
        t.get("phase") == "confirm" and t.get("params") == dict(kwargs)
        for t in entry.get("trials") or []
    )
    if confirmed:  # it led side by side; the winner leads only over the pooled figures
        return (
            " side by side in the final rounds, ahead of the winner there; the winner leads "
            "over the whole search, which holds more figures"
        )
    return " in the search alone: it was not measured beside the winner in the final rounds"


def print_summary(
    rec: Recommendation, console: Console | None = None, *, trials: bool = False
) -> None:
    console = console or plain_console()
    if trials:
        console.print(trials_table(rec.trials))
    console.print(f"loadertune on {rec.hardware.describe()}", highlight=False, soft_wrap=True)
    console.print(summary_table(rec))
    for line in summary_lines(rec):
        console.print(line, highlight=False, soft_wrap=True)
    why = (rec.workload or {}).get("batch_size_fixed") or "your batch_sampler decides the batches"
    sampler = "" if "batch_size" in rec.loader_kwargs else f"  ({why})"
    console.print(
        f"use: DataLoader(dataset, **{rec.loader_kwargs}){sampler}",
        highlight=False,
        soft_wrap=True,
    )
