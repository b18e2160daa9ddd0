"""``loadertune search``: tune a script's DataLoader and save the winner (the work is in
:func:`loadertune.api.tune_script`)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console

from loadertune import api
from loadertune.api import saved
from loadertune.cli._common import (
    ScriptCommand,
    batch_sizes_option,
    budget_option,
    err,
    fail,
    file_option,
    loader_option,
    nproc_option,
    say,
)
from loadertune.errors import (
    LoadertuneError,
    PartialNotSaved,
    RecommendationFileError,
    SearchInterrupted,
)
from loadertune.results import store
from loadertune.results.recommendation import Recommendation
from loadertune.search import SearchSettings
from loadertune.view import html
from loadertune.view.console import plain_console
from loadertune.view.progress import LiveView
from loadertune.view.summary import print_summary


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be (exit 143 instead of 130)."""


@contextmanager
def _interrupts_stop() -> Iterator[None]:
    """Ctrl-C and SIGTERM end a search: the trial stopped, the study kept. Both handlers are
    set here, SIGINT's too: a CLI started in the background by a shell without job control
    inherits SIGINT ignored, and `kill -INT` would otherwise do nothing. Restored after."""

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated("SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@click.command(cls=ScriptCommand, context_settings={"ignore_unknown_options": False})
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@budget_option("Wall-clock seconds for the whole search.")
@click.option(
    "--trials",
    "n_trials",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on the settings measured (default: the budget decides).",
)
@batch_sizes_option("Batch sizes to search, e.g. 32,64,128 (default: keep the script's).")
@click.option(
    "--max-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Highest num_workers to try (default: from CPUs and memory).",
)
@loader_option(
    "Which DataLoader: N (order of creation) or FILE:LINE (default: the one whose batches "
    "feed the optimizer)."
)
@click.option(
    "--storage", default=None, help="Optuna storage URL (default: SQLite in the user cache)."
)
@click.option(
    "--study", "study_name", default=None, help="Study name (default: from script and args)."
)
@click.option(
    "--resume/--fresh",
    default=True,
    show_default=True,
    help="Continue the study of an earlier (interrupted) search, or start it afresh.",
)
@click.option(
    "--save-partial",
    is_flag=True,
    help="On Ctrl-C or SIGTERM, save the best setting so far (marked partial).",
)
@file_option(
    "--out",
    default="loadertune.json",
    help="Recommendation file to merge this machine's entry into.",
)
@click.option("--force", is_flag=True, help="Replace an unreadable --out file (a copy is kept).")
@click.option("--window", "window_s", type=float, default=None, help="Measured seconds per trial.")
@click.option(
    "--startup-timeout",
    "startup_timeout_s",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds the script may take to reach its first batch.",
)
@nproc_option(
    "Run every trial as `torchrun --nproc-per-node N` (a script that calls "
    "init_process_group); the rate is the node's, as its slowest rank allows."
)
@click.option("--seed", type=int, default=None, help="Seed of the sampler.")
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
@click.option("--show-trials", is_flag=True, help="Print every trial in the final report.")
@file_option(
    "--report",
    "report_path",
    default=None,
    help="Also write the HTML report of the result here (see `loadertune report`).",
)
def search(
    script: str,
    script_args: tuple[str, ...],
    budget_s: float,
    n_trials: int | None,
    batch_sizes: list[int] | None,
    max_workers: int | None,
    loader: int | str | None,
    storage: str | None,
    study_name: str | None,
    resume: bool,
    save_partial: bool,
    out: str,
    force: bool,
    window_s: float | None,
    startup_timeout_s: float,
    nproc_per_node: int | None,
    seed: int | None,
    as_json: bool,
    show_trials: bool,
    report_path: str | None,
) -> None:
    """Tune the DataLoader of SCRIPT; its own arguments follow `--`.

    Each trial runs SCRIPT in a fresh process group with one setting applied, measures the
    script's own training loop for a short window, and stops it. The best setting is saved
    in --out under this machine's CPU/GPU key.
    """
    try:
        settings = SearchSettings(
            budget_s=budget_s,
            n_trials=n_trials,
            window_s=window_s,
            startup_timeout_s=startup_timeout_s,
            max_workers=max_workers,
            seed=seed,
            storage=storage,
            study_name=study_name,
            resume=resume,
        )
        _check_before(out, force=force, report_path=report_path)
        with LiveView(err) as view, _interrupts_stop():
            rec = api.tune_script(
                script,
                script_args,
                batch_size=batch_sizes,
                loader=loader,
                settings=settings,
                observer=view,
                nproc_per_node=nproc_per_node,
            )
        path = rec.save(out, force=force)
    except SearchInterrupted as exc:
        if as_json:
            _echo_json_error(exc, out)
        _interrupted(exc, out, save_partial=save_partial, force=force)
    except LoadertuneError as exc:
        if as_json:
            _echo_json_error(exc, out)
        fail(exc)
    except KeyboardInterrupt as exc:  # past the search (saving its file): nothing half-written
        say("yellow", "interrupted; the search's trials are kept in its study")
        sys.exit(143 if isinstance(exc, _Terminated) else 130)
    console = err if as_json else plain_console()
    print_summary(rec, console, trials=show_trials)
    console.print(f"saved to {path}", highlight=False, soft_wrap=True)
    if report_path is not None:
        _write_report(rec, path, report_path, console)
    if as_json:
        _echo_json(rec, path)


def _check_before(out: str, *, force: bool, report_path: str | None) -> None:
    """What would fail after the search, found before its budget is spent."""
    try:
        store.read(out)  # an unreadable file is reported now, not after the search
    except RecommendationFileError as exc:
        if not force:
            raise
        say(
            "yellow",
            f"{exc} With --force the search's result replaces it; the file as it is now is "
            f"kept beside it as {Path(out).name}.corrupt-<date>-<time>.",
        )
    store.check_writable(out)  # so are a read-only file and a folder that cannot be written
    if report_path is not None:
        html.check_installed()


def _interrupted(exc: SearchInterrupted, out: str, *, save_partial: bool, force: bool) -> NoReturn:
    """Ctrl-C or SIGTERM: say so, save the best setting so far if asked, exit 130 or 143."""
    say("yellow", exc)
    if save_partial:
        try:
            saved_to = saved.save_partial(out, exc, force=force)
        except PartialNotSaved as kept:
            say("yellow", kept)  # a complete entry is kept: not an error
        except LoadertuneError as error:
            fail(error)
        else:
            err.print(
                f"loadertune: the best setting so far saved to {saved_to}, marked partial"
                if saved_to
                else "loadertune: no setting finished; nothing saved",
                highlight=False,
                soft_wrap=True,
            )
    sys.exit(143 if isinstance(exc.__cause__, _Terminated) else 130)


def _write_report(rec: Recommendation, path: str, report_path: str, console: Console) -> None:
    """``--report``: the HTML page of the entry just saved."""
    try:
        data = html.load(
            path,
            machine=rec.hardware.key,
            workload=store.workload_key(rec.workload, file=path),
        )
        html.write_report(data, report_path)
    except LoadertuneError as exc:
        fail(exc)
    console.print(f"report written to {report_path}", highlight=False, soft_wrap=True)


def _echo_json_error(exc: LoadertuneError, out: str) -> None:
    """``--json`` when the search fails or is interrupted: what went wrong, on stdout (the
    message is the one stderr gets; a partial entry ``--save-partial`` keeps is said there)."""
    click.echo(
        json.dumps(
            {"out": out, "error": {"type": type(exc).__name__, "message": str(exc)}}, indent=2
        )
    )


def _echo_json(rec: Recommendation, path: str) -> None:
    """``--json``: the entry saved, where, and under which keys, on stdout."""
    click.echo(
        json.dumps(
            {
                "out": path,
                "hardware_key": rec.hardware.key,
                "workload_key": store.workload_key(rec.workload, file=path),
                **rec.to_entry(),
            },
            default=str,
            indent=2,
        )
    )
