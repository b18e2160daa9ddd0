"""``loadertune report``: the HTML page (and PNG images) of an entry (the work is in
:mod:`loadertune.view.html`)."""

from __future__ import annotations

import click

from loadertune.cli._common import fail, file_option
from loadertune.errors import LoadertuneError
from loadertune.view import html
from loadertune.view.console import plain_console


@click.command()
@click.argument("path", default="loadertune.json", type=click.Path(dir_okay=False))
@file_option(
    "-o",
    "--out",
    default="loadertune-report.html",
    help="The HTML page to write (self-contained: it opens offline).",
)
@click.option(
    "--png",
    "png_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Also write PNG images of the main plots into this folder.",
)
@click.option("--machine", default=None, help="Machine key of the entry (default: this one).")
@click.option(
    "--workload", default=None, help="Workload key of the entry (default: the machine's only one)."
)
@click.option("--study", "study_name", default=None, help="Study to read (default: the entry's).")
@click.option("--storage", default=None, help="Its Optuna storage URL (default: the entry's).")
def report(
    path: str,
    out: str,
    png_dir: str | None,
    machine: str | None,
    workload: str | None,
    study_name: str | None,
    storage: str | None,
) -> None:
    """Write an HTML report (and PNG images) of an entry of a recommendation file: rate against
    workers per batch size, the winner beside your settings, the ceilings, memory, GPU
    utilization, the search over time, failures and advice. `loadertune show` lists the
    entries."""
    try:
        data = html.load(
            path, machine=machine, workload=workload, study=study_name, storage=storage
        )
        written = html.write_report(data, out, png_dir=png_dir)
    except LoadertuneError as exc:
        fail(exc)
    console = plain_console()
    console.print(
        f"report of {data.workload} on {data.machine} ({data.study_note})",
        highlight=False,
        soft_wrap=True,
    )
    for file in written:
        console.print(f"wrote {file}", highlight=False, soft_wrap=True)
