"""What the user sees: a live view while searching, and the result tables after.

In a terminal the live view is a small rich panel (trial in progress, best so far, budget left),
redrawn at each event rather than by a timer thread, so it costs the measured loop nothing. When
stdout is not a terminal it prints one plain line per trial instead.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from loadertune.config import Config, kwargs_label
from loadertune.search import plan
from loadertune.search.driver import CEILING_REFUTED
from loadertune.trials import TrialResult
from loadertune.trials.inside.identity import target_line
from loadertune.units import MIB

if TYPE_CHECKING:
    from loadertune.results.recommendation import Recommendation


# Where the output is a file or a pipe (a log, CI) rich would lay tables out in 80 columns,
# wrapping every setting's label over two lines; COLUMNS still decides where it is set.
PIPED_WIDTH = 120


def plain_console(*, stderr: bool = False) -> Console:
    """A console that prints text as it is: no markup parsed (failure texts, paths and library
    messages hold square brackets), no highlighting. Styles come from ``Text`` objects. Piped,
    it is :data:`PIPED_WIDTH` wide."""
    console = Console(stderr=stderr, markup=False, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH
    return console


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def trial_line(result: TrialResult) -> str:
    """One line per trial: phase, setting, rate or cause."""
    m = result.measurement
    if result.failure is not None:
        what = f"FAILED {result.failure.kind}: {result.failure.message}"
    elif result.skipped:
        what = f"skipped: {result.skipped}"
    else:
        what = f"{_rate(result.samples_per_s)} samples/s"
        epoch = result.epoch_samples_per_s
        if epoch and result.samples_per_s and abs(epoch / result.samples_per_s - 1) > 0.1:
            # what the search ranks by: each epoch's start-up counted, which can reorder
            # settings whose window rates alone would rank otherwise
            what += f" ({_rate(epoch)} per epoch)"
        if m is not None:
            what += f"  blocked {_pct(m.blocked_fraction)}  spread {_pct(m.spread)}"
        if result.pruned:
            what += "  (pruned)"
    if result.extra.get("settings_unknown"):
        label = "the script's own"
    elif result.extra.get("batch_size_fixed"):
        label = kwargs_label({**result.params, "batch_size": None})
    else:
        label = result.config.label()
    return f"{result.phase:<8} {label:<32} {what}"


class LiveView:
    """An :class:`loadertune.search.Observer` that shows the search as it runs."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or plain_console(stderr=True)
        self._live: Live | None = None
        self._deadline = 0.0
        self._phase = ""
        self._current: str | None = None
        self._best: TrialResult | None = None
        self._n = 0
        self._last: list[str] = []

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._live = Live(
                self._render(), console=self.console, auto_refresh=False, transient=False
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def _render(self) -> Group:
        left = max(0.0, self._deadline - time.monotonic())
        head = Text(
            f"loadertune · {self._phase or 'starting'} · trial {self._n} · "
            f"{left:.0f} s of budget left",
            style="bold",
        )
        best = (
            f"best so far: {self._best.config.label()}  "
            f"{_rate(self._best.epoch_samples_per_s)} samples/s"
            if self._best
            else "best so far: -"
        )
        now = f"running: {self._current}" if self._current else ""
        return Group(
            head, Text(best), Text(now), *[Text(line, style="dim") for line in self._last[-5:]]
        )

    def _print(self, line: str) -> None:
        """A plain line, written to the console's file as it is. Not through ``Console.print``:
        it clears its buffer only after the write, and a Ctrl-C that lands in between (the user
        presses it on seeing the line) leaves the line there for the next print to repeat."""
        file = self.console.file
        file.write(line + "\n")
        file.flush()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)

    def search_started(self, deadline: float, budget_s: float) -> None:
        self._deadline = deadline
        if self._live is None:
            self._print(f"loadertune: searching for up to {budget_s:.0f} s")
        self._refresh()

    def phase(self, name: str) -> None:
        self._phase = name
        self._refresh()

    def trial_started(self, config: Config | None, phase: str) -> None:
        self._n += 1
        self._current = f"{phase} {config.label() if config else '(its own settings)'}"
        self._refresh()

    def note(self, text: str) -> None:
        self._last.append(text)
        if self._live is None:
            self._print(f"loadertune: {text}")
        self._refresh()

    def trial_finished(self, result: TrialResult, best: TrialResult | None) -> None:
        self._best = best
        self._current = None
        line = trial_line(result)
        self._last.append(line)
        if self._live is None:
            self._print(line)
        self._refresh()


