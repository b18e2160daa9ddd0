"""PNG images of the main plots (for READMEs and issues), drawn with matplotlib from the same
series as the interactive page."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never a window, never a display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from loadertune.view.html.data import ReportData, best_so_far, pss_mib, rate_series, spread

RATE_LABEL = "samples/s (steady)"
_MARKERS = {"baseline": "D", "probe": "s", "search": "o", "confirm": "^"}


def _ceilings(ax: plt.Axes, data: ReportData) -> list[str]:
    near, far = data.ceilings_near()
    for i, (name, value) in enumerate(near):  # labels alternate sides: close ones stay legible
        ax.axhline(value, linestyle="--", color="0.6", linewidth=1)
        ax.annotate(
            f"ceiling: {name} {value:,.0f}",
            (0.01 if i % 2 == 0 else 0.99, value),
            xycoords=("axes fraction", "data"),
            fontsize=8,
            color="0.4",
            ha="left" if i % 2 == 0 else "right",
            va="bottom" if i % 2 == 0 else "top",
        )
    return [f"{name} {value:,.0f}" for name, value in far]


def rate_png(data: ReportData) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for i, series in enumerate(rate_series(data)):
        color = f"C{i}"  # one colour per batch size
        ax.plot(series.median_x, series.median_y, "_-", color=color, linewidth=1.5, ms=16)
        for t in series.trials:
            lo, hi = spread(t)
            ax.errorbar(
                [t.config.num_workers],
                [t.rate],
                yerr=[[lo], [hi]],
                fmt=_MARKERS.get(t.phase, "o"),
                color=color,
                mfc="none" if t.status == "pruned" else color,
                markersize=6,
                capsize=2,
                linewidth=0.8,
            )
        ax.plot([], [], "o-", color=color, label=data.batch_name(series.batch_size))
    for label, config, rounds, marker in (
        ("winner", data.winner, data.rounds("winner"), "*"),
        ("baseline", data.baseline, data.rounds("baseline"), "X"),
    ):
        if config is not None and rounds:
            y = statistics.median(rounds)
            ax.plot([config.num_workers], [y], marker, color="black", markersize=13)
            ax.annotate(label, (config.num_workers, y), xytext=(8, 6), textcoords="offset points")
    far = _ceilings(ax, data)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("num_workers")
    ax.set_ylabel(RATE_LABEL)
    ax.set_ylim(bottom=0)
    title = f"Rate against num_workers: {data.workload}"
    if far:
        title += f"\noff the scale: ceiling {'; '.join(far)}"
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def progress_png(data: ReportData) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    for i, (phase, marker) in enumerate(_MARKERS.items()):
        group = [t for t in data.measured if t.phase == phase]
        if group:
            ax.scatter(
                [t.end_s for t in group],
                [t.rate for t in group],
                marker=marker,
                label=phase,
                edgecolors=f"C{i}",
                facecolors=["none" if t.status == "pruned" else f"C{i}" for t in group],
            )
    xs, ys = best_so_far(data)
    if xs:
        ax.step(xs, ys, where="post", color="black", linewidth=1, label="best so far")
    failed = data.failed
    if failed:
        ax.scatter(
            [t.end_s for t in failed],
            [0] * len(failed),
            marker="x",
            color="crimson",
            label="failed",
        )
    return _finish(fig, ax, x=data.time_axis, y=RATE_LABEL, title="The search over time")


def versus_png(data: ReportData) -> Figure | None:
    rows = [
        (label, data.rounds(key), (data.entry.get(key) or {}).get("blocked_fraction"))
        for label, key in (("baseline (yours)", "baseline"), ("winner", "winner"))
    ]
    rows = [r for r in rows if r[1]]
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.6), dpi=110, width_ratios=[3, 2])
    for i, (_, rounds, _) in enumerate(rows):
        left.scatter([i] * len(rounds), rounds, color=f"C{i}")
        left.hlines(statistics.median(rounds), i - 0.25, i + 0.25, color=f"C{i}")
    left.set_xticks(range(len(rows)), [label for label, _, _ in rows])
    left.set_ylabel("samples/s, each final round")
    left.set_ylim(bottom=0)
    blocked = [100 * (b or 0.0) for _, _, b in rows]
    right.bar([label for label, _, _ in rows], blocked, color=[f"C{i}" for i in range(len(rows))])
    right.set_ylim(0, 100)
    right.set_ylabel("% of the loop blocked on data")
    fig.suptitle(
        "Winner and baseline: each measurement (side by side in the final rounds, where they ran)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def memory_png(data: ReportData) -> Figure | None:
    pts = [(t, mib) for t in data.measured if (mib := pss_mib(t)) is not None]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=110)
    for bs in sorted({t.config.batch_size for t, _ in pts}):
        group = [(t.config.num_workers, mib) for t, mib in pts if t.config.batch_size == bs]
        ax.scatter(*zip(*group, strict=True), label=data.batch_name(bs))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _finish(
        fig,
        ax,
        x="num_workers",
        y="PSS, MiB (training process + workers)",
        title="Memory per setting",
    )


def _finish(fig: Figure, ax: Axes, *, x: str, y: str, title: str) -> Figure:
    """Labels from zero, a small title and legend, a light grid; the figure, laid out."""
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_pngs(data: ReportData, folder: str | os.PathLike[str]) -> list[Path]:
    """Write the main plots into ``folder`` (created if needed); return the files written.
    A plot with nothing to show (no memory figures without the study) is left out."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (
        ("rate_vs_workers", rate_png),
        ("winner_vs_baseline", versus_png),
        ("progress", progress_png),
        ("memory", memory_png),
    ):
        fig = draw(data)
        if fig is None:
            continue
        path = folder / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
