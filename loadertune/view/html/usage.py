"""The report's figures of what the trials used: the memory of their processes and the GPU.

Drawn as :mod:`loadertune.view.html.figures` draws the rates (its layout and hover text); None when
no trial measured any.
"""

from __future__ import annotations

import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from loadertune.view.html.data import ReportData, pss_mib
from loadertune.view.html.figures import LAYOUT, hover, integer_ticks


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
                name=data.batch_name(bs),
                uid=f"pss-bs{bs}",
                marker={"size": 9},
                hovertext=[hover(t) for t in group],
                hoverinfo="text",
            )
        )
    fig.update_layout(
        title="Memory (PSS of the training process and its workers) per setting",
        xaxis_title="num_workers",
        yaxis_title="MiB",
        **LAYOUT,
    )
    integer_ticks(fig, [t.config.num_workers for t in pts])
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
                hovertext=[hover(t) for t in pts],
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
    fig.update_layout(title="GPU utilization (NVML)", **LAYOUT)
    return fig