def _column(
    kwargs: dict[str, Any] | None, fig: dict[str, Any] | None, diag: dict[str, Any] | None
) -> list[str]:
    setting = kwargs_label(kwargs) if kwargs else "-"
    fig = fig or {}
    cpu, cpu_w, gpu = (
        fig.get("cpu_percent_main"),
        fig.get("cpu_percent_workers"),
        fig.get("gpu_util_mean"),
    )
    return [
        setting,
        _rate(fig.get("samples_per_s")),
        _rate(fig.get("epoch_samples_per_s")),
        _pct(fig.get("spread")),
        _pct(fig.get("blocked_fraction")),
        _BOTTLENECKS.get((diag or {}).get("bottleneck") or "", "-"),
        "-" if cpu is None else f"{cpu:.0f}% + {cpu_w or 0:.0f}%",
        "-" if fig.get("pss_bytes") is None else f"{fig['pss_bytes'] / MIB:,.0f} MiB",
        "-" if gpu is None else f"{gpu:.0f}%",
    ]


# The diagnosis' verdicts, as the summary says them (the file keeps the short codes).
_BOTTLENECKS = {
    "input": "the loader (input)",
    "compute": "your step (compute)",
    "balanced": "neither (balanced)",
}

_SUMMARY_ROWS = (
    "setting",
    "samples/s (steady)",
    "samples/s (per epoch)",
    "spread over rounds",
    "blocked on data",
    "bottleneck",
    "CPU main + workers",
    "memory (PSS)",
    "GPU utilization",
)


