"""The report of a search as pictures: an HTML page that opens offline (plotly) and PNG images
of the main plots (matplotlib), from a recommendation file's entry and its Optuna study.

plotly and matplotlib come with the ``report`` extra (``pip install "loadertune[report]"``);
without them, :func:`write_report` says how to install them.
"""

from __future__ import annotations

import os
from pathlib import Path

from loadertune.errors import ConfigError, RecommendationFileError
from loadertune.view.html.data import ReportData, load

__all__ = ["ReportData", "check_installed", "load", "write_report"]


def check_installed(*, png: bool = False) -> None:
    """Raise ConfigError unless the libraries the report needs can be imported (checked before
    a search, so that ``search --report`` does not fail after spending its budget)."""
    names = ["plotly", *(["matplotlib"] if png else [])]
    for name in names:
        try:
            __import__(name)
        except ImportError:
            raise ConfigError(
                f'the report needs {name}, which is not installed: pip install "loadertune[report]"'
            ) from None


def write_report(
    data: ReportData, out: str | os.PathLike[str], *, png_dir: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Write the HTML page to ``out`` and, with ``png_dir``, the PNG images there; return the
    files written (the page first).

    Raises:
        ConfigError: plotly (or matplotlib, for PNG) is not installed.
        RecommendationFileError: a file cannot be written.
    """
    check_installed(png=png_dir is not None)
    from loadertune.view.html import page

    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page.render(data), encoding="utf-8")
        written = [out]
        if png_dir is not None:
            from loadertune.view.html import png

            written += png.write_pngs(data, png_dir)
    except OSError as exc:
        raise RecommendationFileError(
            f"cannot write the report ({exc.strerror or exc}: {exc.filename or out}); "
            "choose another place with -o or --png"
        ) from exc
    return written
