"""The interactive report: one HTML file, plotly.js inlined (it opens offline, no CDN).

The figures come from :mod:`loadertune.view.html.figures` (the rates) and
:mod:`loadertune.view.html.usage` (memory, GPU); the page around them (the summary, the failures,
the advice, every trial) is built here. Every text from the file or a library is escaped.
"""

from __future__ import annotations

import html
import json

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from loadertune.results import store
from loadertune.view.html.data import ReportData, pss_mib
from loadertune.view.html.figures import knobs_figure, progress_figure, rate_figure, versus_figure
from loadertune.view.html.usage import gpu_figure, memory_figure
from loadertune.view.summary import summary_lines
from loadertune.view.tables import summary_rows

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
    sections = [*_summary(data), *_figures(data), *_findings(data)]
    title = html.escape(f"loadertune report: {data.workload}")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head>'
        f"<body>{''.join(sections)}</body></html>\n"
    )


def _summary(data: ReportData) -> list[str]:
    """The title, the machine, the setting to use, the baseline beside the winner."""
    entry = data.entry
    hw = (entry.get("hardware") or {}).get("description") or data.machine
    kwargs = json.dumps(entry.get("loader_kwargs"), default=str)
    return [
        f"<h1>loadertune: {html.escape(data.workload)}</h1>",
        f"<p>{html.escape(hw)}<br>measured {html.escape(str(entry.get('measured_at', '?')))}"
        f" · file {html.escape(data.file)} · machine {html.escape(data.machine)}"
        + (f" · <b>partial</b> ({html.escape(why)})" if (why := store.partial_why(entry)) else "")
        + "</p>",
        f"<p>Use: <code>DataLoader(dataset, **{html.escape(kwargs)})</code></p>",
        _table(["", "baseline (yours)", "winner"], [list(r) for r in summary_rows(entry)]),
        "<ul>"
        + "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(entry))
        + "</ul>",
    ]


def _figures(data: ReportData) -> list[str]:
    """Each figure under its heading, or a line that says why it is missing."""
    return [
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
    ]


def _findings(data: ReportData) -> list[str]:
    """The failures, the advice and warnings, and every trial."""
    advice = data.diagnosis.get("advice") or []
    warnings = data.diagnosis.get("warnings") or []
    return [
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
