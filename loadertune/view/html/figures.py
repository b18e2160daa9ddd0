"""The report's figures of the rates (plotly), each drawn from :mod:`loadertune.view.html.data`:
rate against workers, the knobs, winner beside baseline, the search over time. Those of memory
and the GPU are in :mod:`loadertune.view.html.usage`; a figure with nothing to show is None (the
page says why instead).

Every text from the file or a library is escaped. Each figure's traces carry a ``uid`` naming
what they show (``trials-bs64``, ``median-bs64``...), so a test can count what the browser drew.
"""

from __future__ import annotations

import html
import statistics
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from loadertune.view.html.data import (
    RateSeries,
    ReportData,
    Trial,
    best_so_far,
    rate_series,
    spread,
)

PHASE_SYMBOLS = {
    "baseline": "diamond",
    "probe": "square",
    "search": "circle",
    "confirm": "triangle-up",
}
LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 420,
    "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
    "legend": {"orientation": "h", "y": -0.2},
}
_RATE_AXIS = "samples/s (steady, over the measured window)"


def hover(t: Trial) -> str:
    parts = [f"#{t.index} {t.phase}: {t.label}"]
    if t.samples_per_s is not None:
        parts.append(f"{t.samples_per_s:,.0f} samples/s")
    if t.sub_window_samples_per_s:
        lo, hi = min(t.sub_window_samples_per_s), max(t.sub_window_samples_per_s)
        parts.append(f"sub-windows {lo:,.0f} to {hi:,.0f}")
    if t.blocked_fraction is not None:
        parts.append(f"blocked on data {100 * t.blocked_fraction:.0f}%")
    if t.status != "ok":
        parts.append(t.status)
    return "<br>".join(html.escape(p) for p in parts)


def _ceiling_lines(fig: go.Figure, data: ReportData) -> list[str]:
    """Draw the ceilings near the measurements as dashed lines, labels alternating sides so
    that close ones stay readable; return the labels of those far above (said in the title)."""
    near, far = data.ceilings_near()
    for i, (name, value) in enumerate(near):
        fig.add_hline(
            y=value,
            line_dash="dash",
            line_color="#999",
            annotation_text=html.escape(f"ceiling: {name} {value:,.0f}"),
            annotation_position="top left" if i % 2 == 0 else "bottom right",
            annotation_font_size=11,
        )
    return [f"{name} {value:,.0f}" for name, value in far]