def summary_rows(entry: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Baseline beside winner, row by row (name, baseline, winner), from a file entry (or
    ``Recommendation.to_entry()``): rate, noise, blocked fraction, bottleneck, CPU, memory, GPU."""
    diag = entry.get("diagnosis") or {}
    baseline = entry.get("baseline") or {}
    base = _column(baseline.get("loader_kwargs"), baseline, diag.get("baseline"))
    win = _column(entry.get("loader_kwargs"), entry.get("winner"), diag.get("winner"))
    return list(zip(_SUMMARY_ROWS, base, win, strict=True))


def summary_table(rec: Recommendation) -> Table:
    """Baseline beside winner: rate, noise, blocked fraction, bottleneck, CPU, memory, GPU."""
    table = Table()
    table.add_column("")
    table.add_column("baseline (yours)")
    table.add_column("winner", style="bold")
    for row in summary_rows(rec.to_entry()):
        table.add_row(*row)
    return table


_STAGE_NAMES = {
    "consumer": "your step",
    "loader": "the loader",
    "cpu": "the CPUs, which loading and your step share",
    "transfer": "the host-to-device copy",
    "main_process": "loading in the training process itself (num_workers=0), which beats "
    "handing batches over from workers here",
}

CEILING_EXCEEDED = 105.0  # percent of the estimated ceiling beyond which noise does not explain it


def _ceiling_refuted(entry: Mapping[str, Any], ceiling: float) -> str:
    """What the summary adds when a trial of the search measured far above the estimated
    ceiling that the winner's median stays under: the estimate bounds nothing then. The best of
    several noisy trials reads above a true ceiling by more than a median does, so the bar is
    the search's own (:data:`CEILING_REFUTED` times it). On a busy machine the probe's
    estimate can be far too low, and "reaches N% of it" would then mislead."""
    best = (entry.get("search") or {}).get("best_explored_samples_per_s")
    if not isinstance(best, (int, float)) or best <= CEILING_REFUTED * ceiling:
        return ""
    return (
        f"; a trial of the search measured {best:,.0f} samples/s, {100 * best / ceiling:.0f}% "
        "of it: the probe's figures do not hold there, so this is no bound"
    )


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
    lines = []
    diag = entry.get("diagnosis") or {}
    tuned = _tuned_line(entry)
    if tuned:
        lines.append(tuned)
    workload = entry.get("workload") or {}
    if workload.get("batch_size_fixed"):
        lines.append(f"batch size left out of the search: {workload['batch_size_fixed']}")
    speedup = entry.get("speedup")
    if speedup is not None:
        if not entry.get("within_noise"):
            verdict = "clearly faster than your settings"
        elif entry.get("unconfirmed"):
            verdict = (
                "not confirmed: no time was left to measure the two side by side, and figures "
                "from different moments tell too little"
            )
        elif speedup < 1:
            # It led over the whole search (the rounds and the exploration's figures pooled),
            # not in the rounds alone. The pooled figures rank the two better than the rounds:
            # in simulated searches such a winner is mostly the faster of the two, and keeping
            # the baseline puts more picks below 0.95 of the best (README, "Within the noise,
            # the winner is saved").
            verdict = (
                "within the noise of your settings: behind them side by side, ahead over the "
                "whole search, which holds more figures; the winner is saved"
            )
        elif entry.get("loader_kwargs") == _baseline_kwargs(entry):
            verdict = "within the noise: your settings are the best found; keep them"
        elif _batch_size(entry.get("loader_kwargs")) != _batch_size(_baseline_kwargs(entry)):
            # not for free: a batch size of its own asks the learning rate to change with it
            verdict = (
                "within the noise of your settings, at another batch size: keeping yours "
                "loses nothing (the best setting at it is below; `loadertune run` applies that "
                "one, and in code `rec.best_at_batch_size` holds it)"
            )
        else:
            verdict = (
                "within the noise of your settings, but ahead of them: take the winner, for free"
            )
        if "epoch_samples" not in entry or entry["epoch_samples"]:  # (an older file: not said)
            line = f"speed-up {speedup:.2f}x per epoch ({verdict})"
        else:  # an epoch of unknown length: its start-up is not in the rate
            line = (
                f"speed-up {speedup:.2f}x in the steady rate ({verdict}; the epoch's length is "
                "unknown, so the workers' start-up at each epoch is left out)"
            )
        lines.append(line)
        whole = _end_to_end(entry)
        if whole:
            lines.append(whole)
    ceiling = diag.get("ceiling_samples_per_s")
    if ceiling:
        stage = str((diag.get("ceilings") or {}).get("limiting_stage") or "")
        name = _STAGE_NAMES.get(stage, stage or "an unknown stage")
        if stage == "consumer" and (diag.get("ceilings") or {}).get("step_floored"):
            # the replay ran slower than a loop that also loaded: the step's own rate is unknown
            name += ", at least as fast as a loop measured, which is all the probe could tell"
        line = f"estimated ceiling {ceiling:,.0f} samples/s (limited by {name})"
        percent = diag.get("percent_of_ceiling")
        if percent is not None and percent > CEILING_EXCEEDED:
            # The estimate is built from the probe's per-sample figures at one batch size and
            # worker count; a winner elsewhere (in-process at a larger batch, whose fixed fetch
            # cost a batch spreads thinner) can beat it. Then it bounds nothing.
            line += (
                f"; the winner's median rate is {percent:.0f}% of it: the probe's figures do "
                "not hold for the winner's setting, so this is no bound"
            )
        else:
            if percent is not None:
                line += f"; the winner's median rate reaches {percent:.0f}% of it"
            line += _ceiling_refuted(entry, ceiling)
        lines.append(line)
    at_bs = entry.get("best_at_batch_size")
    at_bs_kwargs = (at_bs or {}).get("loader_kwargs") or {}
    kwargs = entry.get("loader_kwargs") or {}
    if (
        at_bs_kwargs.get("batch_size") is not None
        and "batch_size" in kwargs
        and at_bs_kwargs["batch_size"] != kwargs["batch_size"]
    ):
        at_rate = (at_bs or {}).get("samples_per_s")
        # your own settings, where nothing else at your batch size beat them: say so, or the
        # baseline itself reads as a setting the search found
        own = " (your own settings)" if at_bs_kwargs == _baseline_kwargs(entry) else ""
        lines.append(
            f"best at your batch size: {Config.from_kwargs(at_bs_kwargs).label()}{own} "
            f"{_rate(at_rate)} samples/s{_at_batch_size_note(entry, at_bs_kwargs, at_rate)}; "
            "the winner changes the batch size, so scale the learning rate with it (linearly "
            "or by its square root)"
        )
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
    lines.append(head)
    short = _budget_too_short(entry)
    if short:
        lines.append(short)
    for warning in diag.get("warnings") or []:
        lines.append(f"warning: {warning}")
    for advice in diag.get("advice") or []:
        lines.append(f"advice: {advice}")
    return lines


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


def trials_table(trials: list[TrialResult]) -> Table:
    table = Table(title="trials", title_justify="left")
    for col in ("#", "phase", "setting", "samples/s", "per epoch", "blocked", "status"):
        table.add_column(col)
    for i, t in enumerate(trials, 1):
        m = t.measurement
        status = t.status if t.failure is None else f"{t.failure.kind}: {t.failure.message}"
        if t.kept:
            status += " (kept from an earlier run)"
        table.add_row(
            str(i),
            t.phase,
            t.config.label(),
            _rate(t.samples_per_s),
            _rate(t.epoch_samples_per_s),
            _pct(m.blocked_fraction) if m else "-",
            status,
        )
    return table


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
