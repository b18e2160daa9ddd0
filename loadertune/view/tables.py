"""The result tables: baseline beside winner, and every trial of a search."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table

from loadertune.config import kwargs_label
from loadertune.trials import TrialResult
from loadertune.units import MIB
from loadertune.view.console import percent_text, rate_text

if TYPE_CHECKING:
    from loadertune.results.recommendation import Recommendation


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
        rate_text(fig.get("samples_per_s")),
        rate_text(fig.get("epoch_samples_per_s")),
        percent_text(fig.get("spread")),
        percent_text(fig.get("blocked_fraction")),
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
            rate_text(t.samples_per_s),
            rate_text(t.epoch_samples_per_s),
            percent_text(m.blocked_fraction) if m else "-",
            status,
        )
    return table