def integer_ticks(fig: go.Figure, values: list[int]) -> None:
    """num_workers is a count: integer ticks only."""
    fig.update_xaxes(tick0=0, dtick=max(1, -(-max(values, default=1) // 12)))


def rate_figure(data: ReportData) -> go.Figure:
    """Rate against num_workers, one colour per batch size; each measurement a marker (its
    sub-window range as the error bar), the median per worker count as a line, the ceilings as
    dashed lines, the winner and the baseline ringed."""
    fig = go.Figure()
    for series in rate_series(data):
        _add_series(fig, series, data.batch_name(series.batch_size))
    _add_final_marks(fig, data)
    above = _ceiling_lines(fig, data)
    far = f"<br><sup>off the scale: ceiling {html.escape('; '.join(above))}</sup>" if above else ""
    integer_ticks(fig, [t.config.num_workers for t in data.measured])
    fig.update_layout(
        title=f"Rate against num_workers, per batch size{far}",
        xaxis_title="num_workers",
        yaxis_title=_RATE_AXIS,
        **LAYOUT,
    )
    fig.update_yaxes(rangemode="tozero")
    return fig


def _add_series(fig: go.Figure, series: RateSeries, name: str) -> None:
    """One batch size's measurements (markers by phase, sub-window error bars) and medians."""
    bs = series.batch_size
    errs = [spread(t) for t in series.trials]
    fig.add_trace(
        go.Scatter(
            x=[t.config.num_workers for t in series.trials],
            y=[t.samples_per_s for t in series.trials],
            mode="markers",
            name=f"{name}: each measurement",
            uid=f"trials-bs{bs}",
            legendgroup=f"bs{bs}",
            marker={
                "size": 9,
                "symbol": [
                    PHASE_SYMBOLS.get(t.phase, "circle") + ("-open" if t.status == "pruned" else "")
                    for t in series.trials
                ],
            },
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [hi for _, hi in errs],
                "arrayminus": [lo for lo, _ in errs],
                "thickness": 1,
                "width": 3,
            },
            hovertext=[hover(t) for t in series.trials],
            hoverinfo="text",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=series.median_x,
            y=series.median_y,
            mode="lines+markers",  # a marker too: a median of one worker count is a dash
            marker={"symbol": "line-ew-open", "size": 18},
            name=f"{name}: median",
            uid=f"median-bs{bs}",
            legendgroup=f"bs{bs}",
            hoverinfo="skip",
        )
    )


def _add_final_marks(fig: go.Figure, data: ReportData) -> None:
    """The winner and the baseline, at the median of their final rounds."""
    for label, config, rounds, symbol in (
        ("winner", data.winner, data.rounds("winner"), "star"),
        ("baseline (yours)", data.baseline, data.rounds("baseline"), "x"),
    ):
        if config is None or not rounds:
            continue
        fig.add_trace(
            go.Scatter(
                x=[config.num_workers],
                y=[statistics.median(rounds)],
                mode="markers+text",
                text=[label],
                textposition="top right",
                name=f"{label}: median of its final rounds",
                uid=f"mark-{label.split()[0]}",
                marker={"size": 16, "symbol": symbol, "color": "black"},
                hovertext=[html.escape(f"{label}: {data.label(config)}")],
                hoverinfo="text",
            )
        )


def knobs_figure(data: ReportData) -> go.Figure | None:
    """prefetch_factor, persistent_workers and pin_memory: the rate of every trial with
    workers, grouped by each knob's value (other settings vary within a group)."""
    pts = [t for t in data.measured if t.config.num_workers > 0 and t.status == "ok"]
    if not pts:
        return None
    knobs = [
        (name, value)
        for name, value in (
            ("prefetch_factor", lambda t: str(t.config.prefetch_factor)),
            ("persistent_workers", lambda t: str(t.config.persistent_workers)),
            ("pin_memory", lambda t: str(t.config.pin_memory)),
        )
        if len({value(t) for t in pts}) > 1  # a knob that never changed shows nothing
    ]
    if not knobs:
        return None
    fig = make_subplots(
        rows=1,
        cols=len(knobs),
        shared_yaxes=True,
        subplot_titles=[name for name, _ in knobs],
    )
    for col, (name, value) in enumerate(knobs, 1):
        fig.add_trace(
            go.Box(
                x=[value(t) for t in pts],
                y=[t.samples_per_s for t in pts],
                name=name,
                uid=f"knob-{name}",
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                hovertext=[hover(t) for t in pts],
                hoverinfo="text",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
    fig.update_layout(
        title="prefetch, persistent workers, pinned memory (trials with workers; other "
        "settings vary)",
        yaxis_title=_RATE_AXIS,
        **{**LAYOUT, "height": 380},
    )
    return fig


def versus_figure(data: ReportData) -> go.Figure | None:
    """The winner beside the baseline: every final round's rate, and the blocked fraction."""
    entry = data.entry
    rows = []
    for label, key in (("baseline (yours)", "baseline"), ("winner", "winner")):
        rounds = data.rounds(key)
        blocked = (entry.get(key) or {}).get("blocked_fraction")
        if rounds:
            rows.append((label, rounds, blocked))
    if not rows:
        return None
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        subplot_titles=("samples/s in each final round", "share of the loop blocked on data"),
    )
    for label, rounds, _ in rows:
        fig.add_trace(
            go.Box(
                y=rounds,
                name=label,
                uid=f"rounds-{label.split()[0]}",
                boxpoints="all",
                pointpos=0,
                showlegend=False,
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Bar(
            x=[label for label, _, _ in rows],
            y=[100 * (b or 0.0) for _, _, b in rows],
            text=[f"{100 * b:.0f}%" if b is not None else "-" for _, _, b in rows],
            textposition="outside",
            uid="blocked",
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    for name, value in data.ceilings()[:1]:  # the lowest: what the rounds are measured against
        fig.add_hline(
            y=value,
            line_dash="dash",
            line_color="#999",
            annotation_text=html.escape(f"lowest ceiling: {name} {value:,.0f}"),
            annotation_position="bottom left",
            row=1,
            col=1,
        )
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="% of the loop's time", range=[0, 105], row=1, col=2)
    fig.update_layout(
        title=(
            "Winner and baseline: each measurement "
            "(side by side in the final rounds, where they ran)"
        ),
        **{**LAYOUT, "margin": {**LAYOUT["margin"], "t": 100}},
    )
    return fig


def progress_figure(data: ReportData) -> go.Figure:
    """Every trial's rate at the time it ended, by phase, and the best so far."""
    fig = go.Figure()
    for phase in ("baseline", "probe", "search", "confirm"):
        group = [t for t in data.measured if t.phase == phase]
        if not group:
            continue
        fig.add_trace(
            go.Scatter(
                x=[t.end_s for t in group],
                y=[t.samples_per_s for t in group],
                mode="markers",
                name=phase,
                uid=f"progress-{phase}",
                marker={
                    "size": 9,
                    "symbol": [
                        PHASE_SYMBOLS[phase] + ("-open" if t.status == "pruned" else "")
                        for t in group
                    ],
                },
                hovertext=[hover(t) for t in group],
                hoverinfo="text",
            )
        )
    xs, ys = best_so_far(data)
    if xs:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line_shape="hv",
                name="best so far",
                uid="progress-best",
                hoverinfo="skip",
            )
        )
    failed = data.failed
    if failed:
        fig.add_trace(
            go.Scatter(
                x=[t.end_s for t in failed],
                y=[0] * len(failed),
                mode="markers",
                name="failed",
                uid="progress-failed",
                marker={"symbol": "x", "size": 10, "color": "crimson"},
                hovertext=[html.escape(f"#{t.index} {t.label}: {t.error}") for t in failed],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title="The search over time (hollow: stopped early as clearly slower)",
        xaxis_title=data.time_axis,
        yaxis_title=_RATE_AXIS,
        **LAYOUT,
    )
    fig.update_yaxes(rangemode="tozero")
    return fig
