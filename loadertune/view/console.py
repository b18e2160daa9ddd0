"""The console loadertune prints to, and how its figures read: rates and shares."""

from __future__ import annotations

import os

from rich.console import Console

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


def rate_text(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def percent_text(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
