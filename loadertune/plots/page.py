"""The interactive report: one HTML file, plotly.js inlined (it opens offline, no CDN).

Every figure is drawn from :mod:`loadertune.plots.data`; every text from the file or a library
is escaped. Each figure's traces carry a ``uid`` naming what they show (``trials-bs64``,
``median-bs64``...), so a test can count what the browser drew.
"""

from __future__ import annotations

import html
import json
import statistics
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from loadertune.plots.data import (
    ReportData,
    Trial,
    best_so_far,
    pss_mib,
    rate_series,
    spread,
)
from loadertune.report import summary_lines, summary_rows

PHASE_SYMBOLS = {
    "baseline": "diamond",
    "probe": "square",
    "search": "circle",
    "confirm": "triangle-up",
}
_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 420,
    "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
    "legend": {"orientation": "h", "y": -0.2},
}
_RATE_AXIS = "samples/s (steady, over the measured window)"


def _hover(t: Trial) -> str:
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


def _integer_ticks(fig: go.Figure, values: list[int]) -> None:
    """num_workers is a count: integer ticks only."""
    fig.update_xaxes(tick0=0, dtick=max(1, -(-max(values, default=1) // 12)))


def rate_figure(data: ReportData) -> go.Figure:
    """Rate against num_workers, one colour per batch size; each measurement a marker (its
    sub-window range as the error bar), the median per worker count as a line, the ceilings as
    dashed lines, the winner and the baseline ringed."""
    fig = go.Figure()
    for series in rate_series(data):
        bs = series.batch_size
        errs = [spread(t) for t in series.trials]
        fig.add_trace(
            go.Scatter(
                x=[t.config.num_workers for t in series.trials],
                y=[t.samples_per_s for t in series.trials],
                mode="markers",
                name=f"batch {bs}: each measurement",
                uid=f"trials-bs{bs}",
                legendgroup=f"bs{bs}",
                marker={
                    "size": 9,
                    "symbol": [
                        PHASE_SYMBOLS.get(t.phase, "circle")
                        + ("-open" if t.status == "pruned" else "")
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
                hovertext=[_hover(t) for t in series.trials],
                hoverinfo="text",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=series.median_x,
                y=series.median_y,
                mode="lines+markers",  # a marker too: a median of one worker count is a dash
                marker={"symbol": "line-ew-open", "size": 18},
                name=f"batch {bs}: median",
                uid=f"median-bs{bs}",
                legendgroup=f"bs{bs}",
                hoverinfo="skip",
            )
        )
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
                hovertext=[html.escape(f"{label}: {config.label()}")],
                hoverinfo="text",
            )
        )
    above = _ceiling_lines(fig, data)
    far = f"<br><sup>off the scale: ceiling {html.escape('; '.join(above))}</sup>" if above else ""
    _integer_ticks(fig, [t.config.num_workers for t in data.measured])
    fig.update_layout(
        title=f"Rate against num_workers, per batch size{far}",
        xaxis_title="num_workers",
        yaxis_title=_RATE_AXIS,
        **_LAYOUT,
    )
    fig.update_yaxes(rangemode="tozero")
    return fig


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
                hovertext=[_hover(t) for t in pts],
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
        **{**_LAYOUT, "height": 380},
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
        title="Winner and baseline, re-measured side by side",
        **{**_LAYOUT, "margin": {**_LAYOUT["margin"], "t": 100}},
    )
    return fig


def memory_figure(data: ReportData) -> go.Figure | None:
    """PSS of each trial's processes (main + workers) against num_workers."""
    pts = [t for t in data.measured if pss_mib(t) is not None]
    if not pts:
        return None
    fig = go.Figure()
    for bs in sorted({t.config.batch_size for t in pts}):
        group = [t for t in pts if t.config.batch_size == bs]
        fig.add_trace(
            go.Scatter(
                x=[t.config.num_workers for t in group],
                y=[pss_mib(t) for t in group],
                mode="markers",
                name=f"batch {bs}",
                uid=f"pss-bs{bs}",
                marker={"size": 9},
                hovertext=[_hover(t) for t in group],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title="Memory (PSS of the training process and its workers) per setting",
        xaxis_title="num_workers",
        yaxis_title="MiB",
        **_LAYOUT,
    )
    _integer_ticks(fig, [t.config.num_workers for t in pts])
    fig.update_yaxes(rangemode="tozero")
    return fig


def gpu_figure(data: ReportData) -> go.Figure | None:
    """GPU utilization per trial (mean of NVML's samples) and its histogram for the winner and
    the baseline; None when no trial measured any."""
    pts = [t for t in data.measured if t.gpu_util_percent]
    hist: dict[str, dict[str, float]] = {}
    for label, key in (("baseline (yours)", "baseline"), ("winner", "winner")):
        bands = (data.diagnosis.get(key) or {}).get("gpu_util_histogram")
        if bands:
            hist[label] = bands
    if not pts and not hist:
        return None
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("mean utilization per trial", "share of NVML samples per band"),
    )
    if pts:
        fig.add_trace(
            go.Scatter(
                x=[t.config.num_workers for t in pts],
                y=[statistics.fmean(t.gpu_util_percent) for t in pts],
                mode="markers",
                name="trials",
                uid="gpu-trials",
                hovertext=[_hover(t) for t in pts],
                hoverinfo="text",
            ),
            row=1,
            col=1,
        )
    for label, bands in hist.items():
        fig.add_trace(
            go.Bar(
                x=list(bands),
                y=[100 * v for v in bands.values()],
                name=label,
                uid=f"gpu-hist-{label.split()[0]}",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="num_workers", row=1, col=1)
    fig.update_yaxes(title_text="GPU busy, %", range=[0, 105], row=1, col=1)
    fig.update_yaxes(title_text="% of samples", row=1, col=2)
    fig.update_layout(title="GPU utilization (NVML)", **_LAYOUT)
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
                hovertext=[_hover(t) for t in group],
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
        **_LAYOUT,
    )
    fig.update_yaxes(rangemode="tozero")
    return fig


# -- the page ------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; color: #222;
       margin: 2em auto; padding: 0 1em; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } code { background: #f4f4f4; padding: 1px 4px; }
.note { color: #666; font-size: 0.9em; } .missing { color: #666; font-style: italic; }
"""


def _table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def _figure(fig: go.Figure | None, div_id: str, missing: str) -> str:
    if fig is None:
        return f'<p class="missing" id="{div_id}-missing">{html.escape(missing)}</p>'
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)


def _failures(data: ReportData) -> str:
    if not data.failed:
        return "<p>No trial failed.</p>"
    rows = [
        [
            str(t.index),
            t.label,
            t.error or "-",
            t.failure_message or "-",
            t.failure_advice or "-",
        ]
        for t in data.failed
    ]
    return _table(["#", "setting", "cause", "what happened", "what to do"], rows)


def _trials(data: ReportData) -> str:
    rows = [
        [
            str(t.index),
            t.phase,
            t.label,
            "-" if t.samples_per_s is None else f"{t.samples_per_s:,.0f}",
            "-" if t.blocked_fraction is None else f"{100 * t.blocked_fraction:.0f}%",
            "-" if pss_mib(t) is None else f"{pss_mib(t):,.0f} MiB",
            f"{t.wall_s:.1f} s",
            t.status if not t.error else f"{t.status}: {t.error}",
        ]
        for t in data.trials
    ]
    return _table(
        ["#", "phase", "setting", "samples/s", "blocked", "memory (PSS)", "cost", "status"], rows
    )


def render(data: ReportData) -> str:
    """The whole page as one string."""
    entry = data.entry
    diag = data.diagnosis
    hw = (entry.get("hardware") or {}).get("description") or data.machine
    lines = summary_lines(entry)
    advice = diag.get("advice") or []
    warnings = diag.get("warnings") or []
    kwargs = json.dumps(entry.get("loader_kwargs"), default=str)
    sections = [
        f"<h1>loadertune: {html.escape(data.workload)}</h1>",
        f"<p>{html.escape(hw)}<br>measured {html.escape(str(entry.get('measured_at', '?')))}"
        f" · file {html.escape(data.file)} · machine {html.escape(data.machine)}"
        + (" · <b>partial</b> (an interrupted search)" if entry.get("partial") else "")
        + "</p>",
        f"<p>Use: <code>DataLoader(dataset, **{html.escape(kwargs)})</code></p>",
        _table(["", "baseline (yours)", "winner"], [list(r) for r in summary_rows(entry)]),
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>",
        "<h2>Rate against workers</h2>",
        '<p class="note">Each marker is one measured trial (diamond: your settings; square: '
        "the probe; circle: the search; triangle: the final rounds; hollow: stopped early as "
        "clearly slower). Error bars span the rates of the window's sub-windows. Dashed "
        "lines are the ceilings estimated from the probe: no setting of the loader can go "
        "past the lowest.</p>",
        _figure(rate_figure(data), "rate-vs-workers", "no trial measured a rate"),
        "<h2>Winner and baseline</h2>",
        _figure(
            versus_figure(data),
            "winner-vs-baseline",
            "the entry holds no final rounds of the winner or the baseline",
        ),
        "<h2>prefetch, persistent workers, pinned memory</h2>",
        _figure(
            knobs_figure(data),
            "knobs",
            "nothing to compare: the trials with workers that measured a rate all used the "
            "same prefetch_factor, persistent_workers and pin_memory",
        ),
        "<h2>Memory</h2>",
        _figure(
            memory_figure(data),
            "memory",
            "no memory figures per trial: they live in the study, which could not be read "
            f"({data.study_note})",
        ),
        "<h2>GPU utilization</h2>",
        _figure(
            gpu_figure(data),
            "gpu",
            "no GPU utilization was measured (no GPU, or NVML unavailable)",
        ),
        "<h2>Progress</h2>",
        _figure(progress_figure(data), "progress", "no trial ran"),
        "<h2>Failures</h2>",
        _failures(data),
        "<h2>Advice</h2>",
        "<ul>" + "".join(f"<li>{html.escape(a)}</li>" for a in advice) + "</ul>"
        if advice
        else "<p>No advice: nothing measured called for any.</p>",
        "<ul>" + "".join(f"<li>warning: {html.escape(w)}</li>" for w in warnings) + "</ul>"
        if warnings
        else "",
        "<h2>Trials</h2>",
        _trials(data),
        f'<p class="note">Details: {html.escape(data.study_note)}.</p>',
    ]
    title = html.escape(f"loadertune report: {data.workload}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
        f"<body>{''.join(sections)}</body></html>\n"
    )
